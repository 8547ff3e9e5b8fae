"""Competing consumers: workers share a named subscription by locking its streams
(seed 004, "Subscriptions").

A `Worker` runs seed 004's loop over one subscription:

1. wait for a trigger: the storage's wake-ups (an append, here or in another
   process) or `poll_interval` seconds;
2. read the state: every stream's committed position (`SubscriptionState`);
3. take the streams with messages past their position that lineage order lets us
   read (`riverbed.log.lineage.readable_streams`), ordered by the time of their
   oldest unprocessed message (fairness, not correctness); for each:
   a. try to lock (subscription, stream), skipping it if another worker holds it;
   b. re-validate the position (another worker may have moved it meanwhile);
   c. process up to `batch_size` messages: call the handler once with a `Batch`;
   d. record the new position: a compare-and-set from the position read in b,
      in a transaction that also makes sure the lock is still ours;
   e. unlock.

How the steps map onto transactions depends on the lock service
(`riverbed.storage.locks`). With a `TransactionLocks` (the default on
PostgreSQL: `pg_try_advisory_xact_lock`) one transaction per batch holds a-e:
the lock is taken in it and released by its COMMIT, so the handler runs while
it is open (at least once too: keep handlers short, or pass `locks=` session
locks). With a `PartitionLocks` (the default on SQLite: lease rows with
fencing) the lock is held apart from transactions and step d is a short
transaction of its own, so at least once the handlers of different streams run
in parallel on SQLite too.

Any number of workers, as threads or processes on any machines sharing the
database, run this loop: a stream is handled by one of them at a time, in
offset order, so per-key order holds (DESIGN.md, guarantee 2).

Guarantees (`Guarantee`):

- AT_LEAST_ONCE (default): the handler runs, then the position is recorded. A
  crash or a lost lock between the two makes another worker handle the batch
  again; nothing is skipped. The position's commit does not wait for the disk
  (`transaction(durable=False)`): a database crash may lose the latest
  positions, which again means redelivery.
- EXACTLY_ONCE: the handler runs *inside* the transaction that records the
  position, and writes its own state through it, in the same database::

      def handle(batch: Batch) -> None:
          for m in batch.messages:
              batch.tx.execute("INSERT INTO totals (key, amount) VALUES (?, ?)",
                               (m.key, int(m.payload)))

      Worker(storage, "billing", handle, guarantee=Guarantee.EXACTLY_ONCE).run()

  `batch.tx` is a `riverbed.storage.transactions.Transaction`: `execute` and
  `executemany` with `?` placeholders on both backends, `savepoint` and
  `rollback_to_savepoint`, `connection` for the raw DB-API connection. Its
  writes commit together with the position or not at all, so each message's
  effect is there exactly once, whatever crashes. (What the handler does
  *outside* the transaction, such as an HTTP call, is still at-least-once.) On
  SQLite the transaction holds the database's write lock while the handler
  runs, so handlers of different streams run one at a time there.

Handler errors (`ErrorPolicy`): STOP (default) stops the worker (`run` raises
`HandlerFailed`; the position stays, so the batch is handled again next time);
RETRY handles the batch again after an exponential backoff, holding the stream's
lock (with transaction locks, the open transaction too), `max_attempts` times in
all (None: until it succeeds), then gives up as `give_up` says (STOP or SKIP);
SKIP logs the error and moves past the batch.
Whenever the worker gives up on a batch it calls `on_failure(Failure)` first,
inside the transaction that records the skip: a hook that routes the batch to a
retry or dead-letter queue writes there atomically with the skip. A hook that
raises stops the worker without moving the position. In EXACTLY_ONCE, what a
failed attempt wrote through `batch.tx` is rolled back.

Counting: what became of the messages is in `Worker.stats` (`delivered`,
`retried`, `parked`), and `on_counted` hears of each change: what
`riverbed worker --metrics` serves to Prometheus.

Shutdown: `stop()` (from a signal handler or another thread) lets the batch in
hand finish and record its position, or abandons it unrecorded during a retry
backoff, then `run` returns. Either way nothing is lost.

The two services of seed 004 can be replaced: `state=` (where positions live;
default `CursorState`, the subscription's cursors) and `locks=` (default
`riverbed.storage.locks.default_locks`). A lock service belongs to one worker.
If the subscription is deleted while a worker runs, `run` raises
`SubscriptionNotFound`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from riverbed.errors import HandlerFailed, InvalidInput, StorageError
from riverbed.log.lineage import readable_streams
from riverbed.model import StoredMessage
from riverbed.storage.base import Storage, StorageTopicRecord, StreamHead, SubscriptionRecord
from riverbed.storage.locks import (
    Locks,
    PartitionLock,
    PartitionLocks,
    TransactionLocks,
    default_locks,
)
from riverbed.storage.transactions import (
    Transaction,
    advance_cursor,
    oldest_timestamps,
    sql_storage,
    transaction,
)
from riverbed.subscriptions.committed import committed_positions, refuse_broker_owned
from riverbed.subscriptions.handling import (
    Batch,
    ErrorPolicy,
    Failure,
    Guarantee,
    Handler,
    OnError,
)
from riverbed.topics.filters import matches

logger = logging.getLogger(__name__)

_ATTEMPT = "riverbed_batch"
"""The savepoint a handler's attempt rolls back to (transaction locks, EXACTLY_ONCE)."""


class SubscriptionState(Protocol):
    """Where a subscription's positions live (seed 004, "State")."""

    def positions(self, record: SubscriptionRecord, heads: Sequence[StreamHead]) -> dict[int, int]:
        """The position of every stream of `heads`, streams never recorded included."""
        ...

    def current(self, record: SubscriptionRecord, stream_key: int) -> int | None:
        """The recorded position of one stream, read fresh (None: never recorded)."""
        ...

    def advance(
        self,
        tx: Transaction,
        record: SubscriptionRecord,
        stream_key: int,
        expected: int | None,
        offset: int,
    ) -> bool:
        """In `tx`, record `offset` if the recorded position is still `expected`;
        False if another worker moved it first (the runner rolls back)."""
        ...


class CursorState:
    """The default state: the subscription's own cursors (as `Subscriptions`
    keeps them)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def positions(self, record: SubscriptionRecord, heads: Sequence[StreamHead]) -> dict[int, int]:
        return committed_positions(self.storage, record, heads)

    def current(self, record: SubscriptionRecord, stream_key: int) -> int | None:
        return self.storage.get_cursors(record.name).get(stream_key)

    def advance(
        self,
        tx: Transaction,
        record: SubscriptionRecord,
        stream_key: int,
        expected: int | None,
        offset: int,
    ) -> bool:
        return advance_cursor(tx, record.name, stream_key, expected, offset)


@dataclass(slots=True)
class WorkerStats:
    batches: int = 0
    """Batches whose position was recorded (handled or skipped)."""
    messages: int = 0
    """Messages moved past (filtered-out ones included)."""
    failures: int = 0
    """Handler calls that raised."""
    skipped: int = 0
    """Batches moved past after the handler gave up."""
    abandoned: int = 0
    """Batches left to others: lock lost, or the position moved meanwhile."""
    delivered: int = 0
    """Messages the handler took (its call returned), filtered-out ones not counted."""
    retried: int = 0
    """Messages of failed handler calls tried again (once per retry)."""
    parked: int = 0
    """Messages given up on and moved past (on-error skip, or retry's give-up
    SKIP; a failure hook may have put them in a queue)."""


class _HandlerRaised(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Abandon(Exception):
    """The lock was lost or another worker moved the position: leave the batch."""


def _check_positive_int(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(f"{what} {value!r} must be an integer >= 1")
    return value


class Worker:
    """One competing consumer of a named subscription; see the module docstring.

    Raises `SubscriptionNotFound` for an unknown subscription and `InvalidInput`
    for a bad option or a cursor the broker owns (`refuse_broker_owned`).
    `run()` blocks until `stop()`; `run_once()` is one pass of the loop without
    waiting (returns how many messages it moved past).
    """

    def __init__(
        self,
        storage: Storage,
        subscription: str,
        handler: Handler,
        *,
        batch_size: int = 100,
        guarantee: Guarantee = Guarantee.AT_LEAST_ONCE,
        on_error: ErrorPolicy | None = None,
        state: SubscriptionState | None = None,
        locks: Locks | None = None,
        poll_interval: float = 1.0,
        on_counted: Callable[[WorkerStats], object] | None = None,
    ) -> None:
        sql_storage(storage)
        refuse_broker_owned(subscription, "consumed")
        if not callable(handler):
            raise InvalidInput(f"handler {handler!r} is not callable")
        self.batch_size = _check_positive_int("batch size", batch_size)
        if not isinstance(guarantee, Guarantee):
            raise InvalidInput(
                f"guarantee {guarantee!r} must be Guarantee.AT_LEAST_ONCE or EXACTLY_ONCE"
            )
        if (
            not isinstance(poll_interval, int | float)
            or isinstance(poll_interval, bool)
            or not poll_interval > 0
        ):
            raise InvalidInput(f"poll interval {poll_interval!r}s must be a number > 0")
        self.storage = storage
        self.record = storage.get_subscription(subscription)
        self.handler = handler
        self.guarantee = guarantee
        self.on_error = on_error or ErrorPolicy()
        self.state: SubscriptionState = state or CursorState(storage)
        self._owns_locks = locks is None
        self.locks: Locks = locks or default_locks(storage)
        self._tx_locks: TransactionLocks | None = None
        self._session_locks: PartitionLocks | None = None
        if isinstance(self.locks, TransactionLocks):
            self._tx_locks = self.locks
        else:
            self._session_locks = self.locks
        self.poll_interval = float(poll_interval)
        self.stats = WorkerStats()
        self.on_counted = on_counted
        """Called with `stats` whenever messages were delivered, retried or parked
        (a process's metrics copy them; `riverbed worker --metrics`)."""
        self._stop = threading.Event()
        self._storage_topics: list[StorageTopicRecord] = []
        self._known: frozenset[int] = frozenset()
        self._contended = False

    # ----------------------------------------------------------------- control

    def stop(self) -> None:
        """Ask `run` to return after the batch in hand. Thread-safe; not for a
        signal handler, which would need the locks the interrupted code may hold
        (`riverbed.signals.stop_on_signals` calls it from a thread)."""
        self._stop.set()
        self.storage.wakeups.notify()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkerStats:
        """Run the loop until `stop()`. Raises `HandlerFailed` when the error
        policy says STOP. Storage errors are logged and retried after
        `poll_interval`."""
        try:
            while not self._stop.is_set():
                seen = self.storage.wakeups.version
                try:
                    moved = self.run_once()
                except StorageError as exc:
                    logger.warning("worker of %r: %s; trying again", self.record.name, exc)
                    self._stop.wait(self.poll_interval)
                    continue
                if moved or self._stop.is_set():
                    continue
                if self._contended:
                    # Other workers hold the streams with work; their batches end soon.
                    self._stop.wait(random.uniform(0.002, 0.02))
                else:
                    self.storage.wakeups.wait(seen, self.poll_interval)
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        """Free the lock service if the worker made it."""
        if self._owns_locks:
            self.locks.close()

    # ----------------------------------------------------------------- the loop

    def run_once(self) -> int:
        """One pass of seed 004's loop; how many messages it moved past."""
        self._contended = False
        self.record = self.storage.get_subscription(self.record.name)
        heads = self.storage.list_streams(self.record.topic)
        keys = frozenset(h.key for h in heads)
        if keys != self._known:
            self._storage_topics = self.storage.list_storage_topics(self.record.topic)
            self._known = keys
        positions = self.state.positions(self.record, heads)
        readable, _ = readable_streams(self._storage_topics, heads, positions)
        starts = {
            h.key: max(positions[h.key], h.start_offset)
            for h in readable
            if max(positions[h.key], h.start_offset) < h.next_offset
        }
        if not starts:
            return 0
        pending = [h for h in readable if h.key in starts]
        if len(pending) > 1:
            oldest = oldest_timestamps(sql_storage(self.storage), starts)
            pending.sort(key=lambda h: oldest.get(h.key, 1 << 62))
        moved = 0
        for head in pending:
            if self._stop.is_set():
                break
            if self._tx_locks is not None:
                got = self._process_in_transaction(self._tx_locks, head, positions[head.key])
            else:
                got = self._process_with_lock(head, positions[head.key])
            if got is None:
                self._contended = True
            else:
                moved += got
        return moved

    # --- session locks: lock, handle, record in a transaction of its own, unlock

    def _process_with_lock(self, head: StreamHead, fallback: int) -> int | None:
        assert self._session_locks is not None
        lock = self._session_locks.try_lock(self.record.name, head.key)
        if lock is None:
            return None
        try:
            return self._process(head, lock, fallback)
        finally:
            self._session_locks.unlock(lock)

    def _process(self, head: StreamHead, lock: PartitionLock, fallback: int) -> int:
        # Re-validate: another worker may have moved the position since we read it.
        stored = self.state.current(self.record, head.key)
        batch = self._read(head, stored, fallback, None)
        if batch is None:
            return 0
        try:
            while True:
                try:
                    self._attempt(batch, lock, head.key, stored)
                    return self._done(batch)
                except _HandlerRaised as raised:
                    if self._should_retry(batch, raised.error):
                        batch = replace(batch, attempt=batch.attempt + 1)
                        continue
                    with transaction(self.storage) as tx:
                        failure = self._fail(tx, batch, lock, head.key, stored, raised.error)
                    return self._after_failure(failure)
        except _Abandon:
            self.stats.abandoned += 1
            return 0

    def _attempt(
        self, batch: Batch, lock: PartitionLock, stream_key: int, stored: int | None
    ) -> None:
        if self.guarantee is Guarantee.EXACTLY_ONCE:
            # A transaction per attempt: a failed one rolls back what it wrote.
            with transaction(self.storage) as tx:
                if batch.messages:
                    self._call(replace(batch, transaction=tx))
                self._record(tx, lock, stream_key, stored, batch.end)
            return
        if batch.messages:
            self._call(batch)
        # Not durable: a position lost in a database crash means redelivery, which
        # at least once allows, and not waiting for the disk at each batch is most
        # of the difference in throughput (bench/competing.py).
        with transaction(self.storage, durable=False) as tx:
            self._record(tx, lock, stream_key, stored, batch.end)

    # --- transaction locks: one transaction per batch holds lock, handler, position

    def _process_in_transaction(
        self, locks: TransactionLocks, head: StreamHead, fallback: int
    ) -> int | None:
        exactly_once = self.guarantee is Guarantee.EXACTLY_ONCE
        failure: Failure | None = None
        try:
            with transaction(self.storage, durable=exactly_once) as tx:
                if not locks.try_lock_in(tx, self.record.name, head.key):
                    return None
                stored = self.state.current(self.record, head.key)  # re-validate
                batch = self._read(head, stored, fallback, tx if exactly_once else None)
                if batch is None:
                    return 0
                while batch.messages:
                    # The lock lives as long as the transaction: a failed attempt rolls
                    # back to here, keeping the lock through the backoff.
                    if exactly_once:
                        tx.savepoint(_ATTEMPT)
                    try:
                        self._call(batch)
                        break
                    except _HandlerRaised as raised:
                        if exactly_once:
                            tx.rollback_to_savepoint(_ATTEMPT)
                        if self._should_retry(batch, raised.error):
                            batch = replace(batch, attempt=batch.attempt + 1)
                            continue
                        failure = self._fail(tx, batch, None, head.key, stored, raised.error)
                        break
                if failure is None:
                    self._record(tx, None, head.key, stored, batch.end)
        except _Abandon:
            self.stats.abandoned += 1
            return 0
        if failure is not None:
            return self._after_failure(failure)
        return self._done(batch)

    # --- shared steps

    def _read(
        self, head: StreamHead, stored: int | None, fallback: int, tx: Transaction | None
    ) -> Batch | None:
        """The next batch of the stream from its re-validated position (None: none)."""
        position = max(fallback if stored is None else stored, head.start_offset)
        messages = self.storage.read(head.key, position, self.batch_size)
        if not messages:
            return None
        topic_filter = self.record.filter
        matched: Sequence[StoredMessage] = (
            messages
            if topic_filter is None
            else [m for m in messages if matches(topic_filter, m.mqtt_topic)]
        )
        end = messages[-1].offset + 1
        return Batch(self.record.name, head.stream, matched, position, end, 1, tx)

    def _call(self, batch: Batch) -> None:
        try:
            self.handler(batch)
        except Exception as exc:
            raise _HandlerRaised(exc) from exc

    def _done(self, batch: Batch, parked: bool = False) -> int:
        stats = self.stats
        stats.batches += 1
        stats.messages += batch.end - batch.start
        if parked:
            stats.parked += len(batch.messages)
        else:
            stats.delivered += len(batch.messages)
        self._counted()
        return batch.end - batch.start

    def _counted(self) -> None:
        if self.on_counted is not None:
            self.on_counted(self.stats)

    def _record(
        self,
        tx: Transaction,
        lock: PartitionLock | None,
        stream_key: int,
        stored: int | None,
        end: int,
    ) -> None:
        """Step d of seed 004, fenced twice: a session lock must still be ours, and
        the position must be where we read it (either failing rolls `tx` back)."""
        locks = self._session_locks
        if lock is not None and locks is not None and not locks.still_held(lock, tx):
            # Seen by operators (a worker logs warnings only): the batch it
            # handled is handled again by the worker that has the stream now.
            logger.warning(
                "worker of %r lost its lock of stream %d: its batch is left to another worker",
                self.record.name,
                stream_key,
            )
            raise _Abandon
        if not self.state.advance(tx, self.record, stream_key, stored, end):
            logger.warning(
                "worker of %r: the position of stream %d moved meanwhile: its batch is left",
                self.record.name,
                stream_key,
            )
            raise _Abandon

    def _should_retry(self, batch: Batch, error: Exception) -> bool:
        """Count a failed attempt; True (after the backoff) to try again. Raises
        `_Abandon` if the worker is stopped during the backoff."""
        self.stats.failures += 1
        policy = self.on_error
        if policy.action is not OnError.RETRY or (
            policy.max_attempts is not None and batch.attempt >= policy.max_attempts
        ):
            return False
        delay = policy.delay(batch.attempt)
        logger.warning(
            "handler of %r failed on %s offsets %d-%d (attempt %d), retrying in %.3gs: %r",
            self.record.name, batch.stream, batch.start, batch.end - 1, batch.attempt, delay,
            error,
        )  # fmt: skip
        self.stats.retried += len(batch.messages)
        self._counted()
        if self._stop.wait(delay):
            raise _Abandon  # unrecorded: the next worker handles the batch
        return True

    def _fail(
        self,
        tx: Transaction,
        batch: Batch,
        lock: PartitionLock | None,
        stream_key: int,
        stored: int | None,
        error: Exception,
    ) -> Failure:
        """Give up on `batch` in `tx`: the failure hook, then (SKIP) the position. A
        hook that raises raises `HandlerFailed`, rolling `tx` back."""
        action = self.on_error.final_action()
        failure = Failure(replace(batch, transaction=tx), error, batch.attempt, action, tx)
        hook = self.on_error.on_failure
        if hook is not None:
            try:
                hook(failure)
            except Exception as exc:
                raise HandlerFailed(
                    failure,
                    f"failure hook of subscription {self.record.name!r} raised on"
                    f" {_where(batch)}: {exc!r} (after the handler raised {error!r});"
                    " the worker stops",
                ) from exc
        if action is OnError.SKIP:
            self._record(tx, lock, stream_key, stored, batch.end)
        return failure

    def _after_failure(self, failure: Failure) -> int:
        """Once the failure's transaction committed: log a skip, or stop."""
        batch = failure.batch
        if failure.action is OnError.SKIP:
            logger.error(
                "handler of %r failed on %s after %d attempt(s); skipped: %r",
                self.record.name, _where(batch), batch.attempt, failure.error,
                exc_info=failure.error,
            )  # fmt: skip
            self.stats.skipped += 1
            return self._done(batch, parked=True)
        if self.on_error.action is OnError.RETRY:
            why = f"on-error retry gave up after {_attempts(batch.attempt)}"
        else:
            why = "on-error stop"
        raise HandlerFailed(
            failure,
            f"handler of subscription {self.record.name!r} failed on {_where(batch)}"
            f" ({_attempts(batch.attempt)}): {failure.error!r}; the worker stops ({why})",
        ) from failure.error


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def _where(batch: Batch) -> str:
    return f"{batch.stream} offsets {batch.start}-{batch.end - 1}"
