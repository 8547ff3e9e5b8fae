"""Where a named subscription stands on each stream: its committed cursor, or,
for a stream it never committed on, where the subscription starts (the
stream's first retained message, or the first at its start time).

Shared by `Subscriptions` (lag, reset, consumers) and the workers' default
state, so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from riverbed.storage.base import StartKind, Storage, StreamHead, SubscriptionRecord


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
