"""Each thread's database connection, the transactions on it, and what its
failures become: the plumbing under every SQL storage (`ConnectedStorage`).

sqlite3 and psycopg connections are not shared across threads, so a storage
keeps one per thread (`ThreadConnections`), opened on first use. A connection
lives in a slot of a thread-local; when the thread ends, the thread-local drops
the slot and a finalizer closes the connection, so short-lived threads do not
leave connections behind.

A connection may break (a server restart, `pg_terminate_backend`). It is then
discarded, the thread's next call opens another, and what was in flight is
retried only where that cannot write twice: a read outside a transaction, or a
BEGIN (nothing of the transaction was sent yet). A transaction that broke later
fails with `StorageUnavailable`, saying that nothing was written or, when the
COMMIT itself broke, that its outcome is unknown: repeating it could write it
twice.

`operation` marks a public storage method: once the storage is closed it
refuses to run, and a driver error escaping it becomes a `StorageError` (a
`StorageUnavailable` when the connection was lost, a `StorageFull` when the
database is full or read-only) naming the operation and the database, password
hidden, chained to the driver's error. Neither ends the connection's use: the
same thread's next call goes on (on a new connection if it broke), so a writer
recovers by itself once the database takes writes again.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from riverbed.errors import StorageError, StorageFull, StorageUnavailable
from riverbed.storage.urls import redact_password, redact_url

Connection = Any
Cursor = Any

P = ParamSpec("P")
T = TypeVar("T")


class ConnectionLost(Exception):
    """Internal: a thread's connection broke during an operation (raised from the
    driver's error, turned into `StorageUnavailable` by `operation`)."""

    def __init__(self, consequence: str | None) -> None:
        super().__init__(consequence)
        self.consequence = consequence
        """What became of the operation's writes, if it had any."""


class _Slot:
    """One thread's connection; finalized when the thread-local drops it."""

    __slots__ = ("__weakref__", "conn", "release")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.release: weakref.finalize[Any, Any] | None = None


def _release(open_connections: dict[int, Connection], lock: threading.Lock, conn: Any) -> None:
    with lock:
        open_connections.pop(id(conn), None)
    with contextlib.suppress(Exception):  # closed already, or broken: nothing to save
        conn.close()


CLOSE_WAIT = 5.0
"""Seconds `ThreadConnections.close` gives operations running in other threads."""


class ThreadConnections:
    """One connection per thread, from `connect()`; see the module docstring."""

    def __init__(self, connect: Callable[[], Connection], url: str) -> None:
        self._connect = connect
        self._url = url
        self._local = threading.local()
        self._open: dict[int, Connection] = {}
        """Every connection not closed yet, by id: what `close` closes."""
        self._lock = threading.Lock()
        self._closed = False
        self._busy = 0
        """Storage operations running now, in any thread (`enter` / `leave`)."""
        self._idle = threading.Condition(self._lock)

    def get(self) -> Connection:
        """This thread's connection (opened now if it has none)."""
        try:
            return self._local.slot.conn
        except AttributeError:
            return self._open_one()

    def _open_one(self) -> Connection:
        if self._closed:
            raise self.closed_error()
        conn = self._connect()
        with self._lock:
            registered = not self._closed
            if registered:
                self._open[id(conn)] = conn
        if not registered:  # closed while we connected
            _release({}, threading.Lock(), conn)
            raise self.closed_error()
        slot = _Slot(conn)
        slot.release = weakref.finalize(slot, _release, self._open, self._lock, conn)
        slot.release.atexit = False  # at exit, the driver closes its sockets itself
        self._local.slot = slot
        return conn

    def discard(self, conn: Connection) -> None:
        """Close `conn`, this thread's connection that broke: the next `get` opens
        another."""
        slot = getattr(self._local, "slot", None)
        if slot is not None and slot.conn is conn:
            del self._local.slot
            if slot.release is not None:
                slot.release()  # runs `_release` now, and never again
                return
        _release(self._open, self._lock, conn)

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        """Connections open now (of threads alive, or ended a moment ago)."""
        with self._lock:
            return len(self._open)

    def enter(self) -> None:
        """A storage operation starts (in this thread)."""
        with self._lock:
            self._busy += 1

    def leave(self) -> None:
        """The operation `enter` announced ended."""
        with self._lock:
            self._busy -= 1
            if not self._busy:
                self._idle.notify_all()

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Close every connection, from whichever thread; `get` refuses from now on.
        Operations running in other threads get `wait` seconds to end first: a
        SQLite connection closed while another thread runs a statement on it
        can crash the process (a broker stopping under a sweep did). Past it
        they are closed anyway (one waiting on a database that does not answer
        must not keep the process from stopping; it then fails as closed)."""
        with self._lock:
            self._closed = True
            self._idle.wait_for(lambda: self._busy == 0, timeout=wait)
            conns = list(self._open.values())
            self._open.clear()
        for conn in conns:
            with contextlib.suppress(Exception):  # in use by another thread: best effort
                conn.close()
        self._local = threading.local()

    def closed_error(self, operation: str | None = None) -> StorageError:
        what = f"cannot {operation}: " if operation else ""
        return StorageError(f"{what}storage {redact_url(self._url)!r} is closed")


class ConnectedStorage:
    """Per-thread connections and transactions for a storage at `url`; see the
    module docstring. A backend provides `_connect`, `_begin_write`, `_is_broken`."""

    PARAMSTYLE = "?"
    DRIVER_ERRORS: tuple[type[Exception], ...] = ()
    """The driver's exception classes, which become `StorageError`s."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connections = ThreadConnections(self._connect, url)
        self._conn = self.connections.get
        self._stopping = threading.Event()
        """Set by `close`: watcher threads end."""
        self._sql_cache: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_url(self.url)}>"

    @property
    def closed(self) -> bool:
        return self.connections.closed

    def close(self) -> None:
        """Close every connection; later calls raise `StorageError`."""
        self._stopping.set()
        self.connections.close()

    # --- backend hooks ------------------------------------------------------
    def _connect(self) -> Connection:
        raise NotImplementedError

    def _begin_write(self, conn: Connection) -> None:
        raise NotImplementedError

    def _read_conn(self) -> Connection:
        """This thread's connection for a read (`_conn` unless the backend
        reads on a connection as it is)."""
        return self._conn()

    def _wait_for_read(self, conn: Connection, exc: Exception) -> bool:
        """Whether a read that failed with `exc` on `conn` is to run again,
        `conn` now set to wait for what kept it busy (a backend hook)."""
        return False

    def _is_broken(self, conn: Connection) -> bool:
        """Whether `conn` lost its link to the database (after an error)."""
        return False

    def _refuses_writes(self, exc: Exception) -> bool:
        """Whether the driver's error says the database is full or read-only
        (it becomes `StorageFull`)."""
        return False

    # --- statements and transactions ------------------------------------------
    def _sql(self, text: str) -> str:
        cached = self._sql_cache.get(text)
        if cached is None:
            cached = text if self.PARAMSTYLE == "?" else text.replace("?", self.PARAMSTYLE)
            self._sql_cache[text] = cached
        return cached

    def _q(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run a read outside any transaction. It changes nothing, so if the
        thread's connection turns out broken it runs once more on a new one."""
        text = self._sql(sql)
        retried = False
        while True:
            conn = self._read_conn()
            try:
                return conn.execute(text, params)
            except self.DRIVER_ERRORS as exc:
                if self._wait_for_read(conn, exc):
                    continue
                if not self._discard_if_broken(conn):
                    raise
                if retried:
                    raise ConnectionLost(None) from exc
            retried = True

    def _x(self, cur: Cursor, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run a statement in the transaction of `cur` (from `_write`)."""
        cur.execute(self._sql(sql), params)
        return cur

    @contextmanager
    def _write(self) -> Iterator[Cursor]:
        """A write transaction; commits on success, rolls back on any error."""
        conn = self._begin()
        cur = conn.cursor()
        try:
            yield cur
        except self.DRIVER_ERRORS as exc:
            if self._discard_if_broken(conn):
                # The server ends a transaction whose connection it lost.
                raise ConnectionLost("nothing was written") from exc
            self._rollback(conn)
            raise
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except self.DRIVER_ERRORS as exc:
            if self._discard_if_broken(conn):
                # The COMMIT may have been applied before the link broke: never
                # repeat it, say so.
                raise ConnectionLost("the outcome of its commit is unknown") from exc
            self._rollback(conn)  # SQLite keeps a transaction whose COMMIT failed
            raise

    def _begin(self) -> Connection:
        """This thread's connection, in a new write transaction."""
        retried = False
        while True:
            conn = self._conn()
            try:
                self._begin_write(conn)
                return conn
            except self.DRIVER_ERRORS as exc:
                if not self._discard_if_broken(conn):
                    raise
                if retried:
                    raise ConnectionLost("nothing was written") from exc
            # The connection broke while idle; nothing of this transaction has been
            # sent, so begin once more on a new one.
            retried = True

    def _rollback(self, conn: Connection) -> None:
        try:
            conn.execute("ROLLBACK")
        except self.DRIVER_ERRORS:
            # The transaction ended already or the connection is in a state we do
            # not know: a new connection is the safe way on. The error that made
            # us roll back is the one to report.
            self.connections.discard(conn)

    def _discard_if_broken(self, conn: Connection) -> bool:
        if not self._is_broken(conn):
            return False
        self.connections.discard(conn)
        return True


S = TypeVar("S", bound=ConnectedStorage)


def operation(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """Mark a public storage method; see the module docstring."""
    name = method.__name__.lstrip("_")

    @functools.wraps(method)
    def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        connections = self.connections
        if connections.closed:
            raise connections.closed_error(name)
        connections.enter()
        try:
            return method(self, *args, **kwargs)
        except ConnectionLost as lost:
            cause = lost.__cause__
            if connections.closed:  # closed by another thread while this call ran
                raise connections.closed_error(name) from cause
            message = _lost(self, name, cause, lost.consequence or "")
            raise StorageUnavailable(message) from cause
        except self.DRIVER_ERRORS as exc:
            if connections.closed:
                raise connections.closed_error(name) from exc
            if self._refuses_writes(exc):
                raise StorageFull(_failed(self, name, exc)) from exc
            raise StorageError(_failed(self, name, exc)) from exc
        finally:
            connections.leave()

    return run


def _failed(storage: ConnectedStorage, operation: str, exc: BaseException) -> str:
    return f"{operation} on {redact_url(storage.url)!r} failed: {_detail(storage, exc)}"


def _lost(
    storage: ConnectedStorage, operation: str, exc: BaseException | None, consequence: str
) -> str:
    what = f" ({consequence})" if consequence else ""
    return (
        f"{operation} on {redact_url(storage.url)!r} lost its connection to the database"
        f"{what}: {_detail(storage, exc)}"
    )


def _detail(storage: ConnectedStorage, exc: BaseException | None) -> str:
    return redact_password(" ".join(str(exc).split()), storage.url)  # on one line
