"""The storage protocol: the only contract between Riverbed and a database.

Everything SQL lives below this line; everything above it (the log, sessions,
subscriptions, Spark) speaks these methods. Two backends implement it (SQLite,
the embedded default, and PostgreSQL for several nodes) and one contract suite
tests both.

The storage knows nothing of routing or MQTT: where a write needs a decision
that belongs to a higher layer (binding overlap, the K rule, initial cursors),
the caller passes a function that the storage runs *inside* its transaction,
so the check and the write are atomic across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from riverbed.model import StoredMessage, StreamId
from riverbed.records import quick_init

if TYPE_CHECKING:
    import pyarrow

Row = tuple[bytes, int, str, "str | None", bytes, "bytes | None", int, int]
"""A message row to append: (id bytes, timestamp µs, mqtt topic, key, payload,
encoded properties, qos, retain)."""


class RetentionPolicy(Enum):
    """Which prefix of a stream retention may delete."""

    CONSUMED_AND_EXPIRED = "consumed-and-expired"
    """Only what every subscription has committed *and* is older than retention."""
    EXPIRED = "expired"
    """What is older than retention, consumed or not."""
    CONSUMED = "consumed"
    """What every subscription has committed, however young."""


class StartKind(Enum):
    """Where a new subscription starts reading."""

    EARLIEST = "earliest"
    LATEST = "latest"
    TIME = "time"


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A composite topic (seed 003 CompositeTopic) as stored."""

    name: str
    binding: str | None
    retention_us: int | None
    retention_policy: RetentionPolicy
    produce_pointer: int
    created_us: int
    max_age_us: int | None = None
    """Messages older than this go whoever has not consumed them (like Pulsar's
    message TTL); None: no limit."""
    max_messages: int | None = None
    """A stream keeps at most this many messages, consumed or not (like Pulsar's
    backlog quota, counted in messages per stream); None: no limit."""
    max_bytes: int | None = None
    """A stream keeps at most this many bytes of payload, consumed or not, and
    always its newest message (Pulsar's backlog quota in bytes); None: no limit."""
    key_mode: str = "client-id"
    """The ordering key of the MQTT publishes its binding brings, as text
    (`riverbed.log.topics.KeyMode`; the storage does not read it). Topics made
    before key modes existed have `client-id`."""


@dataclass(frozen=True, slots=True)
class StorageTopicRecord:
    """One generation of a topic: P partitions, scale factor K."""

    topic: str
    generation: int
    partitions: int
    k: int

    @property
    def base_partitions(self) -> int:
        """P / K: the number of lineages this generation refines."""
        return self.partitions // self.k


@quick_init
@dataclass(frozen=True, slots=True)
class StreamHead:
    """A stream and its bounds: `[start_offset, next_offset)` is retained."""

    key: int
    """The storage's own small integer for the stream (used on hot paths)."""
    stream: StreamId
    start_offset: int
    next_offset: int
    sealed: bool


@dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    """A named, durable cursor over a topic's streams."""

    name: str
    topic: str
    filter: str | None
    start: StartKind
    start_us: int | None
    created_us: int
    packed: bool = False
    """Its committed offsets are kept together in the subscription's own row
    (one write for all of its streams) rather than a row per stream. For a
    subscription whose cursors one writer at a time reads and commits whole:
    an MQTT session's on a topic. Every cursor operation of `Storage` works
    the same on both; only `advance_cursor`'s per-stream compare-and-set
    (competing workers) needs rows."""


@dataclass(frozen=True, slots=True)
class KVEntry:
    namespace: str
    key: str
    value: bytes
    version: int


class Storage(Protocol):
    """What every backend provides. All methods are thread-safe.

    Besides the errors each method names, any method may raise `StorageError`
    when the database fails (`StorageUnavailable` when it cannot be reached or
    the connection was lost mid-call; a write that raises it either wrote
    nothing or, if its commit's answer was lost, says that its outcome is
    unknown). After `close()` every method raises `StorageError`.
    """

    url: str
    wakeups: Wakeups
    networked: bool
    """A database server that nodes on other machines may share (PostgreSQL),
    rather than a file of this machine's (SQLite)."""

    def close(self) -> None: ...

    # --- metadata -----------------------------------------------------------
    def meta_version(self) -> int:
        """A counter bumped by every change to topics, storage topics and streams."""
        ...

    def create_topic(
        self,
        topic: TopicRecord,
        partitions: int,
        validate: Callable[[list[TopicRecord]], None],
    ) -> None:
        """Create a topic with generation 0 of `partitions` (K=1).

        `validate(existing_topics)` runs in the transaction and may raise to refuse.
        Raises `AlreadyExists`.
        """
        ...

    def get_topic(self, name: str) -> TopicRecord:
        """Raises `TopicNotFound`."""
        ...

    def list_topics(self) -> list[TopicRecord]: ...

    def update_topic(
        self, name: str, retention_us: int | None, retention_policy: RetentionPolicy
    ) -> TopicRecord: ...

    def set_topic_limits(
        self, name: str, max_age_us: int | None, max_messages: int | None
    ) -> TopicRecord:
        """Set the age and count limits retention applies regardless of
        subscriptions (None: none); `max_bytes` stays as it is (`alter_topic`
        sets every limit). Raises `TopicNotFound`."""
        ...

    def alter_topic(self, name: str, change: Callable[[TopicRecord], TopicRecord]) -> TopicRecord:
        """Change a topic's retention and limits: `change(current)` runs in the
        transaction and returns the record to store, of which only
        `retention_us`, `retention_policy`, `max_age_us`, `max_messages`,
        `max_bytes` and `key_mode` are written. Returns the stored record. Raises
        `TopicNotFound`; whatever `change` raises leaves the topic as it was."""
        ...

    def delete_topic(self, name: str) -> int:
        """Delete the topic, its streams, messages and subscriptions; return messages
        deleted. Raises `TopicNotFound`."""
        ...

    def list_storage_topics(self, topic: str) -> list[StorageTopicRecord]:
        """Generations in order. Raises `TopicNotFound`."""
        ...

    def add_storage_topic(
        self, topic: str, plan: Callable[[StorageTopicRecord], tuple[int, int]]
    ) -> StorageTopicRecord:
        """seed 003 AddStorageTopic: `plan(last_generation) -> (partitions, K)`."""
        ...

    def switch_produce(self, topic: str) -> TopicRecord:
        """seed 003 SwitchProduce: move the pointer on (staying at the last index)
        and seal every stream of an earlier generation, atomically with appends."""
        ...

    def list_streams(self, topic: str | None = None) -> list[StreamHead]:
        """Heads of every stream (of one topic), ordered by topic, generation, partition."""
        ...

    # --- messages -----------------------------------------------------------
    def append(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int]:
        """Append rows to streams in one transaction; return each stream's first
        new offset. Raises `StreamSealed` (writing nothing) if any stream is sealed
        or gone."""
        ...

    @property
    def appends_inline(self) -> bool:
        """Whether `try_append` can commit at all (without a server round trip)."""
        ...

    def commits_elsewhere(self) -> int | None:
        """A number that stays the same until a connection other than this
        thread's commits (SQLite: `PRAGMA data_version` on this thread's
        connection): what this thread read and committed since it last asked
        is all there is while it has not changed. None where the backend
        cannot say (PostgreSQL)."""
        ...

    def try_append(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int] | None:
        """`append` on the calling thread if it can commit without waiting for
        another writer; None, with nothing written, if it would have to wait (or
        if this backend's commits always wait on a server: PostgreSQL). Lets an
        event loop commit small batches itself instead of handing them to a
        writer thread and back, without ever blocking on a lock."""
        ...

    def append_once(
        self, marker: str, batches: Mapping[int, Sequence[Row]]
    ) -> dict[int, int] | None:
        """`append`, idempotent: record `marker` in the same transaction as the rows.

        If `marker` was recorded before, write nothing and return None; an empty
        `batches` records the marker alone. Raises `StreamSealed` (writing nothing,
        the marker neither) if any stream is sealed or gone.
        """
        ...

    def delete_markers(self, before_us: int) -> int:
        """Forget markers recorded before `before_us` (µs since the epoch); return
        how many. A writer repeating an attempt older than that writes again."""
        ...

    def delete_marker(self, marker: str) -> bool:
        """Forget one marker; True if it was recorded. (An MQTT QoS 2 packet id
        that PUBREL released.)"""
        ...

    def delete_markers_with_prefix(self, prefix: str) -> int:
        """Forget every marker starting with `prefix`; return how many. (The QoS 2
        markers of a session that ended.)"""
        ...

    def read(self, stream_key: int, offset: int, limit: int) -> list[StoredMessage]:
        """Up to `limit` messages of a stream from `offset` on, in offset order.
        Raises `InvalidOffset` for a negative offset, `InvalidInput` for a limit
        below 1."""
        ...

    def read_arrow(
        self,
        stream_key: int,
        start: int,
        end: int,
        *,
        key: str | None = None,
        since_us: int | None = None,
        until_us: int | None = None,
    ) -> pyarrow.Table:
        """The messages of a stream with `start <= offset < end`, in offset order, as
        one Arrow table with the columns of `ARROW_SCHEMA` (needs pyarrow, the
        `riverbed[spark]` extra). Optionally only those with this key and a
        timestamp in `[since_us, until_us)`. Deterministic for a range: what a
        retried Spark task reads again. Raises `InvalidOffset` for a negative
        start."""
        ...

    def first_offset_at(self, stream_key: int, timestamp_us: int) -> int:
        """The first offset whose timestamp is at or after `timestamp_us` (the
        stream's next offset if none)."""
        ...

    def first_offset_within_bytes(self, stream_key: int, max_bytes: int) -> int:
        """The first offset from which the stream's newest messages' payloads add
        up to at most `max_bytes`; the newest message's offset if it alone is
        larger (the stream's next offset if it holds none). Reads the sizes from
        the newest message down, so it costs what it keeps, not what precedes."""
        ...

    def delete_before(self, stream_key: int, offset: int, *, keep_uncommitted: bool = False) -> int:
        """Delete the stream's messages below `offset`; return how many.

        With `keep_uncommitted`, never past the lowest offset a subscription of
        the stream's topic has committed, checked in the deleting transaction (a
        subscription created after the caller computed `offset` keeps its
        messages)."""
        ...

    # --- subscriptions ------------------------------------------------------
    def create_subscription(
        self,
        record: SubscriptionRecord,
        initial: Callable[[list[StreamHead]], dict[int, int]],
    ) -> None:
        """Create a subscription; `initial(heads of its topic)` gives the first
        committed offsets, computed in the same transaction. Raises
        `AlreadyExists`, `TopicNotFound`."""
        ...

    def get_subscription(self, name: str) -> SubscriptionRecord:
        """Raises `SubscriptionNotFound`."""
        ...

    def list_subscriptions(
        self, topic: str | None = None, *, named_only: bool = False
    ) -> list[SubscriptionRecord]:
        """Every subscription (of `topic`), by name. `named_only`: not the
        cursors the broker keeps under `$` names (its sessions' and shared
        groups'), which a broker with many sessions has by the thousand."""
        ...

    def delete_subscription(self, name: str) -> None: ...

    def get_cursors(self, name: str) -> dict[int, int]:
        """Committed offsets by stream key (streams never committed are absent)."""
        ...

    def find_cursors(self, name: str) -> dict[int, int] | None:
        """`get_cursors`, and None if there is no such subscription: whether it
        exists and where it is, in one read."""
        ...

    def find_cursors_many(self, names: Sequence[str]) -> dict[str, dict[int, int]]:
        """`find_cursors` of several subscriptions in one read: those that exist,
        by name (a name with no subscription is absent)."""
        ...

    def commit_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        """Set committed offsets; an offset never moves backwards here (use
        `reset_cursors` to rewind)."""
        ...

    def reset_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        """Replace all committed offsets of a subscription."""
        ...

    def min_cursors(self, topic: str) -> dict[int, int]:
        """For each stream of `topic`, the lowest offset any subscription has
        committed (streams some subscription has not committed at all map to -1)."""
        ...

    # --- key-value with preconditions ---------------------------------------
    def kv_get(self, namespace: str, key: str) -> KVEntry | None: ...

    def kv_get_many(self, namespace: str, keys: Sequence[str]) -> dict[str, KVEntry]:
        """`kv_get` of several keys in one read: the entries found, by key."""
        ...

    def kv_list(self, namespace: str, prefix: str = "") -> list[KVEntry]: ...

    def kv_page(self, namespace: str, after: str | None, limit: int) -> list[KVEntry]:
        """At most `limit` entries of `namespace` whose keys come after `after`
        (None: from the first), in key order: `kv_list` a page at a time, for
        a reader of many keys that need not hold them all at once."""
        ...

    def kv_count(self, namespace: str) -> int:
        """How many keys `namespace` holds (without reading their values)."""
        ...

    def kv_any(self, namespace: str, prefix: str = "") -> bool:
        """Whether some key of `namespace` starts with `prefix` (one index
        look-up, no value read)."""
        ...

    def kv_put(self, namespace: str, key: str, value: bytes) -> KVEntry:
        """Unconditional write; the version goes up by one."""
        ...

    def kv_put_if_absent(self, namespace: str, key: str, value: bytes) -> KVEntry:
        """Create with version 1. Raises `PreconditionFailed` if present."""
        ...

    def kv_compare_and_set(
        self, namespace: str, key: str, expected_version: int, value: bytes
    ) -> KVEntry:
        """Write if the stored version is `expected_version`. Raises
        `PreconditionFailed` otherwise (also if absent)."""
        ...

    def kv_delete_if_version(self, namespace: str, key: str, expected_version: int) -> None:
        """Raises `PreconditionFailed` if absent or at another version."""
        ...


class Hearing(Enum):
    """What a storage's wake-ups say of other processes' commits (`Wakeups.hearing`)."""

    MIXED = "mixed"
    """They wake readers, but so do this process's own: they cannot be told apart
    (SQLite's watcher sees that the file changed, not who changed it)."""
    APART = "apart"
    """They wake readers at once and are told apart (`Wakeups.others`): PostgreSQL
    while its LISTEN connection is up."""
    DEAF = "deaf"
    """Nothing tells of them now (PostgreSQL while its LISTEN connection is
    down): a reader that needs them must look for itself."""


class Wakeups:
    """Tells readers that something was appended, in this process or another.

    A single counter bumped after each commit; a reader remembers the value it
    last saw and waits for it to change, then re-reads the heads it cares about
    (a small table). Backends bump it after their own commits and from a watcher
    of other processes' commits.

    The watcher starts on the first wait. A watcher that costs something while it
    runs (SQLite polls) may stop once nobody has waited for a while
    (`watcher_may_stop`); the next wait starts it again. A watcher notifies once
    when it starts: a commit between a reader's look at the heads and its wait
    would otherwise go unnoticed. A wait may say how late it can hear of another
    process's commit (`latency`); a polling watcher polls as often as the most
    demanding wait asks (`poll_interval`).

    A backend that can tell other processes' commits from its own says so
    (`hearing`, `notify(others=True)`): those bump a second counter too
    (`others`), which `wait_others_async` waits on, and may say which streams
    they moved and to where (`heads`, gathered until `take` hands them over). A
    reader that learns of its own process's commits some other way (the
    broker's router) can then answer other processes' commits at once, without
    reading the heads table when it was told them, and pace its looks for the rest.
    """

    def __init__(self, start_watcher: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._start_watcher = start_watcher
        self._watching = False
        self._waiting = 0
        """Waits in progress, blocking or async."""
        self._latencies: list[float | None] = []
        """The `latency` of each wait in progress."""
        self._resting: float | None = None
        """The `latency` of the last wait that ended: between waits, the pace."""
        self._last_wait = time.monotonic()
        """When a wait last began or ended."""
        self._others = 0
        self._others_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._heads: dict[int, int] | None = {}
        """Stream key -> next offset, as told by others' commits since the last
        `take`; None once one did not say (look at every head)."""
        self.hearing = Hearing.MIXED
        """What these wake-ups say of other processes' commits now; the backend's
        watcher keeps it up to date."""

    @property
    def version(self) -> int:
        return self._version

    @property
    def others(self) -> int:
        """A counter bumped by each commit known to be another process's (only
        while `hearing` is APART)."""
        return self._others

    def notify(self, *, others: bool = False, heads: Mapping[int, int] | None = None) -> None:
        """Something was committed; `others`: by another process (a backend
        that hears them APART), which moved the streams in `heads` (stream key
        -> next offset) to there; None: it did not say what it moved."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
            if others:
                self._others += 1
                waiters += self._others_waiters
                self._others_waiters = []
                told = self._heads
                if heads is None:
                    self._heads = None
                elif told is not None:
                    for key, head in heads.items():
                        if head > told.get(key, -1):
                            told[key] = head
        if not waiters:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, future in waiters:
            if loop is here:
                # A commit on the waiting loop's own thread (SQLite's inline
                # appends): no wake-up through its self-pipe, a write and a
                # read of it per commit.
                loop.call_soon(_resolve, future)
            elif not loop.is_closed():
                # A loop closed since its wait began has nobody left to tell;
                # one closing meanwhile refuses: the committer's work is done.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_resolve, future)

    def take(self) -> tuple[int, int, dict[int, int] | None]:
        """(`version`, `others`, the heads others' commits told of since the
        last `take`, None if one did not tell), at one moment; the heads are
        handed over (the next `take` tells only of later commits)."""
        with self._cond:
            heads, self._heads = self._heads, {}
            return self._version, self._others, heads

    def _enter_wait(self, latency: float | None) -> None:
        # Counting the waiter and checking the watcher under one lock: a watcher
        # deciding to stop either sees this waiter or leaves `_watching` False for
        # this waiter to start a new one.
        starter = self._start_watcher
        with self._cond:
            self._waiting += 1
            self._latencies.append(latency)
            self._last_wait = time.monotonic()
            start = not self._watching and starter is not None
            self._watching = True
        if start and starter is not None:
            try:
                starter()
            except BaseException:
                self.watcher_stopped()
                raise

    def _leave_wait(self, latency: float | None) -> None:
        with self._cond:
            self._waiting -= 1
            self._latencies.remove(latency)
            self._resting = latency
            self._last_wait = time.monotonic()

    def poll_interval(self, default: float) -> float:
        """For a polling watcher: how long to wait before the next look. The
        least `latency` of the waits in progress (None counts as `default`);
        between waits, that of the last one (a reader that rests between its
        waits, like the broker's router, keeps its pace). A wait asking for less
        than the watcher's current pause hears of other processes' commits at
        most that pause late, once."""
        with self._cond:
            latencies = self._latencies or [self._resting]
            return min(
                default if latency is None else max(default, latency) for latency in latencies
            )

    def watcher_may_stop(self, idle: float) -> bool:
        """For a watcher: True when nobody waits and nobody has for `idle` seconds,
        and the watcher must then stop (the next wait starts a new one)."""
        with self._cond:
            if self._waiting or time.monotonic() - self._last_wait < idle:
                return False
            self._watching = False
            return True

    def watcher_stopped(self) -> None:
        """For a watcher that stops for another reason (an error): the next wait
        starts a new one."""
        with self._cond:
            self._watching = False

    def wait(self, seen: int, timeout: float, latency: float | None = None) -> int:
        """Block until the version differs from `seen` or `timeout` passes;
        `latency`: how late this wait may hear of other processes' commits
        (None: as soon as the backend can tell)."""
        try:
            self._enter_wait(latency)
            with self._cond:
                self._cond.wait_for(lambda: self._version != seen, timeout)
                return self._version
        finally:
            self._leave_wait(latency)

    async def wait_async(self, seen: int, timeout: float, latency: float | None = None) -> int:
        """Like `wait`, without blocking the event loop."""
        try:
            self._enter_wait(latency)
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            with self._cond:
                if self._version != seen:
                    return self._version
                self._waiters.append((loop, future))
            try:
                await _resolved(future, timeout)
            finally:  # timed out, or given up (cancelled): no longer a waiter
                with self._cond:
                    if (loop, future) in self._waiters:
                        self._waiters.remove((loop, future))
            return self._version
        finally:
            self._leave_wait(latency)

    async def wait_others_async(self, seen: int, timeout: float) -> int:
        """Wait until `others` differs from `seen` or `timeout` passes; return
        `others`. Not a wait for the watcher (it neither starts it nor sets its
        pace): it rests between the reader's waits."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._others != seen:
                return self._others
            self._others_waiters.append((loop, future))
        try:
            await _resolved(future, timeout)
        finally:  # timed out, or given up (cancelled): no longer a waiter
            with self._cond:
                if (loop, future) in self._others_waiters:
                    self._others_waiters.remove((loop, future))
        return self._others


async def _resolved(future: asyncio.Future[None], timeout: float) -> None:
    """Wait for `notify` to resolve `future`, at most `timeout`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(future, timeout)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def chunked(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
