"""Shards of a delivering subscription (issue 7, seed 003): ranges, the rules on
shard counts, and shard consistency with the producers' router."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import InvalidPartitionCount
from riverbed.log.partitioning import route, validate_partitions
from riverbed.storage.base import StorageTopicRecord
from riverbed.subscriptions.shards import (
    InvalidShardCount,
    ShardAssignment,
    assignments,
    queue_partition,
    queue_partitions,
    shard_of,
    shard_partitions,
    validate_shard_count,
)


def _allowed(p: int) -> bool:
    try:
        validate_partitions(p)
    except InvalidPartitionCount:
        return False
    return True


PARTITIONS = [p for p in range(1, 97) if _allowed(p)]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def test_the_seed_003_ranges() -> None:
    assert [list(shard_partitions(s, 4, 16)) for s in range(4)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    assert list(shard_partitions(0, 1, 6)) == [0, 1, 2, 3, 4, 5]


@given(st.sampled_from(PARTITIONS), st.data())
def test_shards_split_every_partition_once_in_contiguous_equal_ranges(
    partitions: int, data: st.DataObject
) -> None:
    count = data.draw(st.sampled_from(divisors(partitions)))
    owned = [list(shard_partitions(s, count, partitions)) for s in range(count)]
    assert sorted(p for r in owned for p in r) == list(range(partitions))
    assert len({len(r) for r in owned}) == 1
    for s, r in enumerate(owned):
        assert all(shard_of(p, count, partitions) == s for p in r)


@given(
    st.sampled_from([1, 2, 3, 4, 6, 8, 12]),
    st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.data(),
)
def test_a_key_stays_with_its_shard_across_scale_ups(
    base: int, factors: list[int], h: int, data: st.DataObject
) -> None:
    """Generations P = base * K (a scale-up keeps the base count): a shard count
    dividing the base puts a key's messages in the same shard in every one."""
    count = data.draw(st.sampled_from(divisors(base)))
    shards = {shard_of(route(h, base * k, k), count, base * k) for k in [1, *factors]}
    assert len(shards) == 1


def test_a_shard_count_must_divide_every_generation() -> None:
    gens = [StorageTopicRecord("t", 0, 8, 1), StorageTopicRecord("t", 1, 24, 3)]
    assert validate_shard_count(4, gens) == 4
    assert assignments(1, 4, gens) == [
        ShardAssignment("t", 0, (2, 3)),
        ShardAssignment("t", 1, (6, 7, 8, 9, 10, 11)),
    ]
    with pytest.raises(InvalidShardCount, match="does not divide the 8 partitions of topic 't'"):
        validate_shard_count(3, gens)
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(InvalidShardCount, match="positive integer"):
            validate_shard_count(bad, gens)
    with pytest.raises(InvalidShardCount, match="shard id 4"):
        shard_partitions(4, 4, 8)


@given(st.integers(min_value=1, max_value=48))
def test_queue_partitions_default_to_the_smallest_allowed_multiple(count: int) -> None:
    chosen = queue_partitions(count)
    assert chosen % count == 0 and _allowed(chosen)
    assert not any(_allowed(m) for m in range(count, chosen, count))


def test_requested_queue_partitions_are_checked() -> None:
    assert queue_partitions(4, 8) == 8
    with pytest.raises(InvalidShardCount, match="multiple of the shard count 4"):
        queue_partitions(4, 6)
    with pytest.raises(InvalidShardCount, match="queue partitions: partition count 10"):
        queue_partitions(5, 10)


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4, 8]), st.data())
def test_a_shard_writes_a_group_to_one_partition_of_its_own_range(
    h: int, count: int, data: st.DataObject
) -> None:
    partitions = count * data.draw(st.sampled_from([1, 2, 3]))
    shard = data.draw(st.integers(0, count - 1))
    j = queue_partition(shard, count, h, partitions)
    assert j in shard_partitions(shard, count, partitions)
    assert shard_of(j, count, partitions) == shard
    assert queue_partition(shard, count, h, partitions) == j


def test_routing_by_key_alone_would_leave_the_shard() -> None:
    """Why the queue write needs its own placement (docs/delivery.md)."""
    h = 1
    assert shard_of(route(h, 8, 1), 4, 8) == 0
    assert shard_of(route(h, 4, 1), 4, 4) == 1
    assert queue_partition(0, 4, h, 4) == 0
