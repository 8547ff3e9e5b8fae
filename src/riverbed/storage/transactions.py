"""Write transactions for code above the storage, and the cursor queries that
must run inside them (seed 004: the position update shares the handler's
transaction).

`transaction(storage)` opens a write transaction on the calling thread's
connection and hands out a `Transaction`: `execute(sql, params)` with `?`
placeholders on both backends (rewritten to `%s` for PostgreSQL, as the
storage's own queries are), `executemany`, `savepoint` and
`rollback_to_savepoint`, and the raw DB-API `connection` for anything else. It
commits when the block ends and rolls back if it raises.

The functions named `..._in(tx, ...)` below are the storage's operations
(`Storage.append_once`, the KV writes with preconditions, marker deletions,
cursor commits) run inside such a transaction, so that code above the storage
composes them into one atomic change without writing SQL itself: the
subscriptions' batch commits, DLQ replays and shard-count changes, the session
writer, the shared-subscription leader's progress.

Everything written through it commits or vanishes together with the cursor
update the competing-consumers runner makes in the same transaction: that is
what makes a handler exactly-once. Do not COMMIT or ROLLBACK through the raw
connection; raise to roll back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from riverbed.errors import (
    InvalidInput,
    StorageBusy,
    StorageError,
    StorageFull,
    StorageUnavailable,
)
from riverbed.storage.base import Row, Storage, StorageTopicRecord, StreamHead, SubscriptionRecord
from riverbed.storage.connections import ConnectionLost, Cursor, operation
from riverbed.storage.sql import SqlStorage
from riverbed.storage.urls import redact_url


class Transaction:
    """One write transaction; see the module docstring."""

    __slots__ = ("_appended", "_cursor", "_open", "_storage", "backend")

    def __init__(self, storage: SqlStorage, cursor: Cursor) -> None:
        self._storage = storage
        self._cursor = cursor
        self._open = True
        self._appended = False
        self.backend = "postgresql" if storage.PARAMSTYLE == "%s" else "sqlite"
        """`"sqlite"` or `"postgresql"`: for a handler that must write dialect SQL."""

    @property
    def connection(self) -> Any:
        """The raw DB-API connection (sqlite3 or psycopg), inside this transaction."""
        self._check_open()
        return self._cursor.connection

    @property
    def cursor(self) -> Any:
        """The raw DB-API cursor the transaction runs on."""
        self._check_open()
        return self._cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement with `?` placeholders; returns the driver's cursor
        (`fetchone()`, `fetchall()`, `rowcount`)."""
        self._check_open()
        return self._cursor.execute(self._storage._sql(sql), params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement with `?` placeholders once per row."""
        self._check_open()
        self._cursor.executemany(self._storage._sql(sql), rows)

    def savepoint(self, name: str) -> None:
        """Mark a point inside this transaction that `rollback_to_savepoint(name)`
        goes back to (SQL `SAVEPOINT`, the same on both backends). `name`: an
        identifier (letters, digits, `_`; not starting with a digit)."""
        self._check_open()
        self.execute(f"SAVEPOINT {_identifier(name)}")

    def rollback_to_savepoint(self, name: str) -> None:
        """Undo what this transaction wrote since `savepoint(name)`, keeping what
        it wrote before. The transaction goes on, usable again on PostgreSQL
        even after a failed statement, and the savepoint stays for another
        rollback."""
        self._check_open()
        self.execute(f"ROLLBACK TO SAVEPOINT {_identifier(name)}")

    def _check_open(self) -> None:
        if not self._open:
            raise StorageError("the transaction has ended: use it only inside its block")


def _identifier(name: str) -> str:
    if not name.isascii() or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise InvalidInput(
            f"savepoint name {name!r} is not an identifier: use letters, digits and _,"
            " not starting with a digit"
        )
    return name


def sql_storage(storage: Storage) -> SqlStorage:
    """`storage` as the SQL storage the runner needs (refused otherwise)."""
    if not isinstance(storage, SqlStorage):
        raise InvalidInput(
            f"storage {storage!r} is not an SQL storage: transactions need sqlite or postgresql"
        )
    return storage


@contextmanager
def transaction(storage: Storage, *, durable: bool = True) -> Iterator[Transaction]:
    """A write transaction on this thread's connection; see the module docstring.

    `durable=False` lets PostgreSQL acknowledge the COMMIT before its WAL reaches
    the disk (`synchronous_commit = off` for this transaction alone): a server
    crash may then lose the transaction, whole, never half of it. For writes that
    can be redone, such as an at-least-once position (losing it means
    redelivery). SQLite ignores it (WAL with `synchronous=NORMAL` does not sync
    each commit anyway).

    Raises `StorageError` when the database fails to begin or commit it
    (`StorageUnavailable` when the connection was lost; at COMMIT that means its
    outcome is unknown; `StorageFull` when it refuses writes: full or
    read-only). An exception raised inside the block rolls back and
    passes through unchanged.
    """
    sql = sql_storage(storage)
    if sql.closed:
        raise sql.connections.closed_error("transaction")
    # An operation, like each of the storage's own: `close` waits for it to end
    # (a SQLite connection closed under a running statement crashes the process).
    sql.connections.enter()
    try:
        with _transaction(sql, durable) as tx:
            yield tx
    finally:
        sql.connections.leave()


def commits_now(storage: Storage) -> bool:
    """Whether `transaction_now` can run on this storage (an embedded database:
    SQLite)."""
    return storage.appends_inline


@contextmanager
def transaction_now(storage: Storage) -> Iterator[Transaction]:
    """`transaction` on the calling thread that does not wait for the write
    lock: `StorageBusy`, with nothing written, if another connection holds it.
    Lets an event loop commit a small write itself when the database is free,
    instead of handing it to a writer thread and back (as `Storage.try_append`
    does for messages). Embedded databases only (`commits_now`)."""
    sql = sql_storage(storage)
    with sql.not_waiting():
        try:
            with transaction(storage) as tx:
                yield tx
        except StorageError as exc:
            if sql.busy(exc.__cause__):
                raise StorageBusy(f"{redact_url(sql.url)!r} is being written by another") from exc
            raise


@contextmanager
def _transaction(sql: SqlStorage, durable: bool) -> Iterator[Transaction]:
    body_raised = False
    try:
        with sql._write() as cur:
            tx = Transaction(sql, cur)
            if not durable and tx.backend == "postgresql":
                cur.execute("SET LOCAL synchronous_commit = off")
            try:
                yield tx
            except BaseException:
                body_raised = True
                raise
            finally:
                tx._open = False
        if tx._appended:
            sql.wakeups.notify()  # readers waiting for the streams it appended to
    except ConnectionLost as lost:
        raise StorageUnavailable(
            f"transaction on {redact_url(sql.url)!r} lost its connection to the database"
            f" ({lost.consequence or 'nothing was written'}): {lost.__cause__}"
        ) from lost.__cause__
    except sql.DRIVER_ERRORS as exc:
        if body_raised:
            raise
        raise storage_error(sql, exc) from exc


def storage_error(storage: Storage, exc: BaseException) -> StorageError:
    """The `StorageError` that a database driver's error, raised by a statement
    in a transaction or by its COMMIT, stands for: `StorageFull` when the store
    refuses writes (full, or read-only), as a storage operation would say it."""
    sql = sql_storage(storage)
    message = f"transaction on {redact_url(sql.url)!r} failed: {' '.join(str(exc).split())}"
    if isinstance(exc, sql.DRIVER_ERRORS) and sql._refuses_writes(exc):
        return StorageFull(message)
    return StorageError(message)


# --------------------------------------------------------------------- log and KV in a transaction


def append_once_in(
    tx: Transaction, marker: str, batches: Mapping[int, Sequence[Row]]
) -> dict[int, int] | None:
    """`Storage.append_once` inside `tx`: the rows and `marker` commit (or roll
    back) with everything else `tx` writes. None, writing nothing, if `marker`
    was recorded before; raises `StreamSealed` if a stream is sealed or gone."""
    tx._check_open()
    firsts = tx._storage._append_once_on(tx._cursor, marker, batches)
    if firsts:
        tx._appended = True
    return firsts


def kv_hold_in(tx: Transaction, namespace: str, key: str, version: int) -> bool:
    """Whether a KV key is still at `version`, and keep it there until `tx`
    ends: a writer of it waits for `tx` (PostgreSQL: a share lock on the row;
    SQLite's write transactions exclude each other anyway)."""
    lock = " FOR SHARE" if tx.backend == "postgresql" else ""
    row = tx.execute(
        "SELECT 1 FROM kv WHERE namespace = ? AND key = ? AND version = ?" + lock,
        (namespace, key, version),
    ).fetchone()
    return row is not None


def kv_bump_in(tx: Transaction, namespace: str, key: str, value: bytes) -> int:
    """Write a KV value inside `tx` whatever its version and return the version
    written (1 for a new key). A transaction that holds the key at an older
    version (`kv_hold_in`) commits first or finds it changed."""
    row = tx.execute(
        "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " version = kv.version + 1 RETURNING version",
        (namespace, key, value),
    ).fetchone()
    return int(row[0])


def kv_keys_in(tx: Transaction, namespace: str, prefix: str) -> list[str]:
    """The keys of `namespace` starting with `prefix`, read inside `tx` (after
    its writes: on PostgreSQL each statement sees what committed before it)."""
    rows = tx.execute(
        "SELECT key FROM kv WHERE namespace = ? AND substr(key, 1, ?) = ?",
        (namespace, len(prefix), prefix),
    ).fetchall()
    return [str(row[0]) for row in rows]


def kv_put_in(
    tx: Transaction, namespace: str, key: str, value: bytes, expected_version: int | None
) -> bool:
    """Write a KV value inside `tx` if its version is still `expected_version`
    (None: the key must not exist yet). False if another writer changed it
    first (the caller rolls back)."""
    return kv_write_in(tx, namespace, key, value, expected_version) is not None


def kv_write_in(
    tx: Transaction,
    namespace: str,
    key: str,
    value: bytes,
    expected_version: int | None,
    expected_value: bytes | None = None,
) -> int | None:
    """Write a KV value inside `tx` if its version is still `expected_version`
    (None: the key must not exist yet), and, with `expected_value`, its value
    still those very bytes; the version written, or None if another writer
    changed the key first (nothing written). A version alone can come back: a
    key deleted and made again counts from 1 anew."""
    if expected_version is None:
        row = tx.execute(
            "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
            " ON CONFLICT (namespace, key) DO NOTHING RETURNING version",
            (namespace, key, value),
        ).fetchone()
    elif expected_value is not None:
        row = tx.execute(
            "UPDATE kv SET value = ?, version = version + 1"
            " WHERE namespace = ? AND key = ? AND version = ? AND value = ? RETURNING version",
            (value, namespace, key, expected_version, expected_value),
        ).fetchone()
    else:
        row = tx.execute(
            "UPDATE kv SET value = ?, version = version + 1"
            " WHERE namespace = ? AND key = ? AND version = ? RETURNING version",
            (value, namespace, key, expected_version),
        ).fetchone()
    return None if row is None else int(row[0])


def find_cursors_many_in(tx: Transaction, names: Sequence[str]) -> dict[str, dict[int, int]]:
    """`Storage.find_cursors_many` inside `tx`: the committed offsets of each
    of the subscriptions `names` that exists, as this transaction sees them."""
    tx._check_open()
    return tx._storage._find_cursors_many_on(tx._cursor, names)


def kv_delete_if_version_in(tx: Transaction, namespace: str, key: str, version: int) -> bool:
    """`Storage.kv_delete_if_version` inside `tx`: delete a KV key if it is still
    at `version`. False, deleting nothing, if it is absent or another writer
    changed it first (the caller rolls back)."""
    tx._check_open()
    return tx._storage._kv_delete_if_version_on(tx._cursor, namespace, key, version)


def kv_delete_numbered_below_in(tx: Transaction, namespace: str, prefix: str, below: int) -> int:
    """Delete, inside `tx`, the KV keys of `namespace` made of `prefix` and a
    decimal number less than `below` (a shared group's released QoS 2 offsets
    of one stream, once its saved progress has passed them); return how many.
    Keys starting with `prefix` must all end in such a number; keys that do
    not start with it are never read as numbers."""
    start = len(prefix) + 1
    cur = tx.execute(
        "DELETE FROM kv WHERE namespace = ? AND substr(key, 1, ?) = ?"
        " AND CASE WHEN substr(key, 1, ?) = ? THEN CAST(substr(key, ?) AS BIGINT) END < ?",
        (namespace, len(prefix), prefix, len(prefix), prefix, start, below),
    )
    return max(0, int(cur.rowcount))


def delete_marker_in(tx: Transaction, marker: str) -> bool:
    """`Storage.delete_marker` inside `tx`: forget one marker, with everything
    else `tx` writes; True if it was recorded. (A marker that only kept a
    one-off transaction from being done twice while it ran.)"""
    tx._check_open()
    return tx._storage._delete_marker_on(tx._cursor, marker)


def delete_markers_with_prefix_in(tx: Transaction, prefix: str, *, keep: str | None = None) -> int:
    """`Storage.delete_markers_with_prefix` inside `tx`, sparing the marker `keep`
    (None: none): forget the markers starting with `prefix`; return how many."""
    tx._check_open()
    return tx._storage._delete_markers_with_prefix_on(tx._cursor, prefix, keep)


def create_subscription_in(
    tx: Transaction,
    record: SubscriptionRecord,
    initial: Callable[[list[StreamHead]], dict[int, int]],
) -> list[StorageTopicRecord]:
    """`Storage.create_subscription` inside `tx` (`AlreadyExists` if the name
    is taken; `TopicNotFound` without its topic; either writes nothing);
    returns the topic's generations (`Storage.list_storage_topics`), read
    with the heads `initial` was given."""
    tx._check_open()
    return tx._storage._create_subscription_on(tx._cursor, record, initial)


def commit_cursors_in(tx: Transaction, subscription: str, offsets: Mapping[int, int]) -> bool:
    """`Storage.commit_cursors` inside `tx`: each stream's committed offset moves
    forward to the given one (never back). False, and nothing written, if the
    subscription does not exist."""
    if not offsets:
        return True
    tx._check_open()
    return tx._storage._commit_cursors_on(tx._cursor, subscription, offsets)


# --------------------------------------------------------------------- cursors in a transaction


def advance_cursor(
    tx: Transaction, subscription: str, stream_key: int, expected: int | None, offset: int
) -> bool:
    """Compare-and-set one stream's committed offset inside `tx`: write `offset`
    only if the stored offset is still `expected` (None: no row yet). False if
    another writer moved it first (the caller rolls back). For subscriptions
    whose cursors are rows (not `SubscriptionRecord.packed`): competing
    workers each commit their own streams."""
    if expected is None:
        row = tx.execute(
            "INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"
            " ON CONFLICT (subscription, stream) DO NOTHING RETURNING committed",
            (subscription, stream_key, offset),
        ).fetchone()
        return row is not None
    row = tx.execute(
        "UPDATE cursors SET committed = ? WHERE subscription = ? AND stream = ? AND committed = ?"
        " RETURNING committed",
        (offset, subscription, stream_key, expected),
    ).fetchone()
    return row is not None


@operation
def oldest_timestamps(storage: SqlStorage, positions: Mapping[int, int]) -> dict[int, int]:
    """For each stream key, the timestamp (µs) of the message at its position
    (streams whose position holds no message are left out). One query: seed 004
    orders the partitions to process by the time of their oldest unprocessed
    message."""
    if not positions:
        return {}
    items = list(positions.items())
    clauses = " OR ".join(["(stream = ? AND off = ?)"] * len(items))
    params = [value for pair in items for value in pair]
    rows = storage._q(f"SELECT stream, ts FROM messages WHERE {clauses}", params).fetchall()
    return {int(stream): int(ts) for stream, ts in rows}
