"""Driving a delivering subscription's shards batch by batch without Spark
(what each Spark task does, `subscriptions/batch.py`), with a clock the test
moves: for tests of the pipeline's rules on both backends; and the workload
those tests share (subscription `billing` on topic `orders`, groups `gN` with
payloads `gN:SEQ:`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from harness.clock import FakeClock
from harness.endpoint import Request
from riverbed.log.log import Log
from riverbed.log.topics import Topics
from riverbed.model import Message
from riverbed.storage.base import Storage
from riverbed.subscriptions.batch import MainRange, ShardRunner, batch_marker
from riverbed.subscriptions.definition import (
    ConsumptionPolicy,
    Definitions,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.endpoint import Deliverer, deliverer
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.pipeline import is_idle
from riverbed.subscriptions.provisioning import create_delivering
from riverbed.subscriptions.queues import QueuedMessage
from riverbed.subscriptions.shards import shard_of
from riverbed.subscriptions.step import Attempts, StepStats


class Driver:
    def __init__(self, storage: Storage, name: str, target: Deliverer | None = None) -> None:
        self.storage = storage
        self.name = name
        self.t0 = time.time_ns() // 1_000_000_000 * 1_000_000
        """The driver's clock starts at the wall clock (whole seconds): what the
        command line writes (a replay, due now) is due for it too."""
        self.clock = FakeClock(us=self.t0)
        self.loop = asyncio.new_event_loop()
        self.batch_id = 0
        self._target = target
        self._attempts: Attempts | None = None
        self.totals = StepStats()
        self.main_batch = 50_000

    @property
    def now(self) -> int:
        """The driver's time, µs."""
        return self.clock.us()

    @property
    def definition(self) -> DeliveryDefinition:
        definition = Definitions(self.storage).get(self.name)
        assert definition is not None
        return definition

    def _runner(self) -> ShardRunner:
        definition, version = Definitions(self.storage).require_versioned(self.name)

        async def make() -> Attempts:
            return Attempts(self._target or deliverer(definition), definition.consumption)

        if self._attempts is None:
            self._attempts = self.loop.run_until_complete(make())
        return ShardRunner(
            self.storage,
            definition,
            version,
            Subscriptions(self.storage).get(self.name),
            self._attempts,
            clock=self.clock.us,
            main_batch=self.main_batch,
        )

    def ranges(self, shard: int, limit: int | None = None) -> list[MainRange]:
        definition = self.definition
        storage = self.storage
        sizes = {
            st.generation: st.partitions for st in storage.list_storage_topics(definition.topic)
        }
        cursors = Subscriptions(storage).positions(
            Subscriptions(storage).get(self.name), storage.list_streams(definition.topic)
        )
        out = []
        for head in storage.list_streams(definition.topic):
            s = head.stream
            if shard_of(s.partition, definition.shard_count, sizes[s.generation]) != shard:
                continue
            start = cursors[head.key]
            end = head.next_offset if limit is None else min(head.next_offset, start + limit)
            if end > start:
                out.append(MainRange(head.key, s.generation, s.partition, start, end))
        return out

    def batch(self, limit: int | None = None) -> list[StepStats | None]:
        """One batch of every shard (main topic up to its heads, or `limit`
        messages per stream)."""
        runner = self._runner()
        out = []
        for shard in range(self.definition.shard_count):
            marker = batch_marker(self.name, shard, "test", self.batch_id)
            stats = self.loop.run_until_complete(
                runner.run_batch(shard, self.ranges(shard, limit), marker)
            )
            if stats is not None:
                self.totals.add(stats)
            out.append(stats)
        self.batch_id += 1
        return out

    def idle(self) -> bool:
        return is_idle(self.storage, self.name)

    def until_idle(
        self, step_us: int = 1_000_000, rounds: int = 200, limit: int | None = None
    ) -> int:
        """Batches (the clock moving `step_us` after each) until nothing is
        left; returns how many ran."""
        for n in range(rounds):
            if self.idle():
                return n
            self.batch(limit)
            self.clock.advance(us=step_us)
        raise AssertionError(f"not idle after {rounds} batches")

    def close(self) -> None:
        if self._attempts is not None:
            self.loop.run_until_complete(self._attempts.deliverer.close())
        self.loop.close()


@contextmanager
def driver(storage: Storage, name: str, target: Deliverer | None = None) -> Iterator[Driver]:
    d = Driver(storage, name, target)
    try:
        yield d
    finally:
        d.close()


# --------------------------------------------------------------------- workloads


def subscribe(
    storage: Storage,
    endpoint_url: str,
    *,
    shards: int = 2,
    partitions: int = 4,
    grouped: bool = True,
    retry: RetryPolicy | None = None,
    consumption: ConsumptionPolicy | None = None,
) -> None:
    """Topic `orders` with `partitions` and subscription `billing` delivering
    it to `endpoint_url` (retrying 503s)."""
    Topics(storage).create("orders", partitions)
    create_delivering(
        storage,
        DeliveryDefinition(
            "billing",
            "orders",
            HttpEndpoint(endpoint_url),
            shard_count=shards,
            grouped=grouped,
            retry=retry or RetryPolicy(retry_on_status=(503,), min_delay=1, max_attempts=4),
            consumption=consumption or ConsumptionPolicy(max_in_flight=8, max_parallel_groups=8),
        ),
    )


def produce_groups(storage: Storage, groups: int, first: int, count: int) -> None:
    """Messages `first`..`first + count - 1` of groups `g0`..: payload
    `gN:SEQ:`, key `gN`, sequence by sequence."""
    log = Log(storage)
    try:
        log.produce(
            "orders",
            [
                Message(f"g{g}:{n}:".encode(), key=f"g{g}", mqtt_topic="orders/new")
                for n in range(first, first + count)
                for g in range(groups)
            ],
        )
    finally:
        log.appender.close()


def by_group(requests: Iterable[Request]) -> dict[str, list[int]]:
    """Each group's sequence numbers, in the order the endpoint got them."""
    out: dict[str, list[int]] = {}
    for r in requests:
        group, seq, _ = r.payload.split(b":")
        out.setdefault(group.decode(), []).append(int(seq))
    return out


def queued(storage: Storage, topic: str) -> list[QueuedMessage]:
    """Every row of a retry or dead-letter queue, stream by stream."""
    return [
        QueuedMessage.from_stored(m)
        for head in storage.list_streams(topic)
        for m in storage.read(head.key, head.start_offset, 100_000)
    ]
