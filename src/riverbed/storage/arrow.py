"""Messages as Arrow columns: what Spark reads (`Storage.read_arrow`).

Needs pyarrow (the `riverbed[spark]` extra); imported when first used, so the
storage works without it. Two ways to fill the columns:

- the ADBC drivers (`adbc-driver-sqlite`, `adbc-driver-postgresql`), which build
  the Arrow columns in C without a Python object per value, when installed;
- the storage's own driver connection otherwise: one tuple per row, then one
  Arrow array per column.

On this machine ADBC reads 1,000,000 messages of 100 bytes about 3x faster on
SQLite and 2x on PostgreSQL than the tuple path (docs/benchmarks.md, Spark).

SQLite types values, not columns, and its ADBC driver infers a column's type
from the first rows it sees: a column that is NULL there and text later would
fail. The query therefore never hands it a NULL: `key` comes as text with a
separate null flag, `properties` as a blob that is empty for none (stored
properties are never empty: `encode_properties` stores None instead).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from riverbed.errors import InvalidOffset, RiverbedError

ARROW_COLUMNS = (
    ("offset", "int64"),
    ("id", "binary"),
    ("timestamp_us", "int64"),
    ("mqtt_topic", "string"),
    ("key", "string"),
    ("payload", "binary"),
    ("properties", "binary"),
    ("qos", "int32"),
    ("retain", "bool_"),
)
"""`read_arrow`'s columns and their Arrow types: a `StoredMessage` column by
column (`id` is the 16 id bytes, `properties` the encoded properties or null)."""

SELECT = (
    "SELECT off, id, ts, mqtt_topic, coalesce(key, '') AS key, key IS NULL AS key_null,"
    " payload, coalesce(properties, {empty_blob}) AS properties, qos, retain"
    " FROM messages WHERE stream = ? AND off >= ? AND off < ?"
)
"""The read; `filtered` appends the optional conditions and the order."""


def pyarrow_module() -> Any:
    try:
        import pyarrow
    except ImportError:  # pragma: no cover - the spark extra brings it
        raise RiverbedError(
            "reading Arrow columns needs pyarrow: pip install 'riverbed[spark]'"
        ) from None
    return pyarrow


def arrow_schema() -> Any:
    pa = pyarrow_module()
    return pa.schema([(name, getattr(pa, kind)()) for name, kind in ARROW_COLUMNS])


def query(
    empty_blob: str,
    stream_key: int,
    start: int,
    end: int,
    key: str | None,
    since_us: int | None,
    until_us: int | None,
    select: str = SELECT,
) -> tuple[str, list[Any]]:
    """The SQL (with `?` placeholders) and parameters of one `read_arrow`
    (`select`: the statement the conditions are appended to)."""
    if start < 0:
        raise InvalidOffset(f"cannot read from offset {start}: offsets start at 0")
    sql = select.format(empty_blob=empty_blob)
    params: list[Any] = [stream_key, start, end]
    if key is not None:
        sql += " AND key = ?"
        params.append(key)
    if since_us is not None:
        sql += " AND ts >= ?"
        params.append(since_us)
    if until_us is not None:
        sql += " AND ts < ?"
        params.append(until_us)
    return sql + " ORDER BY off", params


def conform(table: Any) -> Any:
    """A table of `SELECT`'s columns -> `arrow_schema()`: nulls restored, types cast."""
    pa = pyarrow_module()
    import pyarrow.compute as pc

    schema = arrow_schema()
    if table.num_rows == 0:
        return schema.empty_table()
    columns = [table.column(i) for i in range(table.num_columns)]
    off, id_, ts, mqtt_topic, key, key_null, payload, properties, qos, retain = columns
    key_null = key_null.cast(pa.bool_())
    key = pc.if_else(key_null, pa.scalar(None, pa.string()), key.cast(pa.string()))
    properties = properties.cast(pa.binary())
    properties = pc.if_else(
        pc.equal(pc.binary_length(properties), 0), pa.scalar(None, pa.binary()), properties
    )
    out = [
        off.cast(pa.int64()),
        id_.cast(pa.binary()),
        ts.cast(pa.int64()),
        mqtt_topic.cast(pa.string()),
        key,
        payload.cast(pa.binary()),
        properties,
        qos.cast(pa.int32()),
        retain.cast(pa.bool_()),
    ]
    return pa.Table.from_arrays(out, schema=schema)


TYPED_SELECT = (
    "SELECT off, id, ts, mqtt_topic, key, payload, properties, qos, retain"
    " FROM messages WHERE stream = ? AND off >= ? AND off < ?"
)
"""The read for a database whose driver types columns (PostgreSQL): nulls come
as nulls, so nothing is computed per row on either side (`conform_typed`)."""


def conform_typed(batch: Any) -> Any:
    """A record batch of `TYPED_SELECT`'s columns -> `arrow_schema()` (casts of
    whole columns; the integer ones are zero-copy or one pass)."""
    pa = pyarrow_module()
    schema = arrow_schema()
    columns = [batch.column(i) for i in range(batch.num_columns)]
    return pa.RecordBatch.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


@runtime_checkable
class ArrowStreams(Protocol):
    """A storage that can stream a range of a stream as Arrow record batches
    from one query (`read_arrow` in chunks is the fallback)."""

    def read_arrow_batches(
        self,
        stream_key: int,
        start: int,
        end: int,
        *,
        key: str | None = None,
        since_us: int | None = None,
        until_us: int | None = None,
    ) -> Iterator[Any]:
        """What `read_arrow` returns for the same arguments, as record batches
        of `arrow_schema()`, in offset order, read as the consumer takes them."""
        ...


def from_rows(rows: list[Any]) -> Any:
    """A table of `SELECT`'s columns from driver rows (the path without ADBC)."""
    pa = pyarrow_module()
    names = [
        "off", "id", "ts", "mqtt_topic", "key", "key_null", "payload", "properties", "qos",
        "retain",
    ]  # fmt: skip
    types = [
        pa.int64(), pa.binary(), pa.int64(), pa.string(), pa.string(), pa.bool_(),
        pa.binary(), pa.binary(), pa.int32(), pa.int32(),
    ]  # fmt: skip
    if not rows:
        return pa.table({n: pa.array([], t) for n, t in zip(names, types, strict=True)})
    columns = list(zip(*rows, strict=True))
    # The null flag is 0/1 on SQLite and a bool on PostgreSQL: let Arrow infer it.
    return pa.table(
        {
            n: pa.array(c) if n == "key_null" else pa.array(c, t)
            for n, c, t in zip(names, columns, types, strict=True)
        }
    )


class AdbcConnections:
    """One ADBC connection per thread, opened on first use; None when the ADBC
    driver is not installed (or cannot open the database), so callers fall back
    to the plain driver."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[Any] = []
        self._closed = False

    def get(self) -> Any | None:
        conn = getattr(self._local, "conn", False)
        if conn is not False:
            return conn
        try:
            conn = self._connect()
        except Exception:  # ImportError, or the driver refused: use the plain path
            conn = None
        with self._lock:
            if self._closed and conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
            elif conn is not None:
                self._open.append(conn)
        self._local.conn = conn
        return conn

    def discard(self) -> None:
        """Drop this thread's connection (after an error): the next `get` reopens."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = False
        if conn is not None:
            with self._lock, contextlib.suppress(ValueError):
                self._open.remove(conn)
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


def fetch_adbc(conn: Any, sql: str, params: list[Any]) -> Any:
    """Run a read on an ADBC connection and return its Arrow table."""
    cur = conn.cursor()
    try:
        cur.execute(sql, params)
        return cur.fetch_arrow_table()
    finally:
        cur.close()


def batches(table: Any, rows: int) -> Iterator[Any]:
    yield from table.to_batches(max_chunksize=rows)
