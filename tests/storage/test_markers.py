"""`Storage.append_once`: rows and a marker in one transaction, never twice.

The idempotency the Spark sink relies on (and the MQTT broker's QoS 2 dedup
will): run against SQLite and PostgreSQL through the `storage` fixture.
"""

from __future__ import annotations

import threading

import pytest

from harness.storage import create_topic, head, numbered_rows
from riverbed.errors import StreamSealed
from riverbed.storage import Storage


def payloads(storage: Storage, stream_key: int) -> list[bytes]:
    return [m.payload for m in storage.read(stream_key, 0, 1000)]


def test_append_once_writes_rows_and_returns_first_offsets(storage: Storage) -> None:
    a, b = create_topic(storage, "t", partitions=2)
    storage.append({a.key: numbered_rows(2)})

    firsts = storage.append_once("m1", {a.key: numbered_rows(3, 2), b.key: numbered_rows(1)})

    assert firsts == {a.key: 2, b.key: 0}
    assert payloads(storage, a.key) == [b"0", b"1", b"2", b"3", b"4"]
    assert payloads(storage, b.key) == [b"0"]
    assert head(storage, a.key).next_offset == 5


def test_a_second_append_with_the_same_marker_writes_nothing(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    assert storage.append_once("m1", {a.key: numbered_rows(3)}) == {a.key: 0}

    assert storage.append_once("m1", {a.key: numbered_rows(3, 3)}) is None

    assert payloads(storage, a.key) == [b"0", b"1", b"2"]
    assert head(storage, a.key).next_offset == 3
    # Another marker writes again.
    assert storage.append_once("m2", {a.key: numbered_rows(1, 3)}) == {a.key: 3}


def test_an_empty_append_once_records_the_marker_alone(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    assert storage.append_once("m", {}) == {}
    assert storage.append_once("m", {a.key: numbered_rows(1)}) is None
    assert storage.append_once("e", {a.key: []}) == {}
    assert head(storage, a.key).next_offset == 0


def test_a_sealed_stream_refuses_rows_and_marker_alike(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    storage.add_storage_topic("t", lambda last: (1, 1))
    storage.switch_produce("t")

    with pytest.raises(StreamSealed):
        storage.append_once("m", {a.key: numbered_rows(1)})

    new = next(h for h in storage.list_streams("t") if h.stream.generation == 1)
    # The marker was rolled back with the rows: the retry, routed anew, writes.
    assert storage.append_once("m", {new.key: numbered_rows(1)}) == {new.key: 0}
    assert head(storage, a.key).next_offset == 0


def test_concurrent_attempts_with_one_marker_write_once(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    results: list[object] = []
    barrier = threading.Barrier(4)

    def attempt() -> None:
        barrier.wait()
        results.append(storage.append_once("same", {a.key: numbered_rows(100)}))

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(results, key=lambda r: r is None) == [{a.key: 0}, None, None, None]
    assert head(storage, a.key).next_offset == 100


def test_delete_markers_forgets_old_markers_only(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    storage.append_once("old", {})
    assert storage.delete_markers(0) == 0
    assert storage.delete_markers(1 << 62) == 1
    assert storage.append_once("old", {a.key: numbered_rows(1)}) == {a.key: 0}


def test_append_once_wakes_readers(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    seen = storage.wakeups.version
    storage.append_once("m", {a.key: numbered_rows(1)})
    assert storage.wakeups.version != seen


def test_delete_marker_forgets_one_marker(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    assert storage.append_once("qos2/s1/1", {a.key: numbered_rows(1)}) == {a.key: 0}
    assert storage.append_once("qos2/s1/12", {}) == {}

    assert storage.delete_marker("qos2/s1/1") is True
    assert storage.delete_marker("qos2/s1/1") is False

    assert storage.append_once("qos2/s1/1", {a.key: numbered_rows(1, 1)}) == {a.key: 1}
    assert storage.append_once("qos2/s1/12", {}) is None  # untouched


def test_delete_markers_with_prefix(storage: Storage) -> None:
    for marker in ("qos2/s1/1", "qos2/s1/2", "qos2/s10/1", "qos2/s%/1"):
        assert storage.append_once(marker, {}) == {}

    assert storage.delete_markers_with_prefix("qos2/s1/") == 2
    assert storage.delete_markers_with_prefix("qos2/s%") == 1  # literal, not a pattern

    assert storage.append_once("qos2/s1/1", {}) == {}
    assert storage.append_once("qos2/s10/1", {}) is None
