"""`Storage.read_arrow`: a stream's offset range as Arrow columns, on both backends,
through ADBC and through the plain driver alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.storage import create_topic, mixed_rows
from riverbed.errors import InvalidOffset
from riverbed.model import StoredMessage
from riverbed.storage import Storage

pa = pytest.importorskip("pyarrow")


@pytest.fixture(params=["adbc", "driver"])
def path(request: pytest.FixtureRequest, storage: Storage) -> Iterator[str]:
    """Run once through ADBC, once with ADBC disabled (the plain driver)."""
    if request.param == "driver":
        storage.adbc._connect = _no_adbc  # type: ignore[attr-defined]
    else:
        assert storage.adbc.get() is not None, "the ADBC driver is not installed"  # type: ignore[attr-defined]
    yield request.param


def _no_adbc() -> object:
    raise ImportError("disabled by the test")


def as_messages(table: pa.Table) -> list[StoredMessage]:
    return [
        StoredMessage(
            r["offset"],
            r["id"],
            r["timestamp_us"],
            r["mqtt_topic"],
            r["key"],
            r["payload"],
            r["properties"],
            r["qos"],
            int(r["retain"]),
        )
        for r in table.to_pylist()
    ]


def test_read_arrow_equals_read(storage: Storage, path: str) -> None:
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()})

    table = storage.read_arrow(s.key, 0, 4)

    assert as_messages(table) == storage.read(s.key, 0, 10)
    assert table.schema.names == [
        "offset", "id", "timestamp_us", "mqtt_topic", "key", "payload", "properties", "qos",
        "retain",
    ]  # fmt: skip
    assert table.schema.field("payload").type == pa.binary()
    assert table.schema.field("key").type == pa.string()


def test_read_arrow_reads_the_range_only(storage: Storage, path: str) -> None:
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()})

    assert storage.read_arrow(s.key, 1, 3).column("offset").to_pylist() == [1, 2]
    assert storage.read_arrow(s.key, 3, 100).column("offset").to_pylist() == [3]
    empty = storage.read_arrow(s.key, 4, 10)
    assert empty.num_rows == 0
    assert empty.schema == storage.read_arrow(s.key, 0, 1).schema
    with pytest.raises(InvalidOffset):
        storage.read_arrow(s.key, -1, 2)


def test_read_arrow_filters_by_key_and_time(storage: Storage, path: str) -> None:
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()})

    assert storage.read_arrow(s.key, 0, 4, key="k2").column("offset").to_pylist() == [2]
    window = storage.read_arrow(s.key, 0, 4, since_us=20, until_us=40)
    assert window.column("offset").to_pylist() == [1, 2]
    assert storage.read_arrow(s.key, 0, 4, since_us=41).num_rows == 0


def test_read_arrow_sees_later_commits(storage: Storage, path: str) -> None:
    # An ADBC connection must not hold a snapshot between reads.
    (s,) = create_topic(storage, "t")
    storage.append({s.key: mixed_rows()[:1]})
    assert storage.read_arrow(s.key, 0, 10).num_rows == 1
    storage.append({s.key: mixed_rows()[1:]})
    assert storage.read_arrow(s.key, 0, 10).num_rows == 4
