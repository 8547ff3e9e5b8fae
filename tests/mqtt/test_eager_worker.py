"""A connection's worker (the effects that wait: opening the session, a
SUBSCRIBE) starts at once when its session write would commit at once: on
SQLite a client making its session one exchange after another needs no task
for its CONNECT or its SUBSCRIBE. One whose first step does wait (a takeover
waits for the old connection's save) goes on in a task from there; where
writes always wait (PostgreSQL), and for what always waits (a QoS 2
PUBLISH), a task carries it from the start. In process,
on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from riverbed.mqtt.codec import (
    Disconnect,
    DisconnectReason,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
)


def _count_tasks() -> list[str]:
    """The names of the coroutines tasks are made for from now on, on the
    running loop."""
    started: list[str] = []
    loop = asyncio.get_running_loop()

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
        **kwargs: Any,
    ) -> asyncio.Task[Any]:
        started.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return started


def test_a_session_made_exchange_by_exchange_and_taken_over(storage_url: str) -> None:
    embedded = storage_url.startswith("sqlite")

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            started = _count_tasks()
            first = await AsyncRawClient.open(broker.port)
            assert not (await first.connect("eager", expiry=300)).session_present
            assert (await first.subscribe("eager/#")).reason_codes == (1,)
            workers = started.count("Connection._work")
            assert workers == (0 if embedded else 2), started
            # A QoS 2 PUBLISH always waits (its commit): a task from the start.
            first.send(Publish("eager/q2", b"x", 2, packet_id=7))
            assert (await first.expect(Pubrec)).packet_id == 7
            assert started.count("Connection._work") == workers + 1, started
            assert "_resume" not in started
            first.send(Pubrel(7))
            # The PUBCOMP, and the message through its own subscription, in
            # either order.
            got = {type(p): p for p in [await first.next(), await first.next()]}
            assert got.keys() == {Pubcomp, Publish}, got
            assert got[Publish].payload == b"x"
            first.send(Puback(got[Publish].packet_id))

            # The same client id again: the takeover waits for the first
            # connection's save, so its worker goes on in a task.
            second = await AsyncRawClient.open(broker.port)
            assert (await second.connect("eager", expiry=300)).session_present
            packet = await first.next()
            assert isinstance(packet, Disconnect), packet
            assert packet.reason_code == DisconnectReason.SESSION_TAKEN_OVER
            if embedded:
                assert started.count("_resume") == 1, started
            stored = broker.store.load("eager")
            assert stored is not None and stored.record.epoch == 1
            assert [s.topic_filter for s in stored.record.subscriptions] == ["eager/#"]
            await second.leave()
            first.close()

    asyncio.run(scenario())
