"""SQLite storage: the embedded default.

WAL journal, `synchronous=NORMAL` (a kill -9 loses nothing committed; `FULL`
also survives power loss), one connection per thread, `BEGIN IMMEDIATE` for
writes so writers queue on the database lock instead of failing late. Messages
live in a `WITHOUT ROWID` table keyed by (stream, offset): appended and scanned
fastest in our measurements (DESIGN.md, Storage).

`max_size` (the URL's `?max_size=512MB`) caps the database file: every
connection sets `PRAGMA max_page_count` to it, and a write that would need more
pages fails with SQLITE_FULL, as on a full disk; both become `StorageFull`
(nothing written, the connection goes on). Pages that deletions free (retention)
are reused by later writes, so a capped database keeps taking writes as long as
retention keeps up; the file itself never shrinks (docs/storage.md).

Other processes' commits are noticed through `PRAGMA data_version`, which
changes when another connection commits: a cheap check every few milliseconds
on a watcher thread, started when somebody waits and stopped once nobody has
waited for `WATCH_IDLE` seconds (the next wait starts it again). While no other
process has the file open (and no other storage of this process), there is
nobody to hear: the watcher then waits for a process to open it instead of
polling (`storage/opens.py`), looking at who has it open every `WATCH_ALONE`
seconds, and polls again from the moment one does.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from riverbed.clock import now_us
from riverbed.errors import DatabaseNotFound, StorageUnavailable, StreamSealed
from riverbed.storage import bulk
from riverbed.storage.base import Row
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.opens import (
    OpenWatch,
    closed_here,
    opened_here,
    others_have_open,
    shared_here,
)
from riverbed.storage.sql import RECORD_MARKER, SqlStorage
from riverbed.storage.urls import redact_url

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.002
"""Seconds between two checks for other processes' commits."""

WATCH_IDLE = 5.0
"""Seconds without a waiter after which the watcher stops polling."""

WATCH_ALONE = 1.0
"""Seconds between two looks at who has the file open while the watcher finds
no other process with it open (and waits for one to open it, `OpenWatch`)."""

WATCH_COMPANY = 1.0
"""Seconds the watcher polls before it looks again at who has the file open,
after it found another process with it."""

WATCH_OPENED = 0.2
"""Seconds the watcher polls after it saw the file opened before it looks at
who has it open: a process takes its lock on the `-shm` file a moment after it
opens that file (the last it opens). The file's opens by this process's own
new connections wake it too, and end the same way."""

BUSY_TIMEOUT = 60.0
"""Seconds a connection waits for another's write lock before giving up."""
_BUSY_TIMEOUT_MS = int(BUSY_TIMEOUT * 1000)

_RESERVE = (
    "UPDATE streams SET next_offset = next_offset + ? WHERE id = ? AND sealed = 0"
    " RETURNING next_offset"
)
_INSERT = (
    "INSERT INTO messages (stream, off, id, ts, mqtt_topic, key, payload, properties, qos, retain)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_HAS_META = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
"""A row if the database has Riverbed's schema (its first table)."""

_COPY_STAGED = (
    "INSERT INTO main.messages"
    " (stream, off, id, ts, mqtt_topic, key, payload, properties, qos, retain)"
    " SELECT ?1, ?2 + rowid, id, ts, mqtt_topic, key, payload, properties, qos, retain"
    " FROM staged.rows WHERE rowid > ?3 AND rowid <= ?3 + ?4 ORDER BY rowid"
)
"""One stream's rows from a staging file (`bulk.sqlite_stage`: rowid = row number
from 1): rows `start + 1 .. start + count` get offsets from `first`."""


class SqliteStorage(SqlStorage):
    DRIVER_ERRORS = (sqlite3.Error,)
    SCHEMA_TYPES: Mapping[str, str] = {
        "text": "TEXT",
        "int": "INTEGER",
        "blob": "BLOB",
        # AUTOINCREMENT: a deleted topic's stream keys are never handed out again, so
        # an appender with a stale view gets StreamSealed instead of writing into
        # another topic's stream (PostgreSQL's identity never reuses either).
        "stream_pk": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "messages_suffix": " WITHOUT ROWID",
    }

    def __init__(
        self,
        url: str,
        path: Path,
        synchronous: str = "NORMAL",
        max_size: int | None = None,
        *,
        create: bool = True,
    ) -> None:
        super().__init__(url)
        self._conn = self._waiting_conn
        self.path = path
        self.synchronous = synchronous
        self.max_size = max_size
        """Bytes the database file may grow to (None: as far as the disk allows)."""
        self.created = False
        """This open created the database (its file, or the schema in an empty one)."""
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageUnavailable(
                    f"cannot create the directory of {redact_url(url)!r}: {exc}"
                ) from exc
        else:
            # Before any connection of ours: connecting creates a missing file, and
            # switching to WAL writes to an existing one.
            self._require_schema()
        self._watcher: threading.Thread | None = None
        self._opens: OpenWatch | None = None
        """The running watcher's wait for another process to open the file."""
        self.alone_watch = True
        """Whether the watcher may wait for an open instead of polling while no
        other process has the file open (off: it polls, as where it cannot tell)."""
        self.watching_alone = False
        """The watcher is waiting for another process to open the file (for tests)."""
        self._here: str | None = opened_here(path)
        """This storage counted among the process's own on the file (till `close`)."""
        try:
            self._migrate()
        except BaseException:
            self.close()  # the connection it opened
            raise

    def _require_schema(self) -> None:
        """Raise `DatabaseNotFound` unless the file exists and holds Riverbed's
        tables; looks through a read-only connection, changing nothing."""
        if not self.path.is_file():
            raise DatabaseNotFound(f"no Riverbed database at {self.path}")
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                found = conn.execute(_HAS_META).fetchone()
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageUnavailable(
                f"cannot open SQLite database {redact_url(self.url)!r}: {exc}"
            ) from exc
        if found is None:
            raise DatabaseNotFound(
                f"no Riverbed database at {self.path}: the file holds no Riverbed tables"
            )

    def _connect(self) -> Any:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT,
                factory=_Connection,
            )
            _enable_wal(conn)
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            if self.max_size is not None:
                (page_size,) = conn.execute("PRAGMA page_size").fetchone()
                conn.execute(f"PRAGMA max_page_count={max(1, self.max_size // page_size)}")
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise StorageUnavailable(
                f"cannot open SQLite database {redact_url(self.url)!r}: {exc}"
            ) from exc
        return conn

    def _adbc_connect(self) -> Any:
        import adbc_driver_sqlite.dbapi

        return adbc_driver_sqlite.dbapi.connect(str(self.path), autocommit=True)

    def _rows(self, cursor: Cursor) -> Iterable[Sequence[Any]]:
        return cursor  # type: ignore[no-any-return]  # iterating skips fetchall's list

    def _begin_write(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def _refuses_writes(self, exc: Exception) -> bool:
        # SQLITE_FULL: the disk or `max_page_count`; SQLITE_READONLY: a file we
        # may not write. Both pass once space (or permission) returns.
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            return "full" in str(exc) or "readonly" in str(exc)
        return code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY)

    appends_inline = True

    @operation
    def try_append(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int] | None:
        """`append` unless another connection holds the write lock: the lock is
        asked for without the busy timeout, and a busy database answers None.

        The thread's connection keeps the busy timeout off after this (a thread
        that calls this calls it again, an event loop's many times a second) and
        turns it back on before anything else it does (`_waiting_conn`)."""
        conn = self.connections.get()
        if conn.waits:
            conn.execute("PRAGMA busy_timeout=0")
            conn.waits = False
        conn.inline = True
        try:
            return self._append_rows(batches)
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                return None
            raise
        finally:
            conn.inline = False

    @contextmanager
    def not_waiting(self) -> Iterator[None]:
        """Within it, this thread's connection asks for the write lock without
        the busy timeout, as `try_append` does (and leaves it off after, as
        `try_append` does: a thread that does this does it again)."""
        conn = self.connections.get()
        if conn.waits:
            conn.execute("PRAGMA busy_timeout=0")
            conn.waits = False
        was, conn.inline = conn.inline, True
        try:
            yield
        finally:
            conn.inline = was

    @operation
    def commits_elsewhere(self) -> int | None:
        # Changes with every commit of another connection, this process's
        # others (other threads) included; never with this connection's own.
        row = self._q("PRAGMA data_version").fetchone()
        return int(row[0])

    def busy(self, exc: BaseException | None) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and _busy(exc)

    def _read_conn(self) -> _Connection:
        """The thread's connection as it is: an event loop's keeps its busy
        timeout off between the writes it makes without waiting and its reads
        (each switch is a statement, and a loop alternates them: a SUBSCRIBE
        reads, writes, reads). A read in WAL mode waits for no writer; what
        can make one busy (a checkpoint resetting the WAL, recovery after a
        crash) is rare, and `_wait_for_read` turns the timeout on then."""
        conn: _Connection = self.connections.get()
        return conn

    def _wait_for_read(self, conn: Any, exc: Exception) -> bool:
        if conn.waits or not (isinstance(exc, sqlite3.OperationalError) and _busy(exc)):
            return False
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        conn.waits = True
        return True

    def _waiting_conn(self) -> _Connection:
        """The thread's connection, with its busy timeout on unless `try_append`
        is using it."""
        conn: _Connection = self.connections.get()
        if not conn.waits and not conn.inline:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            conn.waits = True
        return conn

    def _schema_version(self, cur: Cursor) -> int:
        if cur.execute(_HAS_META).fetchone() is None:
            self.created = True
            return 0
        row = cur.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        return 0 if row is None else int(row[0])

    def _reserve(self, cur: Cursor, counts: Mapping[int, int]) -> dict[int, int]:
        # The IMMEDIATE transaction already holds the database's write lock.
        firsts: dict[int, int] = {}
        for key, count in counts.items():
            row = cur.execute(_RESERVE, (count, key)).fetchone()
            if row is not None:
                firsts[key] = row[0] - count
        return firsts

    def _insert_messages(
        self, cur: Cursor, batches: Mapping[int, Sequence[Row]], firsts: Mapping[int, int]
    ) -> None:
        for key, rows in batches.items():
            first = firsts[key]
            cur.executemany(_INSERT, [(key, first + i, *row) for i, row in enumerate(rows)])

    def _bulk_append_once(
        self, marker: str, streams: bulk.StreamCounts, counts: Mapping[int, int], table: Any
    ) -> dict[int, int] | None:
        # Staged outside the write lock (storage/bulk.py); the lock is held only
        # for the copy, which SQLite does without a Python object per row.
        with bulk.sqlite_stage(table) as stage:
            conn = self._conn()
            conn.execute("ATTACH DATABASE ? AS staged", (str(stage),))  # not in a transaction
            try:
                with self._write() as cur:
                    if self._x(cur, RECORD_MARKER, (marker, now_us())).fetchone() is None:
                        return None
                    wanted = {key: counts[key] for key in sorted(counts) if counts[key]}
                    firsts = self._reserve(cur, wanted)
                    missing = [key for key in wanted if key not in firsts]
                    if missing:
                        raise StreamSealed(missing)  # rolls the marker back too
                    for key, start, count in bulk.slices(streams):
                        if count:
                            cur.execute(_COPY_STAGED, (key, firsts[key] - start - 1, start, count))
            finally:
                try:
                    conn.execute("DETACH DATABASE staged")
                except sqlite3.Error:
                    self.connections.discard(conn)  # the next call gets a clean one
        return firsts

    def _start_watcher(self) -> None:
        if self.closed:
            return
        self._watcher = threading.Thread(
            target=self._watch, name="riverbed-sqlite-watch", daemon=True
        )
        self._watcher.start()

    def close(self) -> None:
        super().close()
        here, self._here = self._here, None
        if here is not None:
            closed_here(here)
        opens = self._opens
        if opens is not None:
            opens.interrupt()  # a watcher waiting alone ends now

    def _look(self, conn: sqlite3.Connection, last: int) -> int:
        """The watcher's look for other connections' commits since `last`: the
        version now, readers woken if it moved."""
        version: int = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != last:
            self.wakeups.notify()
        return version

    def _watch(self) -> None:
        conn: sqlite3.Connection | None = None
        # Before the first look at who has the file open: an open after that
        # look is heard by the watch.
        opens = self._opens = OpenWatch.start(self.path) if self.alone_watch else None
        try:
            if self._stopping.is_set():
                return
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            # A commit by another process before `last` was read would go unnoticed
            # by a reader that waits for the first time (or the first time since the
            # watcher stopped); one wake-up makes it look.
            self.wakeups.notify()
            wakeups = self.wakeups
            company_until = 0.0  # till then it polls without looking who has the file open
            while True:
                if (
                    opens is not None
                    and time.monotonic() >= company_until
                    and self._alone_on_file()
                ):
                    # Nobody else has the file open, so nobody else can commit
                    # before opening it: wait for that instead of polling. A
                    # commit made before that look is heard now; our own commits
                    # wake readers themselves (`Wakeups.notify` after each).
                    self.watching_alone = True
                    last = self._look(conn, last)
                    if opens.wait(WATCH_ALONE):
                        self.watching_alone = False
                        company_until = time.monotonic() + WATCH_OPENED
                    stopped = self._stopping.is_set()
                else:
                    if opens is not None and time.monotonic() >= company_until:
                        self.watching_alone = False
                        company_until = time.monotonic() + WATCH_COMPANY
                    stopped = self._stopping.wait(wakeups.poll_interval(WATCH_INTERVAL))
                if stopped:
                    return
                last = self._look(conn, last)
                if self.wakeups.watcher_may_stop(WATCH_IDLE):
                    return
        except sqlite3.Error:
            # Closed under us, or the file went away: the next wait tries again.
            self.wakeups.watcher_stopped()
        except Exception:
            # A bug: said, and the next wait starts another watcher (one that
            # died still counted as watching would leave every later wait to
            # hear of other processes' commits only by its timeout).
            log.exception("the watcher of %s failed", self.path)
            self.wakeups.watcher_stopped()
        finally:
            self.watching_alone = False
            if opens is not None:
                self._opens = None
                opens.close()
            if conn is not None:
                conn.close()

    def _alone_on_file(self) -> bool:
        """Nobody but this storage has the file open: no other storage of this
        process, no other process (their locks on its `-shm` file)."""
        return not (self._here is None or shared_here(self._here) or others_have_open(self.path))


class _Connection(sqlite3.Connection):
    """A connection that knows whether its busy timeout is on (`try_append`)."""

    waits = True
    """The busy timeout is BUSY_TIMEOUT (else 0)."""
    inline = False
    """`try_append` is using it."""


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the database to WAL (a no-op once it is).

    The switch needs an exclusive lock that SQLite does not wait for (no busy
    handler): connections opening a new database at the same moment get
    "database is locked". Retry for as long as a write would wait.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def _busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY (another connection holds the lock), with or without its
    extended code."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == sqlite3.SQLITE_BUSY)
    return "locked" in str(exc)
