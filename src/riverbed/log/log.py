"""The log's front door: topics, producing and publishing by MQTT topic name."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import NamedTuple

from riverbed.errors import InvalidInput, StorageError
from riverbed.log.appender import Appender, Positions
from riverbed.log.topics import (
    BUILTIN_TOPIC,
    CLIENT_ID_KEY,
    KeyMode,
    Topics,
    resolve_binding,
    stored_key_mode,
)
from riverbed.model import Message, MessageIdGenerator
from riverbed.storage import StorageUrl, open_storage
from riverbed.storage.base import Storage, TopicRecord
from riverbed.topics.filters import matches, validate_topic_name

BINDINGS_TTL = 0.2
"""Seconds a cached view of topics and bindings is trusted."""
ROUTES_CACHED = 65_536
"""MQTT topic names whose `Route` is remembered (all forgotten past that)."""


class Route(NamedTuple):
    """Where an MQTT topic name's messages go: the topic that stores it, and
    the key mode of that topic's binding."""

    topic: str
    key_mode: KeyMode


class Log:
    """One storage with its topics and its group-commit appender."""

    def __init__(
        self,
        storage: Storage,
        *,
        max_batch: int = 10_000,
        linger: float = 0.0,
        ids: MessageIdGenerator | None = None,
    ) -> None:
        self.storage = storage
        self._bindings: list[TopicRecord] = []
        self._bindings_version = -1
        self._bindings_checked = 0.0
        self._key_modes: dict[str, KeyMode] = {}
        self._routes: dict[str, Route] = {}
        """MQTT topic name -> route, for the bindings as last loaded."""
        self.topics = Topics(storage, on_change=self.forget_bindings)
        self.topics.ensure_builtin()
        self.appender = Appender(storage, max_batch=max_batch, linger=linger, ids=ids)

    @classmethod
    def open(
        cls, url: str | StorageUrl | None = None, *, create: bool = True, **options: object
    ) -> Log:
        """The log of the database `url` names (`open_storage`). With
        `create=False` a missing database, or one without Riverbed's tables, is
        refused (`DatabaseNotFound`) instead of created."""
        storage = open_storage(url, create=create)
        try:
            return cls(storage, **options)  # type: ignore[arg-type]
        except BaseException:
            storage.close()
            raise

    def close(self) -> None:
        self.appender.close()
        self.storage.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def produce_async(self, topic: str, messages: Sequence[Message]) -> Future[Positions]:
        """Queue messages for a topic; the future resolves when they are committed.

        A message's `mqtt_topic`, if given, must be a valid topic name that the
        topic's binding matches (so MQTT subscribers find it where they expect).
        """
        self._check(topic, messages)
        return self.appender.submit(topic, messages)

    def produce_soon(
        self, topic: str, messages: Sequence[Message]
    ) -> Positions | Future[Positions]:
        """`produce_async`, except that the messages are committed on the calling
        thread when that needs no waiting (`Appender.try_append_now`: an embedded
        storage, no commit running, the write lock free): then their positions
        come back at once, else a future. Checks like `produce`, once."""
        self._check(topic, messages)
        positions = self.appender.try_append_now(topic, messages)
        return self.appender.submit(topic, messages) if positions is None else positions

    def produce(self, topic: str, messages: Sequence[Message]) -> Positions:
        """Append messages to a topic and wait until they are committed.

        A message's `mqtt_topic`, if given, must be a valid topic name that the
        topic's binding matches; for the built-in `mqtt` topic, one that no other
        topic's binding claims. A topic without a binding keeps any name as data.
        """
        self._check(topic, messages)
        return self.appender.append(topic, messages)

    def check(self, topic: str, *messages: Message) -> None:
        """Raise what `produce` would raise for these messages, writing nothing.

        `InvalidInput` if an `mqtt_topic` is no valid topic name or the topic's
        binding does not match it; `TopicNotFound` if there is no such topic. Lets
        a caller validate a whole input before any of it is written.
        """
        self._check(topic, messages)

    def _check(self, topic: str, messages: Sequence[Message]) -> None:
        record = self._topic(topic)
        binding = record.binding
        checked: set[str] = set()
        for m in messages:
            name = m.mqtt_topic
            if not name or name in checked:
                continue
            validate_topic_name(name)
            if binding is not None and not matches(binding, name):
                raise InvalidInput(
                    f"MQTT topic {name!r} is not matched by the binding"
                    f" {binding!r} of topic {topic!r}"
                )
            if topic == BUILTIN_TOPIC:
                owner = resolve_binding(self._bindings, name)
                if owner != BUILTIN_TOPIC:
                    # MQTT subscribers of this name read `owner`, never `mqtt`.
                    raise InvalidInput(
                        f"MQTT topic {name!r} belongs to topic {owner!r} by its binding;"
                        f" the built-in topic {BUILTIN_TOPIC!r} stores only names no binding"
                        " claims"
                    )
            checked.add(name)

    def topic_for(self, mqtt_topic: str) -> str:
        """The topic that stores this MQTT topic name (by binding, else `mqtt`)."""
        return self.route(mqtt_topic).topic

    def route(self, mqtt_topic: str) -> Route:
        """The topic that stores this MQTT topic name and its binding's key mode.

        On the path of every PUBLISH: resolved once per name while the bindings
        stay the same, the key modes parsed once per load of the bindings."""
        self._refresh_bindings()
        found = self._routes.get(mqtt_topic)
        if found is None:
            topic = resolve_binding(self._bindings, mqtt_topic)
            # Not loaded (the storage unreachable so far): the commit will fail;
            # the key every topic had before key modes meanwhile.
            found = Route(topic, self._key_modes.get(topic, CLIENT_ID_KEY))
            if len(self._routes) >= ROUTES_CACHED:
                self._routes.clear()
            self._routes[mqtt_topic] = found
        return found

    def _topic(self, name: str) -> TopicRecord:
        self._refresh_bindings()
        for record in self._bindings:
            if record.name == name:
                return record
        return self.storage.get_topic(name)  # raises TopicNotFound

    def bindings(self) -> list[TopicRecord]:
        """Every topic with its binding, as `route` sees them: another process's
        changes within BINDINGS_TTL, this one's at once. Raises `StorageError`
        while they could never be read (the storage unreachable since the start)."""
        self._refresh_bindings()
        if self._bindings_version < 0:
            raise StorageError("the topics could not be read from the storage yet")
        return self._bindings

    def layout_version(self) -> int:
        """The storage's topic-metadata version the bindings are of (`meta_version`:
        it moves with every topic created, changed, scaled up or deleted), checked
        as `bindings` checks it; -1 before the first read."""
        self._refresh_bindings()
        return self._bindings_version

    def forget_bindings(self) -> None:
        """Check the topics again at the next use, however recent the last look
        (something says they changed: new streams appeared)."""
        self._bindings_checked = 0.0

    def _refresh_bindings(self) -> None:
        # Other processes' topic changes are seen within BINDINGS_TTL; ours at once
        # (the appender re-checks the layout itself on every commit).
        now = time.monotonic()
        if now - self._bindings_checked < BINDINGS_TTL:
            return
        self._bindings_checked = now
        try:
            version = self.storage.meta_version()
        except StorageError:
            # Unreachable: route by what we know. A PUBLISH must be refused by its
            # commit (MQTT 5: 0x97), not fail here before it is even taken.
            return
        if version != self._bindings_version:
            bindings = self.storage.list_topics()
            self._key_modes = {t.name: stored_key_mode(t) for t in bindings}
            self._bindings = bindings
            self._routes = {}
            self._bindings_version = version
