"""Topic shapes: what every session asks alike of the topics it follows, kept.

A session that resumes, subscribes or looks for new streams needs, for each
topic its filters reach, the topic's *shape*: its generations (storage topics)
and its streams with their heads (`Storage.list_storage_topics`,
`Storage.list_streams`), and the topics' bindings, to know which topics its
filters reach. They are the same for every session, and they change rarely: a
topic created, bound, scaled up or deleted moves the storage's metadata
version, and retention moves a stream's start. A fleet resuming at once read
them once per session (three reads each on SQLite, a quarter of a resume's
CPU); here they are read once and kept:

- while the metadata version `Log.layout_version` gives stays the same (it is
  looked at as the log looks at it for `route`: at most every
  `log.BINDINGS_TTL` for another process's changes, at once for this one's);
- until the fan-out sees streams it did not know (`forget`): a topic created
  or scaled up by anyone, at its next look at the heads;
- and for at most `max_age` seconds: a stream's start offset moves with
  retention without a new version. A shape that old is as good as a read that
  started `max_age` earlier: a session starting below a stream's first
  retained offset reads from that offset, and one waiting for its lineage looks
  again every `following.LINEAGE_RECHECK`.

Runs on the event loop. A shape's read goes through the broker's
`read_shared` (on the loop for an embedded database, else one worker-thread
read for every session asking meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from riverbed.errors import TopicNotFound
from riverbed.log.log import Log
from riverbed.storage.base import Storage, StorageTopicRecord, StreamHead

T = TypeVar("T")

Shape = tuple[list[StorageTopicRecord], list[StreamHead]]
"""A topic's generations (oldest first) and its streams' heads."""

ReadShared = Callable[..., Any]
"""`Broker.read_shared(key, read, *args)`: an awaitable of `read(*args)`."""

SHAPE_MAX_AGE = 1.0
"""Seconds a topic's shape is kept at most (its streams' start offsets move
with retention, which does not move the metadata version)."""


class TopicShapes:
    """Each topic's shape and every topic's binding, read once for all sessions."""

    def __init__(
        self,
        log: Log,
        read_shared: ReadShared,
        *,
        max_age: float = SHAPE_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_age >= 0:
            raise ValueError(f"max_age {max_age!r} must be 0 seconds or more")
        self.log = log
        self._read_shared = read_shared
        self.max_age = max_age
        self._clock = clock
        self._shapes: dict[str, tuple[float, Shape | None]] = {}
        """Topic -> (when its read started, its shape; None: no such topic)."""
        self._pairs: list[tuple[str, str | None]] | None = None
        """(topic, binding) of every topic, for the version `_version`."""
        self._version = -1
        """The metadata version the kept shapes and bindings are of."""
        self._epoch = 0
        """Moved by every `forget`: a read that started before one is not kept."""
        self.reads = 0
        """Shapes read from the storage so far (the others were answered here)."""

    def forget(self) -> None:
        """Drop every kept shape and binding: streams appeared that they may not
        name (the fan-out's `on_new_streams`). The log looks at its topics again
        at the next use too."""
        self._shapes.clear()
        self._pairs = None
        self._epoch += 1
        self.log.forget_bindings()

    def _current(self) -> None:
        version = self.log.layout_version()
        if version != self._version:
            self._shapes.clear()
            self._pairs = None
            self._epoch += 1
            self._version = version

    def bindings(self) -> list[tuple[str, str | None]]:
        """(topic, binding) of every topic (`log.topics.reachable_topics` takes
        them). Raises `StorageError` while the topics could never be read."""
        self._current()
        pairs = self._pairs
        if pairs is None:
            pairs = self._pairs = [(t.name, t.binding) for t in self.log.bindings()]
        return pairs

    async def get(self, topic: str) -> Shape | None:
        """`topic`'s shape; None if there is no such topic (deleted)."""
        self._current()
        now = self._clock()
        kept = self._shapes.get(topic)
        if kept is not None and now - kept[0] < self.max_age:
            return kept[1]
        epoch = self._epoch
        self.reads += 1
        key: Hashable = ("topic", topic)
        shape: Shape | None = await self._read_shared(key, read_shape, self.log.storage, topic)
        if epoch == self._epoch:
            self._shapes[topic] = (now, shape)
        return shape


def read_shape(storage: Storage, topic: str) -> Shape | None:
    """A topic's generations and stream heads (None: no such topic), blocking."""
    try:
        generations = storage.list_storage_topics(topic)
    except TopicNotFound:
        return None
    return generations, storage.list_streams(topic)
