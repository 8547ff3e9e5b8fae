"""A session's cursors follow what its subscriptions reach (issue 3).

A session holds a cursor (a named subscription `$session.<id>.<topic>`) on every
topic its filters can reach, so retention keeps what it has not read. Once no
subscription reaches a topic, the cursor goes: an abandoned topic must not hold
its messages back for ever. Messages already sent are still completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from harness.broker import BrokerProcess, Client
from harness.cli import rb
from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from harness.waiting import eventually, eventually_async
from riverbed.log.topics import BUILTIN_TOPIC, Topics
from riverbed.mqtt.codec import Puback, Publish, Subscribe
from riverbed.mqtt.following import Following
from riverbed.sessions.store import CURSOR_PREFIX, cursor_name
from riverbed.storage import open_storage


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    storage = open_storage(storage_url)
    try:
        Topics(storage).create("orders", 4, binding="orders/#")
    finally:
        storage.close()
    with BrokerProcess(storage_url) as running:
        yield running


def _cursor_topics(url: str) -> list[str]:
    storage = open_storage(url)
    try:
        return sorted(
            s.topic for s in storage.list_subscriptions() if s.name.startswith(CURSOR_PREFIX)
        )
    finally:
        storage.close()


def test_unsubscribing_drops_the_cursors_of_topics_no_longer_reached(
    broker: BrokerProcess, storage_url: str
) -> None:
    sub = Client(broker.port, "cursors")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("orders/#", "news/#", qos=1)
    assert _cursor_topics(storage_url) == sorted([BUILTIN_TOPIC, "orders"])

    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("orders/1", b"o1", qos=1).wait_for_publish(10)
    pub.publish("news/1", b"n1", qos=1).wait_for_publish(10)
    assert sorted(m.payload for m in sub.wait_for(2)) == [b"n1", b"o1"]

    assert sub.unsubscribe("orders/#") == [0]
    assert _cursor_topics(storage_url) == [BUILTIN_TOPIC]
    pub.publish("orders/2", b"o2", qos=1).wait_for_publish(10)
    pub.publish("news/2", b"n2", qos=1).wait_for_publish(10)
    assert [m.payload for m in sub.wait_for(3)][2:] == [b"n2"]

    assert sub.unsubscribe("news/#") == [0]
    assert _cursor_topics(storage_url) == []
    sub.disconnect()
    pub.disconnect()

    # The session itself lives on and subscribes again: a new cursor, from now.
    back = Client(broker.port, "cursors")
    assert back.connect(clean=False, expiry=300) is True
    back.subscribe("orders/#", qos=1)
    assert _cursor_topics(storage_url) == sorted([BUILTIN_TOPIC, "orders"])
    back.disconnect()


def test_a_topic_bound_while_a_session_is_subscribed_is_followed(storage_url: str) -> None:
    """`shipments` is created with a binding under a filter a connected session
    has: what is published there (right away, while the broker may still route
    by the bindings it knew, and after) reaches the session, and its cursors
    come to cover the new topic. Before, the session went on following only the
    topics its filters reached at SUBSCRIBE, and never got those messages."""
    with BrokerProcess(storage_url) as broker:
        sub = Client(broker.port, "early")
        sub.connect(clean=True, expiry=300)
        sub.subscribe("shipments/#", qos=1)
        assert _cursor_topics(storage_url) == [BUILTIN_TOPIC]
        storage = open_storage(storage_url)
        try:  # another process: the CLI, say
            Topics(storage).create("shipments", 2, binding="shipments/#")
        finally:
            storage.close()
        pub = Client(broker.port, "pub")
        pub.connect()
        pub.publish("shipments/1", b"s1", qos=1).wait_for_publish(10)
        eventually(
            lambda: _cursor_topics(storage_url) == sorted([BUILTIN_TOPIC, "shipments"]),
            what="the session's cursors on the new topic",
        )
        pub.publish("shipments/2", b"s2", qos=1).wait_for_publish(10)
        assert sorted(m.payload for m in sub.wait_for(2)) == [b"s1", b"s2"]
        sub.disconnect()
        pub.disconnect()


def test_a_look_for_new_topics_leaves_a_subscribe_in_hand_to_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look for new topics (a topic created somewhere) runs while a SUBSCRIBE
    is taken but not yet stored: the SUBSCRIBE's filter is not the look's to
    match. It makes its own cursors, at the heads it took; matched by the look,
    the new subscription got cursors from the start of the streams and was
    sent what had been published before it (seen in a CI run: more messages
    than published)."""
    original = Following.subscribe

    async def looked_at_meanwhile(self: Following, packet: Subscribe) -> None:
        self.check_soon()
        await eventually_async(lambda: self._task is not None and self._task.done(), 30.0)
        await original(self, packet)

    async def go() -> list[bytes]:
        async with running_broker(sqlite_url) as broker:
            publisher = await AsyncRawClient.open(broker.port)
            await publisher.connect("pub", expiry=0)
            publisher.send(Publish("held/x", b"before", qos=1, packet_id=1))
            await publisher.expect(Puback)
            monkeypatch.setattr(Following, "subscribe", looked_at_meanwhile)
            holder = await AsyncRawClient.open(broker.port)
            await holder.connect("holder", expiry=300)
            await holder.subscribe("held/#", 1)
            publisher.send(Publish("held/x", b"after", qos=1, packet_id=2))
            await publisher.expect(Puback)
            first = await holder.expect(Publish)
            publisher.close()
            holder.close()
            return [first.payload]

    assert asyncio.run(go()) == [b"after"]


def test_a_sessions_cursor_is_not_reset_deleted_or_consumed_by_name(
    broker: BrokerProcess, storage_url: str
) -> None:
    """A session's cursor is a named subscription (`$session.<id>.<topic>`), so
    the named-subscription commands could find it: a reset moved it without
    the session's record knowing (a session online keeps its own positions,
    one resuming could start past messages it never got), a delete or a
    consumer's commits took messages from under it. Each is refused, naming
    the rule, and the session gets everything once it is back."""
    sub = Client(broker.port, "kept")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("orders/#", qos=1)
    sub.disconnect()
    pub = Client(broker.port, "pub")
    pub.connect()
    for n in range(3):
        pub.publish(f"orders/{n}", f"o{n}".encode(), qos=1).wait_for_publish(10)
    pub.disconnect()
    record = broker.session("kept")
    assert record is not None
    name = cursor_name(record.session_id, "orders")
    before = _cursors(storage_url, name)

    for args in (
        ("subscription", "reset", name, "--to", "latest"),
        ("subscription", "delete", name),
        ("consume", name),
    ):
        refused = rb(storage_url, *args)
        assert refused.exit_code != 0, (args, refused.stdout)
        assert f"subscription {name!r} is the broker's own" in refused.stderr, refused.stderr
        assert _cursors(storage_url, name) == before, args

    back = Client(broker.port, "kept")
    assert back.connect(clean=False, expiry=300) is True
    assert sorted(m.payload for m in back.wait_for(3)) == [b"o0", b"o1", b"o2"]
    back.disconnect()


def _cursors(url: str, name: str) -> dict[int, int]:
    storage = open_storage(url)
    try:
        assert any(s.name == name for s in storage.list_subscriptions()), name
        return storage.get_cursors(name)
    finally:
        storage.close()
