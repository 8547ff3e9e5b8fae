"""Storage under concurrency: wake-ups and concurrent appenders, in threads and
in separate processes, on SQLite and PostgreSQL.

Offsets must stay dense (0..N-1, no gap, no duplicate) however many writers
share a stream, and each writer's messages keep that writer's order. A reader
waiting on `wakeups` must hear of an append within milliseconds, whether the
appender is this storage, another instance in this process, or another process.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import pytest

from harness.postgres import terminate_connections
from harness.storage import (
    check_writers,
    create_topic,
    finish,
    go,
    head,
    numbered_rows,
    writer_process,
    writer_rows,
)
from harness.waiting import SLOW, eventually
from riverbed.model import MessageIdGenerator
from riverbed.storage import Storage, open_storage
from riverbed.storage import postgres as postgres_module
from riverbed.storage import sqlite as sqlite_module
from riverbed.storage.base import Wakeups

WAIT = 30.0 * SLOW
"""Seconds a wait here lasts without a wake-up."""

WAKEUP_BOUND = 10.0 * SLOW
"""Seconds a wake-up may take here: well short of `WAIT`, so a wait that was
woken is told from one that timed out however busy the machine. The design goal
is milliseconds (bench/ measures it)."""


def wait_for_head(storage: Storage, stream_key: int, at_least: int, timeout: float) -> float:
    """Wait on `storage.wakeups` (never polling on a timer) until the stream's next
    offset reaches `at_least`; return the seconds it took. Spurious wake-ups are
    allowed: each one re-reads the head, as a reader does."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        seen = storage.wakeups.version
        if head(storage, stream_key).next_offset >= at_least:
            return time.monotonic() - start
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no wake-up for stream {stream_key} within {timeout} s"
        storage.wakeups.wait(seen, remaining)


def when_waiting(storage: Storage, action: Callable[[], object]) -> threading.Thread:
    """A started thread that calls `action` once a wait on `storage.wakeups` is
    in progress (so that the wait is what notices it)."""

    def run() -> None:
        eventually(lambda: storage.wakeups._waiting, what="a wait to begin", interval=0.001)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def start_watching(storage: Storage) -> None:
    """Let the storage's watcher of other writers start and settle."""
    storage.wakeups.wait(storage.wakeups.version, 0.5)


# --------------------------------------------------------------------------- wake-ups


def test_wakeup_after_an_append_from_another_thread(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    appender = when_waiting(storage, lambda: storage.append({stream.key: numbered_rows(1)}))
    elapsed = wait_for_head(storage, stream.key, 1, timeout=WAIT)
    appender.join()

    assert elapsed < WAKEUP_BOUND


def test_wait_without_an_append_times_out(storage: Storage) -> None:
    create_topic(storage, "orders", 1)
    start_watching(storage)
    seen = storage.wakeups.version

    started = time.monotonic()
    assert storage.wakeups.wait(seen, 0.2) == seen
    assert 0.15 < time.monotonic() - started < WAKEUP_BOUND


def test_async_wakeup_after_an_append_from_another_thread(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)

    async def wait_for_append() -> float:
        # As `wait_for_head`, with `wait_async`.
        started = time.monotonic()
        while True:
            seen = storage.wakeups.version
            if head(storage, stream.key).next_offset >= 1:
                return time.monotonic() - started
            assert time.monotonic() - started < WAIT, "no wake-up"
            await storage.wakeups.wait_async(seen, WAIT)

    appender = when_waiting(storage, lambda: storage.append({stream.key: numbered_rows(1)}))
    elapsed = asyncio.run(wait_for_append())
    appender.join()

    assert elapsed < WAKEUP_BOUND


def test_wakeup_after_an_append_by_another_instance(storage: Storage, storage_url: str) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    start_watching(storage)
    other = open_storage(storage_url)
    try:
        appender = when_waiting(storage, lambda: other.append({stream.key: numbered_rows(1)}))
        elapsed = wait_for_head(storage, stream.key, 1, timeout=WAIT)
        appender.join()
    finally:
        other.close()

    assert elapsed < WAKEUP_BOUND


def test_an_append_before_the_first_wait_is_not_missed(storage: Storage, storage_url: str) -> None:
    # A reader notes the version, reads the heads, then waits. An append by another
    # writer in between must end the wait, even when it is the reader's first wait
    # (and so the first moment anything watches for other writers).
    (stream,) = create_topic(storage, "orders", 1)
    seen = storage.wakeups.version
    assert head(storage, stream.key).next_offset == 0
    other = open_storage(storage_url)
    try:
        other.append({stream.key: numbered_rows(1)})
    finally:
        other.close()

    started = time.monotonic()
    storage.wakeups.wait(seen, WAIT)

    assert time.monotonic() - started < WAKEUP_BOUND
    assert head(storage, stream.key).next_offset == 1


def test_wakeup_after_an_append_by_another_process(storage: Storage, storage_url: str) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    with writer_process(storage_url, [stream.key], writer=0, batches=1, rows_per_stream=1) as child:
        start_watching(storage)
        assert head(storage, stream.key).next_offset == 0
        go(child)
        elapsed = wait_for_head(storage, stream.key, 1, timeout=WAIT)
        finish(child)

    # From `go` to the wake-up: includes the child's append (a few ms).
    assert elapsed < WAKEUP_BOUND


def test_wakeup_after_a_topic_is_deleted_by_another_instance(
    storage: Storage, storage_url: str
) -> None:
    # Readers of the deleted topic's streams must learn they are gone.
    create_topic(storage, "orders", 1)
    start_watching(storage)
    seen = storage.wakeups.version
    other = open_storage(storage_url)
    try:
        other.delete_topic("orders")
    finally:
        other.close()

    started = time.monotonic()
    assert storage.wakeups.wait(seen, WAIT) != seen
    assert time.monotonic() - started < WAKEUP_BOUND


@pytest.mark.postgres
def test_the_listener_reconnects_and_wakes_readers(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    other = open_storage(postgres_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        start_watching(storage)

        # The LISTEN connection is terminated with the others; an append right
        # after it may NOTIFY while nobody listens.
        assert terminate_connections(postgres_url) >= 2
        other.append({stream.key: numbered_rows(1)})
        assert wait_for_head(storage, stream.key, 1, timeout=WAIT) < WAKEUP_BOUND

        # And it listens again.
        with psycopg.connect(postgres_url, autocommit=True) as watch:
            eventually(
                lambda: watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"
                ).fetchone(),
                what="the listener to LISTEN again",
            )
        appender = when_waiting(storage, lambda: other.append({stream.key: numbered_rows(1)}))
        elapsed = wait_for_head(storage, stream.key, 2, timeout=WAIT)
        appender.join()
        assert elapsed < WAKEUP_BOUND
    finally:
        other.close()
        storage.close()


@pytest.mark.postgres
def test_the_listener_retries_connecting_with_backoff(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = psycopg.connect
    refused: list[float] = []

    def refuse_the_listener_twice(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "riverbed-pg-listen" and len(refused) < 2:
            refused.append(time.monotonic())
            raise psycopg.OperationalError("the database system is starting up")
        return connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", refuse_the_listener_twice)
    storage = open_storage(postgres_url)
    other = open_storage(postgres_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        seen = storage.wakeups.version
        assert head(storage, stream.key).next_offset == 0
        other.append({stream.key: numbered_rows(1)})  # nobody listens yet

        assert storage.wakeups.wait(seen, WAIT) != seen  # woken once it could LISTEN
        assert len(refused) == 2
        assert refused[1] - refused[0] >= postgres_module.LISTEN_RETRY_FIRST
        assert head(storage, stream.key).next_offset == 1
    finally:
        other.close()
        storage.close()


def test_the_sqlite_watcher_stops_when_nobody_waits_and_starts_again(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "WATCH_IDLE", 0.2)
    storage = open_storage(sqlite_url)
    other = open_storage(sqlite_url)
    assert isinstance(storage, sqlite_module.SqliteStorage)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        start_watching(storage)
        first = storage._watcher
        assert first is not None

        # Nobody waits: the watcher stops polling.
        first.join(timeout=WAIT)
        assert not first.is_alive()

        # A reader looks at the head, another process appends, the reader waits:
        # the watcher starts again and wakes it, though it saw no change itself.
        seen = storage.wakeups.version
        assert head(storage, stream.key).next_offset == 0
        other.append({stream.key: numbered_rows(1)})
        started = time.monotonic()
        assert storage.wakeups.wait(seen, WAIT) != seen
        assert time.monotonic() - started < WAKEUP_BOUND
        assert storage._watcher is not first and storage._watcher.is_alive()

        # A wait longer than the idle time keeps it watching (the append comes
        # later than WATCH_IDLE: time passing is the scenario).
        seen = storage.wakeups.version
        appender = threading.Timer(0.5, other.append, ({stream.key: numbered_rows(1)},))
        appender.start()
        assert storage.wakeups.wait(seen, WAIT) != seen
        appender.join()
        assert head(storage, stream.key).next_offset == 2
    finally:
        other.close()
        storage.close()


def test_a_polling_watcher_keeps_the_pace_its_waits_ask_for() -> None:
    wakeups = Wakeups()
    default = 0.002
    assert wakeups.poll_interval(default) == default  # nobody has waited yet

    def wait_in_thread(latency: float | None, pace: float) -> threading.Thread:
        """Start a wait; return once the watcher's pace is `pace`."""
        thread = threading.Thread(target=wakeups.wait, args=(wakeups.version, WAIT, latency))
        thread.start()
        eventually(
            lambda: wakeups.poll_interval(default) == pace,
            what=f"the wait to start (pace {pace})",
            interval=0.001,
        )
        return thread

    relaxed = wait_in_thread(0.02, pace=0.02)  # the broker's router: 20 ms late is fine
    eager = wait_in_thread(None, pace=default)  # a worker: as soon as it can
    wakeups.notify()
    relaxed.join(WAIT)
    eager.join(WAIT)
    router = wait_in_thread(0.02, pace=0.02)
    wakeups.notify()
    router.join(WAIT)  # its wait over
    assert not router.is_alive()
    assert wakeups.poll_interval(default) == 0.02  # resting between the router's waits
    assert wakeups.poll_interval(0.05) == 0.05  # never more often than the backend's own


def test_after_a_try_append_the_threads_other_writes_wait_for_the_lock_again(
    sqlite_url: str,
) -> None:
    # try_append leaves its thread's connection without a busy timeout (an event
    # loop calls it all the time); anything else on that thread gets it back.
    storage = open_storage(sqlite_url)
    other = open_storage(sqlite_url)
    assert isinstance(other, sqlite_module.SqliteStorage)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        assert storage.try_append({stream.key: numbered_rows(1)}) == {stream.key: 0}
        held = other._write()
        held.__enter__()  # BEGIN IMMEDIATE: the write lock, held
        releaser = threading.Timer(0.3, held.__exit__, (None, None, None))
        try:
            assert storage.try_append({stream.key: numbered_rows(1)}) is None
            releaser.start()
            # Waits for the lock (BUSY_TIMEOUT), does not fail at once.
            assert storage.append({stream.key: numbered_rows(1)}) == {stream.key: 1}
        finally:
            if releaser.ident is None:  # never started: release here
                held.__exit__(None, None, None)
            releaser.join()
        assert storage.try_append({stream.key: numbered_rows(1)}) == {stream.key: 2}
        assert head(storage, stream.key).next_offset == 3
    finally:
        other.close()
        storage.close()


def test_a_read_after_a_try_append_that_finds_the_database_busy_waits_and_reads(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event loop's connection keeps its busy timeout off between its writes
    and its reads (no statement to switch it each time). A read that finds the
    database busy all the same (in WAL mode, a checkpoint resetting the log, or
    recovery) turns the timeout on and reads, rather than fail. The busy answer
    is the driver's, made up here: a real one needs another connection in
    exclusive locking mode, which no connection already open lets it take."""
    storage = open_storage(sqlite_url)
    assert isinstance(storage, sqlite_module.SqliteStorage)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        assert storage.try_append({stream.key: numbered_rows(1)}) == {stream.key: 0}
        conn = storage.connections.get()
        assert not conn.waits
        statements: list[str] = []
        original = sqlite_module._Connection.execute

        def busy_once_without_timeout(self: Any, sql: str, *args: Any) -> Any:
            statements.append(sql)
            if sql.startswith("SELECT") and not self.waits and len(statements) == 1:
                raise sqlite3.OperationalError("database is locked")
            return original(self, sql, *args)

        monkeypatch.setattr(sqlite_module._Connection, "execute", busy_once_without_timeout)
        assert head(storage, stream.key).next_offset == 1
        assert statements[1].startswith("PRAGMA busy_timeout=")
        assert conn.waits
    finally:
        storage.close()


# --------------------------------------------------------------------------- concurrent writers


def check_dense_and_ordered(
    storage: Storage, stream_keys: list[int], writers: int, per_writer: int
) -> None:
    for key in stream_keys:
        messages = storage.read(key, 0, writers * per_writer + 10)
        assert [m.offset for m in messages] == list(range(writers * per_writer))
        assert head(storage, key).next_offset == writers * per_writer
        by_writer = check_writers([m.payload for m in messages])
        assert sorted(by_writer) == list(range(writers))
        assert all(len(sequences) == per_writer for sequences in by_writer.values())


@pytest.mark.parametrize("shared", [False, True], ids=["own-instances", "one-instance"])
def test_threads_appending_to_the_same_streams(
    storage: Storage, storage_url: str, shared: bool
) -> None:
    threads_count, batches, rows = 4, 50, 2
    streams = [h.key for h in create_topic(storage, "orders", 2)]
    barrier = threading.Barrier(threads_count)
    failures: list[BaseException] = []

    def write(writer: int, target: Storage) -> None:
        try:
            ids = MessageIdGenerator()
            barrier.wait(timeout=30)
            sequence = 0
            for _ in range(batches):
                batch = {}
                for key in streams:
                    batch[key] = writer_rows(ids, writer, sequence, rows)
                    sequence += rows
                firsts = target.append(batch)
                assert set(firsts) == set(streams)
        except BaseException as exc:
            failures.append(exc)

    with ExitStack() as stack:
        targets = [
            storage if shared else stack.enter_context(_opened(storage_url))
            for _ in range(threads_count)
        ]
        workers = [
            threading.Thread(target=write, args=(n, targets[n])) for n in range(threads_count)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)

    assert not failures, failures
    check_dense_and_ordered(storage, streams, threads_count, batches * rows)


def test_processes_appending_to_the_same_streams(storage: Storage, storage_url: str) -> None:
    processes_count, batches, rows = 3, 50, 2
    streams = [h.key for h in create_topic(storage, "orders", 2)]

    with ExitStack() as stack:
        children = [
            stack.enter_context(writer_process(storage_url, streams, n, batches, rows))
            for n in range(processes_count)
        ]
        for child in children:
            go(child)
        for child in children:
            finish(child)

    check_dense_and_ordered(storage, streams, processes_count, batches * rows)


def test_concurrent_first_opens_migrate_once(storage_url: str) -> None:
    opened: list[Storage] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        try:
            barrier.wait(timeout=30)
            opened.append(open_storage(storage_url))
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=open_one) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    try:
        assert not failures, failures
        assert len(opened) == 4
        create_topic(opened[0], "orders", 1)
        assert [[t.name for t in s.list_topics()] for s in opened] == [["orders"]] * 4
    finally:
        for storage in opened:
            storage.close()


@contextmanager
def _opened(url: str) -> Iterator[Storage]:
    storage = open_storage(url)
    try:
        yield storage
    finally:
        storage.close()
