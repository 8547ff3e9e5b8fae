"""Running one batch of one shard against the log: read, deliver,
commit.

`ShardRunner.run_batch(shard_id, ranges, marker)`:

1. loads the shard's state (`shardstate.py`) and the subscription's cursors;
2. reads its main-topic messages of `ranges` (from the cursor on, if a
   replayed batch finds them committed already; filtered by the
   subscription's MQTT filter) and a window of its retry queue range (up to
   `rq_batch` rows not done yet (`open_rows`), from each stream's first row not done: the
   step passes over rows not due yet and does the rest);
3. runs the step (`step.py`), which delivers and collects queue rows;
4. commits, in one transaction (`commit`): the check that the definition is
   still the one the batch ran with (held until the commit: a shard-count
   change waits for it), the queue rows with the marker (`append_once`), the
   checks that they got the offsets the step gave them, the shard's state
   (compare-and-set on its version) and the cursors (to the ranges' ends).

A batch whose commit finds the state changed by another run of the same
batch, or the shards changed (`Superseded`), writes nothing: its deliveries
were repeats (endpoint delivery is at least once). The definition check
matters because a shard-count change writes the new shards' states afresh: a
state's version alone could match again. A batch that dies before its commit leaves
nothing behind and is run again from the same positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from riverbed.clock import now_us
from riverbed.errors import StreamSealed, Superseded
from riverbed.log.lineage import readable_streams
from riverbed.log.partitioning import key_hash
from riverbed.model import MessageIdGenerator
from riverbed.storage.base import Storage, StreamHead, SubscriptionRecord
from riverbed.storage.outage import ride_out
from riverbed.storage.transactions import (
    append_once_in,
    commit_cursors_in,
    delete_markers_with_prefix_in,
    kv_hold_in,
    kv_put_in,
    transaction,
)
from riverbed.subscriptions.definition import NAMESPACE as DEFINITIONS
from riverbed.subscriptions.definition import DeliveryDefinition
from riverbed.subscriptions.groups import MessageState
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.provisioning import queue_topics
from riverbed.subscriptions.queues import QueuedMessage
from riverbed.subscriptions.shards import queue_partition, shard_partitions
from riverbed.subscriptions.shardstate import (
    NAMESPACE,
    ShardState,
    add_done,
    is_done,
    load_state,
    state_key,
)
from riverbed.subscriptions.step import (
    Attempts,
    MainRow,
    QueueRow,
    QueueWriter,
    ShardStep,
    StepResult,
    StepStats,
)
from riverbed.topics.filters import matches

READ_CHUNK = 1000
RQ_BATCH = 10_000
"""At most this many retry-queue rows per shard and batch."""
MAIN_BATCH = 50_000
"""At most this many main-topic rows per shard and batch (a rewind's backlog
is taken in steps)."""


@dataclass(frozen=True, slots=True)
class MainRange:
    """Offsets `[start, end)` of one main-topic stream, for one shard."""

    stream_key: int
    generation: int
    partition: int
    start: int
    end: int


class QueueLayout:
    """A queue topic's streams, read once, as the shards of a subscription
    with `shard_count` shards see them."""

    def __init__(self, storage: Storage, topic: str, shard_count: int) -> None:
        self.topic = topic
        self.shard_count = shard_count
        record = storage.get_topic(topic)
        self.produce = storage.list_storage_topics(topic)[record.produce_pointer]
        self.by_generation: dict[int, list[StreamHead]] = {}
        for head in storage.list_streams(topic):
            self.by_generation.setdefault(head.stream.generation, []).append(head)
        for streams in self.by_generation.values():
            streams.sort(key=lambda h: h.stream.partition)

    def owned(self, shard_id: int) -> list[StreamHead]:
        """Shard `shard_id`'s streams of every generation whose partition count
        the shard count divides, in generation then partition order."""
        out: list[StreamHead] = []
        for generation in sorted(self.by_generation):
            streams = self.by_generation[generation]
            if len(streams) % self.shard_count:
                continue
            owned = shard_partitions(shard_id, self.shard_count, len(streams))
            out.extend(streams[p] for p in owned)
        return out

    def group_stream(self, shard_id: int, generation: int, group: str) -> StreamHead:
        """The stream of `generation` where shard `shard_id` keeps `group`'s rows."""
        streams = self.by_generation[generation]
        p = queue_partition(shard_id, self.shard_count, key_hash(group), len(streams))
        return streams[p]

    def writer(self, shard_id: int, ids: MessageIdGenerator, now: int) -> QueueWriter:
        """Rows of shard `shard_id` for the produce generation."""
        streams = self.by_generation[self.produce.generation]
        return QueueWriter(
            self.produce.generation,
            [h.key for h in streams],
            {h.key: h.next_offset for h in streams},
            shard_id,
            self.shard_count,
            ids,
            now,
        )


def queue_rows(storage: Storage, head: StreamHead, first: int, last: int) -> Iterable[QueueRow]:
    """Rows `[first, last]` of a queue stream."""
    offset = max(first, head.start_offset)
    while offset <= last:
        chunk = storage.read(head.key, offset, min(READ_CHUNK, last - offset + 1))
        if not chunk:
            return
        for m in chunk:
            yield QueueRow(head.key, head.stream.generation, QueuedMessage.from_stored(m), m.offset)
        offset = chunk[-1].offset + 1


def open_rows(
    storage: Storage,
    streams: Sequence[StreamHead],
    positions: Mapping[int, int],
    done: Mapping[int, list[tuple[int, int]]],
    limit: int | None = None,
) -> tuple[list[QueueRow], bool]:
    """The queue rows not done yet, from each stream's first row not done
    (`positions`, rows `done` above it) on, in stream then offset order; at
    most `limit` in all, shared among the streams (None: every one). Also
    whether some stream has rows past what was read."""
    out: list[QueueRow] = []
    more = False
    share = None if limit is None else max(1, limit // max(1, len(streams)))
    for head in streams:
        position = max(positions.get(head.key, head.start_offset), head.start_offset)
        above = done.get(head.key, [])
        taken = 0
        while position < head.next_offset and (share is None or taken < share):
            count = READ_CHUNK if share is None else min(READ_CHUNK, share - taken)
            chunk = storage.read(head.key, position, count)
            if not chunk:
                break
            for m in chunk:
                if not is_done(m.offset, position, above):
                    out.append(
                        QueueRow(
                            head.key, head.stream.generation, QueuedMessage.from_stored(m), m.offset
                        )
                    )
                    taken += 1
            position = chunk[-1].offset + 1
        if position < head.next_offset:
            more = True
    return out, more


def read_main(
    storage: Storage,
    ranges: Sequence[MainRange],
    cursors: dict[int, int],
    topic_filter: str | None,
    limit: int = MAIN_BATCH,
) -> tuple[list[MainRow], dict[int, int]]:
    """The messages of `ranges` from the cursors on, up to the ranges' ends, in
    range order, filtered by the subscription's filter; at most `limit` read.
    The cursors are the authority: a replayed batch skips what it committed,
    and a batch after one that did not commit (superseded), or after a rewind,
    reads from where they are. Also returns where each stream's reading
    stopped (its range's end unless the limit cut it short)."""
    out: list[MainRow] = []
    reached: dict[int, int] = {}
    budget = limit
    for r in ranges:
        offset = cursors.get(r.stream_key, r.start)
        while offset < r.end and budget > 0:
            chunk = storage.read(r.stream_key, offset, min(READ_CHUNK, r.end - offset, budget))
            if not chunk:
                offset = r.end  # retention took them: nothing left to deliver
                break
            for m in chunk:
                if m.offset >= r.end:
                    break
                if topic_filter is None or matches(topic_filter, m.mqtt_topic):
                    out.append(MainRow(r.generation, r.partition, m))
                budget -= 1
                offset = m.offset + 1
        reached[r.stream_key] = min(offset, r.end)
    return out, reached


def commit(
    storage: Storage,
    name: str,
    shard_id: int,
    marker: str,
    result: StepResult,
    state: ShardState,
    version: int | None,
    cursors: dict[int, int],
    definition_version: int,
) -> bool:
    """Commit a step (see the module docstring). False: the marker was recorded
    before (this batch committed already), nothing written. Raises
    `Superseded` when the state or the definition (a shard-count change: the
    shard's partitions and state are another shard's now) moved meanwhile."""
    batches = {**result.rq.batches, **result.dlq.batches}
    expected = {**result.rq.expected_firsts(), **result.dlq.expected_firsts()}
    with transaction(storage) as tx:
        if not kv_hold_in(tx, DEFINITIONS, name, definition_version):
            raise Superseded(
                f"shard {shard_id} of subscription {name!r}: its definition changed meanwhile"
                " (a shard-count change)"
            )
        try:
            firsts = append_once_in(tx, marker, batches)
        except StreamSealed:
            raise Superseded(
                f"shard {shard_id} of subscription {name!r}: its queues switched to a new"
                " storage topic meanwhile (a shard-count change)"
            ) from None
        if firsts is None:
            return False
        if firsts != expected:
            raise Superseded(
                f"shard {shard_id} of subscription {name!r}: its queue streams moved"
                f" (expected {expected}, got {firsts}): another run wrote to them"
            )
        if not kv_put_in(tx, NAMESPACE, state_key(name, shard_id), state.to_json(), version):
            raise Superseded(
                f"shard {shard_id} of subscription {name!r}: its state changed meanwhile"
                " (another run of this batch committed first)"
            )
        commit_cursors_in(tx, name, cursors)
        # One marker per shard is enough: Spark replays only its last batch.
        delete_markers_with_prefix_in(tx, _marker_prefix(name, shard_id), keep=marker)
    return True


def _marker_prefix(name: str, shard_id: int) -> str:
    return f"delivery/{name}/{shard_id}/"


def batch_marker(name: str, shard_id: int, run_id: str, batch_id: int) -> str:
    """The idempotence marker of one batch of one shard in one run."""
    return f"{_marker_prefix(name, shard_id)}{run_id}/{batch_id}"


class ShardRunner:
    """Runs batches of one subscription's shards in this process; see the module docstring."""

    def __init__(
        self,
        storage: Storage,
        definition: DeliveryDefinition,
        definition_version: int,
        record: SubscriptionRecord,
        attempts: Attempts,
        clock: Callable[[], int] = now_us,
        ids: MessageIdGenerator | None = None,
        rq_batch: int = RQ_BATCH,
        main_batch: int = MAIN_BATCH,
    ) -> None:
        self.storage = storage
        self.definition = definition
        self.definition_version = definition_version
        """Its KV version: a batch commits only if it is still that one."""
        self.record = record
        self.attempts = attempts
        self.clock = clock
        self.ids = ids or MessageIdGenerator()
        self.rq_batch = rq_batch
        self.main_batch = main_batch

    async def run_batch(
        self, shard_id: int, ranges: Sequence[MainRange], marker: str
    ) -> StepStats | None:
        """One batch of shard `shard_id`; its stats, or None if it had been
        committed before (nothing done)."""
        storage, definition, name = self.storage, self.definition, self.definition.name
        state, version = load_state(storage, name, shard_id)
        # Lineage order from the cursors: a generation's stream is read once what
        # it continues is consumed (by whichever shard owns that), whatever
        # Spark's offsets say (a rewind, a batch that did not commit).
        heads = storage.list_streams(self.record.topic)
        cursors = Subscriptions(storage).positions(self.record, heads)
        readable, _ = readable_streams(
            storage.list_storage_topics(self.record.topic), heads, cursors
        )
        keys = {h.key for h in readable}
        ranges = [r for r in ranges if r.stream_key in keys]
        rq_topic, dlq_topic = queue_topics(name)
        rq = QueueLayout(storage, rq_topic, definition.shard_count)
        dlq = QueueLayout(storage, dlq_topic, definition.shard_count)
        now = self.clock()
        owned = rq.owned(shard_id)
        queued, more = open_rows(storage, owned, state.rq_read, state.rq_done, self.rq_batch)
        main, reached = read_main(storage, ranges, cursors, self.record.filter, self.main_batch)

        def followers(head: QueueRow, p: MessageState, group: str) -> list[QueueRow]:
            out: list[QueueRow] = []
            for generation in range(head.generation, p.internal_topic_idx + 1):
                stream = rq.group_stream(shard_id, generation, group)
                first = head.offset + 1 if generation == head.generation else 0
                last = (
                    p.internal_topic_offset
                    if generation == p.internal_topic_idx
                    else stream.next_offset - 1
                )
                out.extend(
                    row
                    for row in queue_rows(storage, stream, first, last)
                    if row.queued.key == group
                )
            return out

        step = ShardStep(
            definition,
            state.groups,
            rq.writer(shard_id, self.ids, now),
            dlq.writer(shard_id, self.ids, now),
            self.attempts,
            followers,
            now,
            state.retries,
        )
        result = await step.run(main, queued)
        for head in owned:
            done = result.done.get(head.key, set())
            start = max(state.rq_read.get(head.key, head.start_offset), head.start_offset)
            state.rq_read[head.key], state.rq_done[head.key] = add_done(
                start, state.rq_done.get(head.key, []), done
            )
        state.retries = result.retries
        state.next_due_us = now if more else result.next_due_us
        # Delivered: a store that went away meanwhile is waited for, so the
        # batch is not delivered again (the commit happens once, by its marker).
        committed = ride_out(
            lambda: commit(
                storage,
                name,
                shard_id,
                marker,
                result,
                state,
                version,
                reached,
                self.definition_version,
            ),
            f"committing a batch of shard {shard_id} of subscription {name!r}",
        )
        if not committed:
            return None
        return result.stats
