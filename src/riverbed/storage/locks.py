"""Partition locks for competing consumers (seed 004, "Locks").

A worker locks `(subscription, stream)` before it processes a batch of that
stream and unlocks it afterwards, so a stream is processed by one worker at a
time. The service is small (`PartitionLocks`): `try_lock` without waiting,
`still_held` inside the transaction that records the new position, `unlock`,
`close`. One instance belongs to one worker. Three implementations
(`default_locks` picks the first on PostgreSQL, the last elsewhere):

- `XactAdvisoryLocks` (PostgreSQL, the default there): a transaction-level
  advisory lock taken in the transaction that handles the batch and records its
  position (`TransactionLocks`): no connection of its own, released by COMMIT or
  ROLLBACK, and a worker that dies takes it along with its transaction.
- `AdvisoryLocks` (PostgreSQL): session-level advisory locks, all of a worker's
  locks on *one* connection of its own (not one per lock). A worker that dies
  loses its connection and with it its locks, at once. `still_held` looks the
  lock up in `pg_locks` by that connection's backend pid, in the position
  transaction: a worker whose lock connection broke cannot record progress made
  under a lock it no longer has.
- `LeaseLocks` (SQLite, and any SQL storage): a row per lock in the
  `partition_locks` table with an owner, an expiry and a fencing counter `fence`
  that goes up by one each time the lock changes hands. Taking a lock is one
  conditional upsert (free, released, or expired). While a worker holds locks a
  heartbeat thread renews them. `still_held` renews the row *in the position
  transaction* on condition that owner and fence are unchanged: a worker that
  stalled past its lease and was overtaken finds its fence gone and rolls back,
  whatever its clock says. A lease whose owner is a dead process on this machine
  (hostname and pid in the owner) is taken at once instead of after its expiry,
  so a SIGKILLed worker's streams move on quickly.

A user replaces them with anything that has these four methods (a lock
service the application runs already, say), or with a `TransactionLocks`
(`try_lock_in(tx, ...)`, `close`): the runner takes either (`Locks`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from riverbed.clock import now_us
from riverbed.errors import InvalidInput, StorageError, StorageUnavailable
from riverbed.storage.base import Storage
from riverbed.storage.transactions import Transaction, sql_storage, transaction
from riverbed.storage.urls import redact_url

if TYPE_CHECKING:
    from riverbed.storage.postgres import PostgresStorage


@dataclass(frozen=True, slots=True)
class PartitionLock:
    """A lock as its holder got it."""

    subscription: str
    stream_key: int
    owner: str
    fence: int
    """Changes whenever the lock changes hands (LeaseLocks: a counter; AdvisoryLocks:
    the backend pid of the holding connection)."""


class PartitionLocks(Protocol):
    """The lock service of seed 004; see the module docstring."""

    def try_lock(self, subscription: str, stream_key: int) -> PartitionLock | None:
        """Take the lock if nobody holds it; None (at once) if somebody does."""
        ...

    def still_held(self, lock: PartitionLock, tx: Transaction) -> bool:
        """Whether `lock` is still ours, checked inside the transaction that records
        the position (the runner rolls back if not)."""
        ...

    def unlock(self, lock: PartitionLock) -> None:
        """Give the lock up (a lock lost meanwhile is no error)."""
        ...

    def close(self) -> None:
        """Give every lock up and free what the service holds."""
        ...


@runtime_checkable
class TransactionLocks(Protocol):
    """Locks that live in the batch's transaction: taken in it, released when it
    ends, so they need no `unlock` and cannot be lost while it lives. The runner
    then holds one transaction per batch: lock, handler, position."""

    def try_lock_in(self, tx: Transaction, subscription: str, stream_key: int) -> bool:
        """Take the lock for the rest of `tx` if nobody holds it; False (at once) if
        somebody does."""
        ...

    def close(self) -> None: ...


Locks = PartitionLocks | TransactionLocks
"""What a worker takes: either kind of lock service."""


def _is_postgres(storage: Storage) -> bool:
    return storage.url.split(":", 1)[0].lower() in ("postgresql", "postgres")


def default_locks(storage: Storage, owner: str | None = None) -> Locks:
    """Transaction-scoped advisory locks on PostgreSQL, lease locks otherwise."""
    if _is_postgres(storage):
        return XactAdvisoryLocks(storage)
    return LeaseLocks(storage, owner=owner)


def session_locks(storage: Storage, owner: str | None = None) -> PartitionLocks:
    """Locks held apart from any transaction: session advisory locks on one
    connection on PostgreSQL, lease locks otherwise."""
    if _is_postgres(storage):
        return AdvisoryLocks(storage)
    return LeaseLocks(storage, owner=owner)


# --------------------------------------------------------------------- leases


HOST = socket.gethostname()


def new_owner() -> str:
    """`host/pid/random`: unique, and says which process on which machine holds it."""
    return f"{HOST}/{os.getpid()}/{uuid.uuid4().hex[:12]}"


def process_dead(owner: str) -> bool:
    """True when `owner` (from `new_owner`) names a process on this machine that
    has ended (or is a zombie). False when unsure."""
    host, _, rest = owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # "pid (comm) S ...": the state follows the last ')'.
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


_TAKE = (
    "INSERT INTO partition_locks (subscription, stream, owner, expires_us, fence)"
    " VALUES (?, ?, ?, ?, 1)"
    " ON CONFLICT (subscription, stream) DO UPDATE SET owner = excluded.owner,"
    " expires_us = excluded.expires_us, fence = partition_locks.fence + 1"
    " WHERE partition_locks.expires_us <= ?"
    " RETURNING fence"
)
_TAKE_FROM = (
    "UPDATE partition_locks SET owner = ?, expires_us = ?, fence = fence + 1"
    " WHERE subscription = ? AND stream = ? AND owner = ? AND fence = ? RETURNING fence"
)
_RENEW = (
    "UPDATE partition_locks SET expires_us = ?"
    " WHERE subscription = ? AND stream = ? AND owner = ? AND fence = ? RETURNING fence"
)
_HOLDER = "SELECT owner, fence FROM partition_locks WHERE subscription = ? AND stream = ?"


class LeaseLocks:
    """Lock rows with leases and fencing; see the module docstring.

    `ttl` is the lease in seconds; `clock` gives µs since the epoch (tests pass a
    fake one and `heartbeat=False`). `reap_dead` takes a lease whose owner is a
    dead process on this machine without waiting for it to expire.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        owner: str | None = None,
        ttl: float = 15.0,
        clock: Callable[[], int] = now_us,
        heartbeat: bool = True,
        reap_dead: bool = True,
    ) -> None:
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0:
            raise InvalidInput(f"lease time-to-live {ttl!r}s must be a positive number")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise InvalidInput(f"lock owner {owner!r} must be a non-empty string")
        self.storage = sql_storage(storage)
        self.owner = owner or new_owner()
        self.ttl_us = max(1, int(ttl * 1_000_000))
        self.clock = clock
        self.reap_dead = reap_dead
        self._held: dict[tuple[str, int], PartitionLock] = {}
        self._mutex = threading.Lock()
        self._closed = threading.Event()
        self._heartbeat = heartbeat
        self._beating: threading.Thread | None = None

    def try_lock(self, subscription: str, stream_key: int) -> PartitionLock | None:
        now = self.clock()
        expires = now + self.ttl_us
        with transaction(self.storage) as tx:
            row = tx.execute(_TAKE, (subscription, stream_key, self.owner, expires, now)).fetchone()
            if row is None and self.reap_dead:
                holder = tx.execute(_HOLDER, (subscription, stream_key)).fetchone()
                if holder is not None and holder[0] != self.owner and process_dead(holder[0]):
                    row = tx.execute(
                        _TAKE_FROM,
                        (self.owner, expires, subscription, stream_key, holder[0], holder[1]),
                    ).fetchone()
        if row is None:
            return None
        lock = PartitionLock(subscription, stream_key, self.owner, int(row[0]))
        with self._mutex:
            self._held[(subscription, stream_key)] = lock
        self._start_heartbeat()
        return lock

    def renew(self, lock: PartitionLock) -> bool:
        """Extend a lease we hold; False if it changed hands."""
        with transaction(self.storage) as tx:
            return self._renew(tx, lock)

    def _renew(self, tx: Transaction, lock: PartitionLock) -> bool:
        row = tx.execute(
            _RENEW,
            (
                self.clock() + self.ttl_us,
                lock.subscription,
                lock.stream_key,
                lock.owner,
                lock.fence,
            ),
        ).fetchone()
        return row is not None

    def still_held(self, lock: PartitionLock, tx: Transaction) -> bool:
        # A renewal, not a read: on PostgreSQL it also row-locks the lease until
        # the position commits, so nobody can take it between check and commit.
        return self._renew(tx, lock)

    def unlock(self, lock: PartitionLock) -> None:
        with self._mutex:
            self._held.pop((lock.subscription, lock.stream_key), None)
        with transaction(self.storage) as tx:
            tx.execute(
                "UPDATE partition_locks SET expires_us = 0"
                " WHERE subscription = ? AND stream = ? AND owner = ? AND fence = ?",
                (lock.subscription, lock.stream_key, lock.owner, lock.fence),
            )

    def holder(self, subscription: str, stream_key: int) -> tuple[str, int, int] | None:
        """(owner, expires µs, fence) of a lock row, released or not; None if none."""
        row = self.storage._q(
            "SELECT owner, expires_us, fence FROM partition_locks"
            " WHERE subscription = ? AND stream = ?",
            (subscription, stream_key),
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))

    def close(self) -> None:
        self._closed.set()
        with self._mutex:
            held, self._held = list(self._held.values()), {}
        for lock in held:
            with contextlib.suppress(StorageError), transaction(self.storage) as tx:
                tx.execute(
                    "UPDATE partition_locks SET expires_us = 0"
                    " WHERE subscription = ? AND stream = ? AND owner = ? AND fence = ?",
                    (lock.subscription, lock.stream_key, lock.owner, lock.fence),
                )
        if self._beating is not None and self._beating is not threading.current_thread():
            self._beating.join(timeout=5)

    def _start_heartbeat(self) -> None:
        if not self._heartbeat or self._beating is not None or self._closed.is_set():
            return
        self._beating = threading.Thread(
            target=self._beat, name="riverbed-lease-heartbeat", daemon=True
        )
        self._beating.start()

    def _beat(self) -> None:
        interval = self.ttl_us / 3_000_000
        while not self._closed.wait(interval):
            with self._mutex:
                held = list(self._held.values())
            for lock in held:
                try:
                    alive = self.renew(lock)
                except StorageError:
                    continue  # the next beat tries again; the fence guards commits
                if not alive:
                    with self._mutex:
                        if self._held.get((lock.subscription, lock.stream_key)) == lock:
                            del self._held[(lock.subscription, lock.stream_key)]


# --------------------------------------------------------------------- PostgreSQL


def lock_space(subscription: str) -> int:
    """The first int4 key of a subscription's advisory locks (a hash: a collision
    only makes two subscriptions' streams wait for each other)."""
    return zlib.crc32(subscription.encode()) & 0x7FFFFFFF


def _stream_key32(stream_key: int) -> int:
    return stream_key & 0x7FFFFFFF


class AdvisoryLocks:
    """Session-level advisory locks of one worker on one connection; see the
    module docstring."""

    def __init__(self, storage: Storage) -> None:
        from riverbed.storage.postgres import PostgresStorage

        if not isinstance(storage, PostgresStorage):
            raise InvalidInput(f"storage {storage!r}: advisory locks need PostgreSQL")
        self.storage: PostgresStorage = storage
        self._conn: Any = None
        self._pid = 0
        self._mutex = threading.Lock()
        self._held: set[tuple[str, int]] = set()

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self.storage._connect()
            self._pid = int(self._conn.info.backend_pid)
            self._held.clear()  # a new session holds nothing
        return self._conn

    def _call(self, sql: str, params: tuple[int, int]) -> Any:
        import psycopg

        for retry in (True, False):
            try:
                return self._connection().execute(sql, params).fetchone()[0]
            except psycopg.Error as exc:
                broken = self._conn is None or bool(self._conn.closed)
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                self._conn = None
                if broken and retry:
                    # It broke while idle (a server restart): its locks went with it,
                    # and a new session runs the statement as if for the first time.
                    continue
                raise StorageUnavailable(
                    f"advisory lock on {redact_url(self.storage.url)!r} failed (its locks"
                    f" are gone with its connection): {' '.join(str(exc).split())}"
                ) from exc
        raise AssertionError("unreachable")

    def try_lock(self, subscription: str, stream_key: int) -> PartitionLock | None:
        with self._mutex:
            if (subscription, stream_key) in self._held:
                return None  # not reentrant: one batch of a stream at a time
            got = self._call(
                "SELECT pg_try_advisory_lock(%s, %s)",
                (lock_space(subscription), _stream_key32(stream_key)),
            )
            if not got:
                return None
            self._held.add((subscription, stream_key))
            return PartitionLock(subscription, stream_key, f"pg:{self._pid}", self._pid)

    def still_held(self, lock: PartitionLock, tx: Transaction) -> bool:
        row = tx.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = ?"
            " AND classid::bigint = ? AND objid::bigint = ? AND objsubid = 2 AND granted",
            (lock.fence, lock_space(lock.subscription), _stream_key32(lock.stream_key)),
        ).fetchone()
        return row is not None

    def unlock(self, lock: PartitionLock) -> None:
        with self._mutex:
            if (lock.subscription, lock.stream_key) not in self._held or lock.fence != self._pid:
                return
            self._held.discard((lock.subscription, lock.stream_key))
            with contextlib.suppress(StorageUnavailable):  # gone with the connection
                self._call(
                    "SELECT pg_advisory_unlock(%s, %s)",
                    (lock_space(lock.subscription), _stream_key32(lock.stream_key)),
                )

    def close(self) -> None:
        with self._mutex:
            self._held.clear()
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()  # the server drops the session's locks
                self._conn = None


class XactAdvisoryLocks:
    """`pg_try_advisory_xact_lock` in the batch's transaction (the default on
    PostgreSQL): no connection of its own and no round trip to release. The keys
    are those of `AdvisoryLocks`, so workers using either exclude each other."""

    def __init__(self, storage: Storage) -> None:
        if not _is_postgres(storage):
            raise InvalidInput(f"storage {storage!r}: advisory locks need PostgreSQL")

    def try_lock_in(self, tx: Transaction, subscription: str, stream_key: int) -> bool:
        row = tx.execute(
            "SELECT pg_try_advisory_xact_lock(?, ?)",
            (lock_space(subscription), _stream_key32(stream_key)),
        ).fetchone()
        return bool(row[0])

    def close(self) -> None:
        pass
