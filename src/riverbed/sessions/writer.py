"""Group commit for session writes: many connections' saves in one
transaction, like the commit pacer does for messages.

A broker whose clients all come back at once (a network blip, a restart) has
every connection write its session record at CONNECT, its subscriptions and
new cursors at SUBSCRIBE and a checkpoint at DISCONNECT. One transaction each
costs a commit (an fsync on PostgreSQL, the write lock on SQLite) per write;
`SessionWriter` runs them on one thread instead, taking every write queued
while the previous transaction committed into the next one. Each caller gets a
`concurrent.futures.Future` answered once its write is durable (committed), so
a CONNACK or SUBACK still goes out only after the state it promises is stored.

Every write keeps its own rules, as `SessionStore` applies them one at a time:

- a record write is a compare-and-set on the version its connection read
  (`PreconditionFailed` for that write alone, the others commit);
- a checkpoint writes the record, then moves the cursors forward (never back),
  skipping topics whose cursor has gone; one that saves a session at its
  disconnect then reads all the session's cursors back, in the same
  transaction, and once it has committed the store keeps record and cursors
  for the session's resume (`SessionStore.keep_resumable`);
- a resume that took those writes its record only if the stored bytes are
  still the ones kept (`expected`);
- the cursors of topics a SUBSCRIBE newly reaches are made in the same
  transaction as the record naming them, after its compare-and-set succeeded;
- a write that records a shared group's QoS 2 messages as released holds the
  lending keys of their streams first (`holds`; `LentElsewhere` for that
  write alone if a stream was lent since, `sharedsub/claims.py`).

On an embedded database (SQLite), a write submitted on the thread that asked
for it (`commit_here`: the broker's event loop) while the writer's thread has
nothing to do is committed there and then (`transaction_now`), unless another
connection holds the write lock: one client creating its session waits for
three commits, and two hand-overs to a thread and back each cost it more than
the commit itself. The loop's later writes in the same turn (clients coming
back together: one turn reads many CONNECTs) wait for the end of the turn and
commit together, in one transaction on the loop, as the commit pacer does for
messages. Writes that come while the thread is busy queue for it and share its
next transaction, as before.

A batch that fails as a whole in the database (not a refused compare-and-set)
is run again write by write, so one connection's bad write never fails
another's. A lost connection is not retried: a COMMIT whose outcome is unknown
must not be repeated, and every write of the batch gets the error.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace

from riverbed.clock import now_us
from riverbed.errors import (
    AlreadyExists,
    LentElsewhere,
    PreconditionFailed,
    RiverbedError,
    StorageBusy,
    StorageError,
    StorageFull,
    StorageUnavailable,
)
from riverbed.sessions.store import (
    NAMESPACE,
    MadeCursors,
    SessionRecord,
    SessionStore,
    Stored,
    cursor_name,
)
from riverbed.storage.base import StreamHead
from riverbed.storage.transactions import (
    Transaction,
    commit_cursors_in,
    commits_now,
    create_subscription_in,
    find_cursors_many_in,
    kv_delete_if_version_in,
    kv_hold_in,
    kv_write_in,
    storage_error,
    transaction,
    transaction_now,
)

MAX_BATCH = 500
"""Writes in one transaction at most (a storm of 5,000 reconnects makes a few
transactions of this size, each short enough not to hold the write lock long)."""


@dataclass(frozen=True, slots=True)
class NewCursors:
    """Cursors to make with a record write: on `topics`, from `start_us` (None:
    the heads), or from `offsets` for the streams named there
    (`SessionStore.ensure_cursors`)."""

    topics: tuple[str, ...]
    start_us: int | None
    offsets: Mapping[int, int] | None = None


@dataclass(frozen=True, slots=True)
class _Write:
    """A record written as given (compare-and-set on `version`; None: create)."""

    record: SessionRecord
    version: int | None
    cursors: NewCursors | None
    also: Sequence[tuple[str, str, bytes]] = ()
    holds: Sequence[tuple[str, str, int]] = ()
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """`SessionStore.commit`: the record with `seen_us` and `sent`, then the cursors."""

    stored: Stored
    cursors: Mapping[str, Mapping[int, int]]
    sent: Mapping[int, int]
    at_us: int | None


@dataclass(frozen=True, slots=True)
class _Discard:
    """The record deleted if still at `stored.version` (its cursors and
    markers are the caller's to drop: `SessionStore.drop_state`)."""

    stored: Stored


_Op = _Write | _Checkpoint | _Discard


class SessionWriter:
    """Writes session records (and the cursors that go with them) for many
    connections, in as few transactions as the database's speed allows.

    Thread-safe; its one thread starts with the first write (`autostart`
    False: with `start`, so a test can queue writes first). `close` answers
    what is queued, then stops it.
    """

    def __init__(
        self, store: SessionStore, *, max_batch: int = MAX_BATCH, autostart: bool = True
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self._autostart = autostart
        self._queue: deque[tuple[_Op, Future[Stored]]] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._idle = False
        """The thread waits for writes (else it is writing, or not started)."""
        self.transactions = 0
        """Transactions committed so far (for tests and benchmarks)."""
        self.writes = 0
        """Writes answered so far."""
        self.written_here = 0
        """Of `writes`, those committed on the thread that submitted them."""
        self._here: int | None = None
        """The thread whose writes may commit there (`commit_here`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop running on `_here`, if any: its turns batch writes."""
        self._turn: list[tuple[_Op, Future[Stored]]] | None = None
        """Writes submitted on the loop since one committed there in this turn
        of it; committed together at the end of the turn (`_end_turn`)."""

    # --- what callers ask for ------------------------------------------------
    def write(
        self,
        record: SessionRecord,
        version: int | None,
        cursors: NewCursors | None = None,
        *,
        also: Sequence[tuple[str, str, bytes]] = (),
        holds: Sequence[tuple[str, str, int]] = (),
        expected: bytes | None = None,
    ) -> Future[Stored]:
        """Create (`version` None) or compare-and-set the record; with `cursors`,
        make those in the same transaction (once the record is written), and
        so the KV entries `also` names (namespace, key, value; one that exists
        already is left as it is). The future fails with `PreconditionFailed`
        if another writer got there first, or with `LentElsewhere` if a KV key
        `holds` names (namespace, key, version) is at another version (a
        shared group's stream lent since); nothing of this write is stored then.
        `expected`: the bytes the record must still be at `version`
        (`PreconditionFailed` otherwise; a version alone comes back when a
        record is deleted and made again)."""
        return self._submit(_Write(record, version, cursors, also, holds, expected))

    def commit(
        self,
        stored: Stored,
        cursors: Mapping[str, Mapping[int, int]],
        sent: Mapping[int, int],
        at_us: int | None = None,
    ) -> Future[Stored]:
        """A checkpoint, as `SessionStore.commit` makes it."""
        return self._submit(_Checkpoint(stored, cursors, sent, at_us))

    def discard(self, stored: Stored) -> Future[Stored]:
        """Delete the session's record if it is still at `stored.version`
        (`PreconditionFailed` otherwise); answered with `stored`. In turn with
        the other writes: a session ended by a DISCONNECT is gone before what
        is written after it (`SessionStore.discard` does it all, cursors
        included, on the calling thread)."""
        return self._submit(_Discard(stored))

    def commit_here(self) -> None:
        """Let writes submitted on the calling thread (an event loop's) commit
        there when the writer's thread is idle and the database is free
        (embedded databases only; elsewhere a no-op)."""
        if commits_now(self.store.storage):
            self._here = threading.get_ident()
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None  # no loop: each write commits on its own

    def writes_wait(self) -> bool:
        """Whether a write submitted now on the calling thread would wait (for
        the end of the loop's turn, or for the writer's thread) rather than
        commit at once (`commit_here`)."""
        return self._here != threading.get_ident() or self._turn is not None or not self._free()

    def gather_turn(self) -> None:
        """Have the writes submitted on the loop's thread from now to the end
        of this turn of the loop commit together at its end, in the order
        submitted, none at once: one submitted now is ahead of whatever a
        later callback of the turn submits, and its commit does not hold up
        the callbacks before the turn's end. (Elsewhere writes queue in the
        order submitted anyway.)"""
        if self._turn is None and self._loop is not None and self._here == threading.get_ident():
            self._turn = []
            self._loop.call_soon(self._end_turn)

    def start(self) -> None:
        """Start the thread (done by the first write unless `autostart` is False)."""
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="riverbed-session-writer", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        """Answer everything queued, then stop the thread."""
        with self._wake:
            if self._here == threading.get_ident() and self._turn:
                # The loop's own thread: its turn's writes are answered with
                # the queue. (Another thread leaves them to the end of the
                # turn, which answers them with an error once closed.)
                self._queue.extend(self._turn)
                self._turn = None
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        else:
            self._run()  # never started: answer what was queued here

    def _submit(self, op: _Op) -> Future[Stored]:
        future: Future[Stored] = Future()
        if self._here is not None and self._here == threading.get_ident():
            if self._turn is not None:
                self._turn.append((op, future))  # behind the loop's earlier ones
                return future
            if self._now(op, future):
                if self._loop is not None:
                    self._turn = []
                    self._loop.call_soon(self._end_turn)
                return future
        self._enqueue([(op, future)])
        return future

    def _enqueue(self, writes: Sequence[tuple[_Op, Future[Stored]]]) -> None:
        """Hand `writes` to the writer's thread, behind what is queued."""
        with self._wake:
            if self._closed:
                for _, future in writes:
                    _answer(future, StorageError("the session writer is closed"))
                return
            self._queue.extend(writes)
            if self._idle:
                # Only a waiting thread needs waking: a busy one takes the
                # queue when its transaction ends (and each wake-up costs the
                # event loop a hand-over of the GIL).
                self._wake.notify()
        if self._autostart and self._thread is None:
            self.start()

    def _free(self) -> bool:
        """Nothing queued or being written by the thread (a write committed
        here cannot overtake an earlier one of its connection)."""
        with self._wake:
            return not self._closed and not self._queue and (self._thread is None or self._idle)

    def _now(self, op: _Op, future: Future[Stored]) -> bool:
        """Commit `op` on this thread if the thread is free and the database
        is; False if it must queue."""
        if not self._free():
            return False
        try:
            self._write_batch([(op, future)], now=True)
        except StorageBusy:
            return False
        return True

    def _end_turn(self) -> None:
        """The writes of the loop's turn, in one transaction on the loop if
        the thread and the database are free, else queued for the thread."""
        batch, self._turn = self._turn, None
        if not batch:
            return
        if self._free():
            try:
                self._write_batch(batch, now=True)
                return
            except StorageBusy:
                pass
            except Exception as exc:  # a bug: fail its writes, as the thread does
                for _, future in batch:
                    _answer(future, exc)
                return
        self._enqueue(batch)

    # --- the thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._idle = True
                    self._wake.wait()
                    self._idle = False
                if not self._queue:
                    return
                take = min(len(self._queue), self.max_batch)
                batch = [self._queue.popleft() for _ in range(take)]
            try:
                self._write_batch(batch)
            except Exception as exc:  # a bug: fail its writes, keep the thread
                for _, future in batch:
                    _answer(future, exc)

    def _write_batch(
        self, batch: Sequence[tuple[_Op, Future[Stored]]], *, now: bool = False
    ) -> None:
        """`batch` in one transaction, its futures answered. `now`: on the
        calling thread without waiting for the write lock (`StorageBusy`, and
        nothing of `batch` is written or answered)."""
        try:
            outcomes = self._transaction([op for op, _ in batch], now=now)
        except (StorageUnavailable, StorageFull) as exc:
            # Unreachable (the outcome of the COMMIT may be unknown: never
            # repeat it), or refusing writes (full, read-only): every write
            # gets the error, and the connections refuse what waited for it.
            for _, future in batch:
                _answer(future, exc)
            return
        except RiverbedError as exc:
            if now and isinstance(exc, StorageBusy):
                raise
            if len(batch) == 1:
                _answer(batch[0][1], exc)
                return
            for i, one in enumerate(batch):
                try:
                    self._write_batch([one], now=now)
                except StorageBusy:
                    self._enqueue(batch[i:])  # the rest, still in order
                    return
            return
        self.transactions += 1
        self.writes += len(batch)
        if now:
            self.written_here += len(batch)
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            _answer(future, outcome)

    def _transaction(
        self, ops: Sequence[_Op], *, now: bool = False
    ) -> list[Stored | RiverbedError]:
        """All of `ops` in one transaction (`now`: one that does not wait for
        the write lock, `StorageBusy`): per op, what it wrote or why it was
        refused (a refusal writes nothing of that op)."""
        outcomes: list[Stored | RiverbedError] = []
        saved: list[tuple[Stored, bytes]] = []
        cursors: dict[str, dict[int, int]] = {}
        storage = self.store.storage
        try:
            with (transaction_now if now else transaction)(storage) as tx:
                for op in ops:
                    try:
                        outcomes.append(self._apply(tx, op, saved))
                    except PreconditionFailed as exc:
                        outcomes.append(exc)
                if saved:
                    # Only a client's last save of the batch stands.
                    last = {o.record.client_id: o for o in outcomes if isinstance(o, Stored)}
                    saved = [(st, raw) for st, raw in saved if last[st.record.client_id] is st]
                    cursors = find_cursors_many_in(
                        tx,
                        [
                            cursor_name(stored.record.session_id, topic)
                            for stored, _ in saved
                            for topic in stored.record.topics
                        ],
                    )
        except RiverbedError:
            raise
        except Exception as exc:  # the database's driver, from a statement
            raise storage_error(storage, exc) from exc
        for stored, raw in saved:  # committed: as the transaction left them
            self.store.keep_resumable(stored, raw, cursors)
        return outcomes

    def _apply(self, tx: Transaction, op: _Op, saved: list[tuple[Stored, bytes]]) -> Stored:
        """`op` in `tx`; a session saved at its disconnect goes to `saved` with
        its bytes (its cursors are read back once all of `tx`'s ops are in)."""
        match op:
            case _Write(record, version, cursors, also, holds, expected):
                for namespace, key, held in holds:  # before anything is written
                    if not kv_hold_in(tx, namespace, key, held):
                        raise LentElsewhere(
                            f"key {namespace}/{key} is not at version {held} any more"
                        )
                written, _ = _put(tx, record, version, self.store, expected)
                if cursors is not None:
                    made = self._make_cursors(tx, record.session_id, cursors)
                    written = Stored(written.record, written.version, made)
                for namespace, key, value in also:
                    kv_write_in(tx, namespace, key, value, None)
                return written
            case _Checkpoint(stored, cursors, sent, at_us):
                record = replace(stored.record, seen_us=at_us or now_us(), sent=dict(sent))
                written, raw = _put(tx, record, stored.version, self.store)
                for topic, offsets in cursors.items():
                    # A topic the session stopped reaching may have lost its
                    # cursor since this checkpoint was taken: nothing to keep
                    # (`commit_cursors_in` writes nothing then).
                    commit_cursors_in(tx, cursor_name(record.session_id, topic), offsets)
                if not record.connected and self.store.resumable_max > 0:
                    saved.append((written, raw))
                return written
            case _Discard(stored):
                client_id = stored.record.client_id
                assert stored.version is not None
                self.store.forget_resumable(client_id)
                if not kv_delete_if_version_in(tx, NAMESPACE, client_id, stored.version):
                    raise PreconditionFailed(
                        f"key {NAMESPACE}/{client_id} is not at version {stored.version}"
                    )
                return stored

    def _make_cursors(
        self, tx: Transaction, session_id: str, cursors: NewCursors
    ) -> dict[str, MadeCursors]:
        """Make the session's cursors on `cursors.topics` (a topic it has one on
        already keeps it); return those made, with the topic's shape as this
        transaction read it (the connection follows them without reading it
        again)."""
        made: dict[str, MadeCursors] = {}
        for topic in cursors.topics:
            record, initial = self.store.new_cursor(
                session_id, topic, cursors.start_us, cursors.offsets
            )
            placed: list[tuple[list[StreamHead], dict[int, int]]] = []

            def place(
                heads: list[StreamHead],
                initial: Callable[[list[StreamHead]], dict[int, int]] = initial,
                placed: list[tuple[list[StreamHead], dict[int, int]]] = placed,
            ) -> dict[int, int]:
                offsets = initial(heads)
                placed.append((heads, offsets))
                return offsets

            try:  # refused before it writes anything if the name exists
                generations = create_subscription_in(tx, record, place)
            except AlreadyExists:
                continue
            heads, committed = placed[0]
            made[topic] = MadeCursors(generations, heads, committed)
        return made


async def outcome_of(future: Future[Stored]) -> Stored:
    """What a write came to, for a coroutine: at once when it committed on the
    calling loop's thread (`SessionWriter.commit_here`: the future is done
    before `write` returns), else once it is answered: on the loop's thread
    (the end of the turn) without waking the loop from outside, from the
    writer's thread through `call_soon_threadsafe`.

    Not `asyncio.wrap_future`: it wakes the loop through its self-pipe even
    from the loop's own thread, and a cancelled waiter cancels the write's
    future, which the writer then could not answer (the write is made all
    the same: a caller that gives up does not take it back)."""
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Stored] = loop.create_future()
    here = threading.get_ident()

    def answered(done: Future[Stored]) -> None:
        if threading.get_ident() == here:
            _pass_on(done, waiter)
        else:
            loop.call_soon_threadsafe(_pass_on, done, waiter)

    future.add_done_callback(answered)
    return await waiter


def _answer(future: Future[Stored], outcome: Stored | BaseException) -> None:
    """Answer a write's future unless it is answered (or was cancelled: a
    caller may give up on it; the others of its batch are answered all the
    same)."""
    try:
        if isinstance(outcome, Stored):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)
    except InvalidStateError:
        pass


def _pass_on(done: Future[Stored], waiter: asyncio.Future[Stored]) -> None:
    if waiter.done():  # its coroutine gave up waiting
        return
    error = done.exception()
    if error is None:
        waiter.set_result(done.result())
    else:
        waiter.set_exception(error)


def _put(
    tx: Transaction,
    record: SessionRecord,
    version: int | None,
    store: SessionStore,
    expected: bytes | None = None,
) -> tuple[Stored, bytes]:
    """The record written (a compare-and-set on `version`, and on the bytes
    `expected` if given), and its bytes."""
    raw = record.to_json()
    written = kv_write_in(tx, NAMESPACE, record.client_id, raw, version, expected)
    if written is None:
        what = "exists already" if version is None else f"is not at version {version}"
        if expected is not None:
            what += " with the bytes saved here"
        raise PreconditionFailed(f"key {NAMESPACE}/{record.client_id} {what}")
    store.remember(record, raw, written)
    return Stored(record, written), raw
