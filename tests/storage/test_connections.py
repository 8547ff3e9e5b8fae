"""Storage when the database misbehaves: driver errors, connections the server
terminated, a commit whose answer is lost, a closed storage, and the connections
of threads that ended. On SQLite and PostgreSQL where both apply.

Connection loss is what `pg_terminate_backend` does (an administrator, a
failover, a server restart): `harness.postgres.terminate_connections`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from harness.postgres import count_connections, terminate_connections, with_password
from harness.storage import accept_any, create_topic, numbered_rows, topic_record
from harness.waiting import eventually
from riverbed.errors import StorageError, StorageUnavailable, SubscriptionNotFound
from riverbed.storage import Storage, open_storage, redact_url
from riverbed.storage.base import RetentionPolicy, StartKind, StreamHead, SubscriptionRecord
from riverbed.storage.connections import ThreadConnections
from riverbed.storage.sql import SqlStorage

PASSWORD = "pw-8c1e-s3cret"
"""In the PostgreSQL URLs here: the test server trusts every client, so any
password connects, and no message may show it."""

TABLES = (
    "meta",
    "topics",
    "storage_topics",
    "streams",
    "messages",
    "subscriptions",
    "cursors",
    "kv",
    "markers",
)


def subscription(name: str, topic: str = "orders") -> SubscriptionRecord:
    return SubscriptionRecord(name, topic, None, StartKind.EARLIEST, None, 1_700_000_000_000_000)


def no_cursors(heads: list[StreamHead]) -> dict[int, int]:
    return {}


CALLS: dict[str, Callable[[Storage], object]] = {
    "meta_version": lambda s: s.meta_version(),
    "create_topic": lambda s: s.create_topic(topic_record("t"), 1, accept_any),
    "get_topic": lambda s: s.get_topic("t"),
    "list_topics": lambda s: s.list_topics(),
    "update_topic": lambda s: s.update_topic("t", None, RetentionPolicy.EXPIRED),
    "set_topic_limits": lambda s: s.set_topic_limits("t", None, None),
    "alter_topic": lambda s: s.alter_topic("t", lambda record: record),
    "delete_topic": lambda s: s.delete_topic("t"),
    "list_storage_topics": lambda s: s.list_storage_topics("t"),
    "add_storage_topic": lambda s: s.add_storage_topic("t", lambda last: (1, 1)),
    "switch_produce": lambda s: s.switch_produce("t"),
    "list_streams": lambda s: s.list_streams(),
    "append": lambda s: s.append({1: numbered_rows(1)}),
    "try_append": lambda s: s.try_append({1: numbered_rows(1)}),
    "commits_elsewhere": lambda s: s.commits_elsewhere(),
    "read": lambda s: s.read(1, 0, 10),
    "append_once": lambda s: s.append_once("m", {1: numbered_rows(1)}),
    "delete_markers": lambda s: s.delete_markers(0),
    "delete_marker": lambda s: s.delete_marker("m"),
    "delete_markers_with_prefix": lambda s: s.delete_markers_with_prefix("m"),
    "read_arrow": lambda s: s.read_arrow(1, 0, 10),
    "first_offset_at": lambda s: s.first_offset_at(1, 0),
    "first_offset_within_bytes": lambda s: s.first_offset_within_bytes(1, 100),
    "delete_before": lambda s: s.delete_before(1, 5),
    "create_subscription": lambda s: s.create_subscription(subscription("s", "t"), no_cursors),
    "get_subscription": lambda s: s.get_subscription("s"),
    "list_subscriptions": lambda s: s.list_subscriptions(),
    "delete_subscription": lambda s: s.delete_subscription("s"),
    "get_cursors": lambda s: s.get_cursors("s"),
    "find_cursors": lambda s: s.find_cursors("s"),
    "find_cursors_many": lambda s: s.find_cursors_many(["s"]),
    "commit_cursors": lambda s: s.commit_cursors("s", {1: 1}),
    "reset_cursors": lambda s: s.reset_cursors("s", {1: 1}),
    "min_cursors": lambda s: s.min_cursors("t"),
    "kv_get": lambda s: s.kv_get("ns", "k"),
    "kv_get_many": lambda s: s.kv_get_many("ns", ["k"]),
    "kv_count": lambda s: s.kv_count("ns"),
    "kv_any": lambda s: s.kv_any("ns", "k"),
    "kv_list": lambda s: s.kv_list("ns"),
    "kv_page": lambda s: s.kv_page("ns", None, 10),
    "kv_put": lambda s: s.kv_put("ns", "k", b"v"),
    "kv_put_if_absent": lambda s: s.kv_put_if_absent("ns", "k", b"v"),
    "kv_compare_and_set": lambda s: s.kv_compare_and_set("ns", "k", 1, b"v"),
    "kv_delete_if_version": lambda s: s.kv_delete_if_version("ns", "k", 1),
}
"""One call of every `Storage` method (`close` aside)."""


@pytest.fixture
def secret_url(storage_url: str) -> str:
    """`storage_url`, with a password on PostgreSQL."""
    if storage_url.startswith("postgresql"):
        return with_password(storage_url, PASSWORD)
    return storage_url


@pytest.fixture
def opened(secret_url: str) -> Iterator[SqlStorage]:
    storage = open_storage(secret_url)
    assert isinstance(storage, SqlStorage)
    try:
        yield storage
    finally:
        storage.close()


def drop_tables(url: str) -> None:
    """Damage the schema behind the storage's back: every query fails in the driver."""
    statements = [f"DROP TABLE {table}" for table in TABLES]
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            for statement in statements:
                conn.execute(statement)
    else:
        with psycopg.connect(url, autocommit=True) as admin:
            for statement in statements:
                admin.execute(statement.encode())


def run_in_thread(call: Callable[[], Any]) -> Any:
    """Run `call` on a new thread that ends afterwards; return its result."""
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(call()))
    worker.start()
    worker.join(timeout=30)
    assert results, "the thread failed"
    return results[0]


# --------------------------------------------------------------------------- driver errors


def test_calls_cover_every_storage_method() -> None:
    methods = {n for n, v in vars(Storage).items() if callable(v) and not n.startswith("_")}
    assert set(CALLS) == methods - {"close"}


def test_driver_errors_become_storage_errors_naming_the_operation_and_database(
    opened: SqlStorage, secret_url: str
) -> None:
    drop_tables(secret_url)
    shown = redact_url(secret_url)

    for name, call in CALLS.items():
        if name == "try_append" and not opened.appends_inline:
            assert call(opened) is None  # never touches the database here
            continue
        if name == "commits_elsewhere":
            # Reads no table (SQLite's data_version; nothing on PostgreSQL).
            assert (call(opened) is None) is not opened.appends_inline
            continue
        with pytest.raises(StorageError) as raised:
            call(opened)

        error = raised.value
        assert type(error) is StorageError, name
        assert str(error).startswith(f"{name} on {shown!r} failed: "), str(error)
        assert "\n" not in str(error)
        assert isinstance(error.__cause__, sqlite3.Error | psycopg.Error), name
        assert PASSWORD not in str(error)


def test_riverbed_errors_pass_through_unchanged(opened: SqlStorage) -> None:
    with pytest.raises(SubscriptionNotFound) as raised:
        opened.get_subscription("nope")

    assert raised.value.__cause__ is None


# --------------------------------------------------------------------------- lost connections


@pytest.mark.postgres
def test_connections_the_server_terminated_are_replaced(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        storage.append({stream.key: numbered_rows(2)})

        # Reads run again on a new connection.
        assert terminate_connections(postgres_url) == 1
        assert [m.payload for m in storage.read(stream.key, 0, 10)] == [b"0", b"1"]
        terminate_connections(postgres_url)
        assert storage.get_topic("orders").name == "orders"
        terminate_connections(postgres_url)
        assert len(storage.list_storage_topics("orders")) == 1

        # A write whose BEGIN met the dead connection begins again on a new one.
        terminate_connections(postgres_url)
        assert storage.append({stream.key: numbered_rows(1, first=2)}) == {stream.key: 2}
        terminate_connections(postgres_url)
        assert storage.kv_put("ns", "k", b"v").version == 1
        assert [m.payload for m in storage.read(stream.key, 0, 10)] == [b"0", b"1", b"2"]
    finally:
        storage.close()


@pytest.mark.postgres
def test_a_thread_keeps_working_after_its_connection_was_terminated(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    try:
        go, done = threading.Event(), threading.Event()
        results: list[object] = []

        def worker() -> None:
            results.append(storage.kv_put("ns", "k", b"1").version)
            go.wait(timeout=30)
            results.append(storage.kv_get("ns", "k"))
            results.append(storage.kv_put("ns", "k", b"2").version)
            done.set()

        thread = threading.Thread(target=worker)
        thread.start()
        eventually(lambda: len(results) == 1, what="the first result")
        assert terminate_connections(postgres_url) == 2  # the worker's and ours
        go.set()
        thread.join(timeout=30)

        assert done.is_set()
        assert results[0] == 1 and results[2] == 2
        assert storage.kv_list("ns")[0].value == b"2"
    finally:
        storage.close()


@pytest.mark.postgres
def test_a_transaction_whose_connection_breaks_fails_and_writes_nothing(
    postgres_url: str,
) -> None:
    url = with_password(postgres_url, PASSWORD)
    storage = open_storage(url)
    try:
        create_topic(storage, "orders", 1)

        def initial(heads: list[StreamHead]) -> dict[int, int]:
            terminate_connections(url)  # inside the transaction, before its last statements
            return {h.key: 0 for h in heads}

        with pytest.raises(StorageUnavailable) as raised:
            storage.create_subscription(subscription("s"), initial)

        message = str(raised.value)
        assert message.startswith(f"create_subscription on {redact_url(url)!r} lost its connection")
        assert "nothing was written" in message
        assert PASSWORD not in message
        assert isinstance(raised.value.__cause__, psycopg.OperationalError)
        with pytest.raises(SubscriptionNotFound):
            storage.get_subscription("s")
        storage.create_subscription(subscription("s"), no_cursors)  # and the next one works
    finally:
        storage.close()


@pytest.mark.postgres
def test_a_commit_whose_answer_is_lost_is_reported_and_not_repeated(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = open_storage(postgres_url)
    assert isinstance(storage, SqlStorage)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        conn = storage.connections.get()
        execute = conn.execute

        def commit_then_lose_the_connection(query: Any, *args: Any, **kwargs: Any) -> Any:
            if query != "COMMIT":
                return execute(query, *args, **kwargs)
            execute(query)  # the server commits...
            terminate_connections(postgres_url)  # ...and the answer never arrives
            return execute("SELECT 1")  # raises the driver's error for a lost connection

        monkeypatch.setattr(conn, "execute", commit_then_lose_the_connection)

        with pytest.raises(StorageUnavailable, match="the outcome of its commit is unknown"):
            storage.append({stream.key: numbered_rows(1)})

        # Committed once: the storage did not try again.
        assert [m.payload for m in storage.read(stream.key, 0, 10)] == [b"0"]
        assert storage.append({stream.key: numbered_rows(1, first=1)}) == {stream.key: 1}
    finally:
        storage.close()


# --------------------------------------------------------------------------- closing


def test_a_closed_storage_refuses_every_call(secret_url: str) -> None:
    storage = open_storage(secret_url)
    create_topic(storage, "t", 1)
    storage.close()

    for name, call in CALLS.items():
        with pytest.raises(StorageError) as raised:
            call(storage)
        assert str(raised.value) == f"cannot {name}: storage {redact_url(secret_url)!r} is closed"
    storage.close()  # twice is fine


def test_a_thread_with_a_connection_is_refused_after_close(storage_url: str) -> None:
    storage = open_storage(storage_url)
    connected, closed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def worker() -> None:
        storage.kv_get("ns", "k")  # this thread's connection opens
        connected.set()
        closed.wait(timeout=30)
        try:
            outcome.append(storage.kv_get("ns", "k"))
        except StorageError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert connected.wait(timeout=30)
    storage.close()
    closed.set()
    thread.join(timeout=30)

    assert len(outcome) == 1 and isinstance(outcome[0], StorageError), outcome
    assert "is closed" in str(outcome[0])


@pytest.mark.postgres
def test_close_leaves_no_server_connection(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    for _ in range(3):
        run_in_thread(storage.list_topics)
    storage.kv_get("ns", "k")
    storage.wakeups.wait(storage.wakeups.version, 0.2)  # the LISTEN thread too
    storage.close()

    with pytest.raises(StorageError):
        storage.list_topics()
    eventually(
        lambda: count_connections(postgres_url) == 0,
        what="no connection left",
        explain=lambda: count_connections(postgres_url),
    )


# --------------------------------------------------------------------------- threads that end


def test_connections_of_threads_that_ended_are_closed(opened: SqlStorage) -> None:
    opened.kv_get("ns", "k")
    for _ in range(5):
        threads = [threading.Thread(target=opened.list_topics) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    eventually(
        lambda: len(opened.connections) == 1,
        what="one connection",
        explain=lambda: len(opened.connections),
    )
    assert opened.kv_get("ns", "k") is None  # ours stays open


@pytest.mark.postgres
def test_fifty_short_lived_threads_leave_few_server_connections(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    try:
        peak = 0
        for _ in range(5):
            threads = [threading.Thread(target=storage.list_topics) for _ in range(10)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            peak = max(peak, count_connections(postgres_url))

        # Ours (opened by the migration) and at most a few that are closing.
        eventually(lambda: count_connections(postgres_url) <= 1, what="at most one connection")
        assert peak <= 12
    finally:
        storage.close()


def test_close_waits_for_operations_running_in_other_threads() -> None:
    """A SQLite connection closed while another thread runs a statement on it
    can crash the process: `close` lets running operations end first (up to
    its `wait`), and refuses new ones meanwhile."""
    closed: list[str] = []
    connections = ThreadConnections(lambda: _Closing(closed), "sqlite:///x")
    connections.get()  # this thread's connection
    connections.enter()  # an operation runs
    closer = threading.Thread(target=connections.close, kwargs={"wait": 30.0})
    closer.start()
    eventually(lambda: connections.closed, what="close begun")
    assert closed == [] and closer.is_alive()  # waits for the operation
    connections.leave()
    closer.join(30)
    assert closed and not closer.is_alive()


def test_close_gives_up_waiting_after_its_wait() -> None:
    closed: list[str] = []
    connections = ThreadConnections(lambda: _Closing(closed), "sqlite:///x")
    connections.get()
    connections.enter()  # never leaves (a database that does not answer)
    connections.close(wait=0.05)
    assert closed and connections.closed


class _Closing:
    """A connection that records its close."""

    def __init__(self, closed: list[str]) -> None:
        self._closed = closed

    def close(self) -> None:
        self._closed.append("closed")
