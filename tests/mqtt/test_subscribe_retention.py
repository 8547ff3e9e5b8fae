"""A SUBSCRIBE's start is kept from retention until its cursors exist (log/retention.py Holds).

A SUBSCRIBE takes its start positions when it is read; its cursors are
committed a little later, by the session writer. Under the `consumed`
retention policy a retention pass in between, with every existing cursor past
what was published meanwhile, deleted those messages: the new subscription
never got them, though they were published after its SUBSCRIBE. In process,
with the subscriber's cursor write held back to make the window wide.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient, RawClient
from harness.waiting import eventually_async
from riverbed.log.topics import BUILTIN_TOPIC
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.codec import Suback, Subscribe, SubscribeTopic
from riverbed.mqtt.config import RetentionConfig
from riverbed.sessions.store import Stored
from riverbed.storage.base import RetentionPolicy
from riverbed.subscriptions.named import Subscriptions

MESSAGES = 5000
"""More than the fan-out keeps in memory per stream (4,096): the new
subscription's first fetch goes to the storage, where retention deleted."""


def _hold_cursor_writes(broker: Broker, client_id: str) -> tuple[threading.Event, asyncio.Event]:
    """Hold back `client_id`'s writes that make cursors until the returned
    event is set; the asyncio event is set once one was asked for."""
    release = threading.Event()
    asked = asyncio.Event()
    loop = asyncio.get_running_loop()
    real: Callable[..., Future[Stored]] = broker.writer.write

    def write(record: Any, version: Any, cursors: Any = None, **kw: Any) -> Future[Stored]:
        if record.client_id != client_id or cursors is None:
            return real(record, version, cursors, **kw)
        out: Future[Stored] = Future()

        def later() -> None:
            release.wait()
            done = real(record, version, cursors, **kw)
            exc = done.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(done.result())

        threading.Thread(target=later, daemon=True).start()
        loop.call_soon_threadsafe(asked.set)
        return out

    broker.writer.write = write  # type: ignore[method-assign]
    return release, asked


def _publish(port: int) -> None:
    with RawClient(port) as client:
        client.connect("publisher", clean=True)
        client.publish_many((("a/x", b"%d" % i) for i in range(MESSAGES)), window=100)


def test_messages_published_after_a_subscribe_survive_retention_before_its_cursors(
    sqlite_url: str,
) -> None:
    async def scenario() -> None:
        async with running_broker(sqlite_url, retention=RetentionConfig(interval=1)) as broker:
            storage = broker.log.storage
            broker.log.topics.set_retention(BUILTIN_TOPIC, None, RetentionPolicy.CONSUMED)
            # Another reader of the topic, which will have read everything.
            Subscriptions(storage).create("other", BUILTIN_TOPIC)
            release, asked = _hold_cursor_writes(broker, "late")
            late = await AsyncRawClient.open(broker.port, timeout=20.0)
            await late.connect("late", expiry=300)
            late.send(Subscribe(1, (SubscribeTopic("a/#", 1),)))
            await asyncio.wait_for(asked.wait(), 30)  # taken; its cursors wait

            await asyncio.to_thread(_publish, broker.port)
            consumer = Subscriptions(storage).consumer("other")
            read = 0
            while batch := await asyncio.to_thread(consumer.poll, 1000):
                read += len(batch)
            assert read == MESSAGES
            await asyncio.to_thread(consumer.commit)
            retainer = broker.retainer
            assert retainer is not None
            passes = retainer.passes
            # Two passes: the second began after the commit above.
            await eventually_async(lambda: retainer.passes >= passes + 2, what="two passes")

            release.set()
            assert isinstance(await late.next(), Suback)
            got: list[bytes] = []
            try:
                await late.receive(MESSAGES, into=got)
            except TimeoutError:
                missing = sorted(set(range(MESSAGES)) - {int(p) for p in got})
                raise AssertionError(
                    f"got {len(got)} of {MESSAGES} messages; missing {len(missing)},"
                    f" from {missing[0]} to {missing[-1]}: deleted by retention"
                ) from None
            assert sorted(got, key=int) == [b"%d" % i for i in range(MESSAGES)]
            await eventually_async(lambda: len(broker.holds) == 0, what="the hold released")
            await late.leave()

    asyncio.run(scenario())
