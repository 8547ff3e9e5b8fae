"""Messages: appends (idempotent ones with their markers), reads, retention's deletes."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from riverbed.clock import now_us
from riverbed.errors import InvalidInput, InvalidOffset, StreamSealed
from riverbed.model import StoredMessage
from riverbed.storage import arrow, bulk
from riverbed.storage.base import Row
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.schema import MESSAGE_COLUMNS
from riverbed.storage.sql.core import SqlCore

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


class MessageQueries(SqlCore):
    """The message and marker queries of `SqlStorage`."""

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
        each = self.JSON_EACH.format("p.offsets")
        lowest, count = self._x(
            cur,
            "SELECT MIN(c.committed), COUNT(*) FROM ("
            "SELECT committed FROM cursors WHERE stream = ? AND subscription IN"
            " (SELECT name FROM subscriptions WHERE topic = ? AND offsets IS NULL)"
            " UNION ALL SELECT CAST(j.value AS BIGINT)"
            f" FROM subscriptions p, {each} j"
            " WHERE p.topic = ? AND p.offsets IS NOT NULL AND j.key = ?) c",
            (stream_key, topic, topic, str(stream_key)),
        ).fetchone()
        return int(lowest) if count == subscriptions else start
