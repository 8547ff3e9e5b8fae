"""The storage's operations inside a transaction (`storage/transactions.py`), on
SQLite and PostgreSQL through the `storage` fixture: what the subscriptions'
batch commits, DLQ replays and shard-count changes compose into one atomic
change, and the savepoints an exactly-once worker rolls a failed attempt back
to.

Each operation writes with the rest of its transaction or not at all (a block
that raises, as a process dying mid-way would, leaves everything as it was),
and its precondition holds against writers in other transactions.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

import pytest

from harness.storage import create_topic, numbered_rows
from riverbed.errors import InvalidInput, PreconditionFailed, StorageBusy, StorageError
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import KVEntry
from riverbed.storage.transactions import (
    Transaction,
    append_once_in,
    commits_now,
    delete_marker_in,
    delete_markers_with_prefix_in,
    kv_delete_if_version_in,
    kv_delete_numbered_below_in,
    kv_put_in,
    transaction,
    transaction_now,
)


class Crash(Exception):
    """Raised inside a transaction's block: what dying before the COMMIT leaves."""


def recorded(storage: Storage, marker: str) -> bool:
    """Whether `marker` is recorded (checked by recording it again, and undoing that)."""
    if storage.append_once(marker, {}) is None:
        return True
    storage.delete_marker(marker)
    return False


def payloads(storage: Storage, stream_key: int) -> list[bytes]:
    return [m.payload for m in storage.read(stream_key, 0, 1000)]


def race(attempts: list[Callable[[], object]]) -> list[object]:
    """Run the attempts at once, each on its own thread (its own connection and
    transaction); their results, or the exceptions they raised, in order."""
    results: list[object] = [None] * len(attempts)
    barrier = threading.Barrier(len(attempts))

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = attempts[index]()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(attempts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "an attempt hangs"
    return results


# --------------------------------------------------------------------- KV: numbered keys below


def kv_keys(storage: Storage, namespace: str) -> list[str]:
    return [e.key for e in storage.kv_list(namespace)]


def test_kv_delete_numbered_below_in_deletes_the_numbers_below_of_its_prefix_only(
    storage: Storage,
) -> None:
    for key in ("a/1/5", "a/1/9", "a/1/10", "a/1/100", "a/12/3", "a/1x", "b/1/2"):
        storage.kv_put("n", key, b"x")
    storage.kv_put("other", "a/1/1", b"x")
    with transaction(storage) as tx:
        # "a/12/3" and "a/1x" share the text "a/1" but not the prefix "a/1/":
        # neither is read as a number (on PostgreSQL that would be an error).
        assert kv_delete_numbered_below_in(tx, "n", "a/1/", 11) == 3
    assert kv_keys(storage, "n") == ["a/1/100", "a/12/3", "a/1x", "b/1/2"]
    assert kv_keys(storage, "other") == ["a/1/1"]


def test_kv_delete_numbered_below_in_with_nothing_below_deletes_nothing(storage: Storage) -> None:
    storage.kv_put("n", "g/7/40", b"x")
    with transaction(storage) as tx:
        assert kv_delete_numbered_below_in(tx, "n", "g/7/", 40) == 0
        assert kv_delete_numbered_below_in(tx, "n", "h/7/", 1_000) == 0
    assert kv_keys(storage, "n") == ["g/7/40"]


def test_kv_delete_numbered_below_in_rolls_back_with_its_transaction(storage: Storage) -> None:
    storage.kv_put("n", "g/7/1", b"x")
    with pytest.raises(Crash), transaction(storage) as tx:
        assert kv_delete_numbered_below_in(tx, "n", "g/7/", 2) == 1
        raise Crash
    assert kv_keys(storage, "n") == ["g/7/1"]


# --------------------------------------------------------------------- KV: delete at a version


def test_kv_delete_if_version_in_deletes_the_key_at_that_version(storage: Storage) -> None:
    storage.kv_put("ns", "k", b"one")
    storage.kv_put("ns", "k", b"two")  # version 2

    with transaction(storage) as tx:
        assert kv_delete_if_version_in(tx, "ns", "k", 2) is True

    assert storage.kv_get("ns", "k") is None


def test_kv_delete_if_version_in_at_another_version_or_absent_deletes_nothing(
    storage: Storage,
) -> None:
    storage.kv_put("ns", "k", b"one")
    storage.kv_put("other", "k", b"same key, other namespace")

    with transaction(storage) as tx:
        assert kv_delete_if_version_in(tx, "ns", "k", 2) is False
        assert kv_delete_if_version_in(tx, "ns", "absent", 1) is False

    entry = storage.kv_get("ns", "k")
    assert entry is not None and (entry.value, entry.version) == (b"one", 1)
    assert storage.kv_get("other", "k") is not None


def test_kv_delete_if_version_in_rolls_back_with_its_transaction(storage: Storage) -> None:
    storage.kv_put("ns", "k", b"one")

    with pytest.raises(Crash), transaction(storage) as tx:
        assert kv_delete_if_version_in(tx, "ns", "k", 1)
        assert kv_put_in(tx, "ns", "new", b"fresh", None)
        raise Crash

    entry = storage.kv_get("ns", "k")
    assert entry is not None and entry.version == 1
    assert storage.kv_get("ns", "new") is None


def test_a_version_moved_before_the_transaction_fails_the_delete(storage: Storage) -> None:
    # A shard-count change reads the shards' states, then deletes them in its
    # transaction at the versions it read: a batch that committed in between wins.
    read = storage.kv_put("ns", "k", b"read").version
    storage.kv_compare_and_set("ns", "k", read, b"a batch committed meanwhile")

    with transaction(storage) as tx:
        assert kv_delete_if_version_in(tx, "ns", "k", read) is False

    entry = storage.kv_get("ns", "k")
    assert entry is not None and entry.value == b"a batch committed meanwhile"


def test_of_concurrent_writers_at_one_version_exactly_one_wins(storage: Storage) -> None:
    version = storage.kv_put("ns", "k", b"v").version

    def delete() -> bool:
        with transaction(storage) as tx:
            return kv_delete_if_version_in(tx, "ns", "k", version)

    def put() -> bool:
        with transaction(storage) as tx:
            return kv_put_in(tx, "ns", "k", b"put", version)

    def compare_and_set() -> object:
        return storage.kv_compare_and_set("ns", "k", version, b"cas")

    results = race([delete, delete, put, put, compare_and_set])

    won = [r for r in results if r is True or isinstance(r, KVEntry)]
    lost = [r for r in results if r is False or isinstance(r, PreconditionFailed)]
    assert (len(won), len(lost)) == (1, len(results) - 1), results
    entry = storage.kv_get("ns", "k")
    if results[0] is True or results[1] is True:
        assert entry is None
    else:
        assert entry is not None and entry.version == version + 1


# --------------------------------------------------------------------- markers


def test_delete_marker_in_forgets_the_marker_it_appended_with(storage: Storage) -> None:
    # A one-off change (a DLQ replay, a shard-count change) appends under a
    # fresh marker and forgets it in the same transaction: rows, no marker.
    (a,) = create_topic(storage, "t")

    with transaction(storage) as tx:
        assert append_once_in(tx, "dlq/s/0/1", {a.key: numbered_rows(2)}) == {a.key: 0}
        assert delete_marker_in(tx, "dlq/s/0/1") is True

    assert payloads(storage, a.key) == [b"0", b"1"]
    assert not recorded(storage, "dlq/s/0/1")


def test_delete_marker_in_of_a_marker_not_recorded(storage: Storage) -> None:
    storage.append_once("kept", {})

    with transaction(storage) as tx:
        assert delete_marker_in(tx, "never") is False
        assert delete_marker_in(tx, "kep") is False  # whole markers only

    assert recorded(storage, "kept")


def test_delete_marker_in_rolls_back_with_its_transaction(storage: Storage) -> None:
    (a,) = create_topic(storage, "t")
    storage.append_once("m", {})

    with pytest.raises(Crash), transaction(storage) as tx:
        assert append_once_in(tx, "other", {a.key: numbered_rows(1)}) == {a.key: 0}
        assert delete_marker_in(tx, "m") is True
        raise Crash

    assert recorded(storage, "m")
    assert not recorded(storage, "other")
    assert payloads(storage, a.key) == []


def test_delete_markers_with_prefix_in_spares_the_one_to_keep(storage: Storage) -> None:
    # A shard's batch keeps its own marker and forgets its earlier batches'.
    markers = [
        "delivery/s/0/run/1",
        "delivery/s/0/run/2",
        "delivery/s/0/run/3",
        "delivery/s/1/run/1",  # another shard
        "delivery/s/0x",  # shares the text, not the prefix
        "delivery/s%/0/run/1",  # `%` and `_` are literal, not patterns
    ]
    for marker in markers:
        storage.append_once(marker, {})

    with transaction(storage) as tx:
        assert delete_markers_with_prefix_in(tx, "delivery/s/0/", keep="delivery/s/0/run/3") == 2
        assert delete_markers_with_prefix_in(tx, "delivery/s_", keep="none of them") == 0

    assert [m for m in markers if recorded(storage, m)] == markers[2:]


def test_delete_markers_with_prefix_in_without_keep_deletes_them_all(storage: Storage) -> None:
    for marker in ("p/1", "p/2", "q/1"):
        storage.append_once(marker, {})

    with transaction(storage) as tx:
        assert delete_markers_with_prefix_in(tx, "p/") == 2

    assert [m for m in ("p/1", "p/2", "q/1") if recorded(storage, m)] == ["q/1"]


def test_delete_markers_with_prefix_in_rolls_back_with_its_transaction(storage: Storage) -> None:
    for marker in ("p/1", "p/2"):
        storage.append_once(marker, {})

    with pytest.raises(Crash), transaction(storage) as tx:
        assert delete_markers_with_prefix_in(tx, "p/", keep="p/2") == 1
        raise Crash

    assert recorded(storage, "p/1") and recorded(storage, "p/2")


# --------------------------------------------------------------------- savepoints


def notes(tx: Transaction) -> list[int]:
    return [int(n) for (n,) in tx.execute("SELECT n FROM notes ORDER BY n").fetchall()]


@pytest.fixture
def with_notes(storage: Storage) -> Storage:
    """`storage` with a table of the handler's own, as an exactly-once handler has."""
    with transaction(storage) as tx:
        tx.execute("CREATE TABLE notes (n INTEGER PRIMARY KEY)")
    return storage


def test_rollback_to_savepoint_undoes_only_what_came_after_it(with_notes: Storage) -> None:
    with transaction(with_notes) as tx:
        tx.execute("INSERT INTO notes (n) VALUES (?)", (1,))
        tx.savepoint("attempt")
        tx.execute("INSERT INTO notes (n) VALUES (?)", (2,))
        kv_put_in(tx, "ns", "k", b"written by the attempt", None)
        tx.rollback_to_savepoint("attempt")
        tx.execute("INSERT INTO notes (n) VALUES (?)", (3,))

    with transaction(with_notes) as tx:
        assert notes(tx) == [1, 3]
    assert with_notes.kv_get("ns", "k") is None


def test_a_failed_statement_rolled_back_to_a_savepoint_leaves_the_transaction_usable(
    with_notes: Storage,
) -> None:
    # An exactly-once handler whose attempt failed on a statement (PostgreSQL
    # then refuses every statement until the rollback) is tried again in the
    # same transaction.
    with transaction(with_notes) as tx:
        tx.execute("INSERT INTO notes (n) VALUES (?)", (1,))
        for attempt in range(3):
            tx.savepoint("riverbed_batch")
            tx.execute("INSERT INTO notes (n) VALUES (?)", (10 + attempt,))
            with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
                tx.execute("INSERT INTO notes (n) VALUES (?)", (1,))
            tx.rollback_to_savepoint("riverbed_batch")
        tx.savepoint("riverbed_batch")
        tx.execute("INSERT INTO notes (n) VALUES (?)", (2,))

    with transaction(with_notes) as tx:
        assert notes(tx) == [1, 2]


@pytest.mark.parametrize("name", ["", "1st", "a b", "x; DROP TABLE notes", "é", "a-b"])
def test_a_savepoint_name_that_is_not_an_identifier_is_refused(
    with_notes: Storage, name: str
) -> None:
    with transaction(with_notes) as tx:
        tx.execute("INSERT INTO notes (n) VALUES (?)", (1,))
        with pytest.raises(InvalidInput, match="is not an identifier"):
            tx.savepoint(name)
        with pytest.raises(InvalidInput, match="is not an identifier"):
            tx.rollback_to_savepoint(name)
        tx.execute("INSERT INTO notes (n) VALUES (?)", (2,))  # nothing else happened

    with transaction(with_notes) as tx:
        assert notes(tx) == [1, 2]


def test_savepoints_of_an_ended_transaction_are_refused(storage: Storage) -> None:
    with transaction(storage) as tx:
        tx.savepoint("a")
    with pytest.raises(StorageError, match="transaction has ended"):
        tx.savepoint("a")
    with pytest.raises(StorageError, match="transaction has ended"):
        tx.rollback_to_savepoint("a")


def test_a_transaction_now_never_waits_for_the_write_lock(sqlite_url: str) -> None:
    """SQLite: another connection holding the write lock makes it fail at once
    with `StorageBusy`, writing nothing; free, it commits like `transaction`.
    And the thread's later transactions wait for the lock again."""
    storage = open_storage(sqlite_url)
    try:
        assert commits_now(storage)
        other = sqlite3.connect(
            sqlite_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
        )
        other.execute("BEGIN IMMEDIATE")
        with (
            pytest.raises(StorageBusy, match="is being written by another"),
            transaction_now(storage) as tx,
        ):
            kv_put_in(tx, "ns", "k", b"busy", None)
        assert storage.kv_get("ns", "k") is None
        # This thread's `transaction` waits for the lock again (busy timeout).
        release = threading.Timer(0.2, lambda: other.execute("COMMIT"))
        release.start()
        kv_in_transaction(storage, b"waited")
        release.join()
        assert storage.kv_get("ns", "k").value == b"waited"  # type: ignore[union-attr]
        with transaction_now(storage) as tx:
            assert kv_put_in(tx, "ns", "k", b"now", 1)
        assert storage.kv_get("ns", "k").value == b"now"  # type: ignore[union-attr]
        other.close()
    finally:
        storage.close()


def test_a_server_database_has_no_transaction_now(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    try:
        assert not commits_now(storage)
        with (
            pytest.raises(NotImplementedError, match="no transactions that do not wait"),
            transaction_now(storage),
        ):
            pass
    finally:
        storage.close()


def kv_in_transaction(storage: Storage, value: bytes) -> None:
    with transaction(storage) as tx:
        assert kv_put_in(tx, "ns", "k", value, None)
