"""A resume reads its session's cursors with its record (SessionStore.load_resuming), in process."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient, RawClient
from riverbed.log.topics import BUILTIN_TOPIC
from riverbed.mqtt.broker import Broker
from riverbed.sessions.store import cursor_name


def _publish(port: int, first: int, count: int) -> None:
    with RawClient(port) as client:
        client.connect("publisher", clean=True)
        client.publish_many(("a/x", b"%d" % i) for i in range(first, first + count))


def _count_cursor_reads(broker: Broker) -> list[Any]:
    calls: list[Any] = []
    real = broker.store.cursors_of

    def counting(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    broker.store.cursors_of = counting  # type: ignore[method-assign]
    return calls


def test_a_resume_reads_its_cursors_with_its_record(sqlite_url: str) -> None:
    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            client = await AsyncRawClient.open(broker.port)
            await client.connect("r", expiry=300)
            await client.subscribe("a/#", 1)
            await asyncio.to_thread(_publish, broker.port, 0, 5)
            assert await client.receive(5) == [b"%d" % i for i in range(5)]
            await client.leave()
            await asyncio.to_thread(_publish, broker.port, 5, 5)  # while it is away

            reads = _count_cursor_reads(broker)
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("r", expiry=300)).session_present
            assert await client.receive(5) == [b"%d" % i for i in range(5, 10)]
            assert reads == []  # read with the record
            await client.leave()

    asyncio.run(scenario())


def test_a_resume_makes_the_cursors_its_record_names_if_they_are_missing(
    sqlite_url: str,
) -> None:
    """A crash between making a session's cursors and writing the record that
    names their topic leaves a record without them: the resume makes them (at
    the heads), and what comes after reaches the session."""

    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            client = await AsyncRawClient.open(broker.port)
            await client.connect("m", expiry=300)
            await client.subscribe("a/#", 1)
            await client.leave()
            stored = broker.store.load("m")
            assert stored is not None and stored.record.topics == (BUILTIN_TOPIC,)
            session_id = stored.record.session_id
            broker.log.storage.delete_subscription(cursor_name(session_id, BUILTIN_TOPIC))
            assert broker.store.missing_cursors(session_id, [BUILTIN_TOPIC]) == [BUILTIN_TOPIC]

            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("m", expiry=300)).session_present
            assert broker.store.missing_cursors(session_id, [BUILTIN_TOPIC]) == []
            await asyncio.to_thread(_publish, broker.port, 0, 3)
            assert await client.receive(3) == [b"0", b"1", b"2"]
            await client.leave()

    asyncio.run(scenario())


def test_a_subscribe_reads_the_heads_of_the_topics_it_reaches_first_only(
    sqlite_url: str,
) -> None:
    """With many topics a SUBSCRIBE read every stream's head; now only those of
    the topics the session reaches for the first time, and none after."""

    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            for i in range(10):
                broker.log.topics.create(f"t{i}", 4, binding=f"t{i}/#")
            asked: list[list[str] | None] = []
            real = broker.fanout.start_positions

            def recording(topics: list[str] | None = None) -> Any:
                asked.append(None if topics is None else list(topics))
                return real(topics)

            broker.fanout.start_positions = recording  # type: ignore[method-assign]
            client = await AsyncRawClient.open(broker.port)
            await client.connect("h", expiry=300)
            await client.subscribe("a/#", 1)
            await client.subscribe("b/#", 1)  # the same topic: nothing to read
            await client.subscribe("t3/#", 1)
            assert asked == [[BUILTIN_TOPIC], [], ["t3"]]
            await asyncio.to_thread(_publish, broker.port, 0, 2)
            assert await client.receive(2) == [b"0", b"1"]
            await client.leave()

    asyncio.run(scenario())
