"""A fleet whose connections went half-open (a NAT or a router forgot them
without a FIN) comes back all at once: every client connects again with its
client id while the broker still holds its old connection, with messages in
flight on it. Each new connection takes its session over (Session Present 1),
each old one is closed with DISCONNECT 0x8E [MQTT-3.1.4-3], and nothing
published to the sessions is lost: what an old connection was sent and did not
acknowledge comes again on the new one, in order, with DUP set
[MQTT-4.4.0-1]; what is published after reaches the new one alone.

The takeovers of one turn of the event loop share the session writer's
transactions (`sessions/writer.py`), each waiting for its old connection's
save first (`Connection.take_over`).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from harness.broker import BrokerProcess
from harness.raw_mqtt import AsyncRawClient, RawClient
from harness.waiting import SLOW
from riverbed.mqtt.codec import Disconnect, DisconnectReason, Puback, Publish

CLIENTS = 150
MESSAGES = 4
"""Per client, published before the takeover, sent to the old connection and
not acknowledged."""
EXPIRY = 3600
TIMEOUT = 60.0 * SLOW


def client_id(i: int) -> str:
    return f"fleet-{i:04d}"


def payload(i: int, k: int) -> bytes:
    return b"%d-%d" % (i, k)


async def old_fleet(port: int, clients: dict[int, AsyncRawClient]) -> None:
    """Every client connected (into `clients`), subscribed to `fleet/<i>` at
    QoS 1, and sent `MESSAGES` it does not acknowledge."""

    async def one(i: int) -> None:
        c = clients[i] = await AsyncRawClient.open(port, TIMEOUT)
        connack = await c.connect(client_id(i), expiry=EXPIRY)
        assert connack.reason_code == 0 and not connack.session_present, connack
        assert (await c.subscribe(f"fleet/{i}")).reason_codes == (1,)

    await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    with RawClient(port) as publisher:
        publisher.connect("fleet-publisher", clean=True)
        publisher.publish_many(
            (f"fleet/{i}", payload(i, k)) for k in range(MESSAGES) for i in range(CLIENTS)
        )
    sent = await asyncio.gather(*(in_flight(clients[i], MESSAGES) for i in range(CLIENTS)))
    for i, packets in enumerate(sent):
        assert [p.payload for p in packets] == [payload(i, k) for k in range(MESSAGES)]
        assert not any(p.dup for p in packets)


async def in_flight(c: AsyncRawClient, count: int) -> list[Publish]:
    """The next `count` PUBLISHes, not acknowledged."""
    got = []
    while len(got) < count:
        packet = await c.next()
        assert isinstance(packet, Publish), f"expected PUBLISH, got {packet!r}"
        got.append(packet)
    return got


async def closed_with(c: AsyncRawClient) -> DisconnectReason | None:
    """What the broker sent the old connection after the PUBLISHes it had, up
    to its close: the DISCONNECT's reason (None: none came)."""
    reason = None
    with contextlib.suppress(ConnectionError):
        while True:
            packet = await c.next()
            assert isinstance(packet, Disconnect), f"expected DISCONNECT, got {packet!r}"
            reason = packet.reason_code
    return reason


@pytest.mark.slow
def test_a_fleet_coming_back_at_once_takes_its_sessions_over(storage_url: str) -> None:
    with BrokerProcess(storage_url) as broker:

        async def run() -> None:
            old: dict[int, AsyncRawClient] = {}
            new: dict[int, AsyncRawClient] = {}
            try:
                await old_fleet(broker.port, old)

                async def back(i: int) -> bool:
                    c = new[i] = await AsyncRawClient.open(broker.port, TIMEOUT)
                    connack = await c.connect(client_id(i), expiry=EXPIRY)
                    assert connack.reason_code == 0, connack
                    return connack.session_present

                present = await asyncio.gather(*(back(i) for i in old))
                lost = [i for i, p in zip(old, present, strict=True) if not p]
                assert not lost, f"sessions not found by their takeover: {lost}"

                reasons = await asyncio.gather(*(closed_with(old[i]) for i in old))
                wrong = {
                    i: r
                    for i, r in zip(old, reasons, strict=True)
                    if r != DisconnectReason.SESSION_TAKEN_OVER
                }
                assert not wrong, f"old connections not closed with 0x8E: {wrong}"

                again = await asyncio.gather(*(in_flight(new[i], MESSAGES) for i in new))
                for i, packets in zip(new, again, strict=True):
                    got = [p.payload for p in packets]
                    assert got == [payload(i, k) for k in range(MESSAGES)], (i, got)
                    assert all(p.dup for p in packets), (i, packets)
                    for p in packets:
                        assert p.packet_id is not None
                        new[i].send(Puback(p.packet_id))

                with RawClient(broker.port) as publisher:
                    publisher.connect("fleet-publisher", clean=True)
                    publisher.publish_many((f"fleet/{i}", b"after") for i in new)
                after = await asyncio.gather(*(in_flight(new[i], 1) for i in new))
                assert all(
                    [p.payload for p in packets] == [b"after"] and not packets[0].dup
                    for packets in after
                ), after
            finally:  # also when an assertion fails: no sockets left to later tests
                for c in (*old.values(), *new.values()):
                    c.close()

        asyncio.run(run())


@pytest.mark.slow
def test_a_broker_killed_during_the_takeovers_loses_no_session_or_message(
    storage_url: str,
) -> None:
    """SIGKILL once a third of the fleet has its takeover's CONNACK: after the
    restart every client finds its session, and every message it never
    acknowledged comes again, in order."""
    with BrokerProcess(storage_url) as broker:
        connacked: set[int] = set()

        async def takeovers() -> None:
            old: dict[int, AsyncRawClient] = {}
            new: list[AsyncRawClient] = []
            third = asyncio.Event()
            try:
                await old_fleet(broker.port, old)

                async def back(i: int) -> None:
                    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                        c = await AsyncRawClient.open(broker.port, TIMEOUT)
                        new.append(c)
                        connack = await c.connect(client_id(i), expiry=EXPIRY)
                        assert connack.reason_code == 0 and connack.session_present, connack
                        connacked.add(i)
                        if len(connacked) >= CLIENTS // 3:
                            third.set()

                async def killer() -> None:
                    await asyncio.wait_for(third.wait(), TIMEOUT)
                    broker.kill()

                await asyncio.gather(killer(), *(back(i) for i in old))
            finally:  # also when an assertion fails: no sockets left to later tests
                for c in (*old.values(), *new):
                    c.close()

        asyncio.run(takeovers())
        assert CLIENTS // 3 <= len(connacked) < CLIENTS, "the kill came too late to test anything"
        broker.start()

        async def come_back() -> dict[int, list[bytes]]:
            clients: dict[int, AsyncRawClient] = {}
            try:

                async def one(i: int) -> list[bytes]:
                    c = clients[i] = await AsyncRawClient.open(broker.port, TIMEOUT)
                    connack = await c.connect(client_id(i), expiry=EXPIRY)
                    assert connack.reason_code == 0 and connack.session_present, (i, connack)
                    return await c.receive(MESSAGES)

                got = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
            finally:
                for c in clients.values():
                    c.close()
            return dict(enumerate(got))

        got = asyncio.run(come_back())
        lost = {i: p for i, p in got.items() if p != [payload(i, k) for k in range(MESSAGES)]}
        assert not lost, f"sessions whose unacknowledged messages did not all come again: {lost}"
