"""Topics: seed 003's CompositeTopic operations and MQTT bindings.

A topic is a named log made of an ordered list of storage topics (generations);
each generation has P partitions and a scale factor K. A binding is an MQTT
topic filter saying which MQTT topic names the topic stores; bindings may not
overlap, and the built-in topic `mqtt` stores whatever no binding claims.

A binding also says which ordering key the MQTT publishes it brings get (its
`KeyMode`): messages with one key stay in one stream, in order, and a shared
group lends whole streams to its members, so the key decides both what stays in
order and how far a group can spread the work. MQTT promises order per topic
from each publisher ([MQTT-4.6.0-5], "Ordered Topic"); `client-topic`, the key
created topics get, is exactly that pair, so nothing MQTT promises is lost and a
busy publisher's topics, or one topic's many publishers, spread over streams.
Topics made before key modes existed keep what they had, `client-id`, and so
does the built-in `mqtt` in every database, new ones included: the catch-all
behaves the same whichever Riverbed made the database (`Topics.set_key_mode`
changes it).
"""

from __future__ import annotations

import contextlib
import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypeVar

from riverbed.clock import now_us
from riverbed.errors import AlreadyExists, BindingOverlap, InvalidInput, TopicNotFound
from riverbed.log.partitioning import scale_factor, validate_partitions
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
MAX_SETTING = 2**63 - 1
"""The largest number a topic's retention and limits may hold: what a signed
64-bit column (SQLite INTEGER, PostgreSQL bigint) stores. In microseconds it is
some 292,000 years."""
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
    (no limit); at most `MAX_SETTING`."""
    _at_most_max_setting(max_age_us, "maximum age", "us")
    _at_most_max_setting(max_messages, "maximum of messages")
    _at_most_max_setting(max_bytes, "maximum of bytes")
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
    """A topic's retention time: zero or more, or None (for ever); at most
    `MAX_SETTING` microseconds."""
    _at_most_max_setting(retention_us, "retention", "us")
    if retention_us is not None and (type(retention_us) is not int or retention_us < 0):
        raise InvalidInput(f"retention {retention_us!r}us must not be negative (or none)")


def _at_most_max_setting(value: object, what: str, unit: str = "") -> None:
    if type(value) is int and value > MAX_SETTING:
        raise InvalidInput(
            f"{what} {value}{unit} is more than the largest allowed, {MAX_SETTING}{unit}"
        )


class Keep(Enum):
    """An argument of `Topics.alter` left out: the topic keeps its value."""

    KEEP = "keep"


class KeyKind(enum.Enum):
    """Where the ordering key of an MQTT PUBLISH comes from (`KeyMode`)."""

    CLIENT_ID = "client-id"
    """The publisher's client id: each publisher's messages in order, all of
    them in one stream (one member of a shared group)."""
    TOPIC = "topic"
    """The MQTT topic name: each topic in order, whoever publishes to it."""
    CLIENT_TOPIC = "client-topic"
    """The client id and the topic name together: what MQTT promises, order per
    topic from each publisher, and the widest spread that keeps it."""
    PROPERTY = "property"
    """A user property the publisher sets (`property:NAME`)."""
    NONE = "none"
    """No key: messages are spread over the streams one by one, in no order."""


KEY_FORMS = "client-id, topic, client-topic, property:NAME or none"
"""The accepted forms of a key mode, for error messages and help."""


@dataclass(frozen=True, slots=True)
class KeyMode:
    """The ordering key a topic's binding gives MQTT publishes.

    Whatever the mode, a PUBLISH with the user property `key` has that key
    (`riverbed.mqtt.messages.KEY_PROPERTY`): the publisher asked for it, so it
    is honoured under `none` too. `property:NAME` falls back to the client id
    when the PUBLISH has no such property (the key MQTT publishes always had).
    """

    kind: KeyKind
    property: str | None = None
    """The user property's name, for `KeyKind.PROPERTY` only."""

    def __post_init__(self) -> None:
        if (self.kind is KeyKind.PROPERTY) != (self.property is not None):
            raise InvalidInput(
                f"key mode {self.kind.value!r}: a user property name goes with"
                " property:NAME, and only with it"
            )
        if self.property is not None and (not self.property or "\x00" in self.property):
            raise InvalidInput(
                f"key mode property:{self.property!r} needs a user property name:"
                " at least one character, no U+0000"
            )

    @classmethod
    def parse(cls, text: str) -> KeyMode:
        """`client-id`, `topic`, `client-topic`, `property:NAME` or `none`;
        anything else raises `InvalidInput` naming the value and those forms."""
        if not isinstance(text, str):
            raise InvalidInput(f"key mode {text!r} is not text: use one of {KEY_FORMS}")
        name, colon, rest = text.partition(":")
        if colon and name == KeyKind.PROPERTY.value:
            if not rest or "\x00" in rest:
                raise InvalidInput(
                    f"key mode {text!r} names no user property: use property:NAME,"
                    f" e.g. property:device, NAME without U+0000 (accepted: {KEY_FORMS})"
                )
            return cls(KeyKind.PROPERTY, rest)
        if not colon and text != KeyKind.PROPERTY.value:
            with contextlib.suppress(ValueError):
                return cls(KeyKind(text))
        raise InvalidInput(f"key mode {text!r} is not one of {KEY_FORMS}")

    def __str__(self) -> str:
        if self.kind is KeyKind.PROPERTY:
            return f"property:{self.property}"
        return str(self.kind.value)


CLIENT_ID_KEY = KeyMode(KeyKind.CLIENT_ID)
"""The key MQTT publishes had before key modes: what older topics keep."""
DEFAULT_KEY_MODE = KeyMode(KeyKind.CLIENT_TOPIC)
"""What a topic created without a key mode gets (module docstring)."""
BUILTIN_KEY_MODE = CLIENT_ID_KEY
"""The built-in `mqtt`'s key mode in a new database: the one it has in every
database made before key modes, so the catch-all (what clients publish without
any binding) behaves the same in a new database and an upgraded one."""


def stored_key_mode(record: TopicRecord) -> KeyMode:
    """The key mode a topic's record holds (`CLIENT_ID_KEY` if its text is
    not one: the storage only ever gets text `KeyMode.parse` took)."""
    try:
        return KeyMode.parse(record.key_mode)
    except InvalidInput:
        return CLIENT_ID_KEY


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
            "key": t.key_mode,
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
        key_mode: KeyMode | None = None,
        *,
        exist_ok: bool = False,
    ) -> TopicRecord:
        """Create a topic with one storage topic of `partitions` (K=1).

        With `exist_ok`, a topic that exists already with these very settings
        (its first generation's partitions) is returned as it is; one with other
        settings raises `AlreadyExists` naming them.

        `max_age_us`, `max_messages` and `max_bytes` (per stream) are limits
        retention applies whoever has not consumed (`alter`). `key_mode`: the
        ordering key of the MQTT publishes its binding brings (`DEFAULT_KEY_MODE`
        if None); only for a topic with a binding.

        Raises `InvalidInput` subclasses for a bad name, partition count, binding,
        retention, limit or key mode, `BindingOverlap` if the binding overlaps
        another topic's, and `AlreadyExists`; in every case nothing is written.
        """
        validate_topic_name(name)
        validate_partitions(partitions)
        if binding is not None:
            validate_filter(binding)
        if key_mode is None:
            key_mode = DEFAULT_KEY_MODE
        else:
            _check_key_mode(name, binding, key_mode)
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
            now_us(),
            max_age_us,
            max_messages,
            max_bytes,
            str(key_mode),
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
            ("key mode", existing.key_mode, wanted.key_mode),
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
        """Create the catch-all topic `mqtt` if it does not exist yet, keyed by
        client id like in every database (`BUILTIN_KEY_MODE`)."""
        try:
            self.storage.get_topic(BUILTIN_TOPIC)
        except TopicNotFound:
            with contextlib.suppress(AlreadyExists):  # another process won the race
                self.create(BUILTIN_TOPIC, BUILTIN_PARTITIONS, key_mode=BUILTIN_KEY_MODE)

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
        key_mode: KeyMode | Keep = Keep.KEEP,
    ) -> TopicRecord:
        """Change topic `name`'s retention time, policy, limits and key mode:
        those given (None removes a limit, or keeps messages for ever for
        `retention_us`); the others keep their values. One transaction: a
        concurrent change to another setting is not undone.

        A new key mode applies from the next PUBLISH on (brokers see it within
        `log.BINDINGS_TTL`). Messages already stored keep their streams: a key
        mode that moves a publisher's messages to another stream gives no order
        between what came before and after.

        Raises `InvalidInput` for a bad value (a key mode for a topic without a
        binding, other than the built-in `mqtt`), `TopicNotFound`; nothing is
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
            if not isinstance(key_mode, Keep):
                _check_key_mode(name, current.binding, key_mode)
            return replace(
                current,
                retention_us=_given(retention_us, current.retention_us),
                retention_policy=_given(retention_policy, current.retention_policy),
                max_age_us=_given(max_age_us, current.max_age_us),
                max_messages=_given(max_messages, current.max_messages),
                max_bytes=_given(max_bytes, current.max_bytes),
                key_mode=current.key_mode if isinstance(key_mode, Keep) else str(key_mode),
            )

        record = self.storage.alter_topic(name, change)
        self._on_change()
        return record

    def set_key_mode(self, name: str, key_mode: KeyMode) -> TopicRecord:
        """`alter(name, key_mode=key_mode)`."""
        return self.alter(name, key_mode=key_mode)

    def delete(self, name: str) -> int:
        """Delete a topic with its messages and subscriptions; returns messages deleted."""
        if name == BUILTIN_TOPIC:
            raise InvalidInput(f"topic {name!r} is built in and cannot be deleted")
        deleted = self.storage.delete_topic(name)
        self._on_change()
        return deleted


def _given(value: T | Keep, current: T) -> T:
    return current if isinstance(value, Keep) else value


def _check_key_mode(name: str, binding: str | None, key_mode: KeyMode) -> None:
    if not isinstance(key_mode, KeyMode):
        raise InvalidInput(f"key mode {key_mode!r} is not a KeyMode: use one of {KEY_FORMS}")
    if binding is None and name != BUILTIN_TOPIC:
        raise InvalidInput(
            f"key mode {str(key_mode)!r} for topic {name!r}: a key mode applies to the MQTT"
            " publishes a binding brings, and the topic has no binding"
        )


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
