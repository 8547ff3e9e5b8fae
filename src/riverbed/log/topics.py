"""Topics: seed 003's CompositeTopic operations and MQTT bindings.

A topic is a named log made of an ordered list of storage topics (generations);
each generation has P partitions and a scale factor K. A binding is an MQTT
topic filter saying which MQTT topic names the topic stores; bindings may not
overlap, and the built-in topic `mqtt` stores whatever no binding claims.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypeVar

from riverbed.errors import AlreadyExists, BindingOverlap, InvalidInput, TopicNotFound
from riverbed.log.router import scale_factor, validate_partitions
from riverbed.model import format_duration
from riverbed.storage.base import (
    RetentionPolicy,
    Storage,
    StorageTopicRecord,
    StreamHead,
    TopicRecord,
)
from riverbed.topics.filters import filters_overlap, matches, validate_filter

BUILTIN_TOPIC = "mqtt"
BUILTIN_PARTITIONS = 16
DEFAULT_RETENTION_US = 7 * 24 * 3600 * 1_000_000
T = TypeVar("T")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def validate_topic_name(name: str) -> str:
    """Riverbed topic names: letters, digits, `.`, `_`, `-`; at most 200."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(
            f"topic name {name!r} is not allowed: use 1-200 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return name


def validate_limits(
    max_age_us: int | None, max_messages: int | None, max_bytes: int | None = None
) -> None:
    """A topic's maximum age, messages and bytes per stream: positive, or None
    (no limit)."""
    if max_age_us is not None and (type(max_age_us) is not int or max_age_us <= 0):
        raise InvalidInput(
            f"maximum age {max_age_us!r}us must be a positive duration (or none for no limit)"
        )
    if max_messages is not None and (type(max_messages) is not int or max_messages < 1):
        raise InvalidInput(
            f"maximum of {max_messages!r} messages per stream must be at least 1"
            " (or none for no limit)"
        )
    if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 1):
        raise InvalidInput(
            f"maximum of {max_bytes!r} bytes per stream must be at least 1 (or none for no limit)"
        )


def validate_retention(retention_us: int | None) -> None:
    """A topic's retention time: zero or more, or None (for ever)."""
    if retention_us is not None and (type(retention_us) is not int or retention_us < 0):
        raise InvalidInput(f"retention {retention_us!r}us must not be negative (or none)")


class Keep(Enum):
    """An argument of `Topics.alter` left out: the topic keeps its value."""

    KEEP = "keep"


@dataclass(frozen=True, slots=True)
class TopicDescription:
    topic: TopicRecord
    storage_topics: list[StorageTopicRecord]
    streams: list[StreamHead]

    def as_dict(self) -> dict[str, object]:
        t = self.topic
        return {
            "name": t.name,
            "binding": t.binding,
            "retention": None if t.retention_us is None else format_duration(t.retention_us),
            "retention_policy": t.retention_policy.value,
            "max_age": None if t.max_age_us is None else format_duration(t.max_age_us),
            "max_messages": t.max_messages,
            "max_bytes": t.max_bytes,
            "produce_pointer": t.produce_pointer,
            "storage_topics": [
                {"generation": s.generation, "partitions": s.partitions, "k": s.k}
                for s in self.storage_topics
            ],
            "streams": [
                {
                    "stream": str(h.stream),
                    "start_offset": h.start_offset,
                    "next_offset": h.next_offset,
                    "sealed": h.sealed,
                }
                for h in self.streams
            ],
        }


class Topics:
    """Create, change and look up topics in one storage."""

    def __init__(self, storage: Storage, on_change: Callable[[], None] | None = None) -> None:
        self.storage = storage
        self._on_change = on_change or (lambda: None)

    def create(
        self,
        name: str,
        partitions: int,
        binding: str | None = None,
        retention_us: int | None = DEFAULT_RETENTION_US,
        retention_policy: RetentionPolicy = RetentionPolicy.CONSUMED_AND_EXPIRED,
        max_age_us: int | None = None,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicRecord:
        """Create a topic with one storage topic of `partitions` (K=1).

        With `exist_ok`, a topic that exists already with these very settings
        (its first generation's partitions) is returned as it is; one with other
        settings raises `AlreadyExists` naming them.

        `max_age_us`, `max_messages` and `max_bytes` (per stream) are limits
        retention applies whoever has not consumed (`alter`).

        Raises `InvalidInput` subclasses for a bad name, partition count, binding,
        retention or limit, `BindingOverlap` if the binding overlaps another
        topic's, and `AlreadyExists`; in every case nothing is written.
        """
        validate_topic_name(name)
        validate_partitions(partitions)
        if binding is not None:
            validate_filter(binding)
        validate_retention(retention_us)
        validate_limits(max_age_us, max_messages, max_bytes)

        def no_overlap(existing: list[TopicRecord]) -> None:
            for other in existing:
                if (
                    binding is not None
                    and other.binding is not None
                    and filters_overlap(binding, other.binding)
                ):
                    raise BindingOverlap(
                        f"binding {binding!r} overlaps binding {other.binding!r} of topic"
                        f" {other.name!r}: an MQTT topic name may be stored by one topic only"
                    )

        record = TopicRecord(
            name,
            binding,
            retention_us,
            retention_policy,
            0,
            time.time_ns() // 1000,
            max_age_us,
            max_messages,
            max_bytes,
        )
        try:
            self.storage.create_topic(record, partitions, no_overlap)
        except AlreadyExists:
            if not exist_ok:
                raise
            return self._same_topic(record, partitions)
        self._on_change()
        return record

    def _same_topic(self, wanted: TopicRecord, partitions: int) -> TopicRecord:
        """The existing topic if it has `wanted`'s settings, else `AlreadyExists`."""
        existing = self.storage.get_topic(wanted.name)
        first = self.storage.list_storage_topics(wanted.name)[0].partitions

        def duration(micros: int | None) -> str:
            return "none" if micros is None else format_duration(micros)

        compared = [
            ("partitions", str(first), str(partitions)),
            ("binding", repr(existing.binding), repr(wanted.binding)),
            ("retention", duration(existing.retention_us), duration(wanted.retention_us)),
            ("retention policy", existing.retention_policy.value, wanted.retention_policy.value),
            ("max age", duration(existing.max_age_us), duration(wanted.max_age_us)),
            ("max messages", str(existing.max_messages), str(wanted.max_messages)),
            ("max bytes", str(existing.max_bytes), str(wanted.max_bytes)),
        ]
        differ = [
            f"{what} {have} (asked {asked})" for what, have, asked in compared if have != asked
        ]
        if differ:
            raise AlreadyExists(
                f"topic {wanted.name!r} exists already with other settings: {', '.join(differ)};"
                " not reusing it"
            )
        return existing

    def ensure_builtin(self) -> None:
        """Create the catch-all topic `mqtt` if it does not exist yet."""
        try:
            self.storage.get_topic(BUILTIN_TOPIC)
        except TopicNotFound:
            with contextlib.suppress(AlreadyExists):  # another process won the race
                self.create(BUILTIN_TOPIC, BUILTIN_PARTITIONS)

    def get(self, name: str) -> TopicRecord:
        return self.storage.get_topic(name)

    def list(self) -> list[TopicRecord]:
        return self.storage.list_topics()

    def describe(self, name: str) -> TopicDescription:
        return TopicDescription(
            self.storage.get_topic(name),
            self.storage.list_storage_topics(name),
            self.storage.list_streams(name),
        )

    def add_storage_topic(self, name: str, partitions: int) -> StorageTopicRecord:
        """seed 003 AddStorageTopic, with its K rule (see `router.scale_factor`)."""
        validate_partitions(partitions)

        def plan(last: StorageTopicRecord) -> tuple[int, int]:
            return partitions, scale_factor(last.partitions, last.k, partitions)

        added = self.storage.add_storage_topic(name, plan)
        self._on_change()
        return added

    def switch_produce(self, name: str) -> TopicRecord:
        """seed 003 SwitchProduce; seals the earlier generations' streams."""
        record = self.storage.switch_produce(name)
        self._on_change()
        return record

    def set_retention(
        self, name: str, retention_us: int | None, policy: RetentionPolicy
    ) -> TopicRecord:
        validate_retention(retention_us)
        record = self.storage.update_topic(name, retention_us, policy)
        self._on_change()
        return record

    def set_limits(
        self, name: str, max_age_us: int | None, max_messages: int | None
    ) -> TopicRecord:
        """Set the limits retention applies to topic `name` whoever has not
        consumed: messages older than `max_age_us` go, and a stream keeps at most
        `max_messages` (None: no such limit). Unlike the retention policy these
        delete what a subscription or an offline session has not read: they bound
        the disk a subscription nobody reads can pin (docs/storage.md).

        Raises `InvalidInput` for a limit that is not positive, `TopicNotFound`;
        nothing is changed then."""
        return self.alter(name, max_age_us=max_age_us, max_messages=max_messages)

    def alter(
        self,
        name: str,
        *,
        retention_us: int | Keep | None = Keep.KEEP,
        retention_policy: RetentionPolicy | Keep = Keep.KEEP,
        max_age_us: int | Keep | None = Keep.KEEP,
        max_messages: int | Keep | None = Keep.KEEP,
        max_bytes: int | Keep | None = Keep.KEEP,
    ) -> TopicRecord:
        """Change topic `name`'s retention time, policy and limits: those given
        (None removes a limit, or keeps messages for ever for `retention_us`);
        the others keep their values. One transaction: a concurrent change to
        another setting is not undone.

        Raises `InvalidInput` for a bad value, `TopicNotFound`; nothing is
        changed then."""
        if not isinstance(retention_us, Keep):
            validate_retention(retention_us)
        if not isinstance(retention_policy, (Keep, RetentionPolicy)):
            raise InvalidInput(
                f"retention policy {retention_policy!r} is not one of"
                f" {', '.join(p.value for p in RetentionPolicy)}"
            )
        validate_limits(
            None if isinstance(max_age_us, Keep) else max_age_us,
            None if isinstance(max_messages, Keep) else max_messages,
            None if isinstance(max_bytes, Keep) else max_bytes,
        )

        def change(current: TopicRecord) -> TopicRecord:
            return replace(
                current,
                retention_us=_given(retention_us, current.retention_us),
                retention_policy=_given(retention_policy, current.retention_policy),
                max_age_us=_given(max_age_us, current.max_age_us),
                max_messages=_given(max_messages, current.max_messages),
                max_bytes=_given(max_bytes, current.max_bytes),
            )

        record = self.storage.alter_topic(name, change)
        self._on_change()
        return record

    def delete(self, name: str) -> int:
        """Delete a topic with its messages and subscriptions; returns messages deleted."""
        if name == BUILTIN_TOPIC:
            raise InvalidInput(f"topic {name!r} is built in and cannot be deleted")
        deleted = self.storage.delete_topic(name)
        self._on_change()
        return deleted


def _given(value: T | Keep, current: T) -> T:
    return current if isinstance(value, Keep) else value


def reachable_topics(
    filters: Iterable[str], bindings: Iterable[tuple[str, str | None]]
) -> list[str]:
    """The topics whose messages these MQTT filters can match: those whose
    binding overlaps one of them, and the built-in `mqtt` (docs/broker.md).
    `bindings`: (topic, binding) pairs."""
    filters = list(filters)
    if not filters:
        return []
    out = [BUILTIN_TOPIC]
    for name, binding in bindings:
        if binding is None or name == BUILTIN_TOPIC:
            continue
        if any(filters_overlap(binding, f) for f in filters):
            out.append(name)
    return out


def resolve_binding(topics: list[TopicRecord], mqtt_topic: str) -> str:
    """The topic that stores an MQTT topic name: the one whose binding matches it,
    else the built-in `mqtt`. Bindings never overlap, so at most one matches."""
    for topic in topics:
        if topic.binding is not None and matches(topic.binding, mqtt_topic):
            return topic.name
    return BUILTIN_TOPIC
