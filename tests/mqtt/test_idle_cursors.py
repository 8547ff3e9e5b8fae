"""An online session's cursors move past messages that match none of its
subscriptions, though the fan-out does not answer it for them (mqtt/fanout.py:
what a commit costs does not grow with the sessions it does not reach).

Where its waiting fetches have got to is handed to every session every
`[storage] idle_cursor_interval` seconds, and to one session at its
disconnect: an idle subscription does not pin retention, and a session
resumed later does not read again what it was passed by.
"""

from __future__ import annotations

import asyncio

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from harness.waiting import eventually_async
from riverbed.log.topics import BUILTIN_TOPIC
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.codec import Puback, Publish, Unsuback, Unsubscribe
from riverbed.mqtt.config import StorageConfig
from riverbed.sessions.store import SessionRecord

PUBLISHED = 40


async def _publish_elsewhere(broker: Broker) -> dict[int, int]:
    """PUBLISH messages nobody subscribed to; the heads of `mqtt` after them."""
    publisher = await AsyncRawClient.open(broker.port)
    await publisher.connect("pub", expiry=0)
    for i in range(PUBLISHED):
        publisher.send(Publish(f"telemetry/{i}", b"t", qos=1, packet_id=i + 1))
        await publisher.expect(Puback)
    publisher.close()
    return {h.key: h.next_offset for h in broker.log.storage.list_streams(BUILTIN_TOPIC)}


async def _idle_device(broker: Broker) -> AsyncRawClient:
    """Client "idle": a persistent session subscribed to its own command topic."""
    idle = await AsyncRawClient.open(broker.port)
    await idle.connect("idle", expiry=300)
    await idle.subscribe("devices/idle/cmd", 1)
    return idle


def _record(broker: Broker, client_id: str) -> SessionRecord:
    stored = broker.store.load(client_id)
    assert stored is not None
    return stored.record


def _stored_cursors(broker: Broker, client_id: str) -> dict[int, int]:
    session_id = _record(broker, client_id).session_id
    _, cursors = broker.store.cursors_of(session_id, [BUILTIN_TOPIC])
    return cursors[BUILTIN_TOPIC]


def test_an_idle_online_session_s_cursors_move_every_interval(sqlite_url: str) -> None:
    async def go() -> None:
        storage = StorageConfig(idle_cursor_interval=1)
        async with running_broker(sqlite_url, storage=storage) as broker:
            idle = await _idle_device(broker)
            before = _stored_cursors(broker, "idle")
            heads = await _publish_elsewhere(broker)
            assert before != heads
            await eventually_async(
                lambda: _stored_cursors(broker, "idle") == heads,
                what="the idle session's stored cursors at the heads",
            )
            # It still gets what is its own.
            publisher = await AsyncRawClient.open(broker.port)
            await publisher.connect("pub2", expiry=0)
            publisher.send(Publish("devices/idle/cmd", b"do", qos=1, packet_id=1))
            await publisher.expect(Puback)
            assert (await idle.expect(Publish)).payload == b"do"
            publisher.close()
            idle.close()

    asyncio.run(go())


def test_a_session_s_last_checkpoint_moves_its_cursors_past_what_passed_it(
    sqlite_url: str,
) -> None:
    """No hand-out comes within the test (an interval of an hour): the cursors
    are where they are at the DISCONNECT."""

    async def go() -> None:
        storage = StorageConfig(idle_cursor_interval=3600)
        async with running_broker(sqlite_url, storage=storage) as broker:
            idle = await _idle_device(broker)
            heads = await _publish_elsewhere(broker)
            await idle.leave()
            await eventually_async(lambda: not _record(broker, "idle").connected, what="saved")
            assert _stored_cursors(broker, "idle") == heads

    asyncio.run(go())


def test_streams_no_subscription_reaches_keep_no_waiting_fetch(sqlite_url: str) -> None:
    """A fetch passed by waits for as long as nothing matches: once no
    subscription reaches its topic (UNSUBSCRIBE), it is dropped at once, not
    kept until the connection ends."""

    async def go() -> None:
        async with running_broker(sqlite_url) as broker:
            client = await AsyncRawClient.open(broker.port)
            await client.connect("leaving", expiry=300)
            await client.subscribe("devices/leaving/cmd", 1)
            (conn,) = broker.connections.values()

            def waiting() -> int:
                return sum(conn in r.waiters for r in broker.fanout._streams.values())

            await eventually_async(lambda: waiting() > 0, what="its fetches waiting")
            await _publish_elsewhere(broker)
            client.send(Unsubscribe(2, ("devices/leaving/cmd",)))
            await client.expect(Unsuback)
            assert waiting() == 0
            client.close()

    asyncio.run(go())
