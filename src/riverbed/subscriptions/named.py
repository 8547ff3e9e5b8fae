"""Named subscriptions: a start position, an optional MQTT filter, and a
committed offset per stream (the next offset to read).

Streams that appear after a subscription was created (new generations) start at
their first retained offset, or, for a subscription that starts at a time, at
the first message at or after that time. Reading follows lineage order
(`riverbed.log.lineage`). Committing only ever moves a cursor forward; `reset`
is the one way back.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from riverbed.clock import now_us
from riverbed.errors import AlreadyExists, InvalidInput, InvalidOffset
from riverbed.log.jsonlines import format_time
from riverbed.log.lineage import readable_streams
from riverbed.model import StoredMessage, StreamId
from riverbed.storage.base import (
    StartKind,
    Storage,
    StorageTopicRecord,
    StreamHead,
    SubscriptionRecord,
)
from riverbed.subscriptions.committed import committed_positions, refuse_broker_owned
from riverbed.topics.filters import filters_overlap, matches, validate_filter

if TYPE_CHECKING:
    from riverbed.subscriptions.handling import Handler
    from riverbed.subscriptions.workers import Worker

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

Start = StartKind | int
"""Where to start or reset: EARLIEST, LATEST, or a timestamp in µs since the epoch."""


def validate_subscription_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(
            f"subscription name {name!r} is not allowed: use 1-200 letters, digits, '.', '_'"
            " or '-', starting with a letter or digit"
        )
    return name


def check_filter(storage: Storage, topic: str, topic_filter: str | None) -> None:
    """Refuse a filter no message of `topic` can match: one that is no valid
    filter, or shares no topic name with the topic's binding (what `produce`
    checks each message against). `TopicNotFound` if there is no such topic."""
    if topic_filter is None:
        return
    validate_filter(topic_filter)
    binding = storage.get_topic(topic).binding
    if binding is not None and not filters_overlap(binding, topic_filter):
        raise InvalidInput(
            f"filter {topic_filter!r} can never match: topic {topic!r} stores only MQTT"
            f" topics its binding {binding!r} matches, and no topic name matches both"
        )


def same_settings(existing: SubscriptionRecord, wanted: SubscriptionRecord) -> SubscriptionRecord:
    """`existing` if it has `wanted`'s topic, filter and start, else
    `AlreadyExists` naming what differs."""
    fields = (
        ("topic", existing.topic, wanted.topic),
        ("filter", existing.filter, wanted.filter),
        ("start", _start_text(existing), _start_text(wanted)),
    )
    differ = [f"{what} {have!r} (asked {asked!r})" for what, have, asked in fields if have != asked]
    if differ:
        raise AlreadyExists(
            f"subscription {existing.name!r} exists already with other settings:"
            f" {', '.join(differ)}; not reusing it"
        )
    return existing


def _start_text(record: SubscriptionRecord) -> str:
    return record.start.value if record.start_us is None else format_time(record.start_us)


class Delivery(NamedTuple):
    """A message handed to a consumer, with the stream it came from.

    A named tuple: a poll makes one per message, and tuples are the cheapest.
    """

    stream: StreamId
    message: StoredMessage


_delivery = functools.partial(tuple.__new__, Delivery)


@dataclass(frozen=True, slots=True)
class StreamLag:
    stream: StreamId
    committed: int
    head: int
    readable: bool
    """False while the stream waits for earlier generations of its lineage."""

    @property
    def lag(self) -> int:
        return self.head - self.committed

    def as_json(self) -> dict[str, object]:
        """What `subscription lag --json` and the HTTP API show of one stream."""
        return {
            "stream": str(self.stream),
            "committed": self.committed,
            "head": self.head,
            "lag": self.lag,
            "readable": self.readable,
        }


def initial_positions(
    storage: Storage, start: Start, heads: Sequence[StreamHead]
) -> dict[int, int]:
    """{stream key: offset} where a subscription starting at `start` begins."""
    if start is StartKind.EARLIEST:
        return {h.key: h.start_offset for h in heads}
    if start is StartKind.LATEST:
        return {h.key: h.next_offset for h in heads}
    if isinstance(start, StartKind):
        raise InvalidInput(f"start {start!r} needs a timestamp")
    return {h.key: max(h.start_offset, storage.first_offset_at(h.key, start)) for h in heads}


class Subscriptions:
    """Create, inspect, reset and consume named subscriptions."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def create(
        self,
        name: str,
        topic: str,
        topic_filter: str | None = None,
        start: Start = StartKind.EARLIEST,
        *,
        exist_ok: bool = False,
    ) -> SubscriptionRecord:
        """Create subscription `name` on `topic`, reading what `topic_filter`
        matches from `start` on.

        Raises `InvalidInput` for a bad name, filter or start, or a filter the
        topic's binding never lets match; `TopicNotFound`; `AlreadyExists` if the
        subscription exists, unless `exist_ok` and it has these very settings
        (then the existing record is returned). Nothing is written on error.
        """
        validate_subscription_name(name)
        check_filter(self.storage, topic, topic_filter)
        kind, start_us = (start, None) if isinstance(start, StartKind) else (StartKind.TIME, start)
        if start_us is not None and start_us < 0:
            raise InvalidInput(f"start time {start_us}us is before the epoch")
        record = SubscriptionRecord(name, topic, topic_filter, kind, start_us, now_us())
        try:
            self.storage.create_subscription(
                record, lambda heads: initial_positions(self.storage, start, heads)
            )
        except AlreadyExists:
            if not exist_ok:
                raise
            return same_settings(self.get(name), record)
        return record

    def get(self, name: str) -> SubscriptionRecord:
        return self.storage.get_subscription(name)

    def list(self, topic: str | None = None) -> list[SubscriptionRecord]:
        return self.storage.list_subscriptions(topic)

    def delete(self, name: str) -> None:
        refuse_broker_owned(name, "deleted")
        self.storage.delete_subscription(name)

    def positions(self, record: SubscriptionRecord, heads: Sequence[StreamHead]) -> dict[int, int]:
        """The committed offset of every stream, filling in streams never committed."""
        return committed_positions(self.storage, record, heads)

    def lag(self, name: str) -> builtins.list[StreamLag]:
        record = self.get(name)
        heads = self.storage.list_streams(record.topic)
        positions = self.positions(record, heads)
        readable, _ = readable_streams(
            self.storage.list_storage_topics(record.topic), heads, positions
        )
        open_keys = {h.key for h in readable}
        return [
            StreamLag(h.stream, positions[h.key], h.next_offset, h.key in open_keys) for h in heads
        ]

    def reset(self, name: str, to: Start | Mapping[StreamId, int]) -> dict[StreamId, int]:
        """Move a subscription's cursors: to the earliest retained message, to the
        heads, to a time (µs), or to explicit offsets (other streams keep theirs).
        Returns the new committed offsets. Out-of-range offsets are refused."""
        offsets = self.plan_reset(name, to)
        self.storage.reset_cursors(name, offsets)
        heads = self.storage.list_streams(self.get(name).topic)
        return {h.stream: offsets[h.key] for h in heads if h.key in offsets}

    def plan_reset(self, name: str, to: Start | Mapping[StreamId, int]) -> dict[int, int]:
        """The cursors (by stream key) `reset` would write, checked, without
        writing them."""
        refuse_broker_owned(name, "reset")
        record = self.get(name)
        heads = self.storage.list_streams(record.topic)
        if isinstance(to, Mapping):
            by_stream = {h.stream: h for h in heads}
            offsets = self.positions(record, heads)
            for stream, offset in to.items():
                head = by_stream.get(stream)
                if head is None:
                    raise InvalidInput(f"stream {stream} is not a stream of topic {record.topic!r}")
                if not isinstance(offset, int) or offset < 0:
                    raise InvalidOffset(f"offset {offset!r} for {stream} must be an integer >= 0")
                if not head.start_offset <= offset <= head.next_offset:
                    raise InvalidOffset(
                        f"offset {offset} for {stream} is outside the retained range"
                        f" [{head.start_offset}, {head.next_offset}]"
                    )
                offsets[head.key] = offset
        else:
            if isinstance(to, int) and to < 0:
                raise InvalidInput(f"reset time {to}us is before the epoch")
            offsets = initial_positions(self.storage, to, heads)
        return offsets

    def consumer(self, name: str) -> Consumer:
        return Consumer(self, self.get(name))

    def worker(self, name: str, handler: Handler, **options: Any) -> Worker:
        """A competing-consumer `Worker` of subscription `name` (seed 004); `options`
        are `Worker`'s (batch_size, guarantee, on_error, state, locks, ...)."""
        from riverbed.subscriptions.workers import Worker

        return Worker(self.storage, name, handler, **options)


class Consumer:
    """Reads a subscription in lineage order and commits what it was given.

    At least once: `poll` hands out messages, `commit` records them as consumed.
    What was polled but not committed is read again by the next consumer.

    A consumer keeps its own positions: `Subscriptions.reset` takes effect for
    consumers created after it (a live consumer's next commit would move the
    cursor forward again), so stop consumers before resetting, as with Kafka.
    """

    def __init__(self, subscriptions: Subscriptions, record: SubscriptionRecord) -> None:
        refuse_broker_owned(record.name, "consumed")
        self.subscriptions = subscriptions
        self.storage = subscriptions.storage
        self.record = record
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._known: set[int] = set()
        self._heads: list[StreamHead] = []
        self._storage_topics: list[StorageTopicRecord] = []
        self._turn = 0

    def _refresh(self) -> None:
        """Reload the heads (a small table), and the generations if streams appeared."""
        heads = self.storage.list_streams(self.record.topic)
        new = [h for h in heads if h.key not in self._known]
        if new:
            fresh = self.subscriptions.positions(self.record, heads)
            for h in new:
                self._positions[h.key] = fresh[h.key]
                self._committed[h.key] = fresh[h.key]
                self._known.add(h.key)
            self._storage_topics = self.storage.list_storage_topics(self.record.topic)
        self._heads = heads

    def _pending(self) -> list[StreamHead]:
        readable, _ = readable_streams(self._storage_topics, self._heads, self._positions)
        # Below the start counts as at the start: retention deleted the rest.
        return [h for h in readable if max(self._positions[h.key], h.start_offset) < h.next_offset]

    def poll(self, max_messages: int = 1000, timeout: float = 0.0) -> list[Delivery]:
        """Up to `max_messages`, waiting up to `timeout` seconds for the first.

        An empty list means caught up: messages the filter does not match are read
        past (and committed by the next `commit`), never mistaken for "no more".
        """
        if max_messages < 1:
            raise InvalidInput(f"max_messages {max_messages} must be at least 1")
        deadline = time.monotonic() + timeout
        while True:
            seen = self.storage.wakeups.version
            out, moved = self._poll_once(max_messages)
            if not out and moved:
                continue  # all we read was filtered out: read on before waiting
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            self.storage.wakeups.wait(seen, min(remaining, 0.5))

    def _poll_once(self, max_messages: int, retry: bool = True) -> tuple[list[Delivery], bool]:
        """Read what is pending: (deliveries, whether any position moved)."""
        # Heads we know of that still have messages are read without asking the
        # database for fresh heads; only once they are drained do we look again.
        pending = self._pending()
        if not pending:
            self._refresh()
            pending = self._pending()
            if not pending:
                return [], False
        self._turn = (self._turn + 1) % len(pending)
        pending = pending[self._turn :] + pending[: self._turn]
        topic_filter = self.record.filter
        out: list[Delivery] = []
        stale = moved = False
        for head in pending:
            room = max_messages - len(out)
            if room <= 0:
                break
            position = max(self._positions[head.key], head.start_offset)
            batch = self.storage.read(head.key, position, room)
            if not batch:
                # The cached head promised messages that are gone (retention moved
                # the start past them): look at the heads again, or we would keep
                # reading this stream and never look for new messages elsewhere.
                stale = True
                continue
            stream = head.stream
            last = batch[-1].offset
            if topic_filter is not None:
                batch = [m for m in batch if matches(topic_filter, m.mqtt_topic)]
            out.extend(map(_delivery, zip(itertools.repeat(stream), batch)))
            self._positions[head.key] = last + 1
            moved = True
        if stale:
            self._refresh()
            if not out and not moved and retry:  # an empty answer must mean "caught up"
                return self._poll_once(max_messages, retry=False)
        return out, moved

    def commit(self) -> None:
        """Record everything polled so far as consumed."""
        changed = {k: v for k, v in self._positions.items() if v != self._committed.get(k)}
        if changed:
            self.storage.commit_cursors(self.record.name, changed)
            self._committed.update(changed)
