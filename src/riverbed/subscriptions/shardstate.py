"""What a shard of a delivering subscription keeps between batches.

One KV record per shard (namespace `delivery.shard`, key `NAME/SHARD_ID`):
seed 003's GroupState of the shard's groups in the retry and dead-letter
queues, the next attempt of group heads that failed again in place
(`HeadRetry`), and how far the shard has read each stream of its queue
ranges: the retry queue is read ahead (a row not due yet does not hold back
the rows behind it), so a stream's progress is its first row not done plus
the rows done above it (offset intervals). `next_due_us` is when the shard
next has retry work (the driver runs a batch for it). Its main-topic
progress is the subscription's cursors. `batch.commit` writes the
record, the cursors and the queue rows in one transaction, with a compare-and-
set on the record's version: two runs of the same batch cannot both commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from riverbed.errors import InvalidInput
from riverbed.storage.base import Storage
from riverbed.subscriptions.groups import GroupState, GroupStates, HeadRetry, MessageState

NAMESPACE = "delivery.shard"


def state_key(name: str, shard_id: int) -> str:
    return f"{name}/{shard_id}"


def _position(state: MessageState | None) -> list[int] | None:
    if state is None:
        return None
    return [
        state.main_topic_idx,
        state.main_topic_offset,
        state.internal_topic_idx,
        state.internal_topic_offset,
    ]


def _message_state(value: Any) -> MessageState | None:
    if value is None:
        return None
    a, b, c, d = (int(x) for x in value)
    return MessageState(a, b, c, d)


@dataclass(slots=True)
class ShardState:
    groups: GroupStates = field(default_factory=GroupStates)
    rq_read: dict[int, int] = field(default_factory=dict)
    """RQ stream key -> its first row not done."""
    rq_done: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """RQ stream key -> rows done above `rq_read`, as sorted `[start, end)` intervals."""
    retries: dict[str, HeadRetry] = field(default_factory=dict)
    dlq_read: dict[int, int] = field(default_factory=dict)
    """DLQ stream key -> the first offset not yet replayed or purged."""
    dlq_done: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """DLQ stream key -> rows replayed or purged above `dlq_read` (intervals)."""
    next_due_us: int | None = None
    """When retry work is due next (None: none known)."""

    def to_json(self) -> bytes:
        def states(table: dict[str, GroupState]) -> dict[str, Any]:
            return {g: [_position(s.p), _position(s.c)] for g, s in sorted(table.items())}

        return json.dumps(
            {
                "rq": states(self.groups.rq),
                "dlq": states(self.groups.dlq),
                "rq_read": {str(k): v for k, v in sorted(self.rq_read.items())},
                "rq_done": {
                    str(k): [list(i) for i in v] for k, v in sorted(self.rq_done.items()) if v
                },
                "retries": {
                    g: [list(r.internal), r.attempt, r.due_us, r.failed_us, r.reason]
                    for g, r in sorted(self.retries.items())
                },
                "dlq_read": {str(k): v for k, v in sorted(self.dlq_read.items())},
                "dlq_done": {
                    str(k): [list(i) for i in v] for k, v in sorted(self.dlq_done.items()) if v
                },
                "next_due": self.next_due_us,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardState:
        try:
            raw = json.loads(data)

            def states(table: dict[str, Any]) -> dict[str, GroupState]:
                out: dict[str, GroupState] = {}
                for group, (p, c) in table.items():
                    at = _message_state(p)
                    assert at is not None
                    out[str(group)] = GroupState(at, _message_state(c))
                return out

            retries = {}
            for group, (internal, attempt, due, failed, reason) in raw["retries"].items():
                idx, offset = (int(x) for x in internal)
                retries[str(group)] = HeadRetry(
                    (idx, offset), int(attempt), int(due), int(failed), str(reason)
                )
            next_due = raw["next_due"]
            return cls(
                GroupStates(states(raw["rq"]), states(raw["dlq"])),
                {int(k): int(v) for k, v in raw["rq_read"].items()},
                {int(k): [(int(a), int(b)) for a, b in v] for k, v in raw["rq_done"].items()},
                retries,
                {int(k): int(v) for k, v in raw["dlq_read"].items()},
                {
                    int(k): [(int(a), int(b)) for a, b in v]
                    for k, v in raw.get("dlq_done", {}).items()
                },
                None if next_due is None else int(next_due),
            )
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise InvalidInput(f"shard state {data[:80]!r} is malformed: {exc!r}") from None


def add_done(
    position: int, done: list[tuple[int, int]], offsets: set[int]
) -> tuple[int, list[tuple[int, int]]]:
    """A stream's progress after `offsets` were done too: the first row not
    done and the done intervals above it."""
    marks = {o for o in offsets if o >= position}
    for start, end in done:
        marks.update(range(max(start, position), end))
    while position in marks:
        marks.discard(position)
        position += 1
    intervals: list[tuple[int, int]] = []
    for offset in sorted(marks):
        if intervals and intervals[-1][1] == offset:
            intervals[-1] = (intervals[-1][0], offset + 1)
        else:
            intervals.append((offset, offset + 1))
    return position, intervals


def is_done(offset: int, position: int, done: list[tuple[int, int]]) -> bool:
    """Whether the row at `offset` of a stream read up to `position` with rows
    `done` above it is done."""
    return offset < position or any(start <= offset < end for start, end in done)


def load_state(storage: Storage, name: str, shard_id: int) -> tuple[ShardState, int | None]:
    """The shard's state and its KV version (None: never committed)."""
    entry = storage.kv_get(NAMESPACE, state_key(name, shard_id))
    if entry is None:
        return ShardState(), None
    return ShardState.from_json(entry.value), entry.version


def load_states(storage: Storage, name: str) -> dict[int, ShardState]:
    """Every committed shard state of subscription `name`, by shard id."""
    out: dict[int, ShardState] = {}
    for entry in storage.kv_list(NAMESPACE, f"{name}/"):
        shard = entry.key.rsplit("/", 1)[1]
        if shard.isdigit():
            out[int(shard)] = ShardState.from_json(entry.value)
    return out


def delete_states(storage: Storage, name: str) -> None:
    for entry in storage.kv_list(NAMESPACE, f"{name}/"):
        storage.kv_delete_if_version(NAMESPACE, entry.key, entry.version)
