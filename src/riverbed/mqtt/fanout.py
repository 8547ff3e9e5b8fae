"""The fan-out: committed messages to the online sessions that wait for them.

Each session asks for its streams' messages one fetch at a time (`fetch(stream,
offset, limit, sink)`, the runtime side of `sessions.session.Fetch`). The fan-out
answers from where it is cheapest:

- the offset is what the fan-out has routed up to: the fetch waits (the session
  is *live*) and is answered as soon as messages of that stream that its
  filters can match are routed (found through the topic trie, once per message
  for all sessions), with them and the new position. Messages that match none
  of its filters pass it by: its fetch waits on, and routing costs nothing per
  session it does not reach (a fleet of idle subscribers is not woken by every
  commit). Where such a fetch has got to is handed out by `passed`: to every
  session, at most every `pass_interval` seconds while its streams move, so
  that an idle subscription's cursor moves on and does not pin retention, and
  to one session when it asks (at disconnect, before its last checkpoint);
- the offset is within the last `buffer_size` messages routed: answered at once
  from memory;
- it is further back: read from storage (in a worker thread), the session is
  *replaying*.

Per stream the fan-out routes in offset order. Messages this broker committed
arrive with their positions (`committed`); if one lands beyond a gap (another
process appended in between), the gap is read first. Messages committed by
others are found through the storage's wake-ups and the heads table, and read
once for all the sessions waiting on that stream. A stream nobody waits on is
not read at all: its position just moves to the head.

When the storage tells other processes' commits apart (PostgreSQL while its
LISTEN connection is up: another node's commit), one of those makes the fan-out
look at the heads at once; wake-ups by this process's own commits (routed
already, unless they came another way than `committed`) make it look at most
every `poll_interval`. When the storage cannot tell them apart (SQLite) every
wake-up counts the same, paced so; when it hears nothing of others (the LISTEN
connection is down) the fan-out looks every `poll_interval` on its own.

Everything here runs on the event loop; storage calls go to threads, except the
look at the heads of an embedded database (SQLite: a small local read).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from riverbed.errors import RiverbedError
from riverbed.model import StoredMessage, StreamId
from riverbed.storage.base import Hearing, Storage, StreamHead
from riverbed.topics.filters import matches
from riverbed.topics.trie import TopicTrie

log = logging.getLogger(__name__)

Sink = Callable[[int, Sequence[StoredMessage], int], None]
"""`sink(stream, messages, upto)`: the answer to a fetch (see `sessions.Offered`)."""

READ_BATCH = 1000
"""Messages per storage read while catching up."""
READ_AHEAD = 1000
"""Messages per storage read for a replaying session; what it did not ask for
yet answers its next fetches (one read kept per stream)."""
WATCH_TIMEOUT = 1.0
"""Seconds between looks at the heads when no wake-up comes (and the storage
hears other processes' commits)."""
PASS_INTERVAL = 1.0
"""The default `pass_interval`: seconds between two hand-outs of where the
waiting fetches that messages passed by have got to."""
REFRESH_INTERVAL = 0.02
"""The default `poll_interval`: seconds between looks at the heads at most,
however many wake-ups by this process's own commits come; also the pace of
the looks while the storage hears nothing of other processes' commits."""


@dataclass(slots=True)
class _Waiter:
    offset: int
    limit: int
    sink: Sink
    topic_filter: str | None = None
    """Matched against this filter instead of the trie (a lease of a shared
    subscription: its handle is not in the trie)."""


@dataclass(slots=True)
class _Routed:
    key: int
    stream: StreamId
    upto: int
    """Everything below has been routed."""
    buffer: deque[StoredMessage]
    waiters: dict[Hashable, _Waiter] = field(default_factory=dict)
    catching_up: bool = False
    head: int = 0
    """The highest head seen (storage or local commits)."""
    filtered: dict[Hashable, None] | None = None
    """The waiters matched against a filter of their own (not in the trie),
    answered whenever the stream moves; None while there are none."""
    passed: int = 0
    """`upto` at the last hand-out of passed fetches: every waiter is at or
    beyond it (one registered later waits from where the stream was then)."""

    @property
    def base(self) -> int:
        return self.upto - len(self.buffer)


class Fanout:
    """Routes each stream's committed messages, in offset order, to waiting sessions.

    `trie` maps filters to session handles (the same hashables the sessions pass
    to `fetch`); the broker keeps it in step with the online sessions' subscriptions.
    """

    def __init__(
        self,
        storage: Storage,
        trie: TopicTrie[Hashable],
        *,
        buffer_size: int = 4096,
        poll_interval: float = REFRESH_INTERVAL,
        pass_interval: float = PASS_INTERVAL,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval {poll_interval!r} must be more than 0 seconds")
        if not pass_interval > 0:
            raise ValueError(f"pass_interval {pass_interval!r} must be more than 0 seconds")
        self.storage = storage
        self.trie = trie
        self.buffer_size = buffer_size
        self.poll_interval = poll_interval
        self.pass_interval = pass_interval
        self.looks = 0
        """Looks at the heads table so far (`refresh`)."""
        self.told = 0
        """Wake-ups by other processes' commits answered from the heads they told
        of, without a look at the heads table."""
        self._streams: dict[int, _Routed] = {}
        self._waiting: dict[Hashable, int] = {}
        """Handle -> on how many streams it has a waiting fetch: `forget` stops
        looking once it found them all (a broker with many streams)."""
        self._keys: dict[StreamId, int] = {}
        self._ahead: dict[int, tuple[int, list[StoredMessage]]] = {}
        """Stream key -> (offset read from, rows) of its last read for a session."""
        self._reads: dict[int, tuple[int, asyncio.Future[list[StoredMessage]]]] = {}
        """Stream key -> (offset, the read running for a session from there):
        fetches it will cover wait for it instead of reading the same rows
        (sessions resuming at once after a crash, at the same cursors)."""
        self._topics: dict[int, str] = {}
        self._read_at: dict[str, tuple[int, list[int]]] = {}
        """Topic -> (`Storage.commits_elsewhere` when `start_positions` read its
        heads on the event loop, its streams then): while that number stays,
        nothing but this broker's own commits (routed here) moved them."""
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Future[list[StreamHead]] | None = None
        """The heads read running for `refresh` (on a database in a thread)."""
        self._stopping = False
        self.started = False
        self.on_new_streams: Callable[[], None] | None = None
        """Called when streams appear after the start (a topic scaled up or was
        created): sessions may have new streams to follow."""
        self.on_passed: Callable[[Hashable, dict[int, int]], None] | None = None
        """Called every `pass_interval` with each session (handle) whose waiting
        fetches messages passed by, and where they wait from now (`passed`)."""
        self._passed_at = 0.0
        """When the last hand-out of passed fetches was (`time.monotonic`)."""
        self._wanted = asyncio.Event()
        """Set while some session may wait on a stream: the watcher runs."""
        self.start_heads: dict[int, int] = {}
        """Each stream's next offset when the fan-out started (docs/broker.md, DUP)."""

    # --- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        heads = await asyncio.to_thread(self.storage.list_streams)
        self._learn(heads)
        self.started = True
        self._passed_at = time.monotonic()
        self.start_heads = {h.key: h.next_offset for h in heads}
        self._watcher = asyncio.create_task(self._watch(), name="riverbed-fanout-watch")

    async def stop(self) -> None:
        # The flag as well as the cancel: on Python 3.11 `asyncio.wait_for` (inside
        # `Wakeups.wait_async`) can swallow a cancellation that races with its
        # future completing, and the watcher would wait on for ever.
        self._stopping = True
        self._wanted.set()
        tasks = [*self._tasks, *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2 * WATCH_TIMEOUT)

    # --- heads and topology --------------------------------------------------------
    def heads(self) -> dict[int, int]:
        return {key: r.head for key, r in self._streams.items()}

    def topic_of(self) -> dict[int, str]:
        """Stream key -> topic name, for every stream known."""
        return dict(self._topics)

    def _learn(self, heads: Sequence[StreamHead]) -> None:
        new = False
        for h in heads:
            routed = self._streams.get(h.key)
            if routed is None:
                new = True
                self._streams[h.key] = _Routed(
                    h.key,
                    h.stream,
                    h.next_offset,
                    deque(maxlen=self.buffer_size),
                    head=h.next_offset,
                )
                self._keys[h.stream] = h.key
                self._topics[h.key] = h.stream.topic
            elif h.next_offset > routed.head:
                routed.head = h.next_offset
        if new and self.started and self.on_new_streams is not None:
            self.on_new_streams()

    async def refresh(self) -> dict[int, int]:
        """Look at the heads now; route what others appended. Returns the heads."""
        self.looks += 1
        if self.storage.appends_inline:
            # An embedded database: reading the small heads table here costs
            # less than the hand-over to a thread and back (which, 50 times a
            # second under load, cost ~10 µs per message at 2,000 msg/s).
            heads = self.storage.list_streams()
        else:
            # One read for every caller while it runs (a storm of resumes
            # each asked for all the heads): its answer is as of a moment
            # after the call, and heads only move forward.
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.ensure_future(
                    asyncio.to_thread(self.storage.list_streams)
                )
                reading.add_done_callback(self._read_done)
            heads = await asyncio.shield(reading)
        self._look(heads)
        return self.heads()

    def _read_done(self, _reading: object) -> None:
        self._reading = None

    def _look(self, heads: Sequence[StreamHead], *, only_these: bool = False) -> None:
        """Learn `heads` and route what they show: on every stream known, or on
        `heads`' own streams only (`only_these`)."""
        self._learn(heads)
        streams = self._streams
        for routed in (streams[h.key] for h in heads) if only_these else streams.values():
            self._advance(routed)

    def start_positions(self, topics: Sequence[str] | None = None) -> tuple[dict[int, int], bool]:
        """Where a subscription that starts now starts: the head of each stream
        of `topics` (None: of every topic; a message committed after this call
        lands at or beyond it), and whether they are current. On an embedded
        database they are read now, on the event loop (those topics' rows of
        the small heads table, as `refresh` reads them all); otherwise they
        are as last seen, for every stream known: this broker's own commits
        are in them, others' as of the last look, current while the fan-out
        watches (refreshed on every wake-up), possibly old while it does not."""
        if self.storage.appends_inline:
            if topics is None:
                self._look(self.storage.list_streams())
                return self.heads(), True
            return self._read_heads(topics), True
        return self.heads(), self._wanted.is_set()

    def _read_heads(self, topics: Sequence[str]) -> dict[int, int]:
        """`start_positions` on an embedded database: the topics' heads as read
        from the heads table, or as the fan-out holds them when no other
        connection committed since they were last read here (a SUBSCRIBE after
        another then reads nothing: the heads it would read are those it read
        before, moved by this broker's own commits, which `committed` routed).
        A stream made since on this thread's own connection (a topic scaled up
        here) is not among them; the SUBSCRIBE's cursors start such a stream
        from the time it was read (`Following.take`)."""
        version = self.storage.commits_elsewhere()
        read_at = self._read_at
        streams = self._streams
        out: dict[int, int] = {}
        unread: list[str] = []
        for topic in topics:
            known = read_at.get(topic)
            if known is not None and known[0] == version:
                for key in known[1]:
                    out[key] = streams[key].head
            else:
                unread.append(topic)
        if not unread:
            return out
        heads = [h for topic in unread for h in self.storage.list_streams(topic)]
        self._look(heads, only_these=True)
        for h in heads:
            out[h.key] = streams[h.key].head
        if version is not None:
            for topic in unread:
                read_at[topic] = (version, [h.key for h in heads if h.stream.topic == topic])
        return out

    # --- sessions --------------------------------------------------------------------
    def key_of(self, stream: StreamId) -> int | None:
        """The key of a stream the fan-out knows."""
        return self._keys.get(stream)

    def fetch(
        self,
        key: int,
        offset: int,
        limit: int,
        handle: Hashable,
        sink: Sink,
        topic_filter: str | None = None,
    ) -> None:
        """Answer a session's fetch now (from memory), later (when the stream
        moves) or after a storage read; `sink` is called exactly once, unless
        the fetch is cancelled. A waiting fetch is matched through the trie,
        or against `topic_filter` when given."""
        routed = self._streams.get(key)
        if routed is None:
            # A stream we have not seen yet (created since the last look): read it.
            self._spawn(self._read_for(key, offset, limit, sink))
            return
        if offset >= routed.upto:
            self._wait(routed, handle, _Waiter(offset, limit, sink, topic_filter))
            if topic_filter is not None:
                if routed.filtered is None:
                    routed.filtered = {}
                routed.filtered[handle] = None
            if not self._wanted.is_set():
                self._wanted.set()
            if offset > routed.upto or routed.head > routed.upto:
                self._advance(routed)
            return
        if offset >= routed.base:
            start = offset - routed.base
            buffer = routed.buffer
            end = min(len(buffer), start + limit)
            rows = [buffer[i] for i in range(start, end)]
            sink(key, rows, rows[-1].offset + 1 if rows else offset)
            return
        if self._from_read_ahead(key, offset, limit, sink):
            return
        reading = self._reads.get(key)
        if reading is not None and reading[0] <= offset < reading[0] + READ_AHEAD:
            self._spawn(self._after_read(reading[1], key, offset, limit, sink))
            return
        self._spawn(self._read_for(key, offset, limit, sink))

    def fetch_many(
        self, positions: Mapping[int, int], limit: int, handle: Hashable, sink: Sink
    ) -> None:
        """`fetch` of each of these streams from its offset (stream -> offset),
        at most `limit` each (`sessions.session.FetchMany`: a resumed session's
        streams, most of them caught up)."""
        streams = self._streams
        added = 0
        for key, offset in positions.items():
            routed = streams.get(key)
            if routed is not None and offset == routed.upto and routed.head <= offset:
                # Caught up: it waits (the usual case, without `fetch`'s call).
                waiters = routed.waiters
                if handle not in waiters:
                    added += 1
                waiters[handle] = _Waiter(offset, limit, sink)
            else:
                self.fetch(key, offset, limit, handle, sink)
        if added:
            waiting = self._waiting
            waiting[handle] = waiting.get(handle, 0) + added
        if positions and not self._wanted.is_set():
            self._wanted.set()

    def _from_read_ahead(self, key: int, offset: int, limit: int, sink: Sink) -> bool:
        """Answer a replaying session's fetch from the stream's last storage read,
        if that covers `offset`: a session fetches its share of its queue at a
        time, the fan-out reads READ_AHEAD rows at a time."""
        ahead = self._ahead.get(key)
        if ahead is None:
            return False
        start, rows = ahead
        if not rows or not start <= offset <= rows[-1].offset:
            return False
        i = bisect.bisect_left(rows, offset, key=_offset_of)
        taken = rows[i : i + limit]
        sink(key, taken, taken[-1].offset + 1)
        return True

    def _wait(self, routed: _Routed, handle: Hashable, waiter: _Waiter) -> None:
        """`handle`'s fetch waits on `routed` (instead of one it had there)."""
        waiters = routed.waiters
        if handle not in waiters:
            waiting = self._waiting
            waiting[handle] = waiting.get(handle, 0) + 1
        waiters[handle] = waiter

    def _waited(self, handle: Hashable) -> None:
        """One of `handle`'s waiting fetches is gone (answered, cancelled)."""
        waiting = self._waiting
        left = waiting.get(handle, 0) - 1
        if left > 0:
            waiting[handle] = left
        else:
            waiting.pop(handle, None)

    def forget(self, handle: Hashable, streams: Iterable[int] = ()) -> dict[int, int]:
        """Drop a session's waiting fetches (it went offline). Returns where
        those that messages passed by had got to, as `passed` does: the
        session's last checkpoint moves its cursors there. `streams`: where
        they are likely to be (the session's streams); only if some are not
        there are all of the fan-out's streams looked at."""
        left = self._waiting.pop(handle, 0)
        out: dict[int, int] = {}
        if not left:
            return out
        every = self._streams
        for key in streams:
            routed = every.get(key)
            if routed is not None and self._drop(key, routed, handle, out):
                left -= 1
                if not left:
                    return out
        for key, routed in every.items():
            self._drop(key, routed, handle, out)
        return out

    def _drop(self, key: int, routed: _Routed, handle: Hashable, out: dict[int, int]) -> bool:
        """`forget` on one stream; whether `handle` waited there."""
        waiter = routed.waiters.pop(handle, None)
        if waiter is None:
            return False
        if waiter.topic_filter is not None:
            self._unfilter(routed, handle)
        elif waiter.offset < routed.upto:
            out[key] = routed.upto
        return True

    def cancel(self, key: int, handle: Hashable) -> None:
        """Drop a waiting fetch of one stream (a lease given back)."""
        routed = self._streams.get(key)
        if routed is not None and routed.waiters.pop(handle, None) is not None:
            self._waited(handle)
            self._unfilter(routed, handle)

    @staticmethod
    def _unfilter(routed: _Routed, handle: Hashable) -> None:
        filtered = routed.filtered
        if filtered is not None:
            filtered.pop(handle, None)
            if not filtered:
                routed.filtered = None

    def passed(self, handle: Hashable) -> dict[int, int]:
        """Where `handle`'s waiting fetches are, of the streams whose messages
        since passed it by (none matched its filters): stream key -> the
        position routed up to. The fetches wait on from there; the session
        moves its cursors there (`Session.passed`)."""
        out: dict[int, int] = {}
        for key, routed in self._streams.items():
            waiter = routed.waiters.get(handle)
            if waiter is not None and waiter.topic_filter is None and waiter.offset < routed.upto:
                waiter.offset = routed.upto
                out[key] = routed.upto
        return out

    def pass_all(self) -> dict[Hashable, dict[int, int]]:
        """`passed` for every session at once: each handle whose waiting
        fetches messages passed by, with where they wait from now. A stream
        that has not moved since the last call is not looked at."""
        out: dict[Hashable, dict[int, int]] = {}
        for key, routed in self._streams.items():
            upto = routed.upto
            if routed.passed == upto:
                continue
            routed.passed = upto
            for handle, waiter in routed.waiters.items():
                if waiter.offset < upto and waiter.topic_filter is None:
                    waiter.offset = upto
                    mine = out.get(handle)
                    if mine is None:
                        mine = out[handle] = {}
                    mine[key] = upto
        return out

    # --- routing ---------------------------------------------------------------------
    def committed(self, stream: StreamId, first: int, rows: Sequence[StoredMessage]) -> None:
        """Messages this broker committed to `stream` from offset `first` on."""
        key = self._keys.get(stream)
        if key is None:
            self._spawn(self._refresh_quietly())
            return
        routed = self._streams[key]
        end = first + len(rows)
        routed.head = max(routed.head, end)
        if end <= routed.upto:
            return  # read from storage already
        if first > routed.upto:
            self._advance(routed)  # a gap: others appended first; read it in order
            return
        self._route(routed, rows[routed.upto - first :])

    def _route(self, routed: _Routed, rows: Sequence[StoredMessage]) -> None:
        if not rows:
            return
        routed.buffer.extend(rows)
        upto = rows[-1].offset + 1
        routed.upto = upto
        routed.head = max(routed.head, upto)
        waiters = routed.waiters
        if not waiters:
            return
        # One trie match per message for all sessions; a waiting session is
        # answered only when some message can match its filters. The others
        # wait on: their position is handed out later (`passed`), so what a
        # commit costs does not grow with the sessions it does not reach.
        matched: dict[Hashable, list[StoredMessage]] = {}
        match = self.trie.match
        for row in rows:
            for handle in match(row.mqtt_topic):
                if handle in waiters:
                    mine = matched.get(handle)
                    if mine is None:
                        matched[handle] = [row]
                    elif mine[-1] is not row:  # several of its filters match
                        mine.append(row)
        key = routed.key
        for handle, mine in matched.items():
            waiter = waiters[handle]
            offset = waiter.offset
            if offset > mine[0].offset:
                mine = [m for m in mine if m.offset >= offset]
                if not mine:
                    continue
            del waiters[handle]
            self._waited(handle)
            self._answer(key, waiter, mine, upto)
        filtered = routed.filtered
        if filtered is None:
            return
        # A lease's fetch (a shared subscription's stream lent to a session):
        # answered whenever the stream moves, its progress is its group's.
        for handle in list(filtered):
            waiter = waiters[handle]
            if waiter.offset >= upto:
                continue
            del waiters[handle]
            self._waited(handle)
            del filtered[handle]
            pattern = waiter.topic_filter
            assert pattern is not None
            offset = waiter.offset
            mine = [m for m in rows if m.offset >= offset and matches(pattern, m.mqtt_topic)]
            self._answer(key, waiter, mine, upto)
        if not filtered:
            routed.filtered = None

    @staticmethod
    def _answer(key: int, waiter: _Waiter, mine: list[StoredMessage], upto: int) -> None:
        """Answer a waiting fetch with its messages up to `upto`, at most its limit."""
        if len(mine) > waiter.limit:
            upto = mine[waiter.limit].offset
            mine = mine[: waiter.limit]
        waiter.sink(key, mine, upto)

    def _advance(self, routed: _Routed) -> None:
        """Bring the stream to its head: read the gap if anyone waits, else skip it."""
        if routed.head <= routed.upto or routed.catching_up:
            return
        if not routed.waiters:
            routed.buffer.clear()
            routed.upto = routed.head
            return
        routed.catching_up = True
        self._spawn(self._catch_up(routed))

    async def _catch_up(self, routed: _Routed) -> None:
        try:
            while routed.upto < routed.head and routed.waiters:
                start = routed.upto
                rows = await asyncio.to_thread(self.storage.read, routed.key, start, READ_BATCH)
                if routed.upto != start:
                    # Local commits were routed while we read: only what lies past
                    # them is new, and nothing here says anything about what lies
                    # past the read (it was read before the newer head was known).
                    rows = [r for r in rows if r.offset >= routed.upto]
                    if rows:
                        self._route(routed, rows)
                    continue
                if not rows:
                    # Nothing at or after `start` although the head is past it:
                    # retention deleted it all; nothing to route there.
                    routed.upto = routed.head
                    routed.buffer.clear()
                    break
                if rows[0].offset > start:
                    routed.buffer.clear()  # retention deleted up to rows[0]
                    routed.upto = rows[0].offset
                self._route(routed, rows)
        except RiverbedError:
            log.exception("reading stream %s failed; retrying on the next wake-up", routed.stream)
        finally:
            routed.catching_up = False
        if routed.head > routed.upto and not routed.waiters:
            self._advance(routed)

    async def _read_for(self, key: int, offset: int, limit: int, sink: Sink) -> None:
        # Where the stream's routed messages began when the read started: every
        # message below it was committed before the read, so an empty read means
        # retention deleted them. A position learnt during the read says nothing
        # of the sort (the read may predate commits below it).
        known = self._streams.get(key)
        base = known.base if known is not None else None
        read = asyncio.ensure_future(
            asyncio.to_thread(self.storage.read, key, offset, max(limit, READ_AHEAD))
        )
        self._reads[key] = (offset, read)
        try:
            rows = await read
        except RiverbedError:
            log.exception("reading stream %d for a session failed", key)
            rows = []
        finally:
            if self._reads.get(key, (0, None))[1] is read:
                del self._reads[key]
        if rows:
            self._ahead[key] = (offset, rows)
            rows = rows[:limit]
        if rows:
            sink(key, rows, rows[-1].offset + 1)
        elif base is not None and offset < base:
            sink(key, (), base)  # retention deleted the rest
        else:
            if known is None and key not in self._streams:
                # A stream created since the last look: learn it, so the
                # session's next fetch waits for its messages instead of
                # reading storage again and again.
                await self._refresh_quietly()
            sink(key, (), offset)

    async def _after_read(
        self,
        read: asyncio.Future[list[StoredMessage]],
        key: int,
        offset: int,
        limit: int,
        sink: Sink,
    ) -> None:
        """Answer a fetch from the read another fetch of the stream started,
        once it is done; from a read of its own if that did not cover it."""
        with contextlib.suppress(RiverbedError):
            await asyncio.shield(read)  # a failure is the reader's to log
        if not self._from_read_ahead(key, offset, limit, sink):
            await self._read_for(key, offset, limit, sink)

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(RiverbedError):
            await self.refresh()

    async def _watch(self) -> None:
        # Only while some session waits on a stream (`_wanted`). Our own commits
        # wake this too (the storage notifies after each), and `committed` has
        # routed those already: so the watcher looks at the heads table for
        # them at most every `poll_interval`, which bounds its cost under load.
        # Another process's commit ends the rest between looks when the storage
        # tells it apart (`Hearing.APART`), and is answered from the heads it
        # told of when it did (a look at the table otherwise); our own wake-ups
        # meanwhile wait for their look. A storage that cannot tell (MIXED)
        # has every wake-up paced so; one that hears nothing of others (DEAF)
        # is looked at every `poll_interval`. And a look at the whole table at
        # least every WATCH_TIMEOUT, and first thing when sessions wait again
        # (what others told meanwhile was not kept).
        wakeups = self.storage.wakeups
        seen, heard, _ = wakeups.take()
        looked = -WATCH_TIMEOUT
        owed = False  # wake-ups by our own commits not looked at yet
        while not self._stopping:
            if not self._wanted.is_set():
                await self._wanted.wait()
                seen, heard, _ = wakeups.take()
                looked, owed = -WATCH_TIMEOUT, False
            # DEAF or owed: the rest was the pause before a look, look now. The
            # wait all the same: it starts the storage's watcher, which may hear.
            deaf = wakeups.hearing is Hearing.DEAF
            await wakeups.wait_async(
                seen, 0.0 if deaf or owed else WATCH_TIMEOUT, latency=self.poll_interval
            )
            version, others, heads = wakeups.take()
            woken = version != seen
            owed = owed or version - seen > others - heard
            seen, heard = version, others
            if not self._waiting:  # no fetch waits on any stream (counted, not looked for)
                self._wanted.clear()
                continue
            since = time.monotonic() - looked
            try:
                if (
                    woken
                    and heads is not None
                    and since < WATCH_TIMEOUT
                    and not (owed and since >= self.poll_interval)
                    and self._heard(heads)
                ):
                    self.told += bool(heads)
                else:
                    looked, owed = time.monotonic(), False
                    await self.refresh()
            except RiverbedError:
                log.exception("looking at the stream heads failed")
                await asyncio.sleep(WATCH_TIMEOUT)
            if time.monotonic() - self._passed_at >= self.pass_interval:
                self._hand_out_passed()
            # The rest. Only a storage that hears APART counts others' commits
            # (a DEAF one once, when it hears again).
            await wakeups.wait_others_async(heard, self.poll_interval)

    def _hand_out_passed(self) -> None:
        """Tell each session whose waiting fetches messages passed by where
        they wait from now (`on_passed`): its cursors move on."""
        self._passed_at = time.monotonic()
        on_passed = self.on_passed
        if on_passed is None:
            return  # nobody to tell: the fetches stay where the sessions know them
        for handle, positions in self.pass_all().items():
            try:
                on_passed(handle, positions)
            except Exception:
                log.exception("handing out passed positions to %r failed", handle)

    def _heard(self, heads: Mapping[int, int]) -> bool:
        """Move the streams to the heads another process's commits told of; False
        (nothing moved) if one is a stream not known yet: look at them all."""
        if any(key not in self._streams for key in heads):
            return False
        for key, head in heads.items():
            routed = self._streams[key]
            if head > routed.head:
                routed.head = head
                self._advance(routed)
        return True

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _offset_of(row: StoredMessage) -> int:
    return row.offset
