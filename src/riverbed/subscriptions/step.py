"""One micro-batch of one shard of a delivering subscription (seed 003).

A step takes the shard's main-topic messages of the batch (in offset order per
partition) and the due prefix of its retry queue range (read by the caller),
and, for each message, delivers it, or writes it to the retry queue (RQ) or
the dead-letter queue (DLQ). Nothing is written here: queue rows collect in a
`QueueWriter` for each queue, with the offsets they will get (the shard is the
only writer of its queue range, so the heads it read at the start are where
its rows land; `batch.commit` checks that in the transaction), and the shard's
`GroupStates` change in memory. The caller commits rows, states and progress
together.

Grouped subscriptions (`definition.grouped`) keep per-group order with
`groups.GroupStates` (seed 003's p/c): a group's events of the batch (its RQ
rows first, then its main-topic rows: the RQ holds the older ones) are taken
one after the other; groups run in parallel, at most
`consumption.max_parallel_groups` with an attempt in flight at once. A
message without a key belongs to no group: it is delivered like an
ungrouped one. Ungrouped subscriptions
deliver every message of the batch in parallel and retry each alone.

A retryable failure whose next attempt is due within
`retry.inline_max_delay` is retried inside the batch after its delay
(holding only its group); longer waits go through the retry queue.

Every attempt goes through `Attempts`: at most `consumption.max_in_flight` at
once, and when the share of failures over the last `error_window` attempts
is above `error_rate_threshold`, at most `throttled_rate` attempts per second.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace

from riverbed.log.partitioning import key_hash
from riverbed.model import MessageIdGenerator, StoredMessage, encode_properties
from riverbed.storage.base import Row
from riverbed.subscriptions.definition import ConsumptionPolicy, DeliveryDefinition
from riverbed.subscriptions.endpoint import Attempt, Deliverer, Outcome
from riverbed.subscriptions.groups import Action, GroupStates, HeadRetry, MessageState, Queue
from riverbed.subscriptions.queues import QueuedMessage
from riverbed.subscriptions.shards import queue_partition

INLINE_WAITS = 4
"""At most this many in-batch retries of one message in a row."""

FOLLOWS = "follows its group"
"""The reason of a message written to a queue behind its pending group."""


@dataclass(frozen=True, slots=True)
class MainRow:
    """A main-topic message of the batch: generation (storage topic index),
    partition, message."""

    generation: int
    partition: int
    message: StoredMessage


@dataclass(frozen=True, slots=True)
class QueueRow:
    """A message read from the shard's range of the retry queue."""

    stream_key: int
    generation: int
    queued: QueuedMessage
    offset: int

    @property
    def at(self) -> MessageState:
        q = self.queued
        return MessageState(q.main_topic_idx, q.main_offset, self.generation, self.offset)


def _hash(queued: QueuedMessage) -> int:
    return key_hash(queued.key if queued.key is not None else str(queued.message_id))


class QueueWriter:
    """Rows for one queue, placed in the shard's range of its produce
    generation, with the offsets they will get."""

    def __init__(
        self,
        generation: int,
        stream_keys: Sequence[int],
        heads: Mapping[int, int],
        shard_id: int,
        shard_count: int,
        ids: MessageIdGenerator,
        now_us: int,
    ) -> None:
        self.generation = generation
        self.stream_keys = tuple(stream_keys)
        self.heads = {k: heads[k] for k in self.stream_keys}
        self._next = dict(self.heads)
        self.shard_id = shard_id
        self.shard_count = shard_count
        self.ids = ids
        self.now_us = now_us
        self.batches: dict[int, list[Row]] = {}
        self.written: list[QueuedMessage] = []

    def partition_of(self, queued: QueuedMessage) -> int:
        return queue_partition(
            self.shard_id, self.shard_count, _hash(queued), len(self.stream_keys)
        )

    def stream_of(self, queued: QueuedMessage) -> int:
        return self.stream_keys[self.partition_of(queued)]

    def write(self, queued: QueuedMessage) -> tuple[int, int]:
        """Add a row; returns its (generation, offset)."""
        stream = self.stream_of(queued)
        offset = self._next[stream]
        self._next[stream] = offset + 1
        m = queued.to_message()
        ((id_bytes, ts),) = self.ids.reserve(1)
        row: Row = (
            id_bytes,
            ts,
            m.mqtt_topic,
            m.key,
            m.payload,
            encode_properties(m.properties) if m.properties else None,
            m.qos,
            int(m.retain),
        )
        self.batches.setdefault(stream, []).append(row)
        self.written.append(queued)
        return (self.generation, offset)

    def expected_firsts(self) -> dict[int, int]:
        """The first offset each appended stream must get (what `write` said)."""
        return {k: self.heads[k] for k in self.batches}

    def __len__(self) -> int:
        return len(self.written)


class Attempts:
    """Delivery attempts under the consumption policy (see the module docstring).

    Kept across batches (the error rate is a property of the endpoint, not of a
    batch); bound to one event loop."""

    def __init__(
        self,
        deliverer: Deliverer,
        policy: ConsumptionPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deliverer = deliverer
        self.policy = policy
        self.clock = clock
        self._slots = asyncio.Semaphore(policy.max_in_flight)
        self._recent: deque[bool] = deque(maxlen=policy.error_window)
        self._failures = 0
        self._next_allowed = 0.0

    @property
    def throttled(self) -> bool:
        recent = self._recent
        return (
            len(recent) == recent.maxlen
            and self._failures / len(recent) > self.policy.error_rate_threshold
        )

    async def __call__(self, message: StoredMessage, attempt: int) -> Attempt:
        async with self._slots:
            if self.throttled:
                now = self.clock()
                wait = self._next_allowed - now
                self._next_allowed = max(now, self._next_allowed) + 1 / self.policy.throttled_rate
                if wait > 0:
                    await asyncio.sleep(wait)
            result = await self.deliverer.deliver(message, attempt)
        failed = result.outcome is not Outcome.DELIVERED
        recent = self._recent
        if len(recent) == recent.maxlen and recent[0]:
            self._failures -= 1
        recent.append(failed)
        self._failures += failed
        return result


@dataclass(slots=True)
class StepStats:
    delivered: int = 0
    retried: int = 0
    """Failures written to the RQ for another attempt."""
    parked: int = 0
    """Messages written to the DLQ after their last attempt or a permanent failure."""
    followed: int = 0
    """Messages written to a queue behind their pending group (not attempted)."""
    skipped: int = 0
    """Superseded RQ rows passed over (a later copy counts)."""
    retried_inline: int = 0
    """Retries made inside the batch (due within `retry.inline_max_delay`)."""

    def add(self, other: StepStats) -> None:
        for name in StepStats.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(slots=True)
class StepResult:
    stats: StepStats
    rq: QueueWriter
    dlq: QueueWriter
    groups: GroupStates
    retries: dict[str, HeadRetry]
    done: dict[int, set[int]]
    """RQ rows done, by stream key."""
    next_due_us: int | None


FollowerReader = Callable[[QueueRow, MessageState, str], list[QueueRow]]
"""`(head, p, group)` -> the group's RQ rows after `head` up to and including
`p`, in order (read from the log: they are committed rows)."""


def _stored(queued: QueuedMessage) -> StoredMessage:
    """The message as the endpoint gets it again (its original id and topic)."""
    return StoredMessage(
        queued.main_offset,
        queued.message_id.to_bytes(),
        queued.failed_us,
        queued.mqtt_topic,
        queued.key,
        queued.payload,
        encode_properties(queued.properties) if queued.properties else None,
        queued.qos,
        int(queued.retain),
    )


class ShardStep:
    """One batch of one shard; see the module docstring. `run` once."""

    def __init__(
        self,
        definition: DeliveryDefinition,
        groups: GroupStates,
        rq: QueueWriter,
        dlq: QueueWriter,
        attempts: Attempts,
        followers: FollowerReader,
        now_us: int,
        retries: dict[str, HeadRetry] | None = None,
    ) -> None:
        self.definition = definition
        self.groups = groups
        self.retries = {} if retries is None else retries
        self.done: dict[int, set[int]] = {}
        """RQ rows done in this step, by stream key."""
        self.next_due_us: int | None = None
        self._lanes: asyncio.Semaphore | None = None
        self.rq = rq
        self.dlq = dlq
        self.attempts = attempts
        self.read_followers = followers
        self.now_us = now_us
        self.stats = StepStats()

    # --- queue records ------------------------------------------------------------
    def _from_main(self, row: MainRow, attempt: int, due: int, reason: str) -> QueuedMessage:
        m = row.message
        return QueuedMessage(
            m.message_id,
            row.generation,
            row.partition,
            m.offset,
            attempt,
            due,
            self.now_us,
            reason,
            m.key,
            m.payload,
            m.mqtt_topic,
            m.properties,
            m.qos,
            bool(m.retain),
        )

    def _again(self, q: QueuedMessage, attempt: int, due: int, reason: str) -> QueuedMessage:
        return replace(q, attempt=attempt, due_us=due, failed_us=self.now_us, reason=reason)

    def _write(self, queue: Queue, queued: QueuedMessage) -> MessageState:
        writer = self.rq if queue is Queue.RQ else self.dlq
        if queue is Queue.RQ and queued.reason != FOLLOWS:
            self._due(queued.due_us)
        generation, offset = writer.write(queued)
        return MessageState(queued.main_topic_idx, queued.main_offset, generation, offset)

    def _after_failure(self, attempt: int, result: Attempt) -> tuple[Queue, int]:
        """Where a failed attempt goes, and when the next one is due."""
        retry = self.definition.retry
        if result.outcome is Outcome.RETRY and attempt < retry.max_attempts:
            return Queue.RQ, self.now_us + int(retry.delay(attempt) * 1_000_000)
        return Queue.DLQ, self.now_us

    async def _try(
        self, message: StoredMessage, attempt: int, lane: bool = False
    ) -> tuple[Attempt, int]:
        """Attempt `attempt`; a retryable failure whose next attempt is due
        within `retry.inline_max_delay` is retried here after that delay (up to
        INLINE_WAITS times). Returns the last result and its attempt number."""
        retry = self.definition.retry
        waits = 0
        while True:
            if lane and self._lanes is not None:
                async with self._lanes:
                    result = await self.attempts(message, attempt)
            else:
                result = await self.attempts(message, attempt)
            if result.outcome is not Outcome.RETRY or attempt >= retry.max_attempts:
                return result, attempt
            delay = retry.delay(attempt)
            if delay > retry.inline_max_delay or waits >= INLINE_WAITS:
                return result, attempt
            waits += 1
            self.stats.retried_inline += 1
            await asyncio.sleep(delay)
            attempt += 1

    def _finish(self, row: QueueRow) -> None:
        self.done.setdefault(row.stream_key, set()).add(row.offset)

    def _due(self, due_us: int) -> None:
        if self.next_due_us is None or due_us < self.next_due_us:
            self.next_due_us = due_us

    def _count_failure(self, queue: Queue) -> None:
        if queue is Queue.RQ:
            self.stats.retried += 1
        else:
            self.stats.parked += 1

    # --- one message without a group ------------------------------------------------
    async def _alone_main(self, row: MainRow) -> None:
        result, attempt = await self._try(row.message, 1)
        if result.outcome is Outcome.DELIVERED:
            self.stats.delivered += 1
            return
        queue, due = self._after_failure(attempt, result)
        self._write(queue, self._from_main(row, attempt + 1, due, result.reason))
        self._count_failure(queue)

    async def _alone_queued(self, row: QueueRow) -> None:
        q = row.queued
        if q.due_us > self.now_us:
            self._due(q.due_us)  # read ahead past it; it stays
            return
        self._finish(row)
        result, attempt = await self._try(_stored(q), q.attempt)
        if result.outcome is Outcome.DELIVERED:
            self.stats.delivered += 1
            return
        queue, due = self._after_failure(attempt, result)
        self._write(queue, self._again(q, attempt + 1, due, result.reason))
        self._count_failure(queue)

    # --- one group's events, in order ---------------------------------------------------
    async def _group(self, group: str, queued: list[QueueRow], main: list[MainRow]) -> None:
        states = self.groups
        for row in queued:
            at = row.at
            action = states.read(group, at)
            if action is Action.SKIP:
                states.skipped(group, at)
                self._finish(row)
                self.stats.skipped += 1
                continue
            q = row.queued
            if action is Action.TO_DLQ:
                moved = self._write(Queue.DLQ, self._again(q, q.attempt, q.due_us, FOLLOWS))
                states.queued(Queue.DLQ, group, moved)
                states.finished(Queue.RQ, group, at)
                self._finish(row)
                self.stats.followed += 1
                continue
            retry = self.retries.get(group)
            if retry is not None and retry.internal == at.internal:
                attempt, due = retry.attempt, retry.due_us
            else:
                attempt, due = q.attempt, q.due_us
            if due > self.now_us:
                self._due(due)
                await self._follow(group, main)  # pending: they go behind it
                return
            result, attempt = await self._try(_stored(q), attempt, lane=True)
            if result.outcome is Outcome.DELIVERED:
                states.finished(Queue.RQ, group, at)
                self.retries.pop(group, None)
                self._finish(row)
                self.stats.delivered += 1
                continue
            queue, next_due = self._after_failure(attempt, result)
            self._count_failure(queue)
            if queue is Queue.RQ:
                # It stays the group's head; its next attempt is due later.
                self.retries[group] = HeadRetry(
                    at.internal, attempt + 1, next_due, self.now_us, result.reason
                )
                self._due(next_due)
                await self._follow(group, main)
                return
            # Parked: the head and the group's messages behind it in the RQ.
            state = states.rq.get(group)
            behind = (
                self.read_followers(row, state.p, group)
                if state is not None and state.p.internal > at.internal
                else []
            )
            again = [self._write(Queue.DLQ, self._again(q, attempt + 1, next_due, result.reason))]
            for follower in behind:
                f = follower.queued
                again.append(self._write(Queue.DLQ, self._again(f, f.attempt, f.due_us, f.reason)))
            states.parked(group, at, again)
            self.retries.pop(group, None)
            self._finish(row)
            self.stats.followed += len(behind)
        await self._follow(group, main)

    async def _follow(self, group: str, main: list[MainRow]) -> None:
        """The group's main-topic rows of the batch, in order."""
        states = self.groups
        for main_row in main:
            route = states.route_main(group)
            if route is not None:
                written = self._write(route, self._from_main(main_row, 1, self.now_us, FOLLOWS))
                states.queued(route, group, written)
                self.stats.followed += 1
                continue
            result, attempt = await self._try(main_row.message, 1, lane=True)
            if result.outcome is Outcome.DELIVERED:
                self.stats.delivered += 1
                continue
            queue, due = self._after_failure(attempt, result)
            written = self._write(queue, self._from_main(main_row, attempt + 1, due, result.reason))
            states.queued(queue, group, written)
            self._count_failure(queue)

    async def run(self, main: Sequence[MainRow], queued: Sequence[QueueRow]) -> StepResult:
        """Deliver the batch: `main` in offset order per partition, `queued` the
        due RQ rows in queue order."""
        work: list[Coroutine[None, None, None]] = []
        by_group: dict[str, tuple[list[QueueRow], list[MainRow]]] = {}
        grouped = self.definition.grouped
        for row in queued:
            group = row.queued.key if grouped else None  # a key is a group id
            if group is None:
                work.append(self._alone_queued(row))
            else:
                by_group.setdefault(group, ([], []))[0].append(row)
        for main_row in main:
            group = main_row.message.key if grouped else None
            if group is None:
                work.append(self._alone_main(main_row))
            else:
                by_group.setdefault(group, ([], []))[1].append(main_row)
        # A group counts against max_parallel_groups while it has an attempt in
        # flight (not while it waits for an in-batch retry).
        self._lanes = asyncio.Semaphore(self.definition.consumption.max_parallel_groups)
        work.extend(self._group(group, *rows) for group, rows in by_group.items())
        await asyncio.gather(*work)
        return StepResult(
            self.stats, self.rq, self.dlq, self.groups, self.retries, self.done, self.next_due_us
        )
