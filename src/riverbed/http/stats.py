"""The dashboard's numbers in one cheap answer (docs/http.md, docs/metrics.md).

    GET /api/v1/stats

The dashboard polls this every couple of seconds, so it costs no storage query
while a broker runs here with its metrics on: the counters are the broker's
plain ints (`Broker.counts`, the ones `$SYS` and `/metrics` read), the commit
figures its histograms, and what needs the database (subscription lag, queue
depths, offline sessions, retained messages) is the metrics' last storage
reading (`readings_at` says when it was taken; 0: not yet).

Under `riverbed admin` (no broker) or with `[metrics] enabled = false` there
is no such reading: this module reads the storage itself, at most once every
`READING_INTERVAL` seconds, and answers with that reading meanwhile. Without a
broker the broker's fields are 0; with metrics off the broker still counts
(its `$SYS` topics need it), so its counters are there, and the commit
figures are 0 (the log's commits are timed only with metrics on).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from riverbed.errors import StorageError
from riverbed.http.context import HttpContext
from riverbed.metrics import Readings
from riverbed.mqtt.readings import read_storage

if TYPE_CHECKING:
    from riverbed.mqtt.broker import Broker
    from riverbed.storage import Storage

READING_INTERVAL = 5.0
"""Seconds an own storage reading serves (no broker, or its metrics off)."""


def routes(context: HttpContext) -> APIRouter:
    """`GET /stats` over `context` (the module docstring)."""
    api = APIRouter()
    own = _OwnReading(context.log.storage)

    @api.get("/stats", tags=["stats"], responses={503: {"description": "storage unavailable"}})
    def stats() -> dict[str, Any]:
        """This node's counters, commit times and subscription backlogs, without a
        storage query (the last reading of the storage-derived ones)."""
        broker = context.broker
        metrics = None if broker is None else broker.metrics
        readings = own.get() if metrics is None else metrics.readings
        view: dict[str, Any] = {
            "at": time.time(),
            "node": context.node,
            "uptime_seconds": round(time.time() - context.started, 3),
            **_broker_view(broker),
            "sessions_offline": readings.sessions_offline,
            "retained": readings.retained,
            "commit": _commits(broker),
            "subscriptions": [
                {
                    "name": name,
                    "lag": lag,
                    "retry_queue": readings.retry_queue.get(name),
                    "dead_letter_queue": readings.dead_letter_queue.get(name),
                }
                for name, lag in sorted(readings.subscription_lag.items())
            ],
            "readings_at": readings.at,
        }
        return view

    return api


def _broker_view(broker: Broker | None) -> dict[str, int]:
    if broker is None:
        return dict.fromkeys(
            (
                "connections",
                "sessions_online",
                "publish_in",
                "publish_out",
                "bytes_in",
                "bytes_out",
                "in_flight",
            ),
            0,
        )
    counts = broker.counts
    return {
        "connections": broker.open_connections,
        "sessions_online": len(broker.connections),
        "publish_in": sum(counts.publish_in),
        "publish_out": sum(counts.publish_out),
        "bytes_in": counts.bytes_in,
        "bytes_out": counts.bytes_out,
        "in_flight": broker.in_flight(),
    }


def _commits(broker: Broker | None) -> dict[str, Any]:
    metrics = None if broker is None else broker.metrics
    if metrics is None:
        return {"count": 0, "sum_seconds": 0.0, "p50_seconds": None, "p99_seconds": None}
    histogram = metrics.commit_seconds
    counts, total = histogram.snapshot()
    return {
        "count": sum(counts),
        "sum_seconds": total,
        "p50_seconds": histogram.quantile(0.5),
        "p99_seconds": histogram.quantile(0.99),
    }


class _OwnReading:
    """A storage reading taken here when no broker's metrics take one: at most
    one every `READING_INTERVAL` seconds, one request reading while the others
    wait for it. A reading that fails raises (503) unless an earlier one is
    there to answer with."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.readings: Readings | None = None
        self.taken = 0.0
        """When `readings` was taken (monotonic seconds)."""
        self.lock = threading.Lock()

    def get(self) -> Readings:
        with self.lock:
            now = time.monotonic()
            if self.readings is None or now - self.taken >= READING_INTERVAL:
                try:
                    self.readings = replace(read_storage(self.storage), at=time.time())
                except StorageError:
                    if self.readings is None:
                        raise
                self.taken = now  # a failure waits its interval too: no query per poll
            return self.readings
