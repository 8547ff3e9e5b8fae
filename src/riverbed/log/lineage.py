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
