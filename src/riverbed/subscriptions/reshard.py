"""ChangeShardCount of a delivering subscription (seed 003).

`change_shard_count(storage, name, new_count)`:

1. checks the new count (`splitting.check_shard_count`): it must divide every
   generation of the main topic the subscription still reads (not fully
   consumed), the one producers write to and any added after it; fully
   consumed generations do not matter (seed 003's second case: the main topic
   grew to a partition count the old count cannot split);
2. gives the retry and dead-letter queues a new storage topic with a
   partition count the new count divides when their produce generation's is
   not (AddStorageTopic, then SwitchProduce: failures go there from now on);
3. feeds what the old shards still hold — every retry-queue row not done yet
   (superseded copies left out; a head that failed again in place written
   with its next attempt) and every parked row not replayed or purged — to
   the new shards through the producers' router (a group goes to the shard
   owning its main-topic partition, into its partition of that shard's queue
   range), in order per group;
4. re-shards GroupState: each group's state is rebuilt from where its rows
   were fed (a partial replay's position in the DLQ kept);
5. commits the fed rows, the new shards' state (the old ones deleted by
   compare-and-set: a batch of a running job that commits meanwhile makes the
   change start again) and the new definition in one transaction.

A running `subscription run` picks the new shards up at its next batch (its
batch in flight, if any, loses its commit and runs again: at least once).
Main-topic progress (the cursors, per stream) does not change.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from riverbed.clock import now_us
from riverbed.errors import StorageError, Superseded
from riverbed.log.partitioning import key_hash, route
from riverbed.log.topics import Topics
from riverbed.model import MessageIdGenerator
from riverbed.storage.base import Row, Storage
from riverbed.storage.transactions import (
    append_once_in,
    delete_marker_in,
    kv_delete_if_version_in,
    kv_put_in,
    transaction,
)
from riverbed.subscriptions.batch import QueueLayout, open_rows
from riverbed.subscriptions.definition import NAMESPACE as DEFINITIONS
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition, not_delivering
from riverbed.subscriptions.groups import GroupState, MessageState, Queue
from riverbed.subscriptions.provisioning import queue_topics
from riverbed.subscriptions.queues import QueuedMessage
from riverbed.subscriptions.shards import queue_partitions, shard_of
from riverbed.subscriptions.shardstate import NAMESPACE, ShardState, state_key
from riverbed.subscriptions.splitting import check_shard_count
from riverbed.subscriptions.step import QueueRow, QueueWriter

MAX_CONFLICTS = 10
Progress = Callable[[int, int], None]
"""`(done, total)` rows fed so far."""


@dataclass(frozen=True, slots=True)
class Reshard:
    old_count: int
    new_count: int
    fed_rq: int
    fed_dlq: int
    new_storage_topics: tuple[str, ...]
    """Queues that got a new storage topic."""

    def as_json(self, name: str) -> dict[str, object]:
        """What `subscription reshard --json` prints and an API job's result is."""
        return {
            "subscription": name,
            "shards_before": self.old_count,
            "shards": self.new_count,
            "fed_rq": self.fed_rq,
            "fed_dlq": self.fed_dlq,
            "new_storage_topics": list(self.new_storage_topics),
        }


def check_shard_change(storage: Storage, name: str, new_count: int) -> None:
    """Refuse what `change_shard_count` would refuse before changing anything:
    `NotFound` (no such subscription, or it does not deliver),
    `InvalidShardCount`."""
    check_shard_count(storage, Definitions(storage).require(name), new_count)


def _queue_generation(storage: Storage, topic: str, count: int) -> str | None:
    """Give queue `topic` a produce generation `count` divides; its name if it
    needed one."""
    record = storage.get_topic(topic)
    produce = storage.list_storage_topics(topic)[record.produce_pointer]
    if produce.partitions % count == 0:
        return None
    topics = Topics(storage)
    topics.add_storage_topic(topic, queue_partitions(count))
    topics.switch_produce(topic)
    return topic


def _open_rows(
    storage: Storage, topic: str, positions: dict[int, int], done: dict[int, list[tuple[int, int]]]
) -> tuple[list[QueueRow], dict[int, int]]:
    """Every row of every stream of `topic` not done, in generation, partition,
    offset order; and each stream's next offset (where the new shards start)."""
    heads = sorted(
        storage.list_streams(topic), key=lambda h: (h.stream.generation, h.stream.partition)
    )
    rows, _ = open_rows(storage, heads, positions, done)
    return rows, {head.key: head.next_offset for head in heads}


def change_shard_count(
    storage: Storage,
    name: str,
    new_count: int,
    progress: Progress | None = None,
) -> Reshard:
    """See the module docstring. Raises `NotFound`, `InvalidShardCount`
    (nothing changed)."""
    for _attempt in range(MAX_CONFLICTS):
        try:
            return _change(storage, name, new_count, progress)
        except Superseded:
            continue
    raise StorageError(
        f"subscription {name!r} kept changing while its shards were changed:"
        f" {MAX_CONFLICTS} attempts failed; stop its job and try again"
    )


def _change(storage: Storage, name: str, new_count: int, progress: Progress | None) -> Reshard:
    entry = storage.kv_get(DEFINITIONS, name)
    if entry is None:
        raise not_delivering(storage, name)
    definition = DeliveryDefinition.from_json(entry.value)
    check_shard_count(storage, definition, new_count)
    rq_topic, dlq_topic = queue_topics(name)
    grew = tuple(
        t for t in (_queue_generation(storage, q, new_count) for q in (rq_topic, dlq_topic)) if t
    )

    # The old shards' state, and what they still hold.
    old: dict[str, int] = {}
    states: list[ShardState] = []
    for item in storage.kv_list(NAMESPACE, f"{name}/"):
        old[item.key] = item.version
        states.append(ShardState.from_json(item.value))
    rq_read: dict[int, int] = {}
    rq_done: dict[int, list[tuple[int, int]]] = {}
    dlq_read: dict[int, int] = {}
    dlq_done: dict[int, list[tuple[int, int]]] = {}
    for s in states:
        rq_read.update(s.rq_read)
        rq_done.update(s.rq_done)
        dlq_read.update(s.dlq_read)
        dlq_done.update(s.dlq_done)
    rq_rows, rq_ends = _open_rows(storage, rq_topic, rq_read, rq_done)
    dlq_rows, dlq_ends = _open_rows(storage, dlq_topic, dlq_read, dlq_done)
    total = len(rq_rows) + len(dlq_rows)
    if progress is not None:
        progress(0, total)

    rq_groups = {g: st for s in states for g, st in s.groups.rq.items()}
    dlq_groups = {g: st for s in states for g, st in s.groups.dlq.items()}
    retries = {g: r for s in states for g, r in s.retries.items()}

    # Where a group goes: the shard owning its main-topic partition.
    record = storage.get_topic(definition.topic)
    produce = storage.list_storage_topics(definition.topic)[record.produce_pointer]

    def shard_for(queued: QueuedMessage) -> int:
        h = key_hash(queued.key if queued.key is not None else str(queued.message_id))
        partition = route(h, produce.partitions, produce.k)
        return shard_of(partition, new_count, produce.partitions)

    now = now_us()
    ids = MessageIdGenerator()
    new_states = [ShardState() for _ in range(new_count)]
    writers: dict[tuple[Queue, int], QueueWriter] = {}
    for queue, topic in ((Queue.RQ, rq_topic), (Queue.DLQ, dlq_topic)):
        layout = QueueLayout(storage, topic, new_count)
        for shard in range(new_count):
            writers[(queue, shard)] = layout.writer(shard, ids, now)
    fed = 0
    for queue, rows in ((Queue.RQ, rq_rows), (Queue.DLQ, dlq_rows)):
        for row in rows:
            q = row.queued
            group = q.key
            if queue is Queue.RQ and group is not None:
                state = rq_groups.get(group)
                if (
                    state is not None
                    and state.c is not None
                    and row.at.internal <= state.c.internal
                ):
                    fed += 1
                    continue  # superseded: a later copy counts
                retry = retries.get(group)
                if retry is not None and retry.internal == row.at.internal:
                    q = replace(
                        q,
                        attempt=retry.attempt,
                        due_us=retry.due_us,
                        failed_us=retry.failed_us,
                        reason=retry.reason,
                    )
            shard = shard_for(q)
            generation, offset = writers[(queue, shard)].write(q)
            if definition.grouped and group is not None:
                at = MessageState(q.main_topic_idx, q.main_offset, generation, offset)
                new_states[shard].groups.queued(queue, group, at)
            fed += 1
            if progress is not None and fed % 500 == 0:
                progress(fed, total)
    # A partial replay's place in the DLQ: replayed messages go before what is left.
    for new in new_states:
        for group, state in list(new.groups.dlq.items()):
            before = dlq_groups.get(group)
            if before is not None and before.c is not None:
                c = before.c
                new.groups.dlq[group] = GroupState(
                    state.p, MessageState(c.main_topic_idx, c.main_topic_offset, -1, -1)
                )
        new.rq_read = dict(rq_ends)
        new.dlq_read = dict(dlq_ends)
        new.next_due_us = now
    new_definition = replace(
        definition,
        shard_count=new_count,
        rq_partitions=_produce_partitions(storage, rq_topic),
        dlq_partitions=_produce_partitions(storage, dlq_topic),
    )
    batches: dict[int, list[Row]] = {}
    expected: dict[int, int] = {}
    for writer in writers.values():
        batches.update(writer.batches)
        expected.update(writer.expected_firsts())
    with transaction(storage) as tx:
        # The definition first: a shard's batch holds it (`batch.commit`) before
        # the rows this writes: in the same order, the two never wait for each
        # other in a cycle (a deadlock PostgreSQL would break by failing one).
        if not kv_put_in(tx, DEFINITIONS, name, new_definition.to_json(), entry.version):
            raise Superseded("the definition moved")
        marker = f"reshard/{name}/{uuid.uuid4().hex}"
        firsts = append_once_in(tx, marker, batches)
        if firsts != expected:
            raise Superseded("the queues moved")
        for key, version in old.items():
            if not kv_delete_if_version_in(tx, NAMESPACE, key, version):
                raise Superseded(f"shard state {key} moved")
        for shard, fresh in enumerate(new_states):
            if not kv_put_in(tx, NAMESPACE, state_key(name, shard), fresh.to_json(), None):
                raise Superseded(f"shard state {shard} appeared")
        delete_marker_in(tx, marker)
    if progress is not None:
        progress(total, total)
    return Reshard(
        definition.shard_count,
        new_count,
        sum(len(writers[(Queue.RQ, shard)]) for shard in range(new_count)),
        len(dlq_rows),
        grew,
    )


def _produce_partitions(storage: Storage, topic: str) -> int:
    record = storage.get_topic(topic)
    return storage.list_storage_topics(topic)[record.produce_pointer].partitions
