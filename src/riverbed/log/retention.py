"""Retention: delete the prefix of a stream that nobody needs any more.

Per topic, a retention time and a policy (`RetentionPolicy`) say what may go:
by default only what every subscription has committed *and* is older than the
retention time, so nothing a subscription has not consumed is ever deleted. A
stream with no subscription on its topic counts as consumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import assert_never

from riverbed.model import StreamId
from riverbed.storage.base import RetentionPolicy, Storage, TopicRecord


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What retention deleted from one stream."""

    stream: StreamId
    deleted: int
    start_offset: int
    """The stream's first retained offset afterwards."""


def run_retention(
    storage: Storage, topic: str | None = None, now_us: int | None = None
) -> list[RetentionResult]:
    """Apply every topic's retention (or one topic's); report streams that lost messages."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    topics = [storage.get_topic(topic)] if topic is not None else storage.list_topics()
    results: list[RetentionResult] = []
    for record in topics:
        results.extend(_retain_topic(storage, record, now_us))
    return results


def _retain_topic(storage: Storage, record: TopicRecord, now_us: int) -> list[RetentionResult]:
    policy = record.retention_policy
    has_subscriptions = bool(storage.list_subscriptions(record.name))
    lowest = storage.min_cursors(record.name) if has_subscriptions else {}
    results: list[RetentionResult] = []
    for head in storage.list_streams(record.name):
        if head.next_offset <= head.start_offset:
            continue
        if has_subscriptions:
            committed = lowest.get(head.key, -1)
            consumed = head.start_offset if committed < 0 else committed
        else:
            consumed = head.next_offset
        if record.retention_us is None:
            expired = head.start_offset
        else:
            expired = storage.first_offset_at(head.key, now_us - record.retention_us)
        match policy:
            case RetentionPolicy.CONSUMED_AND_EXPIRED:
                bound = min(consumed, expired)
            case RetentionPolicy.EXPIRED:
                bound = expired
            case RetentionPolicy.CONSUMED:
                bound = consumed
            case _:
                assert_never(policy)
        if bound > head.start_offset:
            deleted = storage.delete_before(
                head.key, bound, keep_uncommitted=policy is not RetentionPolicy.EXPIRED
            )
            if deleted:
                results.append(RetentionResult(head.stream, deleted, bound))
    if results:  # the storage may have stopped short of `bound` (keep_uncommitted)
        starts = {h.stream: h.start_offset for h in storage.list_streams(record.name)}
        results = [RetentionResult(r.stream, r.deleted, starts[r.stream]) for r in results]
    return results
