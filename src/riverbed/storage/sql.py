"""What both SQL backends share: every query but the hot append and the wake-ups.

Queries are written once with `?` placeholders; a backend that uses another
paramstyle sets `PARAMSTYLE` and they are rewritten once. Reads go through
`_q`, writes through `with self._write() as cur` (`connections.py`: per-thread
connections, transactions, what happens when a connection breaks). Every public
method is an `operation`: a driver error escaping it becomes a `StorageError`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from riverbed.errors import (
    AlreadyExists,
    InvalidInput,
    InvalidOffset,
    PreconditionFailed,
    StreamSealed,
    SubscriptionNotFound,
    TopicNotFound,
)
from riverbed.model import StoredMessage, StreamId
from riverbed.storage import arrow, bulk
from riverbed.storage.base import (
    KVEntry,
    RetentionPolicy,
    Row,
    StartKind,
    StorageTopicRecord,
    StreamHead,
    SubscriptionRecord,
    TopicRecord,
    Wakeups,
)
from riverbed.storage.connections import ConnectedStorage, Cursor, operation
from riverbed.storage.schema import MESSAGE_COLUMNS, MIGRATIONS

_TOPIC_COLUMNS = (
    "name, binding, retention_us, retention_policy, produce_pointer, created_us,"
    " max_age_us, max_messages, max_bytes, key_mode"
)
_SUB_COLUMNS = "name, topic, topic_filter, start_kind, start_us, created_us"
_HEAD_COLUMNS = "id, topic, generation, part, start_offset, next_offset, sealed"
_STORAGE_TOPICS = (
    "SELECT topic, generation, partitions, k FROM storage_topics"
    " WHERE topic = ? ORDER BY generation"
)

RECORD_MARKER = (
    "INSERT INTO markers (marker, created_us) VALUES (?, ?)"
    " ON CONFLICT (marker) DO NOTHING RETURNING marker"
)
"""Records an idempotency marker; returns no row if it was recorded before."""

FIRST_OFFSET_AT = "SELECT off FROM messages WHERE stream = ? AND ts >= ? ORDER BY off LIMIT 1"
"""Walks the stream's primary key in offset order and stops at the first match,
so it costs what precedes the answer, whatever the planner makes of MIN()."""

FIRST_OFFSET_AT_OR_NEXT = (
    f"SELECT COALESCE(({FIRST_OFFSET_AT}), (SELECT next_offset FROM streams WHERE id = ?), 0)"
)
"""`FIRST_OFFSET_AT`, or the stream's next offset when no message is that
recent: one statement, so one snapshot. Two would let an append commit between
them, and the answer would pass over the message it added."""

_PAYLOAD_SIZES = (
    "SELECT off, length(payload) FROM messages WHERE stream = ? AND off < ?"
    " ORDER BY off DESC LIMIT ?"
)
"""A page of payload sizes, newest first (`first_offset_within_bytes`)."""

_PAGE_OF_SIZES = (
    "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(off) FROM (SELECT off, length(payload) AS size"
    " FROM messages WHERE stream = ? AND off < ? ORDER BY off DESC LIMIT ?) AS page"
)
"""How many messages such a page holds, their payloads' sum and the lowest offset."""

SIZES_PAGE = 10_000
"""Payload sizes read per query when counting a stream's bytes."""


_stored = functools.partial(tuple.__new__, StoredMessage)
"""Row tuple -> StoredMessage without a Python-level call per row (`_make` is slower)."""


def now_us() -> int:
    return time.time_ns() // 1000


def _topic(row: Sequence[Any]) -> TopicRecord:
    return TopicRecord(
        row[0],
        row[1],
        row[2],
        RetentionPolicy(row[3]),
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
    )


def _found_topic(row: Sequence[Any] | None, name: str) -> TopicRecord:
    if row is None:
        raise TopicNotFound(f"topic {name!r} does not exist")
    return _topic(row)


def _head(row: Sequence[Any]) -> StreamHead:
    return StreamHead(row[0], StreamId(row[1], row[2], row[3]), row[4], row[5], bool(row[6]))


def _subscription(row: Sequence[Any]) -> SubscriptionRecord:
    return SubscriptionRecord(row[0], row[1], row[2], StartKind(row[3]), row[4], row[5])


class SqlStorage(ConnectedStorage):
    """Base of the SQLite and PostgreSQL storages: the queries."""

    SCHEMA_TYPES: Mapping[str, str] = {}
    EMPTY_BLOB = "X''"
    """An empty blob literal (`read_arrow`)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.wakeups = Wakeups(self._start_watcher)
        self.adbc = arrow.AdbcConnections(self._adbc_connect)
        """Per-thread ADBC connections for `read_arrow` (none without the driver)."""

    def close(self) -> None:
        super().close()
        self.adbc.close()

    # --- backend hooks ------------------------------------------------------
    def _insert_messages(
        self, cur: Cursor, batches: Mapping[int, Sequence[Row]], firsts: Mapping[int, int]
    ) -> None:
        raise NotImplementedError

    def _reserve(self, cur: Cursor, counts: Mapping[int, int]) -> dict[int, int]:
        """Move the heads of these streams on by `counts`, locking them for this
        transaction, and return each one's first reserved offset. Streams that are
        sealed or gone are left out. Backends that notify other processes of
        appends do it here, in the same statement where they can."""
        raise NotImplementedError

    def _bulk_append_once(
        self, marker: str, streams: bulk.StreamCounts, counts: Mapping[int, int], table: Any
    ) -> dict[int, int] | None:
        """`append_arrow_once`'s transaction, loading the columns in bulk (the
        wake-up of this process's readers is the caller's); raises
        `bulk.NoBulkLoader` if this backend cannot here."""
        raise bulk.NoBulkLoader

    def _rows(self, cursor: Cursor) -> Iterable[Sequence[Any]]:
        """A query's rows, the cheapest way this driver hands them over."""
        return cursor.fetchall()  # type: ignore[no-any-return]

    def _lock_meta(self, cur: Cursor) -> None:
        """Serialise metadata changes across processes (a backend hook)."""

    def _notify_in_tx(self, cur: Cursor) -> None:
        """Hook for cross-process wake-ups that ride the transaction."""

    def _start_watcher(self) -> None:
        """Start watching other processes' commits (backend specific)."""

    def _adbc_connect(self) -> Any:
        """An ADBC connection in autocommit mode (raises if the driver is missing)."""
        raise ImportError("no ADBC driver for this backend")

    def _adbc_sql(self, sql: str) -> str:
        """`sql` with `?` placeholders in the ADBC driver's style."""
        return sql

    # --- schema -------------------------------------------------------------
    @operation
    def _migrate(self) -> None:
        with self._write() as cur:
            version = self._schema_version(cur)
            for number, statements in enumerate(MIGRATIONS, start=1):
                if number <= version:
                    continue
                for statement in statements:
                    cur.execute(statement.format(**self.SCHEMA_TYPES))
                self._x(
                    cur,
                    "INSERT INTO meta (name, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (number,),
                )

    def _schema_version(self, cur: Cursor) -> int:
        raise NotImplementedError

    def _bump_meta(self, cur: Cursor) -> None:
        self._x(cur, "UPDATE meta SET value = value + 1 WHERE name = 'meta_version'")

    # --- metadata -----------------------------------------------------------
    @operation
    def meta_version(self) -> int:
        row = self._q("SELECT value FROM meta WHERE name = 'meta_version'").fetchone()
        return int(row[0])

    def _get_topic(self, cur: Cursor, name: str) -> TopicRecord:
        row = self._x(cur, f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = ?", (name,))
        return _found_topic(row.fetchone(), name)

    @operation
    def create_topic(
        self,
        topic: TopicRecord,
        partitions: int,
        validate: Callable[[list[TopicRecord]], None],
    ) -> None:
        with self._write() as cur:
            self._lock_meta(cur)
            existing = [_topic(r) for r in self._x(cur, f"SELECT {_TOPIC_COLUMNS} FROM topics")]
            if any(t.name == topic.name for t in existing):
                raise AlreadyExists(f"topic {topic.name!r} exists already")
            validate(existing)
            self._x(
                cur,
                f"INSERT INTO topics ({_TOPIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    topic.name,
                    topic.binding,
                    topic.retention_us,
                    topic.retention_policy.value,
                    topic.produce_pointer,
                    topic.created_us,
                    topic.max_age_us,
                    topic.max_messages,
                    topic.max_bytes,
                    topic.key_mode,
                ),
            )
            self._insert_generation(cur, StorageTopicRecord(topic.name, 0, partitions, 1))
            self._bump_meta(cur)

    def _insert_generation(self, cur: Cursor, st: StorageTopicRecord) -> None:
        self._x(
            cur,
            "INSERT INTO storage_topics (topic, generation, partitions, k) VALUES (?, ?, ?, ?)",
            (st.topic, st.generation, st.partitions, st.k),
        )
        cur.executemany(
            self._sql(
                "INSERT INTO streams (topic, generation, part, start_offset, next_offset, sealed)"
                " VALUES (?, ?, ?, 0, 0, 0)"
            ),
            [(st.topic, st.generation, p) for p in range(st.partitions)],
        )

    @operation
    def get_topic(self, name: str) -> TopicRecord:
        return self._read_topic(name)

    def _read_topic(self, name: str) -> TopicRecord:
        row = self._q(f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = ?", (name,)).fetchone()
        return _found_topic(row, name)

    @operation
    def list_topics(self) -> list[TopicRecord]:
        rows = self._q(f"SELECT {_TOPIC_COLUMNS} FROM topics ORDER BY name").fetchall()
        return [_topic(r) for r in rows]

    @operation
    def update_topic(
        self, name: str, retention_us: int | None, retention_policy: RetentionPolicy
    ) -> TopicRecord:
        return self._set_topic(
            name, "retention_us = ?, retention_policy = ?", (retention_us, retention_policy.value)
        )

    @operation
    def set_topic_limits(
        self, name: str, max_age_us: int | None, max_messages: int | None
    ) -> TopicRecord:
        return self._set_topic(name, "max_age_us = ?, max_messages = ?", (max_age_us, max_messages))

    @operation
    def alter_topic(self, name: str, change: Callable[[TopicRecord], TopicRecord]) -> TopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            wanted = change(self._get_topic(cur, name))
            self._x(
                cur,
                "UPDATE topics SET retention_us = ?, retention_policy = ?, max_age_us = ?,"
                " max_messages = ?, max_bytes = ?, key_mode = ? WHERE name = ?",
                (
                    wanted.retention_us,
                    wanted.retention_policy.value,
                    wanted.max_age_us,
                    wanted.max_messages,
                    wanted.max_bytes,
                    wanted.key_mode,
                    name,
                ),
            )
            self._bump_meta(cur)
            return self._get_topic(cur, name)

    def _set_topic(self, name: str, assignments: str, values: Sequence[Any]) -> TopicRecord:
        """Change columns of a topic's row (`assignments`: `col = ?, ...`)."""
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, name)
            self._x(cur, f"UPDATE topics SET {assignments} WHERE name = ?", (*values, name))
            self._bump_meta(cur)
            return self._get_topic(cur, name)

    @operation
    def delete_topic(self, name: str) -> int:
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, name)
            deleted = self._x(
                cur,
                "DELETE FROM messages WHERE stream IN (SELECT id FROM streams WHERE topic = ?)",
                (name,),
            ).rowcount
            self._x(
                cur,
                "DELETE FROM cursors WHERE subscription IN"
                " (SELECT name FROM subscriptions WHERE topic = ?)",
                (name,),
            )
            self._x(cur, "DELETE FROM subscriptions WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM streams WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM storage_topics WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM topics WHERE name = ?", (name,))
            self._bump_meta(cur)
            # Readers of its streams (in other processes too) learn they are gone.
            self._notify_in_tx(cur)
        self.wakeups.notify()
        return int(deleted)

    def _storage_topics(self, cur: Cursor, topic: str) -> list[StorageTopicRecord]:
        rows = self._x(cur, _STORAGE_TOPICS, (topic,)).fetchall()
        return [StorageTopicRecord(*r) for r in rows]

    @operation
    def list_storage_topics(self, topic: str) -> list[StorageTopicRecord]:
        self._read_topic(topic)
        return [StorageTopicRecord(*r) for r in self._q(_STORAGE_TOPICS, (topic,)).fetchall()]

    @operation
    def add_storage_topic(
        self, topic: str, plan: Callable[[StorageTopicRecord], tuple[int, int]]
    ) -> StorageTopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, topic)
            last = self._storage_topics(cur, topic)[-1]
            partitions, k = plan(last)
            added = StorageTopicRecord(topic, last.generation + 1, partitions, k)
            self._insert_generation(cur, added)
            self._bump_meta(cur)
            return added

    @operation
    def switch_produce(self, topic: str) -> TopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            record = self._get_topic(cur, topic)
            last = len(self._storage_topics(cur, topic)) - 1
            pointer = min(record.produce_pointer + 1, last)
            if pointer != record.produce_pointer:
                self._x(
                    cur, "UPDATE topics SET produce_pointer = ? WHERE name = ?", (pointer, topic)
                )
                # Sealing happens in the same transaction that moves the pointer. An
                # append holds the lock on the heads it writes (SQLite: the database
                # write lock; PostgreSQL: row locks), so no write is in flight to a
                # stream once it reads as sealed (DESIGN.md, Stream).
                self._x(
                    cur,
                    "UPDATE streams SET sealed = 1 WHERE topic = ? AND generation < ?",
                    (topic, pointer),
                )
                self._bump_meta(cur)
                self._notify_in_tx(cur)
            result = self._get_topic(cur, topic)
        self.wakeups.notify()
        return result

    @operation
    def list_streams(self, topic: str | None = None) -> list[StreamHead]:
        if topic is None:
            rows = self._q(
                f"SELECT {_HEAD_COLUMNS} FROM streams ORDER BY topic, generation, part"
            ).fetchall()
        else:
            rows = self._q(
                f"SELECT {_HEAD_COLUMNS} FROM streams WHERE topic = ? ORDER BY generation, part",
                (topic,),
            ).fetchall()
        return [_head(r) for r in rows]

    # --- messages -----------------------------------------------------------
    @operation
    def append(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int]:
        return self._append_rows(batches)

    def _append_rows(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int]:
        counts = {k: len(batches[k]) for k in sorted(batches)}  # a fixed lock order
        with self._write() as cur:
            firsts = self._reserve(cur, counts)
            missing = [k for k in counts if k not in firsts]
            if missing:
                raise StreamSealed(missing)  # rolls the reservation back
            self._insert_messages(cur, batches, firsts)
        self.wakeups.notify()
        return firsts

    appends_inline = False

    @operation
    def try_append(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int] | None:
        return None  # a server round trip: see SqliteStorage

    @operation
    def append_once(
        self, marker: str, batches: Mapping[int, Sequence[Row]]
    ) -> dict[int, int] | None:
        with self._write() as cur:
            firsts = self._append_once_on(cur, marker, batches)
        if firsts:
            self.wakeups.notify()
        return firsts

    def _append_once_on(
        self, cur: Cursor, marker: str, batches: Mapping[int, Sequence[Row]]
    ) -> dict[int, int] | None:
        """`append_once` inside the transaction of `cur` (the caller notifies
        the wake-ups after it commits)."""
        counts = {k: len(batches[k]) for k in sorted(batches) if batches[k]}
        # First, so that a concurrent attempt with the same marker waits here
        # for ours to end (PostgreSQL: the unique index; SQLite: the write lock).
        recorded = self._x(cur, RECORD_MARKER, (marker, now_us())).fetchone()
        if recorded is None:
            return None
        if not counts:
            return {}
        firsts = self._reserve(cur, counts)
        missing = [k for k in counts if k not in firsts]
        if missing:
            raise StreamSealed(missing)  # rolls the marker back too
        self._insert_messages(cur, {k: batches[k] for k in counts}, firsts)
        return firsts

    @operation
    def append_arrow_once(
        self, marker: str, streams: bulk.StreamCounts, table: Any
    ) -> dict[int, int] | None:
        """`append_once` for rows given as Arrow columns (`bulk.ArrowAppends`):
        loaded in bulk where the backend can (`_bulk_append_once`), else a tuple
        per row."""
        counts = bulk.check(streams, table)
        if table.num_rows >= bulk.MIN_ROWS:
            try:
                firsts = self._bulk_append_once(marker, streams, counts, table)
            except bulk.NoBulkLoader:
                pass
            else:
                if firsts is not None:
                    self.wakeups.notify()
                return firsts
        return self.append_once(marker, bulk.row_batches(streams, table))

    @operation
    def delete_markers(self, before_us: int) -> int:
        with self._write() as cur:
            return int(
                self._x(cur, "DELETE FROM markers WHERE created_us < ?", (before_us,)).rowcount
            )

    @operation
    def delete_marker(self, marker: str) -> bool:
        with self._write() as cur:
            return self._delete_marker_on(cur, marker)

    def _delete_marker_on(self, cur: Cursor, marker: str) -> bool:
        """`delete_marker` inside the transaction of `cur`."""
        deleted: int = self._x(cur, "DELETE FROM markers WHERE marker = ?", (marker,)).rowcount
        return deleted > 0

    @operation
    def delete_markers_with_prefix(self, prefix: str) -> int:
        with self._write() as cur:
            return self._delete_markers_with_prefix_on(cur, prefix)

    def _delete_markers_with_prefix_on(
        self, cur: Cursor, prefix: str, keep: str | None = None
    ) -> int:
        """`delete_markers_with_prefix` inside the transaction of `cur`, sparing
        the marker `keep` (if given)."""
        # substr, not LIKE: no escaping of `%`/`_`, same meaning on both backends.
        sql = "DELETE FROM markers WHERE substr(marker, 1, ?) = ?"
        params: tuple[object, ...] = (len(prefix), prefix)
        if keep is not None:
            sql, params = f"{sql} AND marker <> ?", (*params, keep)
        return int(self._x(cur, sql, params).rowcount)

    @operation
    def read_arrow(
        self,
        stream_key: int,
        start: int,
        end: int,
        *,
        key: str | None = None,
        since_us: int | None = None,
        until_us: int | None = None,
    ) -> Any:
        sql, params = arrow.query(self.EMPTY_BLOB, stream_key, start, end, key, since_us, until_us)
        conn = self.adbc.get()
        if conn is not None:
            try:
                return arrow.conform(arrow.fetch_adbc(conn, self._adbc_sql(sql), params))
            except Exception:
                # Its state is unknown now: the next call reconnects. This one reads
                # through the plain driver, whose errors say what went wrong in the
                # storage's usual terms.
                self.adbc.discard()
        table = arrow.from_rows(self._q(sql, params).fetchall())
        return arrow.conform(table)

    @operation
    def read(self, stream_key: int, offset: int, limit: int) -> list[StoredMessage]:
        # Checked here, not left to the databases: they disagree (SQLite reads
        # everything for LIMIT -1, PostgreSQL refuses it).
        if offset < 0:
            raise InvalidOffset(f"cannot read from offset {offset}: offsets start at 0")
        if limit < 1:
            raise InvalidInput(f"cannot read with limit {limit}: the limit must be at least 1")
        cursor = self._q(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE stream = ? AND off >= ?"
            " ORDER BY off LIMIT ?",
            (stream_key, offset, limit),
        )
        return list(map(_stored, self._rows(cursor)))

    @operation
    def first_offset_at(self, stream_key: int, timestamp_us: int) -> int:
        (offset,) = self._q(
            FIRST_OFFSET_AT_OR_NEXT, (stream_key, timestamp_us, stream_key)
        ).fetchone()
        return int(offset)

    @operation
    def first_offset_within_bytes(self, stream_key: int, max_bytes: int) -> int:
        # Pages walk the primary key down from the newest message, each summed by
        # the database; only the page where the limit falls comes back row by
        # row. Appends land above the first page and are left out; a concurrent
        # deletion of the oldest messages only ends the walk sooner.
        kept = 0
        lowest: int | None = None  # the lowest offset kept so far; None: the newest is next
        while True:
            below = (1 << 62) if lowest is None else lowest
            count, size, first = self._q(_PAGE_OF_SIZES, (stream_key, below, SIZES_PAGE)).fetchone()
            if not count:
                break
            if kept + size > max_bytes:
                for offset, row_size in self._q(_PAYLOAD_SIZES, (stream_key, below, SIZES_PAGE)):
                    if kept + row_size > max_bytes:
                        return int(offset) if lowest is None else lowest
                    kept += row_size
                    lowest = int(offset)
                break  # rows went meanwhile: what is left fits
            kept += size
            lowest = int(first)
            if count < SIZES_PAGE:
                break
        if lowest is not None:
            return lowest
        (next_offset,) = self._q(
            "SELECT COALESCE((SELECT next_offset FROM streams WHERE id = ?), 0)", (stream_key,)
        ).fetchone()
        return int(next_offset)

    @operation
    def delete_before(self, stream_key: int, offset: int, *, keep_uncommitted: bool = False) -> int:
        with self._write() as cur:
            if keep_uncommitted:
                # Serialised with create_subscription (which holds this lock), so a
                # subscription created since the caller looked is seen here.
                self._lock_meta(cur)
            head = self._x(
                cur,
                "SELECT start_offset, next_offset, topic FROM streams WHERE id = ?",
                (stream_key,),
            ).fetchone()
            if head is None or offset <= head[0]:
                return 0
            upto = min(offset, head[1])
            if keep_uncommitted:
                upto = min(upto, self._lowest_committed(cur, stream_key, head[2], head[0]))
                if upto <= head[0]:
                    return 0
            deleted = self._x(
                cur, "DELETE FROM messages WHERE stream = ? AND off < ?", (stream_key, upto)
            ).rowcount
            # Guarded so that two concurrent retention runs cannot move the start
            # backwards (on PostgreSQL both may have read the old start).
            self._x(
                cur,
                "UPDATE streams SET start_offset = ? WHERE id = ? AND start_offset < ?",
                (upto, stream_key, upto),
            )
            return int(deleted)

    def _lowest_committed(self, cur: Cursor, stream_key: int, topic: str, start: int) -> int:
        """The lowest offset any subscription of `topic` has committed on the stream
        (`start` if one has committed nothing there; no subscription: no limit)."""
        subscriptions = self._x(
            cur, "SELECT COUNT(*) FROM subscriptions WHERE topic = ?", (topic,)
        ).fetchone()[0]
        if not subscriptions:
            return 1 << 62
        lowest, count = self._x(
            cur,
            "SELECT MIN(committed), COUNT(*) FROM cursors WHERE stream = ? AND subscription IN"
            " (SELECT name FROM subscriptions WHERE topic = ?)",
            (stream_key, topic),
        ).fetchone()
        return int(lowest) if count == subscriptions else start

    # --- subscriptions ------------------------------------------------------
    @operation
    def create_subscription(
        self,
        record: SubscriptionRecord,
        initial: Callable[[list[StreamHead]], dict[int, int]],
    ) -> None:
        with self._write() as cur:
            self._create_subscription_on(cur, record, initial)

    def _create_subscription_on(
        self,
        cur: Cursor,
        record: SubscriptionRecord,
        initial: Callable[[list[StreamHead]], dict[int, int]],
    ) -> None:
        """`create_subscription` inside the transaction of `cur`."""
        self._lock_meta(cur)
        self._get_topic(cur, record.topic)
        found = self._x(
            cur, "SELECT 1 FROM subscriptions WHERE name = ?", (record.name,)
        ).fetchone()
        if found is not None:
            raise AlreadyExists(f"subscription {record.name!r} exists already")
        self._x(
            cur,
            f"INSERT INTO subscriptions ({_SUB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (
                record.name,
                record.topic,
                record.filter,
                record.start.value,
                record.start_us,
                record.created_us,
            ),
        )
        heads = [
            _head(r)
            for r in self._x(
                cur,
                f"SELECT {_HEAD_COLUMNS} FROM streams WHERE topic = ? ORDER BY generation, part",
                (record.topic,),
            ).fetchall()
        ]
        offsets = initial(heads)
        cur.executemany(
            self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
            [(record.name, k, v) for k, v in offsets.items()],
        )

    @operation
    def get_subscription(self, name: str) -> SubscriptionRecord:
        row = self._q(
            f"SELECT {_SUB_COLUMNS} FROM subscriptions WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")
        return _subscription(row)

    @operation
    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionRecord]:
        if topic is None:
            rows = self._q(f"SELECT {_SUB_COLUMNS} FROM subscriptions ORDER BY name").fetchall()
        else:
            rows = self._q(
                f"SELECT {_SUB_COLUMNS} FROM subscriptions WHERE topic = ? ORDER BY name",
                (topic,),
            ).fetchall()
        return [_subscription(r) for r in rows]

    @operation
    def delete_subscription(self, name: str) -> None:
        with self._write() as cur:
            if self._x(cur, "DELETE FROM subscriptions WHERE name = ?", (name,)).rowcount == 0:
                raise SubscriptionNotFound(f"subscription {name!r} does not exist")
            self._x(cur, "DELETE FROM cursors WHERE subscription = ?", (name,))

    @operation
    def get_cursors(self, name: str) -> dict[int, int]:
        rows = self._q(
            "SELECT stream, committed FROM cursors WHERE subscription = ?", (name,)
        ).fetchall()
        return {int(s): int(c) for s, c in rows}

    def _require_subscription(self, cur: Cursor, name: str) -> None:
        if self._x(cur, "SELECT 1 FROM subscriptions WHERE name = ?", (name,)).fetchone() is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")

    @operation
    def commit_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        if not offsets:
            return
        with self._write() as cur:
            self._require_subscription(cur, name)
            cur.executemany(
                self._sql(
                    "INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"
                    " ON CONFLICT (subscription, stream) DO UPDATE SET committed ="
                    " CASE WHEN excluded.committed > cursors.committed"
                    " THEN excluded.committed ELSE cursors.committed END"
                ),
                [(name, k, v) for k, v in offsets.items()],
            )

    @operation
    def reset_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        with self._write() as cur:
            self._require_subscription(cur, name)
            self._x(cur, "DELETE FROM cursors WHERE subscription = ?", (name,))
            cur.executemany(
                self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
                [(name, k, v) for k, v in offsets.items()],
            )

    @operation
    def min_cursors(self, topic: str) -> dict[int, int]:
        subs = self._q("SELECT COUNT(*) FROM subscriptions WHERE topic = ?", (topic,)).fetchone()
        total = int(subs[0])
        rows = self._q(
            "SELECT s.id, MIN(c.committed), COUNT(c.committed) FROM streams s"
            " LEFT JOIN cursors c ON c.stream = s.id AND c.subscription IN"
            " (SELECT name FROM subscriptions WHERE topic = ?)"
            " WHERE s.topic = ? GROUP BY s.id",
            (topic, topic),
        ).fetchall()
        out: dict[int, int] = {}
        for stream, lowest, count in rows:
            if total == 0:
                continue
            out[int(stream)] = int(lowest) if int(count) == total else -1
        return out

    # --- key-value ----------------------------------------------------------
    @operation
    def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        row = self._q(
            "SELECT value, version FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
        ).fetchone()
        return None if row is None else KVEntry(namespace, key, bytes(row[0]), int(row[1]))

    @operation
    def kv_list(self, namespace: str, prefix: str = "") -> list[KVEntry]:
        rows = self._q(
            "SELECT key, value, version FROM kv WHERE namespace = ? AND substr(key, 1, ?) = ?"
            " ORDER BY key",
            (namespace, len(prefix), prefix),
        ).fetchall()
        return [KVEntry(namespace, k, bytes(v), int(ver)) for k, v, ver in rows]

    @operation
    def kv_count(self, namespace: str) -> int:
        row = self._q("SELECT count(*) FROM kv WHERE namespace = ?", (namespace,)).fetchone()
        return int(row[0])

    @operation
    def kv_put(self, namespace: str, key: str, value: bytes) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
                " version = kv.version + 1 RETURNING version",
                (namespace, key, value),
            ).fetchone()
            return KVEntry(namespace, key, value, int(row[0]))

    @operation
    def kv_put_if_absent(self, namespace: str, key: str, value: bytes) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (namespace, key) DO NOTHING RETURNING version",
                (namespace, key, value),
            ).fetchone()
            if row is None:
                raise PreconditionFailed(f"key {namespace}/{key} exists already")
            return KVEntry(namespace, key, value, 1)

    @operation
    def kv_compare_and_set(
        self, namespace: str, key: str, expected_version: int, value: bytes
    ) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "UPDATE kv SET value = ?, version = version + 1"
                " WHERE namespace = ? AND key = ? AND version = ? RETURNING version",
                (value, namespace, key, expected_version),
            ).fetchone()
            if row is None:
                raise PreconditionFailed(
                    f"key {namespace}/{key} is not at version {expected_version}"
                )
            return KVEntry(namespace, key, value, int(row[0]))

    @operation
    def kv_delete_if_version(self, namespace: str, key: str, expected_version: int) -> None:
        with self._write() as cur:
            if not self._kv_delete_if_version_on(cur, namespace, key, expected_version):
                raise PreconditionFailed(
                    f"key {namespace}/{key} is not at version {expected_version}"
                )

    def _kv_delete_if_version_on(
        self, cur: Cursor, namespace: str, key: str, expected_version: int
    ) -> bool:
        """`kv_delete_if_version` inside the transaction of `cur`: whether the
        key was there at that version (and is gone now)."""
        deleted: int = self._x(
            cur,
            "DELETE FROM kv WHERE namespace = ? AND key = ? AND version = ?",
            (namespace, key, expected_version),
        ).rowcount
        return deleted > 0
