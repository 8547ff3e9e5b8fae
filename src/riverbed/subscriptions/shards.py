"""Shards of a named subscription that delivers to an endpoint (seed 003).

A subscription runs as `shard_count` shards. Shard `sid` owns, in every storage
topic (generation) of its main topic with P partitions, the contiguous range

    [sid * P / shard_count, (sid + 1) * P / shard_count - 1]

so `shard_count` must divide every generation's P. Because producers route
shard-consistently (`log.partitioning.route`: a key's lineage depends only on the
base count P / K, which a scale-up keeps), a key stays with one shard across
the generations of a lineage as long as `shard_count` divides the base count:
per-group order needs no coordination between shards.

The retry and dead-letter queues are composite topics of their own, created
with r and d partitions, multiples of `shard_count` (and partition counts the
log allows); shard `sid` owns the same kind of range in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from riverbed.errors import InvalidInput, InvalidPartitionCount
from riverbed.log.partitioning import validate_partitions
from riverbed.storage.base import StorageTopicRecord


class InvalidShardCount(InvalidInput):
    """A shard count the subscription's topics cannot be split into evenly."""


@dataclass(frozen=True, slots=True)
class ShardAssignment:
    """The partitions of one storage topic (generation) a shard owns."""

    topic: str
    generation: int
    partitions: tuple[int, ...]


def validate_shard_count(shard_count: object, storage_topics: Sequence[StorageTopicRecord]) -> int:
    """The shard count, if it is a positive integer dividing the partition count
    of every generation (and so every base count a scale-up keeps)."""
    if not isinstance(shard_count, int) or isinstance(shard_count, bool) or shard_count < 1:
        raise InvalidShardCount(f"shard count {shard_count!r} must be a positive integer")
    for st in storage_topics:
        if st.partitions % shard_count:
            raise InvalidShardCount(
                f"shard count {shard_count} does not divide the {st.partitions} partitions of"
                f" topic {st.topic!r} generation {st.generation}: every shard must own the"
                " same number of partitions of every generation (seed 003)"
            )
    return shard_count


def shard_partitions(shard_id: int, shard_count: int, partitions: int) -> range:
    """The partitions of a storage topic with `partitions` that shard `shard_id` owns."""
    if not 0 <= shard_id < shard_count:
        raise InvalidShardCount(f"shard id {shard_id} is not between 0 and {shard_count - 1}")
    if partitions % shard_count:
        raise InvalidShardCount(
            f"shard count {shard_count} does not divide {partitions} partitions"
        )
    size = partitions // shard_count
    return range(shard_id * size, (shard_id + 1) * size)


def shard_of(partition: int, shard_count: int, partitions: int) -> int:
    """The shard owning `partition` of a storage topic with `partitions`."""
    return partition * shard_count // partitions


def assignments(
    shard_id: int, shard_count: int, storage_topics: Sequence[StorageTopicRecord]
) -> list[ShardAssignment]:
    """What shard `shard_id` owns in each generation of a topic."""
    validate_shard_count(shard_count, storage_topics)
    return [
        ShardAssignment(
            st.topic, st.generation, tuple(shard_partitions(shard_id, shard_count, st.partitions))
        )
        for st in storage_topics
    ]


def queue_partition(shard_id: int, shard_count: int, group_hash: int, partitions: int) -> int:
    """The partition of a retry or dead-letter queue with `partitions` that shard
    `shard_id` writes a group's failures to: in the shard's own range, by the
    group's hash, so a group's queued messages stay in one partition, in order.

    (Routing by key would not do: with 8 main partitions, 4 queue partitions and
    4 shards, hash 1 is main partition 1, shard 0, but queue partition 1, shard 1.)
    `Appender.append_once(..., place=...)` takes it as `place`."""
    owned = shard_partitions(shard_id, shard_count, partitions)
    return owned.start + group_hash % len(owned)


def queue_partitions(shard_count: int, requested: int | None = None) -> int:
    """The partition count of a retry or dead-letter queue for `shard_count`
    shards: `requested` if it is a multiple of it the log allows, else (None)
    the smallest such multiple."""
    if requested is not None:
        try:
            validate_partitions(requested)
        except InvalidPartitionCount as exc:
            raise InvalidShardCount(f"queue partitions: {exc}") from None
        if requested % shard_count:
            raise InvalidShardCount(
                f"queue partitions {requested} must be a multiple of the shard count"
                f" {shard_count} (seed 003: each shard owns an equal range)"
            )
        return requested
    multiple = shard_count
    while True:
        try:
            return validate_partitions(multiple)
        except InvalidPartitionCount:
            multiple += shard_count
