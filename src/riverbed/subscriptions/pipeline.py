"""The pieces of a delivering subscription's pipeline that Spark's driver and
tasks call (the Spark side is `riverbed.spark.delivery_job`).

- `run_shard` (in a task): one batch of one shard (`batch.ShardRunner`). A
  Python worker process keeps its storage connection, its event loop and
  each subscription's `Attempts` (httpx client, error-rate window) across
  batches.
- `retry_due` (driver): whether some shard has a retry-queue row due now.
- `is_idle` (driver): no main-topic lag and no unread retry-queue row.
"""

from __future__ import annotations

import asyncio
import json
import logging

from riverbed.clock import now_us
from riverbed.errors import Superseded
from riverbed.storage.base import Storage
from riverbed.storage.outage import ride_out
from riverbed.subscriptions.batch import MainRange, QueueLayout, ShardRunner, batch_marker
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition
from riverbed.subscriptions.endpoint import deliverer
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.provisioning import queue_topics
from riverbed.subscriptions.shardstate import ShardState, load_states
from riverbed.subscriptions.step import Attempts, StepStats

logger = logging.getLogger(__name__)


class _Worker:
    """What one Python worker process keeps between batches."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.storages: dict[str, Storage] = {}
        self.attempts: dict[tuple[str, str], tuple[bytes, Attempts]] = {}

    def storage(self, url: str) -> Storage:
        storage = self.storages.get(url)
        if storage is None or getattr(storage, "closed", False):
            from riverbed.storage import open_storage

            storage = self.storages[url] = open_storage(url)
        return storage

    def attempts_for(self, url: str, definition: DeliveryDefinition) -> Attempts:
        key = (url, definition.name)
        wanted = definition.to_json()
        kept = self.attempts.get(key)
        if kept is not None and kept[0] == wanted:
            return kept[1]
        if kept is not None:
            self.loop.run_until_complete(kept[1].deliverer.close())

        async def make() -> Attempts:  # the semaphore and the client bind to the loop
            return Attempts(deliverer(definition), definition.consumption)

        made = self.loop.run_until_complete(make())
        self.attempts[key] = (wanted, made)
        return made


_worker: _Worker | None = None


def _this_worker() -> _Worker:
    global _worker
    if _worker is None:
        _worker = _Worker()
    return _worker


def definition_of(storage: Storage, name: str) -> DeliveryDefinition:
    return Definitions(storage).require(name)


def run_shard(
    url: str,
    name: str,
    run_id: str,
    batch_id: int,
    shard_id: int,
    shard_count: int,
    ranges_json: str,
) -> StepStats | None:
    """One batch of one shard of a batch planned with `shard_count` shards; its
    stats, or None when it had been committed before, another run of it
    committed first, or the shard count changed since it was planned (the
    next batch reads from the cursors). A store that cannot be reached for a
    while is waited out (`storage.outage`): the batch runs again from its
    start, or its commit is tried again (it commits once, by its marker)."""

    def attempt() -> StepStats | None:
        worker = _this_worker()
        storage = worker.storage(url)
        definition, version = Definitions(storage).require_versioned(name)
        if definition.shard_count != shard_count:
            logger.warning(
                "subscription %r: batch %d was planned for %d shards, it has %d now: skipped",
                name,
                batch_id,
                shard_count,
                definition.shard_count,
            )
            return None
        record = Subscriptions(storage).get(name)
        runner = ShardRunner(
            storage, definition, version, record, worker.attempts_for(url, definition)
        )
        ranges = [MainRange(**item) for item in json.loads(ranges_json)]
        marker = batch_marker(name, shard_id, run_id, batch_id)
        try:
            return worker.loop.run_until_complete(runner.run_batch(shard_id, ranges, marker))
        except Superseded as exc:
            logger.warning("%s", exc)
            return None

    return ride_out(attempt, f"subscription {name!r}, batch {batch_id} of shard {shard_id}")


def _has_unread(
    storage: Storage, definition: DeliveryDefinition, states: dict[int, ShardState]
) -> bool:
    """Whether a shard has retry-queue rows it has not done."""
    rq_topic, _ = queue_topics(definition.name)
    layout = QueueLayout(storage, rq_topic, definition.shard_count)
    for shard in range(definition.shard_count):
        state = states.get(shard)
        for head in layout.owned(shard):
            position = head.start_offset if state is None else state.rq_read.get(head.key, 0)
            if max(position, head.start_offset) < head.next_offset:
                return True
    return False


def retry_due(storage: Storage, definition: DeliveryDefinition, now: int | None = None) -> bool:
    """Whether some shard has retry work due (a batch should run for it)."""
    now = now_us() if now is None else now
    states = load_states(storage, definition.name)
    due = any(s.next_due_us is not None and s.next_due_us <= now for s in states.values())
    return due and _has_unread(storage, definition, states)


def is_idle(storage: Storage, name: str) -> bool:
    """No main-topic lag and no unread retry-queue row."""
    definition = definition_of(storage, name)
    if any(lag.lag > 0 for lag in Subscriptions(storage).lag(name)):
        return False
    return not _has_unread(storage, definition, load_states(storage, name))


def queue_depths(storage: Storage, name: str) -> tuple[int, int]:
    """How many messages wait in the retry queue and are parked in the
    dead-letter queue of subscription `name` (rows not done yet)."""
    rq_read: dict[int, int] = {}
    rq_done: dict[int, list[tuple[int, int]]] = {}
    dlq_read: dict[int, int] = {}
    dlq_done: dict[int, list[tuple[int, int]]] = {}
    for state in load_states(storage, name).values():
        rq_read.update(state.rq_read)
        rq_done.update(state.rq_done)
        dlq_read.update(state.dlq_read)
        dlq_done.update(state.dlq_done)
    depths = []
    for topic, read, done in zip(
        queue_topics(name), (rq_read, dlq_read), (rq_done, dlq_done), strict=True
    ):
        count = 0
        for head in storage.list_streams(topic):
            position = max(read.get(head.key, head.start_offset), head.start_offset)
            above = sum(
                max(0, min(end, head.next_offset) - max(start, position))
                for start, end in done.get(head.key, [])
            )
            count += max(0, head.next_offset - position - above)
        depths.append(count)
    return depths[0], depths[1]
