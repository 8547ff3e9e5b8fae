"""The storage-derived metrics: what `riverbed status` and `riverbed subscription
lag` compute, read for the broker's `riverbed.metrics.Refresher` thread.

Queries that grow with the subscriptions, sessions and retained topics, so they
run every `[metrics] refresh_interval` seconds on that thread, never per scrape.
"""

from __future__ import annotations

from riverbed.errors import NotFound
from riverbed.metrics import Readings
from riverbed.mqtt.retained import NAMESPACE as RETAINED
from riverbed.sessions.store import SessionStore
from riverbed.storage import Storage
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.pipeline import queue_depths


def read_storage(
    storage: Storage, sessions: SessionStore | None = None, max_age: float = 0.0
) -> Readings:
    """Lag of every named subscription, queue depths of the delivered ones,
    sessions not connected and retained topic names, as `riverbed status`
    counts them. `sessions`: the store to read the sessions with (one kept
    between refreshes decodes only the records that changed, and counts from
    the expiry sweep's read of them if it is at most `max_age` seconds old)."""
    lags: dict[str, int] = {}
    retry: dict[str, int] = {}
    parked: dict[str, int] = {}
    deliveries = {d.name for d in Definitions(storage).list()}
    subscriptions = Subscriptions(storage)
    for sub in storage.list_subscriptions(named_only=True):
        try:
            lags[sub.name] = sum(s.lag for s in subscriptions.lag(sub.name))
        except NotFound:
            continue  # deleted meanwhile
        if sub.name in deliveries:
            retry[sub.name], parked[sub.name] = queue_depths(storage, sub.name)
    store = sessions if sessions is not None else SessionStore(storage)
    offline = store.census(max_age).disconnected
    retained = storage.kv_count(RETAINED)  # not every retained message read to count them
    return Readings(lags, retry, parked, offline, retained)
