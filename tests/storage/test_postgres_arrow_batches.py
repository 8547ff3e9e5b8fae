"""`PostgresStorage.read_arrow_batches`: a stream's range streamed from one ADBC
query, the same messages as `read_arrow`; with ADBC missing, or failing in the
middle of the stream, the rest comes through the plain driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness.storage import create_topic, make_rows, mixed_rows
from riverbed.errors import InvalidOffset
from riverbed.storage import open_storage
from riverbed.storage.arrow import ArrowStreams, arrow_schema
from riverbed.storage.postgres import PostgresStorage

pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.postgres


@pytest.fixture
def storage(postgres_url: str) -> Iterator[PostgresStorage]:
    opened = open_storage(postgres_url)
    assert isinstance(opened, PostgresStorage)
    try:
        yield opened
    finally:
        opened.close()


def streamed(storage: PostgresStorage, *args: Any, **kwargs: Any) -> Any:
    batches = list(storage.read_arrow_batches(*args, **kwargs))
    for batch in batches:
        assert batch.schema == arrow_schema()
    return pa.Table.from_batches(batches, schema=arrow_schema())


def test_streamed_batches_equal_read_arrow(storage: PostgresStorage) -> None:
    assert isinstance(storage, ArrowStreams)
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()})

    assert streamed(storage, s.key, 0, 4).equals(storage.read_arrow(s.key, 0, 4))
    assert streamed(storage, s.key, 1, 3).column("offset").to_pylist() == [1, 2]
    assert streamed(storage, s.key, 4, 10).num_rows == 0
    assert streamed(storage, s.key, 0, 4, key="k2").column("offset").to_pylist() == [2]
    window = streamed(storage, s.key, 0, 4, since_us=20, until_us=40)
    assert window.column("offset").to_pylist() == [1, 2]
    with pytest.raises(InvalidOffset):
        storage.read_arrow_batches(s.key, -1, 2)


def test_a_key_with_quotes_is_read_as_a_value(storage: PostgresStorage) -> None:
    # The streamed query carries its values as SQL literals.
    (s,) = create_topic(storage, "t")
    odd = "it's a \\ key'); DROP TABLE messages; --"
    storage.append({s.key: make_rows([b"a"], key=odd) + make_rows([b"b"], key="plain")})

    table = streamed(storage, s.key, 0, 2, key=odd)

    assert table.column("payload").to_pylist() == [b"a"]
    assert table.column("key").to_pylist() == [odd]
    assert streamed(storage, s.key, 0, 2).num_rows == 2


def test_without_adbc_the_plain_driver_reads_in_chunks(
    storage: PostgresStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_adbc() -> object:
        raise ImportError("disabled by the test")

    storage.adbc._connect = no_adbc
    monkeypatch.setattr("riverbed.storage.postgres.FALLBACK_CHUNK", 3)
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()})

    batches = list(storage.read_arrow_batches(s.key, 0, 4))

    assert [b.num_rows for b in batches] == [3, 1]
    expected = storage.read_arrow(s.key, 0, 4)
    assert pa.Table.from_batches(batches).equals(expected)


class FailingAfterOneBatch:
    """An ADBC connection whose query yields its first record batch, then fails
    (a connection that broke in the middle of the stream)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.closed = False
        self.first_rows = 0

    def cursor(self) -> Any:
        real = self.real.cursor()
        outer = self

        class Cursor:
            adbc_statement = real.adbc_statement

            def execute(self, sql: str, params: Any = None) -> None:
                real.execute(sql, params)

            def fetch_record_batch(self) -> Iterator[Any]:
                first = next(iter(real.fetch_record_batch()))
                outer.first_rows = first.num_rows
                yield first
                raise OSError("connection broke mid-stream (the test)")

            def close(self) -> None:
                real.close()

        return Cursor()

    def close(self) -> None:
        self.closed = True
        self.real.close()


def test_a_stream_broken_midway_goes_on_through_the_plain_driver(
    storage: PostgresStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("riverbed.storage.postgres.BATCH_BYTES", 64 << 10)
    (s,) = create_topic(storage, "t")
    # About 2.5 MB: several of the driver's record batches of 64 KiB.
    payloads = [bytes([n % 251]) * 100 for n in range(20_000)]
    storage.append({s.key: make_rows(payloads)})
    real = storage.adbc.get()
    assert real is not None
    failing = FailingAfterOneBatch(real)
    storage.adbc._local.conn = failing  # this thread's connection

    table = streamed(storage, s.key, 0, len(payloads))

    assert table.column("offset").to_pylist() == list(range(len(payloads)))
    assert table.column("payload").to_pylist() == payloads
    assert 0 < failing.first_rows < len(payloads), "the stream did not break midway"
    assert failing.closed, "the broken connection was not dropped"
    assert storage.adbc.get() is not failing


def test_reads_use_the_primary_key_in_order_without_a_sort(
    storage: PostgresStorage, postgres_url: str
) -> None:
    # Statistics from before a bulk load: the planner would otherwise pick a bitmap
    # scan and sort the rows (on disk, for a Spark task's range).
    s, other = create_topic(storage, "t", partitions=2)
    storage.append({s.key: make_rows([b"x"] * 10), other.key: make_rows([b"y"] * 10)})
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("ANALYZE messages")
    for _ in range(10):  # two streams' rows interleaved on the heap, as appends leave them
        storage.append({s.key: make_rows([b"x"] * 5000), other.key: make_rows([b"y"] * 5000)})
    conn = storage.adbc.get()
    assert conn is not None
    cur = conn.cursor()
    try:
        # With a bound parameter: the driver would wrap it in a COPY otherwise.
        cur.execute(
            "EXPLAIN SELECT off, id FROM messages WHERE stream = $1"
            " AND off >= 0 AND off < 50000 ORDER BY off",
            (s.key,),
        )
        plan = "\n".join(str(row[0]) for row in cur.fetchall())
    finally:
        cur.close()

    assert "Index Scan using messages_pkey" in plan, plan
    assert "Sort" not in plan, plan
