"""Wake-ups that tell other processes' commits apart (storage/base.py `Wakeups`,
`Hearing`) and PostgreSQL's LISTEN thread that feeds them (storage/postgres.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from harness.storage import create_topic, numbered_rows
from harness.waiting import SLOW, eventually
from riverbed.storage import open_storage
from riverbed.storage.base import Hearing, Wakeups
from riverbed.storage.postgres import LISTENER_NAME, NOTIFY_HEADS, PostgresStorage, parse_heads

WAIT = 30.0 * SLOW


def test_others_commits_bump_their_own_counter_and_gather_their_heads() -> None:
    wakeups = Wakeups()
    wakeups.notify()  # this process's own commit
    version, others, heads = wakeups.take()
    assert (version, others, heads) == (1, 0, {})

    wakeups.notify(others=True, heads={3: 10, 4: 7})
    wakeups.notify(others=True, heads={3: 12})
    wakeups.notify(others=True, heads={4: 5})  # an older head, told late
    assert wakeups.take() == (4, 3, {3: 12, 4: 7})
    assert wakeups.take() == (4, 3, {})  # handed over once


def test_an_others_commit_that_does_not_say_what_it_moved_asks_for_a_full_look() -> None:
    wakeups = Wakeups()
    wakeups.notify(others=True, heads={3: 10})
    wakeups.notify(others=True)
    wakeups.notify(others=True, heads={4: 1})
    assert wakeups.take() == (3, 3, None)
    assert wakeups.take() == (3, 3, {})


def test_a_wait_for_others_ends_with_their_commit_and_not_with_ours() -> None:
    async def scenario() -> tuple[int, int, int]:
        wakeups = Wakeups()
        loop = asyncio.get_running_loop()
        ours = loop.call_later(0.01, wakeups.notify)
        timed_out = await wakeups.wait_others_async(0, 0.2)
        assert ours.when() < loop.time()
        theirs = asyncio.create_task(wakeups.wait_others_async(0, WAIT))
        await asyncio.sleep(0)
        wakeups.notify(others=True)
        woken = await asyncio.wait_for(theirs, WAIT)
        at_once = await wakeups.wait_others_async(0, WAIT)  # it moved since 0 already
        return timed_out, woken, at_once

    assert asyncio.run(scenario()) == (0, 1, 1)


def test_a_wake_up_tells_its_waiters_on_another_thread() -> None:
    async def scenario() -> int:
        wakeups = Wakeups()
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(wakeups.wait_others_async(0, WAIT))
        await asyncio.sleep(0)
        await loop.run_in_executor(None, lambda: wakeups.notify(others=True, heads={1: 2}))
        return await asyncio.wait_for(waiting, WAIT)

    assert asyncio.run(scenario()) == 1


@pytest.mark.parametrize(
    ("text", "heads"),
    [
        ("3:10 4:7", {3: 10, 4: 7}),
        ("12:1", {12: 1}),
        ("", None),  # no heads: a seal, a deletion, many streams, an older node
        ("3:10 x:1", None),
        ("3:-1", None),
        ("3", None),
    ],
)
def test_a_notify_payload_names_heads_or_none(text: str, heads: dict[int, int] | None) -> None:
    assert parse_heads(text) == heads


def _listeners(url: str) -> list[int]:
    """Backend pids of LISTEN connections to `url`'s database."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            (LISTENER_NAME,),
        ).fetchall()
    return [int(pid) for (pid,) in rows]


@pytest.mark.postgres
def test_postgres_tells_another_storages_appends_from_its_own_with_their_heads(
    postgres_url: str,
) -> None:
    storage = open_storage(postgres_url)
    other = open_storage(postgres_url)
    try:
        assert isinstance(storage, PostgresStorage)
        wakeups = storage.wakeups
        assert wakeups.hearing is Hearing.DEAF  # nobody waited yet: no LISTEN
        (stream,) = create_topic(storage, "orders", 1)
        wakeups.wait(wakeups.version, 0.01)  # starts the LISTEN thread
        eventually(lambda: wakeups.hearing is Hearing.APART, WAIT, "the LISTEN connection")
        _, others, _ = wakeups.take()

        storage.append({stream.key: numbered_rows(2)})  # its own
        other.append({stream.key: numbered_rows(3)})  # another's: heads 2 + 3
        eventually(lambda: wakeups.others > others, WAIT, "the other's NOTIFY")
        _, now, heads = wakeups.take()
        assert (now, heads) == (others + 1, {stream.key: 5})

        # Its own NOTIFY came through the LISTEN too (before the other's), and
        # counted as its own: only the other's commit bumped `others`.
        other.append({stream.key: numbered_rows(1)})
        eventually(lambda: wakeups.others > now, WAIT, "the next NOTIFY")
        _, later, heads = wakeups.take()
        assert (later, heads) == (now + 1, {stream.key: 6})
    finally:
        other.close()
        storage.close()


@pytest.mark.postgres
def test_postgres_wake_ups_are_deaf_while_the_listen_connection_is_down(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = psycopg.connect
    refuse = threading.Event()

    def refuse_the_listener(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "riverbed-pg-listen" and refuse.is_set():
            raise psycopg.OperationalError("the database system is shutting down")
        return connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", refuse_the_listener)
    storage = open_storage(postgres_url)
    try:
        wakeups = storage.wakeups
        wakeups.wait(wakeups.version, 0.01)
        eventually(lambda: wakeups.hearing is Hearing.APART, WAIT, "the LISTEN connection")
        (pid,) = _listeners(postgres_url)

        refuse.set()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        eventually(lambda: wakeups.hearing is Hearing.DEAF, WAIT, "the wake-ups to go deaf")
        _, others, _ = wakeups.take()

        # It connects again, and wakes the readers once: a NOTIFY may have been lost.
        refuse.clear()
        eventually(lambda: wakeups.hearing is Hearing.APART, WAIT, "the LISTEN connection again")
        assert _listeners(postgres_url) not in ([], [pid])
        _, now, heads = wakeups.take()
        assert now > others
        assert heads is None  # it cannot say what it missed: look at every head
    finally:
        storage.close()


@pytest.mark.postgres
@pytest.mark.parametrize("partitions", [3, NOTIFY_HEADS + 1])
def test_an_append_to_many_streams_notifies_once(postgres_url: str, partitions: int) -> None:
    storage = open_storage(postgres_url)
    other = open_storage(postgres_url)
    try:
        streams = create_topic(storage, "orders", partitions)
        wakeups = storage.wakeups
        wakeups.wait(wakeups.version, 0.01)
        eventually(lambda: wakeups.hearing is Hearing.APART, WAIT, "the LISTEN connection")
        _, others, _ = wakeups.take()

        other.append({s.key: numbered_rows(2) for s in streams})  # one transaction
        other.append({streams[0].key: numbered_rows(1)})  # and the next
        eventually(lambda: wakeups.others >= others + 2, WAIT, "two NOTIFYs")
        _, now, heads = wakeups.take()
        assert now == others + 2  # one per transaction, however many streams
        if partitions <= NOTIFY_HEADS:
            assert heads == {s.key: 3 if s is streams[0] else 2 for s in streams}
        else:
            assert heads is None  # too many to name: a look at every head
    finally:
        other.close()
        storage.close()


def test_a_commit_on_the_waiting_loops_thread_wakes_it_without_the_self_pipe() -> None:
    """SQLite's inline appends commit on the event loop's own thread: their
    wake-up is an ordinary callback of that loop (a thread-safe one writes to
    the loop's self-pipe and costs it a read); a waiter on another thread's
    loop still gets the thread-safe one."""

    async def scenario() -> int:
        wakeups = Wakeups()
        loop = asyncio.get_running_loop()

        def refuse(*_: object) -> None:
            raise AssertionError("woken through the self-pipe from its own thread")

        loop.call_soon_threadsafe = refuse  # type: ignore[method-assign]
        waiting = asyncio.create_task(wakeups.wait_async(0, WAIT))
        await asyncio.sleep(0)
        wakeups.notify()  # on this loop's thread
        return await asyncio.wait_for(waiting, WAIT)

    assert asyncio.run(scenario()) == 1


@pytest.mark.parametrize("kind", ["any", "others"])
def test_a_wait_given_up_with_its_loop_leaves_nothing_for_a_later_commit(kind: str) -> None:
    # A wait whose task is cancelled (its loop shutting down, a caller's own
    # timeout) must not stay among the waiters: once its loop is closed, the
    # next commit's wake-up would raise "Event loop is closed" in the thread
    # that committed (a storage's watcher, which then died; an appender, after
    # its COMMIT).
    wakeups = Wakeups()

    async def give_up() -> None:
        wait = (
            wakeups.wait_async(wakeups.version, WAIT)
            if kind == "any"
            else wakeups.wait_others_async(wakeups.others, WAIT)
        )
        task = asyncio.ensure_future(wait)
        await asyncio.sleep(0)  # the wait is registered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(give_up())  # the loop is closed after this
    assert not wakeups._waiters and not wakeups._others_waiters
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            wakeups.notify(others=True)
        except BaseException as exc:
            errors.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    committer.join(WAIT)
    assert errors == []


def test_a_wake_up_for_a_closed_loop_does_not_fail_the_commit_that_tells_it() -> None:
    # However a waiter of a closed loop was left behind, telling it is skipped.
    wakeups = Wakeups()
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    loop.close()
    wakeups._waiters.append((loop, future))
    wakeups.notify()
    assert wakeups.version == 1
