"""Browsing a delivering subscription's dead-letter queue (issue 7).

`parked(storage, name, ...)` reads every stream of `NAME.dlq` (all its
generations) and returns the parked messages that match the selectors — failed
at or after `since_us` (and before `until_us`), of the given group ids, with the
given message ids — oldest failure first (then by stream and offset), a page
at a time. Each comes with where it is parked (stream, offset), which is what
replay and purge act on.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from riverbed.errors import InvalidInput, NotFound
from riverbed.model import MessageId, StreamId
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.delivering import queue_topics
from riverbed.subscriptions.queues import QueuedMessage

READ_PAGE = 1000
"""Rows per storage read."""


@dataclass(frozen=True, slots=True)
class Parked:
    stream: StreamId
    offset: int
    message: QueuedMessage


def parked(
    storage: Storage,
    name: str,
    *,
    since_us: int | None = None,
    until_us: int | None = None,
    groups: Collection[str] = (),
    message_ids: Collection[MessageId] = (),
    limit: int = 50,
    page: int = 1,
) -> list[Parked]:
    """The parked messages of subscription `name` that match, page `page` of
    `limit` each (1-based). Raises `NotFound` if `name` does not deliver."""
    if limit < 1 or page < 1:
        raise InvalidInput(f"limit {limit} and page {page} must be at least 1")
    if Definitions(storage).get(name) is None:
        raise NotFound(f"subscription {name!r} does not deliver to an endpoint: no DLQ")
    _, dlq = queue_topics(name)
    found: list[Parked] = []
    wanted_groups = set(groups)
    wanted_ids = set(message_ids)
    for head in storage.list_streams(dlq):
        offset = head.start_offset
        while offset < head.next_offset:
            rows = storage.read(head.key, offset, READ_PAGE)
            if not rows:
                break
            for row in rows:
                message = QueuedMessage.from_stored(row)
                if since_us is not None and message.failed_us < since_us:
                    continue
                if until_us is not None and message.failed_us >= until_us:
                    continue
                if wanted_groups and message.key not in wanted_groups:
                    continue
                if wanted_ids and message.message_id not in wanted_ids:
                    continue
                found.append(Parked(head.stream, row.offset, message))
            offset = rows[-1].offset + 1
    found.sort(
        key=lambda p: (p.message.failed_us, p.stream.generation, p.stream.partition, p.offset)
    )
    start = (page - 1) * limit
    return found[start : start + limit]


def _failure_order(p: Parked) -> tuple[int, int, int, int]:
    return (p.message.failed_us, p.stream.generation, p.stream.partition, p.offset)
