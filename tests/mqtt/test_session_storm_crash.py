"""A broker killed (SIGKILL) in the middle of a storm of new persistent
sessions: every client whose CONNACK came back finds its session after the
restart, and every client whose SUBACK came back its subscription too.

The session writer (`sessions/writer.py`) commits many connections' writes in
one transaction and answers them only once it is committed; this is the
durability that CONNACK and SUBACK promise (docs/broker.md), under load.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from harness.broker import BrokerProcess
from harness.raw_mqtt import AsyncRawClient, RawClient
from harness.waiting import SLOW
from riverbed.mqtt.codec import Puback, Publish

CLIENTS = 300
AT_ONCE = 100
EXPIRY = 3600
TIMEOUT = 60.0 * SLOW


def client_id(i: int) -> str:
    return f"storm-{i:04d}"


async def storm(
    port: int,
    connacked: set[int],
    subacked: set[int],
    third: asyncio.Event,
    killed: asyncio.Event,
) -> None:
    """CLIENTS new sessions, AT_ONCE at a time: CONNECT, SUBSCRIBE storm/<i>,
    then stay connected (no DISCONNECT: nothing saved at leaving helps).
    `third` is set once a third of them have their SUBACK."""
    gate = asyncio.Semaphore(AT_ONCE)
    clients: list[AsyncRawClient] = []

    async def one(i: int) -> None:
        async with gate:
            if killed.is_set():
                return
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                c = await AsyncRawClient.open(port, TIMEOUT)
                clients.append(c)
                connack = await c.connect(client_id(i), expiry=EXPIRY)
                assert connack.reason_code == 0 and not connack.session_present
                connacked.add(i)
                suback = await c.subscribe(f"storm/{i}")
                assert suback.reason_codes == (1,), suback
                subacked.add(i)
                if len(subacked) >= CLIENTS // 3:
                    third.set()

    try:
        await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    finally:  # also when an assertion fails: no sockets left to later tests
        for c in clients:
            c.close()


@pytest.mark.slow
def test_sessions_acknowledged_before_a_kill_survive_it(storage_url: str) -> None:
    with BrokerProcess(storage_url, extra_args=("--log-level", "info")) as broker:
        connacked: set[int] = set()
        subacked: set[int] = set()

        async def run_storm() -> None:
            third = asyncio.Event()
            killed = asyncio.Event()

            async def killer() -> None:
                # SIGKILL once a third of the sessions have their SUBACK: some
                # clients then have it, some only their CONNACK, some nothing.
                await asyncio.wait_for(third.wait(), TIMEOUT)
                broker.kill()
                killed.set()

            await asyncio.gather(storm(broker.port, connacked, subacked, third, killed), killer())

        asyncio.run(run_storm())
        assert CLIENTS // 3 <= len(subacked) < CLIENTS, "the kill came too late to test anything"
        assert subacked <= connacked
        broker.start()

        async def come_back() -> tuple[dict[int, bool], dict[int, bytes]]:
            clients: dict[int, AsyncRawClient] = {}
            present: dict[int, bool] = {}
            got: dict[int, bytes] = {}
            gate = asyncio.Semaphore(AT_ONCE)

            async def back(i: int) -> None:
                async with gate:
                    c = await AsyncRawClient.open(broker.port, TIMEOUT)
                    clients[i] = c
                    present[i] = (await c.connect(client_id(i), expiry=EXPIRY)).session_present

            async def receive(i: int) -> None:
                c = clients[i]
                with contextlib.suppress(TimeoutError):  # missing: told below
                    packet = await c.next()
                    assert isinstance(packet, Publish), packet
                    got[i] = packet.payload
                    if packet.packet_id is not None:
                        c.send(Puback(packet.packet_id))

            try:
                await asyncio.gather(*(back(i) for i in sorted(connacked)))
                lost = sorted(i for i in connacked if not present[i])
                assert not lost, f"sessions acknowledged by CONNACK and lost: {lost}"
                # Subscribed before the kill: a message published now reaches
                # it without a new SUBSCRIBE.
                with RawClient(broker.port) as publisher:
                    publisher.connect("storm-publisher", clean=True)
                    sent = publisher.publish_many(
                        (f"storm/{i}", b"after %d" % i) for i in sorted(subacked)
                    )
                    assert sent == len(subacked)
                await asyncio.gather(*(receive(i) for i in sorted(subacked)))
            finally:  # also when an assertion fails: no sockets left to later tests
                for c in clients.values():
                    c.close()
            return present, got

        _, got = asyncio.run(come_back())
        unsubscribed = sorted(subacked - set(got))
        assert not unsubscribed, f"subscriptions acknowledged by SUBACK and lost: {unsubscribed}"
        assert got == {i: b"after %d" % i for i in subacked}
