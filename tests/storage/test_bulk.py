"""`append_arrow_once`: rows given as Arrow columns, appended exactly once.

Run on SQLite and PostgreSQL (the `storage` fixture), through the bulk loader
(ADBC: a staging file on SQLite, COPY on PostgreSQL) and through the tuple path
it falls back to, which must store the same thing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness.storage import create_topic, head, make_rows
from riverbed.errors import InvalidInput, StreamSealed
from riverbed.storage import Storage, bulk, open_storage
from riverbed.storage.base import Row

pa = pytest.importorskip("pyarrow")


def as_table(rows: list[Row]) -> Any:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(bulk.ROW_FIELDS)
    return pa.Table.from_arrays(
        [pa.array(list(c), f.type) for c, f in zip(columns, bulk.row_schema(), strict=True)],
        schema=bulk.row_schema(),
    )


def varied_rows(count: int, first: int = 0) -> list[Row]:
    """Rows that use every column: keys and properties present and absent, qos 0-2."""
    rows = make_rows(str(n).encode() for n in range(first, first + count))
    return [
        (
            id_,
            ts,
            f"t/{n % 3}",
            None if n % 5 == 0 else f"k{n % 7}",
            payload,
            None if n % 2 else f"props{n}".encode(),
            n % 3,
            0,
        )
        for n, (id_, ts, _, _, payload, _, _, _) in enumerate(rows, start=first)
    ]


def stored(storage: Storage, stream_key: int) -> list[tuple[Any, ...]]:
    return [tuple(m) for m in storage.read(stream_key, 0, 100_000)]


@pytest.fixture(params=["bulk", "tuples"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force one of `append_arrow_once`'s two ways."""
    monkeypatch.setattr(bulk, "MIN_ROWS", 1 if request.param == "bulk" else 10**9)
    return str(request.param)


def test_rows_land_in_order_after_what_was_there(storage: Storage, path: str) -> None:
    a, b = create_topic(storage, "t", partitions=2)
    storage.append({a.key: make_rows([b"before"])})
    rows = varied_rows(1500)

    firsts = storage.append_arrow_once("m", [(b.key, 1000), (a.key, 500)], as_table(rows))

    assert firsts == {a.key: 1, b.key: 0}
    assert head(storage, a.key).next_offset == 501
    assert head(storage, b.key).next_offset == 1000
    # Offsets dense from each stream's head, every column as given.
    assert stored(storage, b.key) == [(off, *row) for off, row in enumerate(rows[:1000])]
    assert stored(storage, a.key)[1:] == [
        (off, *row) for off, row in enumerate(rows[1000:], start=1)
    ]


def test_a_second_call_with_the_marker_writes_nothing(storage: Storage, path: str) -> None:
    (a,) = create_topic(storage, "t")
    table = as_table(varied_rows(1200))

    assert storage.append_arrow_once("m", [(a.key, 1200)], table) == {a.key: 0}
    assert storage.append_arrow_once("m", [(a.key, 1200)], table) is None

    assert head(storage, a.key).next_offset == 1200
    assert len(stored(storage, a.key)) == 1200
    # The same marker written through `append_once` is taken too.
    assert storage.append_once("m", {a.key: make_rows([b"x"])}) is None


def test_concurrent_attempts_with_one_marker_write_once(storage: Storage, path: str) -> None:
    (a,) = create_topic(storage, "t")
    table = as_table(varied_rows(2000))
    results: list[Any] = []

    def attempt() -> None:
        results.append(storage.append_arrow_once("same", [(a.key, 2000)], table))

    threads = [threading.Thread(target=attempt) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(results, key=lambda r: r is None) == [{a.key: 0}, None, None]
    assert head(storage, a.key).next_offset == 2000


def test_a_sealed_stream_refuses_rows_and_marker(storage: Storage, path: str) -> None:
    a, b = create_topic(storage, "t", partitions=2)
    storage.add_storage_topic("t", lambda last: (1, 1))
    storage.switch_produce("t")
    table = as_table(varied_rows(1000))

    with pytest.raises(StreamSealed):
        storage.append_arrow_once("m", [(a.key, 400), (b.key, 600)], table)

    assert head(storage, a.key).next_offset == head(storage, b.key).next_offset == 0
    (c,) = [h for h in storage.list_streams("t") if h.stream.generation == 1]
    assert storage.append_arrow_once("m", [(c.key, 1000)], table) == {c.key: 0}


def test_an_empty_table_records_the_marker_alone(storage: Storage, path: str) -> None:
    (a,) = create_topic(storage, "t")
    assert storage.append_arrow_once("m", [], as_table([])) == {}
    assert storage.append_once("m", {a.key: make_rows([b"x"])}) is None


def test_a_table_that_does_not_match_its_streams_is_refused(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    with pytest.raises(InvalidInput, match="add up"):
        storage.append_arrow_once("m", [(a.key, 5)], as_table(varied_rows(4)))
    with pytest.raises(InvalidInput, match="columns"):
        storage.append_arrow_once("m", [(a.key, 1)], as_table(varied_rows(1)).drop(["qos"]))
    assert head(storage, a.key).next_offset == 0


def test_a_bulk_append_wakes_readers_of_another_storage(storage_url: str) -> None:
    # Another storage object stands for another process: only the cross-process
    # path (PostgreSQL NOTIFY, SQLite's data_version) reaches it.
    writer = open_storage(storage_url)
    reader = open_storage(storage_url)
    try:
        (a,) = create_topic(writer, "t")
        # The first wait starts the watcher, which wakes everyone once: not ours.
        reader.wakeups.wait(reader.wakeups.version, 2.0)
        seen = reader.wakeups.version
        woke = threading.Event()

        def wait() -> None:
            if reader.wakeups.wait(seen, 30) != seen:
                woke.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        writer.append_arrow_once("m", [(a.key, 1500)], as_table(varied_rows(1500)))
        waiter.join(30)
        assert woke.is_set()
        assert head(reader, a.key).next_offset == 1500
    finally:
        writer.close()
        reader.close()
