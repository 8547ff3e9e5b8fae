"""Topic shapes read once for all sessions (mqtt/shapes.py), in process, on SQLite."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pytest

from riverbed.log.log import Log
from riverbed.log.topics import BUILTIN_TOPIC, Topics
from riverbed.mqtt.shapes import TopicShapes
from riverbed.storage import open_storage


class Reads:
    """A `read_shared` that reads at once, counting, and can be held."""

    def __init__(self) -> None:
        self.count = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, key: Hashable, read: Callable[..., Any], *args: object) -> Any:
        self.count += 1
        result = read(*args)
        if self.gate is not None:
            await self.gate.wait()
        return result


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log(sqlite_url: str) -> Iterator[Log]:
    opened = Log.open(sqlite_url)
    try:
        yield opened
    finally:
        opened.close()


def _generations(shape: Any) -> list[int]:
    return [st.generation for st in shape[0]]


def test_sessions_asking_alike_read_a_shape_once(log: Log) -> None:
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=1.0, clock=clock)

    async def ask() -> list[Any]:
        return [await shapes.get(BUILTIN_TOPIC) for _ in range(50)]

    answers = asyncio.run(ask())
    assert reads.count == 1 and shapes.reads == 1
    generations, heads = answers[0]
    assert all(answer is answers[0] for answer in answers)
    assert [st.generation for st in generations] == [0]
    assert len(heads) == log.storage.list_storage_topics(BUILTIN_TOPIC)[0].partitions


def test_a_shape_is_read_again_once_it_is_max_age_old(log: Log) -> None:
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=1.0, clock=clock)

    async def ask() -> None:
        await shapes.get(BUILTIN_TOPIC)
        clock.now += 0.9
        await shapes.get(BUILTIN_TOPIC)
        assert reads.count == 1
        clock.now += 0.2
        await shapes.get(BUILTIN_TOPIC)
        assert reads.count == 2

    asyncio.run(ask())


def test_this_processs_scale_up_is_seen_at_once(log: Log) -> None:
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=3600.0, clock=clock)

    async def ask() -> None:
        assert _generations(await shapes.get(BUILTIN_TOPIC)) == [0]
        log.topics.add_storage_topic(BUILTIN_TOPIC, 32)
        assert _generations(await shapes.get(BUILTIN_TOPIC)) == [0, 1]

    asyncio.run(ask())


def test_another_processs_scale_up_is_seen_once_the_fanout_sees_its_streams(
    log: Log, sqlite_url: str
) -> None:
    """`forget` is what the fan-out's `on_new_streams` calls: the log looks at
    the metadata again at once, whatever its BINDINGS_TTL says."""
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=3600.0, clock=clock)
    other = open_storage(sqlite_url)

    async def ask() -> None:
        assert _generations(await shapes.get(BUILTIN_TOPIC)) == [0]
        Topics(other).add_storage_topic(BUILTIN_TOPIC, 32)
        shapes.forget()
        assert _generations(await shapes.get(BUILTIN_TOPIC)) == [0, 1]

    try:
        asyncio.run(ask())
    finally:
        other.close()


def test_a_read_that_started_before_a_forget_is_not_kept(log: Log) -> None:
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=3600.0, clock=clock)

    async def ask() -> None:
        reads.gate = asyncio.Event()
        running = asyncio.create_task(shapes.get(BUILTIN_TOPIC))
        while reads.count == 0:
            await asyncio.sleep(0)
        log.topics.add_storage_topic(BUILTIN_TOPIC, 32)
        shapes.forget()
        reads.gate.set()
        reads.gate = None
        assert _generations(await running) == [0]  # as of its read
        assert _generations(await shapes.get(BUILTIN_TOPIC)) == [0, 1]
        assert reads.count == 2

    asyncio.run(ask())


def test_a_missing_topic_has_no_shape_until_it_is_created(log: Log) -> None:
    reads, clock = Reads(), Clock()
    shapes = TopicShapes(log, reads, max_age=3600.0, clock=clock)

    async def ask() -> None:
        assert await shapes.get("later") is None
        assert await shapes.get("later") is None
        assert reads.count == 1
        log.topics.create("later", 2, binding="later/#")
        shape = await shapes.get("later")
        assert shape is not None and len(shape[1]) == 2

    asyncio.run(ask())


def test_bindings_follow_topic_changes(log: Log) -> None:
    shapes = TopicShapes(log, Reads())
    before = shapes.bindings()
    assert before is shapes.bindings()  # kept while nothing changed
    assert ("sensors", "sensors/#") not in before
    log.topics.create("sensors", 2, binding="sensors/#")
    assert ("sensors", "sensors/#") in shapes.bindings()
    log.topics.delete("sensors")
    assert all(name != "sensors" for name, _ in shapes.bindings())


def test_a_negative_max_age_is_refused(log: Log) -> None:
    with pytest.raises(ValueError, match=r"max_age -1\.0 must be 0 seconds or more"):
        TopicShapes(log, Reads(), max_age=-1.0)
