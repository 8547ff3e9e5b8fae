"""Appending rows held as Arrow columns, exactly once (`ArrowAppends`).

`Storage.append_once` takes a Python tuple per row; a writer that already holds
its rows as Arrow columns (the Spark sink) would spend most of its time making
and binding those tuples (docs/benchmarks.md, Spark). A storage that implements
`append_arrow_once` loads the columns in bulk instead, in the same transaction as
the marker and the stream heads, so exactly-once and the heads stay as with
`append_once`:

- SQLite: the ADBC driver writes the columns into a private staging database
  file (before the write lock is taken, so tasks stage in parallel), and the
  storage's own connection attaches it and copies the rows over with one
  `INSERT ... SELECT` per stream inside its write transaction. The ADBC driver
  carries its own copy of SQLite, and two copies of SQLite in one process must
  never open the same database file (their POSIX locks do not see each other:
  sqlite.org/howtocorrupt.html, 2.2.1): the staging file is opened by one copy
  at a time, the log's file by ours only.
- PostgreSQL: an ADBC connection runs the whole transaction: marker, heads,
  binary COPY of the columns (`adbc_ingest`), NOTIFY.

Without the ADBC driver, or for a handful of rows, it falls back to
`append_once` with a tuple per row (`row_batches`).

Needs pyarrow (the `riverbed[spark]` extra), imported when first used.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from riverbed.errors import InvalidInput, StorageError
from riverbed.storage.base import Row

ROW_FIELDS = (
    ("id", "binary"),
    ("ts", "int64"),
    ("mqtt_topic", "string"),
    ("key", "string"),
    ("payload", "binary"),
    ("properties", "binary"),
    ("qos", "int16"),
    ("retain", "int16"),
)
"""The columns of the rows `append_arrow_once` takes: a `Row` column by column."""

MIN_ROWS = 1_000
"""Fewer rows than this go through `append_once`: for them, opening a bulk
loader costs more than it saves."""

StreamCounts = Sequence[tuple[int, int]]
"""(stream key, rows) pairs: the rows of a table grouped by stream, in table order."""


@runtime_checkable
class ArrowAppends(Protocol):
    """A storage that can append Arrow columns in bulk."""

    def append_arrow_once(
        self, marker: str, streams: StreamCounts, table: Any
    ) -> dict[int, int] | None:
        """`Storage.append_once` for rows given as Arrow columns (`ROW_FIELDS`):
        the first `streams[0][1]` rows of `table` go to stream `streams[0][0]`,
        the next ones to `streams[1][0]`, and so on, each stream's rows in table
        order. Returns each stream's first new offset, or None if `marker` was
        recorded before (nothing written)."""
        ...


class NoBulkLoader(Exception):
    """Internal: this backend cannot load columns in bulk here (no ADBC driver)."""


def row_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in ROW_FIELDS])


def check(streams: StreamCounts, table: Any) -> dict[int, int]:
    """Refuse a table that is not `ROW_FIELDS` grouped as `streams` says;
    return the row count per stream."""
    if table.schema.names != [name for name, _ in ROW_FIELDS]:
        raise InvalidInput(f"rows to append have columns {table.schema.names}; want {ROW_FIELDS}")
    counts: dict[int, int] = {}
    for key, count in streams:
        if key in counts or count < 0:
            raise InvalidInput(f"stream {key} is listed twice or with {count} rows")
        counts[key] = count
    if sum(counts.values()) != table.num_rows:
        raise InvalidInput(f"{table.num_rows} rows do not add up to the streams' counts {counts}")
    return counts


def slices(streams: StreamCounts) -> Iterator[tuple[int, int, int]]:
    """(stream key, first row, rows) of each stream's rows in the table."""
    start = 0
    for key, count in streams:
        yield key, start, count
        start += count


def row_batches(streams: StreamCounts, table: Any) -> dict[int, list[Row]]:
    """The rows as `append_once` takes them: a tuple per row, by stream."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    rows: list[Row] = list(zip(*columns, strict=True))
    return {key: rows[start : start + count] for key, start, count in slices(streams) if count}


def message_table(streams: StreamCounts, firsts: Mapping[int, int], table: Any) -> Any:
    """The rows with their `stream` and `off` in front: the messages table's columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys: list[Any] = []
    offsets: list[Any] = []
    ones = pa.repeat(pa.scalar(1, pa.int64()), max((c for _, c in streams), default=0))
    for key, _, count in slices(streams):
        keys.append(pa.repeat(pa.scalar(key, pa.int64()), count))
        # firsts[key], firsts[key] + 1, ... without a Python int per row
        offsets.append(pc.add(pc.cumulative_sum(ones.slice(0, count)), firsts[key] - 1))
    stream_column = pa.concat_arrays(keys) if keys else pa.array([], pa.int64())
    off_column = pa.concat_arrays(offsets) if offsets else pa.array([], pa.int64())
    return table.add_column(0, "stream", stream_column).add_column(1, "off", off_column)


@contextlib.contextmanager
def sqlite_stage(table: Any) -> Iterator[Path]:
    """The rows in a new SQLite database file (table `rows`, rowid = row number
    from 1), written by the ADBC driver; deleted afterwards. See the module
    docstring for why the file is private."""
    try:
        import adbc_driver_sqlite.dbapi
    except ImportError:
        raise NoBulkLoader from None
    directory = Path(tempfile.mkdtemp(prefix="riverbed-stage-"))
    try:
        path = directory / "rows.db"
        conn = adbc_driver_sqlite.dbapi.connect(str(path), autocommit=True)
        try:
            with conn.cursor() as cur:
                # Scratch data: nothing to recover if the process dies now. Large
                # pages: fewer of them to write here and to read in the copy.
                cur.execute("PRAGMA journal_mode=OFF")
                cur.fetchall()
                cur.execute("PRAGMA synchronous=OFF")
                cur.execute("PRAGMA page_size=65536")
                cur.adbc_ingest("rows", table, mode="create")
        except Exception as exc:
            raise StorageError(f"could not stage {table.num_rows} rows in {path}: {exc}") from exc
        finally:
            conn.close()
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)
