"""Group commit: concurrent producers' messages go to the log in one transaction.

Producers (threads, the event loop) hand messages to `Appender.submit`, which
stamps ids and timestamps, hashes keys and queues them. One writer thread takes
everything queued (up to `max_batch` messages, after waiting up to `linger`
seconds for more), routes each message to a stream of its topic's produce
generation (seed 003 Produce), appends the lot in one transaction, and only then
resolves the producers' futures: a produce call returns after its batch is
committed. sqlite3 and psycopg release the GIL while the database works, so the
writer overlaps with the producers.

If SwitchProduce sealed a stream since we last looked, or the topic was deleted
(stream keys are never reused), the storage refuses the whole transaction
(nothing is written); we reload the topic's layout and route again, so no
message ever lands in a sealed stream. That is the only way a cached layout goes
stale, so the hot path asks the database nothing else.

A store that refuses writes (`StorageFull`: a full disk, a size cap, a read-only
PostgreSQL; `StorageUnavailable`: the server cannot be reached) fails the
producers of that transaction, nothing written, and nothing else: the writer
thread and its connection carry on, so the next commit after space returns
succeeds by itself. Such an episode is logged once when it starts and once when
it ends (`WriteRefusals`), not per message.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, overload

from riverbed.errors import (
    InvalidInput,
    RiverbedError,
    StorageError,
    StorageFull,
    StorageUnavailable,
    StreamSealed,
)
from riverbed.log.partitioning import key_hash, route
from riverbed.metrics import Metrics
from riverbed.model import (
    SEQUENCE_BITS,
    Message,
    MessageIdGenerator,
    StreamId,
    encode_properties,
)
from riverbed.storage import bulk
from riverbed.storage.base import Row, Storage

log = logging.getLogger(__name__)

Position = tuple[StreamId, int]
"""Where a message landed: its stream and offset."""


def store_refused(exc: BaseException | None) -> bool:
    """Whether a failed write failed because the store refuses writes for now
    (full, read-only or unreachable), not because of what was written: the
    producer may try again later (MQTT 5: PUBACK 0x97 Quota exceeded)."""
    return isinstance(exc, StorageFull | StorageUnavailable)


class WriteRefusals:
    """Episodes of a store refusing writes: one log line when the first write is
    refused, one when a write succeeds again, whatever happens in between.
    Thread-safe (the writer thread and inline commits report here)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refusing: BaseException | None = None
        """The error that started the current episode (None: writes succeed)."""
        self.refused = 0
        """Messages refused in the current episode."""
        self.episodes = 0
        """Episodes since this appender started."""

    def failed(self, exc: BaseException, messages: int) -> None:
        if not store_refused(exc):
            return
        with self._lock:
            started = self.refusing is None
            if started:
                self.refusing = exc
                self.refused = 0
                self.episodes += 1
            self.refused += messages
        if started:
            log.error(
                "the store refuses writes: %s; publishing is refused until it takes writes"
                " again (it is retried with every new message)",
                exc,
            )

    def succeeded(self) -> None:
        if self.refusing is None:  # the common case: no lock
            return
        with self._lock:
            ended, self.refusing = self.refusing, None
            refused = self.refused
        if ended is not None:
            log.warning("the store takes writes again; %d messages were refused meanwhile", refused)


class Positions(Sequence[Position]):
    """Where each message of one produce call landed, in call order.

    Computed on access: the broker only needs to know *that* a batch is
    committed, so we do not build a tuple per message up front.
    """

    __slots__ = ("_firsts", "_indexes", "_layout", "_targets", "rows")

    def __init__(
        self,
        layout: _Layout,
        firsts: Mapping[int, int],
        targets: list[int],
        indexes: list[int],
        rows: Sequence[Row] = (),
    ) -> None:
        self._layout = layout
        self._firsts = firsts
        self._targets = targets
        self._indexes = indexes
        self.rows = rows
        """The rows as stored, in call order (row i is message i's): what a
        reader would read back at those positions, but the offset."""

    def __len__(self) -> int:
        return len(self._indexes)

    @overload
    def __getitem__(self, index: int) -> Position: ...

    @overload
    def __getitem__(self, index: slice) -> list[Position]: ...

    def __getitem__(self, index: int | slice) -> Position | list[Position]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        j = self._targets[index] if len(self._targets) > 1 else self._targets[0]
        layout = self._layout
        return layout.streams[j], self._firsts[layout.keys[j]] + self._indexes[index]

    def run(self, start: int, count: int) -> Position | None:
        """Where messages `start` to `start + count` (at least one) begin, when
        they all went to one stream one after another (message `start + i` at
        that offset plus i): the common case of a batch whose messages share a
        key, answered without a lookup per message. None otherwise."""
        targets = self._targets
        if len(targets) != 1 or count < 1:
            return None
        layout = self._layout
        j = targets[0]
        return layout.streams[j], self._firsts[layout.keys[j]] + self._indexes[start]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Positions({list(self)!r})"


def _route_into(
    item: _Pending, layout: _Layout, batches: dict[int, list[Row]]
) -> tuple[list[int], list[int]]:
    """Add an item's rows to the per-stream batches (seed 003 Produce).

    Returns each row's partition (a single entry when all share one) and its
    index in that stream's batch.
    """
    partitions, k, keys = layout.partitions, layout.k, layout.keys
    hashes = item.hashes
    if len(set(hashes)) == 1:  # one key: the common case of a publisher's batch
        j = (k * hashes[0]) % partitions + (hashes[0] // partitions) % k
        same = batches.setdefault(keys[j], [])
        start = len(same)
        same.extend(item.rows)
        return [j], list(range(start, start + len(item.rows)))
    targets: list[int] = []
    indexes: list[int] = []
    routed: dict[int, int] = {}
    for h, row in zip(hashes, item.rows, strict=True):
        j = routed.get(h, -1)
        if j < 0:
            j = routed[h] = route(h, partitions, k)
        rows = batches.get(keys[j])
        if rows is None:
            rows = batches[keys[j]] = []
        targets.append(j)
        indexes.append(len(rows))
        rows.append(row)
    return targets, indexes


_MAX_ROUTE_ATTEMPTS = 10

_ANSWERED_INLINE: Future[Positions] = Future()
"""The future of every `_Pending` that `try_append_now` commits: never set or
read (that commit's positions are its return value)."""


@dataclass(slots=True)
class _Pending:
    topic: str
    hashes: list[int]
    rows: list[Row]
    future: Future[Positions]


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
        self._committing = False
        self._layouts: dict[str, _Layout] = {}
        self._spread = itertools.count()
        self.refusals = WriteRefusals()
        """Whether the store refuses writes now (`WriteRefusals`)."""
        self.metrics: Metrics | None = None
        """Where each transaction's duration and messages are counted (a broker's)."""

    # --- producer side ------------------------------------------------------
    def submit(self, topic: str, messages: Sequence[Message]) -> Future[Positions]:
        """Queue messages for `topic`; the future resolves once they are committed.

        Never blocks on the database: the writer thread commits.
        """
        pending = self._prepare(topic, messages)
        if pending.rows:
            with self._cond:
                self._queue_locked(pending)
                self._wake_writer_locked()
        return pending.future

    def append(
        self, topic: str, messages: Sequence[Message], timeout: float | None = None
    ) -> Positions:
        """Append and wait for the commit; returns each message's position.

        A caller that is going to wait anyway commits itself when no commit is
        running (and takes whatever else is queued along): no hand-over to the
        writer thread and back on the path of a lone producer.
        """
        pending = self._prepare(topic, messages)
        if not pending.rows:
            return pending.future.result()
        with self._cond:
            self._queue_locked(pending)
            lead = not self._committing
            if lead:
                self._committing = True
            else:
                self._wake_writer_locked()
        if lead:
            self._lead(pending)
        return pending.future.result(timeout)

    def try_append_now(self, topic: str, messages: Sequence[Message]) -> Positions | None:
        """Commit on the calling thread, now, if that needs no waiting: the storage
        commits inline (`Storage.appends_inline`), no commit is running or queued
        (so per-key order holds), and no other process holds the write lock.
        Returns the positions, or None with nothing written (the caller submits
        instead). For an event loop: a small batch committed in place costs less
        than the hand-over to the writer thread and back."""
        if not self.storage.appends_inline:
            return None
        with self._cond:
            if self._committing or self._queue or self._closing:
                return None
            self._committing = True
        try:
            if not messages:
                return Positions(_Layout(1, 1, [], []), {}, [], [])
            # Answered by the return value: no future for it (a Future and its
            # Condition per commit).
            pending = self._prepare(topic, messages, _ANSWERED_INLINE)
            for _attempt in range(_MAX_ROUTE_ATTEMPTS):
                layout = self._layout(topic)
                batches: dict[int, list[Row]] = {}
                targets, indexes = _route_into(pending, layout, batches)
                started = time.perf_counter()
                try:
                    firsts = self.storage.try_append(batches)
                except StreamSealed:
                    self._layouts.clear()  # SwitchProduce happened: route again
                    continue
                except RiverbedError as exc:
                    self.refusals.failed(exc, len(pending.rows))
                    raise
                if firsts is None:
                    return None
                self.refusals.succeeded()
                if self.metrics is not None:
                    self.metrics.committed(
                        {topic: len(pending.rows)}, time.perf_counter() - started
                    )
                return Positions(layout, firsts, targets, indexes, pending.rows)
            raise StorageError(
                f"could not route to an open stream after {_MAX_ROUTE_ATTEMPTS} attempts"
            )
        finally:
            with self._cond:
                self._committing = False
                if self._queue:
                    self._wake_writer_locked()

    def append_once(
        self,
        topic: str,
        rows: Sequence[Row],
        marker: str,
        place: Callable[[int, int, int], int] | None = None,
    ) -> dict[int, int] | None:
        """Route `rows` to `topic`'s produce generation by their keys (seed 003
        Produce; a row without a key is spread) and append them in one transaction
        that also records `marker` (`Storage.append_once`): a second call with the
        same marker writes nothing and returns None. Returns each stream's first
        new offset (by stream key).

        `place(hash, partitions, k)`, if given, picks the partition instead of the
        router (a subscription shard writing into its own range of its retry
        queue, `subscriptions.shards.queue_partition`); it is asked again if the
        topic switched produce meanwhile. A partition outside the generation's
        raises `InvalidInput`, writing nothing.

        Not group-committed: the transaction must hold exactly these rows. This is
        how a writer that may be retried (a Spark task) writes exactly once.
        """
        spread = self._spread
        cache: dict[str, int] = {}
        hashes: list[int] = []
        for row in rows:
            key = row[3]
            if key is None:
                hashes.append(next(spread))
            else:
                h = cache.get(key)
                if h is None:
                    h = cache[key] = key_hash(key)
                hashes.append(h)
        for _attempt in range(_MAX_ROUTE_ATTEMPTS):
            layout = self._layout(topic)
            partitions, k, keys = layout.partitions, layout.k, layout.keys
            batches: dict[int, list[Row]] = {}
            for h, row in zip(hashes, rows, strict=True):
                if place is None:
                    j = route(h, partitions, k)
                else:
                    j = place(h, partitions, k)
                    if not 0 <= j < partitions:
                        raise InvalidInput(
                            f"partition {j} for topic {topic!r}: its produce generation has"
                            f" partitions 0 to {partitions - 1}"
                        )
                stream = keys[j]
                same = batches.get(stream)
                if same is None:
                    same = batches[stream] = []
                same.append(row)
            started = time.perf_counter()
            try:
                firsts = self.storage.append_once(marker, batches)
            except StreamSealed:
                self._layouts.pop(topic, None)  # SwitchProduce happened: route again
                continue
            except RiverbedError as exc:
                self.refusals.failed(exc, len(rows))
                raise
            self.refusals.succeeded()
            if self.metrics is not None and firsts is not None:
                self.metrics.committed({topic: len(rows)}, time.perf_counter() - started)
            return firsts
        raise StorageError(
            f"could not route to an open stream after {_MAX_ROUTE_ATTEMPTS} attempts"
        )

    def append_arrow_once(self, topic: str, table: Any, marker: str) -> dict[int, int] | None:
        """`append_once` for rows held as Arrow columns `mqtt_topic, key, payload,
        properties, qos, retain` (a `Row` without id and timestamp, types as in
        `bulk.ROW_FIELDS`): ids, hashes and routes are computed column-wise
        (`log/columns.py`), to the same streams `append_once` picks, and a
        storage that can loads the columns in bulk (`bulk.ArrowAppends`).
        """
        from riverbed.log import columns

        table = table.combine_chunks()
        hashes = columns.key_hashes(table.column("key"), self._spread)
        ids, stamps = columns.stamp(self.ids, table.num_rows)
        rows = table.add_column(0, "id", ids).add_column(1, "ts", stamps)
        rows = rows.cast(bulk.row_schema())
        for _attempt in range(_MAX_ROUTE_ATTEMPTS):
            layout = self._layout(topic)
            order, found = columns.group(columns.routes(hashes, layout.partitions, layout.k))
            streams = [(layout.keys[j], count) for j, count in found]
            ordered = rows if order is None else rows.take(order)
            try:
                if isinstance(self.storage, bulk.ArrowAppends):
                    return self.storage.append_arrow_once(marker, streams, ordered)
                return self.storage.append_once(marker, bulk.row_batches(streams, ordered))
            except StreamSealed:
                self._layouts.pop(topic, None)  # SwitchProduce happened: route again
        raise StorageError(
            f"could not route to an open stream after {_MAX_ROUTE_ATTEMPTS} attempts"
        )

    def stream_of(self, topic: str, key: int) -> StreamId | None:
        """The stream with this key in `topic`'s produce generation as last seen
        (where `append_once` routed to); None if it is not there."""
        layout = self._layout(topic)
        for stream_key, stream in zip(layout.keys, layout.streams, strict=True):
            if stream_key == key:
                return stream
        return None

    def _prepare(
        self, topic: str, messages: Sequence[Message], future: Future[Positions] | None = None
    ) -> _Pending:
        if future is None:
            future = Future()
        if not messages:
            future.set_result(Positions(_Layout(1, 1, [], []), {}, [], []))
            return _Pending(topic, [], [], future)
        spread = self._spread
        hashes: list[int] = []
        rows: list[Row] = []
        seen: dict[str, int] = {}  # most batches repeat a few keys
        blobs: dict[Any, bytes | None] = {}  # and a few property sets (a publisher's)
        node = self.ids.node << SEQUENCE_BITS
        index = 0
        # Ids straight from the reserved spans: no (id, timestamp) pair per message.
        for ts, first, n in self.ids.reserve_spans(len(messages)):
            base = (ts << 64) | node
            for sequence in range(first, first + n):
                m = messages[index]
                index += 1
                key = m.key
                if key is None:
                    hashes.append(next(spread))
                else:
                    h = seen.get(key)
                    if h is None:
                        h = seen[key] = key_hash(key)
                    hashes.append(h)
                properties = m.properties
                if properties:
                    try:
                        blob = blobs[properties]
                    except KeyError:
                        blob = blobs[properties] = encode_properties(properties)
                    except TypeError:  # not hashable: encode_properties says what is wrong
                        blob = encode_properties(properties)
                else:
                    blob = None
                rows.append(
                    (
                        (base | sequence).to_bytes(16, "big"),
                        ts,
                        m.mqtt_topic,
                        key,
                        m.payload,
                        blob,
                        m.qos,
                        int(m.retain),
                    )
                )
        return _Pending(topic, hashes, rows, future)

    def _queue_locked(self, pending: _Pending) -> None:
        if self._closing:
            raise RiverbedError("the appender is closed")
        self._queue.append(pending)
        self._cond.notify_all()

    def _wake_writer_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="riverbed-appender", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._cond:
            self._closing = True
            if self._queue:
                self._wake_writer_locked()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    # --- writer side --------------------------------------------------------
    def _lead(self, mine: _Pending) -> None:
        """Commit batches from this thread until `mine` is committed."""
        try:
            while not mine.future.done():
                with self._cond:
                    taken = self._take_locked()
                self._commit_or_fail(taken)
        finally:
            with self._cond:
                self._committing = False
                if self._queue:
                    self._wake_writer_locked()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue or self._committing:
                    if self._closing and not self._queue:
                        return
                    self._cond.wait()
                self._committing = True
                taken = self._take_locked()
            try:
                self._commit_or_fail(taken)
            finally:
                with self._cond:
                    self._committing = False
                    self._cond.notify_all()

    def _take_locked(self) -> list[_Pending]:
        """What the next transaction commits: up to `max_batch` messages, waiting
        up to `linger` for more. Called holding the lock, with a non-empty queue."""
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

    def _commit_or_fail(self, taken: list[_Pending]) -> None:
        try:
            committed = self._commit(taken)
        except BaseException as exc:  # every producer must hear of it
            self.refusals.failed(exc, sum(len(item.rows) for item in taken))
            for item in taken:
                if not item.future.done():
                    item.future.set_exception(exc)
        else:
            if committed:
                self.refusals.succeeded()

    def _count(self, live: Sequence[tuple[_Pending, Any, Any, Any]], seconds: float) -> None:
        """A transaction committed the messages of `live` in `seconds`."""
        assert self.metrics is not None
        appended: dict[str, int] = {}
        for item, *_ in live:
            appended[item.topic] = appended.get(item.topic, 0) + len(item.rows)
        self.metrics.committed(appended, seconds)

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

    def _commit(self, taken: list[_Pending]) -> bool:
        """Commit what `taken` holds; False if nothing was left to commit."""
        # A caller may cancel a submitted future (asyncio does when the awaiting task
        # is cancelled). Drop those now and make the rest uncancellable, so that
        # setting a result after the commit cannot fail and leave the others of the
        # batch with an error for messages that were committed.
        taken = [item for item in taken if item.future.set_running_or_notify_cancel()]
        for _attempt in range(_MAX_ROUTE_ATTEMPTS):
            live: list[tuple[_Pending, _Layout, list[int], list[int]]] = []
            batches: dict[int, list[Row]] = {}
            for item in taken:
                if item.future.done():
                    continue  # failed in an earlier attempt (its topic is gone)
                try:
                    layout = self._layout(item.topic)
                except StorageError:
                    raise  # not this producer's fault: the whole batch fails
                except RiverbedError as exc:  # the topic is gone: fail this producer only
                    item.future.set_exception(exc)
                    continue
                targets, indexes = _route_into(item, layout, batches)
                live.append((item, layout, targets, indexes))
            if not live:
                return False
            started = time.perf_counter()
            try:
                firsts = self.storage.append(batches)
            except StreamSealed:
                self._layouts.clear()  # SwitchProduce happened: route again
                continue
            if self.metrics is not None:
                self._count(live, time.perf_counter() - started)
            for item, layout, targets, indexes in live:
                item.future.set_result(Positions(layout, firsts, targets, indexes, item.rows))
            return True
        raise StorageError(
            f"could not route to an open stream after {_MAX_ROUTE_ATTEMPTS} attempts"
        )
