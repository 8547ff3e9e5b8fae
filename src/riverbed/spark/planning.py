"""What a micro-batch reads: Spark offsets, admission control, Spark partitions.

Pure functions of the stream heads and the offsets Spark hands us, so that the
driver's decisions can be tested without Spark and a replayed batch plans the
same ranges again.

Spark offsets are `{"<topic>/<generation>/<partition>": next_offset}` (DESIGN.md,
Spark). A stream that appears after the query started (a new generation) first
enters an end offset at its initial position, with nothing of it planned in that
batch; its messages are planned from the next batch on. So every range a batch
reads has both bounds in the offset log, and `partitions(start, end)` never needs
to ask the database where a stream begins: a replayed batch reads exactly what it
read before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from riverbed.log.lineage import readable_streams
from riverbed.spark.options import Ordering
from riverbed.storage.base import StorageTopicRecord, StreamHead


@dataclass(frozen=True, slots=True)
class Range:
    """Offsets `[start, end)` of one stream."""

    stream_key: int
    topic: str
    generation: int
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def next_offsets(
    start: Mapping[str, int],
    heads: Sequence[StreamHead],
    storage_topics: Sequence[StorageTopicRecord],
    initial: Mapping[int, int],
    ordering: Ordering,
    max_messages: int | None = None,
    target: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The end offset of the next micro-batch after `start`.

    `initial` gives the first position (by stream key) of streams that `start`
    does not know yet; they join at that position. With `Ordering.STRICT` only the
    streams that `readable_streams` allows at `start` move on. `max_messages`
    caps the batch (shared fairly among the streams that have messages);
    `target` (Trigger.AvailableNow) caps each stream and keeps streams that are
    not in it out. Returns `start` itself (equal) when there is nothing to read.
    """
    end = dict(start)
    known = [h for h in heads if str(h.stream) in start]
    for head in heads:
        name = str(head.stream)
        if name not in start and (target is None or name in target):
            end[name] = initial.get(head.key, head.start_offset)
    if ordering is Ordering.STRICT:
        positions = {h.key: start[str(h.stream)] for h in known}
        # Streams not in `start` yet count as read up to nothing: they are not
        # fully consumed, so nothing after them becomes readable.
        readable, _ = readable_streams(storage_topics, heads, positions)
        candidates = [h for h in readable if str(h.stream) in start]
    else:
        candidates = known
    wanted: dict[str, int] = {}
    for head in candidates:
        name = str(head.stream)
        limit = head.next_offset
        if target is not None:
            limit = min(limit, target.get(name, start[name]))
        if limit > start[name]:
            wanted[name] = limit - start[name]
    granted = wanted if max_messages is None else share(wanted, max_messages)
    for name, count in granted.items():
        end[name] = start[name] + count
    return end


def share(wanted: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split `budget` messages fairly among streams wanting `wanted[name]` each:
    equal shares, what a stream cannot use going to the others, the remainder to
    the first streams in name order. Never more than wanted or than the budget."""
    granted = dict.fromkeys(wanted, 0)
    open_ = sorted(name for name, count in wanted.items() if count > 0)
    while budget > 0 and open_:
        each, extra = divmod(budget, len(open_))
        still_open: list[str] = []
        for index, name in enumerate(open_):
            give = min(each + (1 if index < extra else 0), wanted[name] - granted[name])
            granted[name] += give
            budget -= give
            if granted[name] < wanted[name]:
                still_open.append(name)
        if len(still_open) == len(open_) and each == 0 and extra == 0:
            break
        open_ = still_open
    return {name: count for name, count in granted.items() if count > 0}


def ranges(
    start: Mapping[str, int], end: Mapping[str, int], heads: Sequence[StreamHead]
) -> list[Range]:
    """The non-empty ranges between two offsets, in stream order.

    A stream missing from `start` joined at `end` (nothing to read yet); one whose
    head is gone (its topic was deleted) has nothing left to read.
    """
    by_name = {str(h.stream): h for h in heads}
    out: list[Range] = []
    for name in sorted(end, key=_stream_order):
        head = by_name.get(name)
        first = start.get(name)
        if head is None or first is None or end[name] <= first:
            continue
        s = head.stream
        out.append(Range(head.key, s.topic, s.generation, s.partition, first, end[name]))
    return out


def _stream_order(name: str) -> tuple[str, int, int]:
    topic, generation, partition = name.rsplit("/", 2)
    return topic, int(generation), int(partition)


def split(items: Sequence[Range], max_messages: int, min_partitions: int = 1) -> list[list[Range]]:
    """Group ranges into Spark partitions of at most `max_messages` offsets each.

    A range larger than that is cut; small ranges share a partition (a task costs
    tens of milliseconds, a one-message batch should be one task). At least
    `min_partitions` partitions when there are that many messages, so every core
    gets work. Deterministic: the same ranges give the same partitions.
    """
    total = sum(r.size for r in items)
    if total == 0:
        return []
    per = max(1, min(max_messages, -(-total // max(1, min_partitions))))
    pieces: list[Range] = []
    for r in items:
        for first in range(r.start, r.end, per):
            pieces.append(
                Range(
                    r.stream_key,
                    r.topic,
                    r.generation,
                    r.partition,
                    first,
                    min(first + per, r.end),
                )
            )
    out: list[list[Range]] = []
    current: list[Range] = []
    size = 0
    for piece in pieces:
        if current and size + piece.size > per:
            out.append(current)
            current, size = [], 0
        current.append(piece)
        size += piece.size
    if current:
        out.append(current)
    return out


def filter_regex(topic_filter: str) -> str:
    """An RE2 pattern (Arrow's `match_substring_regex`) that matches exactly the
    topic names an MQTT filter matches, except that a filter starting with a
    wildcard must also not match names starting with `$` [MQTT-4.7.2-1]: the
    caller checks that separately (RE2 has no look-ahead)."""
    out: list[str] = []
    for index, level in enumerate(topic_filter.split("/")):
        if level == "#":
            out.append(".*" if index == 0 else "(/.*)?")
            break
        if index:
            out.append("/")
        out.append("[^/]*" if level == "+" else re.escape(level))
    return "(?s)^" + "".join(out) + "$"
