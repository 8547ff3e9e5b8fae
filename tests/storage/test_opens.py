"""Who else has a SQLite database open (storage/opens.py), and the watcher that
waits for an open instead of polling while nobody has (storage/sqlite.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.storage import create_topic, finish, go, head, numbered_rows, writer_process
from harness.waiting import SLOW, eventually
from riverbed.storage import open_storage
from riverbed.storage import sqlite as sqlite_module
from riverbed.storage.opens import (
    OpenWatch,
    closed_here,
    opened_here,
    others_have_open,
    shared_here,
)
from riverbed.storage.sqlite import SqliteStorage

WAIT = 30.0 * SLOW
"""Seconds a wait here may last; the waits that matter end long before."""

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT COUNT(*) FROM meta").fetchall()
print("ready", flush=True)
sys.stdin.readline()
"""
"""A process that opens the database, reads once (which maps its -shm), says
`ready` and keeps it open until a line comes on stdin."""


def sqlite_storage(url: str) -> SqliteStorage:
    storage = open_storage(url)
    assert isinstance(storage, SqliteStorage)
    return storage


@contextmanager
def holder(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with the database at `path` open while inside."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
            yield process
        finally:
            if process.poll() is None:
                process.communicate("\n", timeout=WAIT)


class HeadReader(threading.Thread):
    """Waits on a storage's wake-ups until a stream's head reaches `at_least`
    (`done`), re-reading it at each; a wait that nothing ends ends it undone."""

    def __init__(self, storage: SqliteStorage, key: int, at_least: int) -> None:
        super().__init__()
        self.storage, self.key, self.at_least = storage, key, at_least
        self.done = False

    def run(self) -> None:
        wakeups = self.storage.wakeups
        while True:
            seen = wakeups.version
            if head(self.storage, self.key).next_offset >= self.at_least:
                self.done = True
                return
            if wakeups.wait(seen, WAIT) == seen:
                return  # not woken: what it waits for was not heard of


def head_reader(storage: SqliteStorage, key: int, at_least: int) -> HeadReader:
    reader = HeadReader(storage, key, at_least)
    reader.start()
    return reader


# ------------------------------------------------------------- who has the file open


def test_another_process_with_the_database_open_is_seen_and_this_one_is_not(
    sqlite_url: str,
) -> None:
    storage = sqlite_storage(sqlite_url)
    try:
        create_topic(storage, "orders", 1)  # this process: connections, the -shm held
        assert not others_have_open(storage.path)
        with holder(storage.path):
            assert others_have_open(storage.path)
        eventually(lambda: not others_have_open(storage.path), what="the holder to be gone")
    finally:
        storage.close()


def test_the_lock_table_is_read_for_the_shm_file_and_other_pids(tmp_path: Path) -> None:
    shm = tmp_path / "riverbed.db-shm"
    shm.write_bytes(b"")
    stat = os.stat(shm)
    ident = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    elsewhere = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino + 1}"
    me, other = os.getpid(), os.getpid() + 1
    locks = tmp_path / "locks"

    def seen(*lines: str) -> bool:
        locks.write_text("".join(f"{line}\n" for line in lines))
        return others_have_open(tmp_path / "riverbed.db", locks=locks)

    assert not seen()
    assert not seen(f"1: POSIX  ADVISORY  READ {me} {ident} 128 128")
    assert not seen(f"1: POSIX  ADVISORY  READ {other} {elsewhere} 128 128")
    assert not seen(f"1: FLOCK  ADVISORY  WRITE {other} {elsewhere} 0 EOF")
    assert seen(f"1: POSIX  ADVISORY  READ {other} {ident} 128 128")
    assert seen(f"2: OFDLCK ADVISORY  READ -1 {ident} 128 128")
    assert seen(
        f"1: POSIX  ADVISORY  READ {me} {ident} 128 128",
        f"1: -> POSIX  ADVISORY  WRITE {other} {ident} 120 120",
    )
    # What cannot be read answers "maybe": the caller polls.
    assert others_have_open(tmp_path / "riverbed.db", locks=tmp_path / "no-such-table")
    assert others_have_open(tmp_path / "missing.db", locks=locks)


def test_this_processs_own_storages_of_a_file_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "riverbed.db"
    first = opened_here(path)
    assert not shared_here(first)
    second = opened_here(tmp_path / "." / "riverbed.db")  # the same file
    assert second == first and shared_here(first)
    closed_here(second)
    assert not shared_here(first)
    closed_here(first)
    assert not shared_here(first)


# ------------------------------------------------------------------ waiting for an open


def test_an_open_of_the_database_files_ends_a_wait_and_others_do_not(tmp_path: Path) -> None:
    path = tmp_path / "riverbed.db"
    for name in ("riverbed.db", "riverbed.db-wal", "unrelated.txt", "riverbed.db.nodes"):
        (tmp_path / name).write_bytes(b"")
    watch = OpenWatch.start(path)
    assert watch is not None  # Linux
    try:
        assert not watch.wait(0)
        (tmp_path / "unrelated.txt").read_bytes()
        (tmp_path / "riverbed.db.nodes").read_bytes()
        assert not watch.wait(0)  # the events were there: only other names
        (tmp_path / "riverbed.db-wal").read_bytes()
        assert watch.wait(WAIT)
        assert watch.opens == 1
        assert not watch.wait(0)  # taken
        with open(path, "rb"), open(path, "rb"):
            pass
        assert watch.wait(WAIT)
        assert watch.opens >= 2  # the kernel may tell two alike opens as one
    finally:
        watch.close()
        watch.close()
    assert not watch.wait(WAIT)  # closed: no wait at all


def test_interrupt_ends_a_wait_at_once_and_every_later_one(tmp_path: Path) -> None:
    watch = OpenWatch.start(tmp_path / "riverbed.db")
    assert watch is not None
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(watch.wait(3600)))
    waiter.start()
    try:
        watch.interrupt()
        waiter.join(WAIT)
        assert not waiter.is_alive() and answers == [False]
        watch.interrupt()  # twice: the pipe holds one byte, no error
        assert not watch.wait(3600)
    finally:
        watch.interrupt()
        waiter.join(WAIT)
        watch.close()
    watch.interrupt()  # closed: nothing


# ------------------------------------------------------------------ the watcher alone


def test_a_lone_watcher_waits_for_an_open_and_hears_the_commit_after_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No look at the clock while alone: only the open can wake it.
    monkeypatch.setattr(sqlite_module, "WATCH_ALONE", 3600.0)
    storage = sqlite_storage(sqlite_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        reader = head_reader(storage, stream.key, 1)
        eventually(lambda: storage.watching_alone, what="the watcher to wait alone")
        with writer_process(sqlite_url, [stream.key], 1, 1, 1) as writer:
            go(writer)
            finish(writer)
        reader.join(WAIT)
        assert reader.done, "the reader did not hear of the other's commit"
        eventually(lambda: storage.watching_alone, what="the watcher alone again")
    finally:
        storage.close()
    eventually(lambda: storage._watcher is None or not storage._watcher.is_alive())


def test_with_another_process_holding_the_file_open_the_watcher_polls(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "WATCH_ALONE", 3600.0)
    storage = sqlite_storage(sqlite_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        # The writer opens the file before the watcher starts: there is no open
        # for the watcher to hear, only the writer's lock to see.
        with writer_process(sqlite_url, [stream.key], 1, 1, 1) as writer:
            reader = head_reader(storage, stream.key, 1)
            eventually(lambda: storage._watcher is not None, what="the watcher to start")
            go(writer)
            finish(writer)
            reader.join(WAIT)
        assert reader.done, "the reader did not hear of the other's commit"
    finally:
        storage.close()


def test_two_storages_of_this_process_on_one_file_hear_each_other(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each wakes its own readers after its own commits, not the other's.
    monkeypatch.setattr(sqlite_module, "WATCH_ALONE", 3600.0)
    storage = sqlite_storage(sqlite_url)
    other = sqlite_storage(sqlite_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        reader = head_reader(storage, stream.key, 1)
        eventually(lambda: storage._watcher is not None, what="the watcher to start")
        other.append({stream.key: numbered_rows(1)})
        reader.join(WAIT)
        assert reader.done, "the reader did not hear of the other storage's commit"
        assert not storage.watching_alone
        other.close()
        # Alone now: it waits for an open, and its own commits wake its readers.
        reader = head_reader(storage, stream.key, 2)
        eventually(lambda: storage.watching_alone, what="the watcher to wait alone")
        storage.append({stream.key: numbered_rows(1)})
        reader.join(WAIT)
        assert reader.done
    finally:
        other.close()
        storage.close()


def test_without_the_open_watch_the_watcher_polls_as_before(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "WATCH_ALONE", 3600.0)
    monkeypatch.setattr(OpenWatch, "start", classmethod(lambda cls, path: None))
    storage = sqlite_storage(sqlite_url)
    try:
        (stream,) = create_topic(storage, "orders", 1)
        reader = head_reader(storage, stream.key, 1)
        eventually(lambda: storage._watcher is not None, what="the watcher to start")
        with writer_process(sqlite_url, [stream.key], 1, 1, 1) as writer:
            go(writer)
            finish(writer)
        reader.join(WAIT)
        assert reader.done, "the reader did not hear of the other's commit"
        assert not storage.watching_alone
    finally:
        storage.close()


def test_a_watcher_that_fails_is_said_and_the_next_wait_starts_another(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = sqlite_storage(sqlite_url)
    looks = iter([RuntimeError("a bug")])
    original = SqliteStorage._look

    def look(self: SqliteStorage, conn: object, last: int) -> int:
        failure = next(looks, None)
        if failure is not None:
            raise failure
        return original(self, conn, last)  # type: ignore[arg-type]

    monkeypatch.setattr(SqliteStorage, "_look", look)
    try:
        storage.wakeups.wait(storage.wakeups.version, 0.01)  # starts the watcher
        first = storage._watcher
        assert first is not None
        first.join(WAIT)
        assert not first.is_alive()
        assert "the watcher of" in caplog.text and "a bug" in caplog.text
        (stream,) = create_topic(storage, "orders", 1)
        with writer_process(sqlite_url, [stream.key], 1, 1, 1) as writer:
            reader = head_reader(storage, stream.key, 1)
            eventually(lambda: storage._watcher is not first, what="a new watcher")
            go(writer)
            finish(writer)
            reader.join(WAIT)
        assert reader.done, "the reader did not hear of the other's commit"
    finally:
        storage.close()
