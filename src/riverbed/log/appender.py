"""Group commit: concurrent producers' messages go to the log in one transaction.

Producers (threads, the event loop) hand messages to `Appender.submit`, which
stamps ids and timestamps, hashes keys and queues them. One writer thread takes
everything queued (up to `max_batch` messages, after waiting up to `linger`
seconds for more), routes each message to a stream of its topic's produce
generation (seed 003 Produce), appends the lot in one transaction, and only then
resolves the producers' futures: a produce call returns after its batch is
committed. sqlite3 and psycopg release the GIL while the database works, so the
writer overlaps with the producers.

If SwitchProduce sealed a stream since we last looked, the storage refuses the
whole transaction (nothing is written); we reload the topic's layout and route
again, so no message ever lands in a sealed stream.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from riverbed.errors import RiverbedError, StorageError
from riverbed.log.router import key_hash, route
from riverbed.model import Message, MessageIdGenerator, StreamId, encode_properties
from riverbed.storage.base import Row, Storage, StreamSealed

Position = tuple[StreamId, int]
"""Where a message landed: its stream and offset."""

_MAX_ROUTE_ATTEMPTS = 10


@dataclass(slots=True)
class _Pending:
    topic: str
    hashes: list[int]
    rows: list[Row]
    future: Future[list[Position]]


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a topic produces now: its produce generation's streams."""

    partitions: int
    k: int
    keys: list[int]
    streams: list[StreamId]


class Appender:
    """The group-commit writer for one storage. Thread-safe."""

    def __init__(
        self,
        storage: Storage,
        *,
        max_batch: int = 10_000,
        linger: float = 0.0,
        ids: MessageIdGenerator | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch} must be at least 1")
        if linger < 0:
            raise ValueError(f"linger {linger} must not be negative")
        self.storage = storage
        self.max_batch = max_batch
        self.linger = linger
        self.ids = ids or MessageIdGenerator()
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._layouts: dict[str, _Layout] = {}
        self._meta_version = -1
        self._spread = itertools.count()

    # --- producer side ------------------------------------------------------
    def submit(self, topic: str, messages: Sequence[Message]) -> Future[list[Position]]:
        """Queue messages for `topic`; the future resolves once they are committed."""
        future: Future[list[Position]] = Future()
        if not messages:
            future.set_result([])
            return future
        spread = self._spread
        hashes: list[int] = []
        rows: list[Row] = []
        seen: dict[str, int] = {}  # most batches repeat a few keys
        for m, (id_bytes, ts) in zip(messages, self.ids.reserve(len(messages)), strict=True):
            key = m.key
            if key is None:
                hashes.append(next(spread))
            else:
                h = seen.get(key)
                if h is None:
                    h = seen[key] = key_hash(key)
                hashes.append(h)
            rows.append(
                (
                    id_bytes,
                    ts,
                    m.mqtt_topic,
                    key,
                    m.payload,
                    encode_properties(m.properties) if m.properties else None,
                    m.qos,
                    int(m.retain),
                )
            )
        self._enqueue(_Pending(topic, hashes, rows, future))
        return future

    def append(
        self, topic: str, messages: Sequence[Message], timeout: float | None = None
    ) -> list[Position]:
        """Append and wait for the commit; returns each message's position."""
        return self.submit(topic, messages).result(timeout)

    def _enqueue(self, pending: _Pending) -> None:
        with self._cond:
            if self._closing:
                raise RiverbedError("the appender is closed")
            self._queue.append(pending)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="riverbed-appender", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    # --- writer side --------------------------------------------------------
    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            taken = [self._queue.popleft()]
            count = len(taken[0].rows)
            deadline = time.monotonic() + self.linger
            while count < self.max_batch:
                if not self._queue:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closing:
                        break
                    self._cond.wait(remaining)
                    continue
                if count + len(self._queue[0].rows) > self.max_batch:
                    break
                item = self._queue.popleft()
                taken.append(item)
                count += len(item.rows)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            try:
                self._commit(taken)
            except BaseException as exc:  # every producer must hear of it
                for item in taken:
                    if not item.future.done():
                        item.future.set_exception(exc)

    def _layout(self, topic: str) -> _Layout:
        layout = self._layouts.get(topic)
        if layout is None:
            record = self.storage.get_topic(topic)
            generation = self.storage.list_storage_topics(topic)[record.produce_pointer]
            heads = [
                h
                for h in self.storage.list_streams(topic)
                if h.stream.generation == generation.generation
            ]
            layout = _Layout(
                generation.partitions,
                generation.k,
                [h.key for h in heads],
                [h.stream for h in heads],
            )
            self._layouts[topic] = layout
        return layout

    def _commit(self, taken: list[_Pending]) -> None:
        for _attempt in range(_MAX_ROUTE_ATTEMPTS):
            version = self.storage.meta_version()
            if version != self._meta_version:
                self._layouts.clear()
                self._meta_version = version
            live: list[tuple[_Pending, _Layout, list[int], list[int]]] = []
            batches: dict[int, list[Row]] = {}
            for item in taken:
                try:
                    layout = self._layout(item.topic)
                except RiverbedError as exc:  # the topic is gone: fail this producer only
                    item.future.set_exception(exc)
                    continue
                partitions, k, keys = layout.partitions, layout.k, layout.keys
                targets: list[int] = []
                indexes: list[int] = []
                for h, row in zip(item.hashes, item.rows, strict=True):
                    j = route(h, partitions, k)
                    rows = batches.get(keys[j])
                    if rows is None:
                        rows = batches[keys[j]] = []
                    targets.append(j)
                    indexes.append(len(rows))
                    rows.append(row)
                live.append((item, layout, targets, indexes))
            if not live:
                return
            try:
                firsts = self.storage.append(batches)
            except StreamSealed:
                self._layouts.clear()  # SwitchProduce happened: route again
                continue
            for item, layout, targets, indexes in live:
                keys, streams = layout.keys, layout.streams
                item.future.set_result(
                    [
                        (streams[j], firsts[keys[j]] + i)
                        for j, i in zip(targets, indexes, strict=True)
                    ]
                )
            return
        raise StorageError(
            f"could not route to an open stream after {_MAX_ROUTE_ATTEMPTS} attempts"
        )
