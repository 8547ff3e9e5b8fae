"""Which streams a cursor may read now: per-key order across generations.

The router keeps every key in one lineage (`j // K`) while a topic scales up with
an unchanged base count P/K. A reader therefore starts stream (g+1, j) only when
the streams of generation g in the same lineage are fully consumed: sealed and
read to their head. After a K=1 reset (the base count changed) a key may move to
any lineage, so the whole of generation g must be consumed first
(DESIGN.md, Lineage).

"Fully consumed" is recursive: a sealed stream that was never readable (its own
predecessors are unread) is not consumed even if it is empty, or a later
generation could overtake an earlier one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

from riverbed.storage.base import StorageTopicRecord, StreamHead


def predecessors(
    previous: StorageTopicRecord, current: StorageTopicRecord, partition: int
) -> range | list[int]:
    """Partitions of `previous` that partition `partition` of `current` must wait for."""
    if previous.base_partitions != current.base_partitions:
        return range(previous.partitions)  # K=1 reset: everything before
    lineage = partition // current.k
    return range(lineage * previous.k, (lineage + 1) * previous.k)


def readable_streams(
    storage_topics: Sequence[StorageTopicRecord],
    heads: Sequence[StreamHead],
    committed: Mapping[int, int],
) -> tuple[list[StreamHead], set[int]]:
    """Return (streams a reader may read now, keys of fully consumed streams).

    `committed` maps stream keys to the reader's next offset; a missing stream
    counts as read up to nothing, an offset below a stream's start as its start.
    """
    if len(storage_topics) == 1:
        return _one_generation(storage_topics[0], heads, committed)
    return _by_lineage(storage_topics, heads, committed)


def _one_generation(
    only: StorageTopicRecord, heads: Sequence[StreamHead], committed: Mapping[int, int]
) -> tuple[list[StreamHead], set[int]]:
    """`readable_streams` of a topic that never scaled (most topics, and every
    session resuming on one): each of its streams is readable, with no lineage
    to wait for. The same answer as `_by_lineage`, without its bookkeeping."""
    generation, partitions = only.generation, only.partitions
    readable = [
        h for h in heads if h.stream.generation == generation and h.stream.partition < partitions
    ]
    if any(a.stream.partition > b.stream.partition for a, b in pairwise(readable)):
        readable.sort(key=_partition)
    consumed = {
        h.key
        for h in readable
        if h.sealed and max(committed.get(h.key, 0), h.start_offset) >= h.next_offset
    }
    return readable, consumed


def _partition(head: StreamHead) -> int:
    return head.stream.partition


def _by_lineage(
    storage_topics: Sequence[StorageTopicRecord],
    heads: Sequence[StreamHead],
    committed: Mapping[int, int],
) -> tuple[list[StreamHead], set[int]]:
    """`readable_streams` generation by generation, each partition after its
    lineage's predecessors."""
    by_generation: dict[int, dict[int, StreamHead]] = {}
    for head in heads:
        by_generation.setdefault(head.stream.generation, {})[head.stream.partition] = head
    readable: list[StreamHead] = []
    consumed: set[int] = set()
    previous: StorageTopicRecord | None = None
    previous_done: set[int] = set()  # partitions of the previous generation consumed
    for st in storage_topics:
        streams = by_generation.get(st.generation, {})
        done: set[int] = set()
        for partition in range(st.partitions):
            found = streams.get(partition)
            if found is None:
                continue
            head = found
            if previous is not None and not all(
                p in previous_done for p in predecessors(previous, st, partition)
            ):
                continue
            readable.append(head)
            # Below the start counts as at the start: retention may have deleted
            # what this reader had not read (EXPIRED), and it is gone for everyone.
            position = max(committed.get(head.key, 0), head.start_offset)
            if head.sealed and position >= head.next_offset:
                done.add(partition)
                consumed.add(head.key)
        previous, previous_done = st, done
    return readable, consumed
