"""A resume reads its session's cursors with its record (SessionStore.load_resuming),
or, for a session saved at its disconnect here, takes what the save left
(SessionStore.take_resumable) and writes over those very bytes only; in process."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient, RawClient
from harness.waiting import eventually_async
from riverbed.clock import now_us
from riverbed.log.topics import BUILTIN_TOPIC
from riverbed.mqtt.broker import Broker
from riverbed.sessions.store import SessionRecord, SessionStore, cursor_name
from riverbed.storage import open_storage


def _publish(port: int, first: int, count: int) -> None:
    with RawClient(port) as client:
        client.connect("publisher", clean=True)
        client.publish_many(("a/x", b"%d" % i) for i in range(first, first + count))


def _publish_to(port: int, topic: str, payload: bytes) -> None:
    with RawClient(port) as client:
        client.connect("publisher", clean=True)
        client.publish_many([(topic, payload)])


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
    the heads), and what comes after reaches the session. (The crash is a
    new broker over the same store: the one that saved the session would
    resume it from what its save left, `SessionStore.take_resumable`.)"""

    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            client = await AsyncRawClient.open(broker.port)
            await client.connect("m", expiry=300)
            await client.subscribe("a/#", 1)
            await client.leave()
            stored = broker.store.load("m")
            assert stored is not None and stored.record.topics == (BUILTIN_TOPIC,)
            session_id = stored.record.session_id
        async with running_broker(sqlite_url) as broker:
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


def _count_resume_reads(broker: Broker) -> list[str]:
    calls: list[str] = []
    real = broker.store.load_resuming_many

    def counting(client_ids: Any) -> Any:
        calls.extend(client_ids)
        return real(client_ids)

    broker.store.load_resuming_many = counting  # type: ignore[method-assign]
    return calls


async def _away(broker: Broker, client_id: str) -> str:
    """`client_id` subscribes to a/#, gets 0-4, leaves; 5-9 are published while
    it is away. Its session id."""
    client = await AsyncRawClient.open(broker.port)
    await client.connect(client_id, expiry=300)
    await client.subscribe("a/#", 1)
    await asyncio.to_thread(_publish, broker.port, 0, 5)
    assert await client.receive(5) == [b"%d" % i for i in range(5)]
    await client.leave()
    await asyncio.to_thread(_publish, broker.port, 5, 5)
    stored = broker.store.load(client_id)
    assert stored is not None and not stored.record.connected
    return stored.record.session_id


def test_a_session_saved_here_resumes_from_its_save_without_reading(storage_url: str) -> None:
    """The save at its disconnect left the record and cursors it keeps: the
    resume reads neither, and gets what was published while it was away,
    once."""

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            await _away(broker, "r")
            reads = _count_resume_reads(broker)
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("r", expiry=300)).session_present
            assert await client.receive(5) == [b"%d" % i for i in range(5, 10)]
            assert reads == []
            await client.leave()
            # Saved again at this disconnect; and again without a read.
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("r", expiry=300)).session_present
            await asyncio.to_thread(_publish, broker.port, 10, 1)
            assert await client.receive(1) == [b"10"]
            assert reads == []
            await client.leave()

    asyncio.run(scenario())


def test_a_record_written_elsewhere_since_its_save_is_read_and_resumed(
    storage_url: str,
) -> None:
    """Another process wrote the session's record after this broker saved it
    (here: a longer expiry): the compare-and-set on the saved bytes fails,
    the resume reads the record and goes on from it (before the saves were
    kept, the same race ended in CONNACK 0x89)."""

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            await _away(broker, "w")
            other = open_storage(storage_url)
            try:
                store = SessionStore(other)
                stored = store.load("w")
                assert stored is not None
                store.write(replace(stored.record, expiry_interval=900), stored.version)
            finally:
                other.close()
            reads = _count_resume_reads(broker)
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("w", expiry=300)).session_present
            assert await client.receive(5) == [b"%d" % i for i in range(5, 10)]
            assert reads == ["w"]
            await client.leave()

    asyncio.run(scenario())


def test_a_session_deleted_and_made_again_elsewhere_is_not_brought_back(
    storage_url: str,
) -> None:
    """Another process deleted the session and the client made a new one there
    whose record reached the version saved here: the version alone would
    match, so the resume's compare-and-set is on the saved bytes, and the new
    session is the one resumed (the old one, its cursors deleted, must not
    come back over it)."""

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            old_id = await _away(broker, "d")
            saved = broker.store.load("d")
            assert saved is not None and saved.version is not None
            other = open_storage(storage_url)
            try:
                store = SessionStore(other)
                store.discard(saved)
                made = store.write(
                    SessionRecord("d", "new-session", 5, 300, False, now_us(), now_us()), None
                )
                while made.version is not None and made.version < saved.version:
                    made = store.write(made.record, made.version)
                assert made.version == saved.version
            finally:
                other.close()
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("d", expiry=300)).session_present
            stored = broker.store.load("d")
            assert stored is not None and stored.record.session_id == "new-session"
            assert stored.record.session_id != old_id and stored.record.subscriptions == ()
            names = [s.name for s in broker.log.storage.list_subscriptions()]
            assert not [n for n in names if n.startswith(cursor_name(old_id, ""))]
            await client.leave()

    asyncio.run(scenario())


def test_a_topic_deleted_and_made_again_while_away_gets_new_cursors(storage_url: str) -> None:
    """The cursors saved at disconnect are on streams the topic made again does
    not have: the resume reads, and makes its cursors on the new streams (at
    their heads), so retention keeps what the session has not read."""

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            broker.log.topics.create("orders", 2, binding="orders/#")
            client = await AsyncRawClient.open(broker.port)
            await client.connect("o", expiry=300)
            await client.subscribe("orders/#", 1)
            await client.leave()
            stored = broker.store.load("o")
            assert stored is not None and "orders" in stored.record.topics
            name = cursor_name(stored.record.session_id, "orders")
            broker.log.topics.delete("orders")
            broker.log.topics.create("orders", 2, binding="orders/#")
            new_keys = {h.key for h in broker.log.storage.list_streams("orders")}
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("o", expiry=300)).session_present
            await eventually_async(
                lambda: set(broker.log.storage.get_cursors(name)) == new_keys,
                what="the session's cursors on the topic made again",
            )
            await asyncio.to_thread(_publish_to, broker.port, "orders/1", b"o1")
            assert await client.receive(1) == [b"o1"]
            await client.leave()

    asyncio.run(scenario())
