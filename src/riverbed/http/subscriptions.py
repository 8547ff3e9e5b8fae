"""Named-subscription routes of the admin API.

    GET    /api/v1/subscriptions[?topic=T]  each with its lag
    GET    /api/v1/subscriptions/{name}     lag per stream, retry and dead-letter queue depths

Handlers call what `riverbed subscription ...` calls (`Subscriptions`,
`Definitions`, `queue_depths`), on FastAPI's worker threads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from riverbed.http.context import HttpContext
from riverbed.log.jsonlines import format_time
from riverbed.log.log import Log
from riverbed.storage.base import SubscriptionRecord
from riverbed.subscriptions.cursors import Subscriptions
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.pipeline import queue_depths


def _subscription_view(log: Log, record: SubscriptionRecord) -> dict[str, Any]:
    delivery = Definitions(log.storage).get(record.name)
    lags = Subscriptions(log.storage).lag(record.name)
    view: dict[str, Any] = {
        "name": record.name,
        "topic": record.topic,
        "filter": record.filter,
        "start": record.start.value,
        "start_time": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "endpoint": None if delivery is None else delivery.target,
        "lag": sum(s.lag for s in lags),
        "streams": [s.as_json() for s in lags],
    }
    if delivery is not None:
        view["retry_queue"], view["dead_letter_queue"] = queue_depths(log.storage, record.name)
    return view


def routes(context: HttpContext) -> APIRouter:
    """The subscription routes over `context.log` (the module docstring)."""
    log = context.log
    api = APIRouter()

    @api.get("/subscriptions", tags=["subscriptions"])
    def list_subscriptions(topic: str | None = None) -> list[dict[str, Any]]:
        """Named subscriptions (of `topic`, if given) with their lag."""
        if topic is not None:
            log.topics.get(topic)  # 404 rather than an empty list
        return [_subscription_view(log, r) for r in Subscriptions(log.storage).list(topic)]

    @api.get("/subscriptions/{name}", tags=["subscriptions"])
    def get_subscription(name: str) -> dict[str, Any]:
        """One subscription with its lag per stream (and its retry and
        dead-letter queues when it delivers to an endpoint)."""
        return _subscription_view(log, Subscriptions(log.storage).get(name))

    return api
