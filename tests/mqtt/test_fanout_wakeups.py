"""What wakes the fan-out (mqtt/fanout.py `_watch`): another process's commit
at once, told heads without a look at the heads table, the poll only when the
storage hears nothing of other processes. In process, on a real SQLite storage
whose wake-ups the test drives as PostgreSQL's LISTEN thread would."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import pytest

from harness.waiting import SLOW, eventually_async
from riverbed.log.log import Log
from riverbed.model import Message, StoredMessage
from riverbed.mqtt import fanout as fanout_module
from riverbed.mqtt.fanout import Fanout
from riverbed.storage.base import Hearing, StreamHead, Wakeups
from riverbed.topics.trie import TopicTrie

POLL = 60.0
"""The fan-out's `poll_interval` where the poll must not be what delivers."""
PROMPT = 10.0 * SLOW
"""A delivery woken by a commit takes less than this (a sixth of POLL)."""


class Heard:
    """A real storage whose wake-ups are the test's own (`hearing` as given),
    counting the fan-out's reads of the heads table."""

    def __init__(self, storage: Any, hearing: Hearing) -> None:
        self._storage = storage
        self.wakeups = Wakeups()
        self.wakeups.hearing = hearing
        self.heads_read = 0

    def list_streams(self, *args: Any) -> list[StreamHead]:
        self.heads_read += 1
        return self._storage.list_streams(*args)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


@pytest.fixture
def log(sqlite_url: str) -> Iterator[Log]:
    opened = Log.open(sqlite_url)
    opened.topics.create("r", 1)
    yield opened
    opened.close()


@pytest.fixture(autouse=True)
def no_safety_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """No look at the heads table for want of wake-ups (1 s) during a test."""
    monkeypatch.setattr(fanout_module, "WATCH_TIMEOUT", POLL)


class Session:
    """One session of the fan-out, subscribed to "a", fetching from stream `key`."""

    def __init__(self, fanout: Fanout, key: int, offset: int) -> None:
        self.fanout = fanout
        self.key = key
        self.offset = offset
        self.got: list[bytes] = []
        self.answered = asyncio.Event()
        fanout.trie.add("a", "session")
        self.fetch()

    def fetch(self) -> None:
        self.answered.clear()
        self.fanout.fetch(self.key, self.offset, 100, "session", self._sink)

    def _sink(self, key: int, rows: Sequence[StoredMessage], upto: int) -> None:
        self.got.extend(r.payload for r in rows)
        self.offset = upto
        self.answered.set()

    async def receive(self, *payloads: bytes, timeout: float = PROMPT) -> None:
        """Fetch until `payloads` came, within `timeout`."""

        async def all_of_them() -> None:
            while not set(payloads) <= set(self.got):
                await self.answered.wait()
                self.fetch()

        await asyncio.wait_for(all_of_them(), timeout)


def commit_elsewhere(log: Log, payload: bytes) -> int:
    """Append as another process would (no `Fanout.committed`, no wake-up);
    the stream's new head."""
    log.produce("r", [Message(payload, key="k", mqtt_topic="a")])
    (head,) = log.storage.list_streams("r")
    return head.next_offset


async def started(storage: Heard, poll_interval: float) -> tuple[Fanout, Session]:
    trie: TopicTrie[Hashable] = TopicTrie()
    fanout = Fanout(storage, trie, poll_interval=poll_interval)  # type: ignore[arg-type]
    await fanout.start()
    (head,) = storage.list_streams("r")
    session = Session(fanout, head.key, head.next_offset)
    # Its watcher waits for wake-ups (the first wait sets the pace it asks for).
    await eventually_async(
        lambda: storage.wakeups.poll_interval(0) == poll_interval, what="the fan-out to wait"
    )
    return fanout, session


def test_another_process_commit_is_routed_at_once_from_the_heads_it_told(log: Log) -> None:
    storage = Heard(log.storage, Hearing.APART)

    async def scenario() -> tuple[list[bytes], int, int]:
        fanout, session = await started(storage, POLL)
        try:
            storage.wakeups.notify(others=True)  # as the LISTEN thread does when it connects
            await eventually_async(lambda: fanout.looks == 1, what="the first look")
            read_before = storage.heads_read
            for n in range(3):
                head = commit_elsewhere(log, b"%d" % n)
                storage.wakeups.notify(others=True, heads={session.key: head})
                # Within a sixth of the poll: each commit ends the fan-out's rest.
                await session.receive(b"%d" % n)
            return session.got, storage.heads_read - read_before, fanout.told
        finally:
            await fanout.stop()

    got, heads_read, told = asyncio.run(scenario())
    assert got == [b"0", b"1", b"2"]
    assert heads_read == 0  # the heads came with the wake-ups
    assert told == 3


def test_a_told_head_of_a_stream_not_known_yet_makes_the_fanout_look(log: Log) -> None:
    storage = Heard(log.storage, Hearing.APART)

    async def scenario() -> tuple[int, int | None]:
        fanout, _ = await started(storage, POLL)
        try:
            storage.wakeups.notify(others=True)
            await eventually_async(lambda: fanout.looks == 1, what="the first look")
            log.topics.create("s", 1)
            log.produce("s", [Message(b"s", key="k", mqtt_topic="a")])
            (new,) = log.storage.list_streams("s")
            storage.wakeups.notify(others=True, heads={new.key: 1})
            await eventually_async(lambda: fanout.looks == 2, PROMPT, "a look at the heads")
            return fanout.told, fanout.heads().get(new.key)
        finally:
            await fanout.stop()

    told, head = asyncio.run(scenario())
    assert (told, head) == (0, 1)


def test_a_storage_that_hears_nothing_of_others_is_polled(log: Log) -> None:
    storage = Heard(log.storage, Hearing.DEAF)

    async def scenario() -> list[bytes]:
        fanout, session = await started(storage, 0.05)
        try:
            commit_elsewhere(log, b"polled")  # no wake-up at all
            await session.receive(b"polled")  # MIXED would wait for WATCH_TIMEOUT (POLL)
            return session.got
        finally:
            await fanout.stop()

    assert asyncio.run(scenario()) == [b"polled"]


def test_a_deaf_storage_that_hears_again_ends_the_poll_s_pause(log: Log) -> None:
    storage = Heard(log.storage, Hearing.DEAF)

    async def scenario() -> list[bytes]:
        fanout, session = await started(storage, POLL)
        try:
            await eventually_async(lambda: fanout.looks == 1, what="the first poll")
            # The LISTEN connection is back: it hears APART and wakes once.
            storage.wakeups.hearing = Hearing.APART
            storage.wakeups.notify(others=True)
            await eventually_async(lambda: fanout.looks == 2, PROMPT, "a look after the pause")
            head = commit_elsewhere(log, b"heard")
            storage.wakeups.notify(others=True, heads={session.key: head})
            await session.receive(b"heard")
            return session.got
        finally:
            await fanout.stop()

    assert asyncio.run(scenario()) == [b"heard"]


def test_own_wake_ups_are_paced_when_others_are_told_apart(log: Log) -> None:
    """This process's own commits wake the fan-out too; they were routed
    (`committed`) and a look for them waits for the rest's end."""
    storage = Heard(log.storage, Hearing.APART)

    async def scenario() -> tuple[int, list[bytes]]:
        fanout, session = await started(storage, 0.2)
        try:
            storage.wakeups.notify(others=True)
            await eventually_async(lambda: fanout.looks == 1, what="the first look")
            commit_elsewhere(log, b"own")  # as if through the HTTP API: not `committed`
            storage.wakeups.notify()
            await session.receive(b"own")
            return fanout.looks, session.got
        finally:
            await fanout.stop()

    looks, got = asyncio.run(scenario())
    assert got == [b"own"]
    assert looks == 2  # a look, not the told path: its heads are not known


def test_others_commits_are_told_while_own_wake_ups_wait_for_their_look(log: Log) -> None:
    storage = Heard(log.storage, Hearing.APART)

    async def scenario() -> tuple[list[bytes], int, int]:
        fanout, session = await started(storage, 8.0)
        try:
            storage.wakeups.notify(others=True)
            await eventually_async(lambda: fanout.looks == 1, what="the first look")
            storage.wakeups.notify()  # our own: a look within the pace
            head = commit_elsewhere(log, b"theirs")
            storage.wakeups.notify(others=True, heads={session.key: head})
            await session.receive(b"theirs")
            told, looks = fanout.told, fanout.looks
            await eventually_async(lambda: fanout.looks == 2, 30 * SLOW, "the look owed")
            return session.got, told, looks
        finally:
            await fanout.stop()

    got, told, looks = asyncio.run(scenario())
    assert (got, told, looks) == ([b"theirs"], 1, 1)


def test_the_poll_interval_must_be_positive(log: Log) -> None:
    trie: TopicTrie[Hashable] = TopicTrie()
    with pytest.raises(ValueError, match="poll_interval 0 must be more than 0 seconds"):
        Fanout(log.storage, trie, poll_interval=0)
