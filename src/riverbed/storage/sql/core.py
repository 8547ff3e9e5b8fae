"""The base of the SQL storage's parts (`riverbed.storage.sql`): the connections
and the dialect (`PARAMSTYLE`, the backend hooks a backend overrides), the schema,
and the row helpers and queries more than one part uses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from riverbed.errors import TopicNotFound
from riverbed.model import StreamId
from riverbed.storage import arrow, bulk
from riverbed.storage.base import RetentionPolicy, Row, StreamHead, TopicRecord, Wakeups
from riverbed.storage.connections import ConnectedStorage, Cursor, operation
from riverbed.storage.schema import MIGRATIONS

_TOPIC_COLUMNS = (
    "name, binding, retention_us, retention_policy, produce_pointer, created_us,"
    " max_age_us, max_messages, max_bytes, key_mode"
)
_HEAD_COLUMNS = "id, topic, generation, part, start_offset, next_offset, sealed"


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


IN_PART = 500
"""Values in one `IN (...)` list at most (`in_parts`)."""


def in_parts(values: Sequence[str]) -> list[list[str]]:
    """`values` without repeats, in parts of at most IN_PART: a read of many
    keys is a statement per part, each with a list of placeholders."""
    unique = list(dict.fromkeys(values))
    return [unique[i : i + IN_PART] for i in range(0, len(unique), IN_PART)]


def _head(row: Sequence[Any]) -> StreamHead:
    return StreamHead(row[0], StreamId(row[1], row[2], row[3]), row[4], row[5], bool(row[6]))


class SqlCore(ConnectedStorage):
    """What the queries stand on: the connections, the backend hooks, the schema."""

    SCHEMA_TYPES: Mapping[str, str] = {}
    EMPTY_BLOB = "X''"
    """An empty blob literal (`read_arrow`)."""
    JSON_EACH = "json_each({})"
    """A table function of a JSON object's members (`key`, `value`), given the
    column or expression holding it as text (packed cursors)."""

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

    def _lock_meta_shared(self, cur: Cursor) -> None:
        """What `_lock_meta` excludes, without excluding one another: a new
        subscription reads its topic's streams as no metadata change in
        progress leaves them, alongside other new subscriptions (a backend
        hook)."""

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

    # --- shared queries ----------------------------------------------------
    def _get_topic(self, cur: Cursor, name: str) -> TopicRecord:
        row = self._x(cur, f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = ?", (name,))
        return _found_topic(row.fetchone(), name)
