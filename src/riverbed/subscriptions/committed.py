"""Where a named subscription stands on each stream: its committed cursor, or,
for a stream it never committed on, where the subscription starts (the
stream's first retained message, or the first at its start time).

Shared by `Subscriptions` (lag, reset, consumers) and the workers' default
state, so neither imports the other for it; so is the rule that cursors the
broker owns are not moved by name (`refuse_broker_owned`).
"""

from __future__ import annotations

from collections.abc import Sequence

from riverbed.errors import InvalidInput
from riverbed.storage.base import StartKind, Storage, StreamHead, SubscriptionRecord

BROKER_OWNED_PREFIX = "$"
"""Names the broker gives its own cursors (a user's name starts with a letter
or digit): an MQTT session's (`$session.<client id>.<topic>`) and a shared
subscription group's (`$share.<group>.<topic>`)."""


def refuse_broker_owned(name: str, what: str) -> None:
    """Refuse to reset, delete or consume a cursor the broker owns by its name:
    its owner keeps its positions in memory and in its own record, so a
    change from outside would be undone or, worse, skip messages under it."""
    if name.startswith(BROKER_OWNED_PREFIX):
        raise InvalidInput(
            f"subscription {name!r} is the broker's own (a name starting with"
            f" {BROKER_OWNED_PREFIX!r}: the cursor of an MQTT session or of a shared"
            f" subscription group) and moves only with its owner; it cannot be {what}"
            " by name (to forget a session's cursors, delete the session)"
        )


def committed_positions(
    storage: Storage, record: SubscriptionRecord, heads: Sequence[StreamHead]
) -> dict[int, int]:
    """The committed offset of every stream of `heads`, filling in streams never
    committed."""
    stored = storage.get_cursors(record.name)
    out: dict[int, int] = {}
    for h in heads:
        offset = stored.get(h.key)
        if offset is None:
            if record.start is StartKind.TIME and record.start_us is not None:
                offset = storage.first_offset_at(h.key, record.start_us)
            else:
                offset = h.start_offset
        out[h.key] = max(offset, h.start_offset)
    return out
