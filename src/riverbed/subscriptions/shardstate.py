"""What a shard of a delivering subscription keeps between batches (issue 7).

One KV record per shard (namespace `delivery.shard`, key `NAME/SHARD_ID`):
seed 003's GroupState of the shard's groups in the retry and dead-letter
queues, and how far the shard has read each stream of its queue ranges. Its
main-topic progress is the subscription's cursors. `batch.commit` writes the
record, the cursors and the queue rows in one transaction, with a compare-and-
set on the record's version: two runs of the same batch cannot both commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from riverbed.errors import InvalidInput
from riverbed.storage.base import Storage
from riverbed.subscriptions.groups import GroupState, GroupStates, MessageState

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
    """RQ stream key -> the next offset the shard reads."""
    dlq_read: dict[int, int] = field(default_factory=dict)
    """DLQ stream key -> the first offset not yet replayed or purged."""

    def to_json(self) -> bytes:
        def states(table: dict[str, GroupState]) -> dict[str, Any]:
            return {g: [_position(s.p), _position(s.c)] for g, s in sorted(table.items())}

        return json.dumps(
            {
                "rq": states(self.groups.rq),
                "dlq": states(self.groups.dlq),
                "rq_read": {str(k): v for k, v in sorted(self.rq_read.items())},
                "dlq_read": {str(k): v for k, v in sorted(self.dlq_read.items())},
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

            return cls(
                GroupStates(states(raw["rq"]), states(raw["dlq"])),
                {int(k): int(v) for k, v in raw["rq_read"].items()},
                {int(k): int(v) for k, v in raw["dlq_read"].items()},
            )
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise InvalidInput(f"shard state {data[:80]!r} is malformed: {exc!r}") from None


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
