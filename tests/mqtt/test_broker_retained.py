"""Retained messages end to end: stored durably, sent on SUBSCRIBE per Retain
Handling, Retain As Published for live messages, deleted by an empty payload,
`$` topics kept from wildcard filters, and switched off by configuration."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from harness.waiting import eventually, eventually_async
from riverbed.errors import StorageError
from riverbed.model import Message
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.codec import Puback, Publish, Suback, SubackReason, Subscribe, SubscribeTopic
from riverbed.mqtt.config import Limits
from riverbed.mqtt.connection import Connection
from riverbed.mqtt.retained import RetainedStore
from riverbed.sessions.session import Session

PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url) as running:
        yield running


def _retain(port: int, topic: str, payload: bytes, qos: int = 1) -> None:
    pub = Client(port, "retainer")
    pub.connect()
    pub.publish(topic, payload, qos=qos, retain=True).wait_for_publish(30)
    pub.disconnect()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_retained_message_survives_a_restart_and_comes_on_subscribe(
    broker: BrokerProcess, protocol: int
) -> None:
    _retain(broker.port, "r/a", b"first")
    _retain(broker.port, "r/a", b"second")  # replaces
    _retain(broker.port, "r/b", b"b", qos=2)
    _retain(broker.port, "r/gone", b"x")
    _retain(broker.port, "r/gone", b"")  # an empty payload deletes it
    # Retained messages go out in topic name order, those at QoS 2 after their
    # window is saved: these come last of each QoS.
    _retain(broker.port, "r/zz-1", b"marker 1")
    _retain(broker.port, "r/zz-2", b"marker 2", qos=2)
    broker.kill()
    broker.start()

    sub = Client(broker.port, "rsub", protocol=protocol)
    sub.connect()
    sub.subscribe("r/#", qos=2)
    got = sub.wait_payloads(b"marker 1", b"marker 2")
    assert sorted((m.topic, m.payload, m.qos, m.retain) for m in got) == [
        ("r/a", b"second", 1, True),
        ("r/b", b"b", 2, True),
        ("r/zz-1", b"marker 1", 1, True),
        ("r/zz-2", b"marker 2", 2, True),
    ]
    sub.disconnect()


def test_retain_handling_and_retain_as_published(broker: BrokerProcess) -> None:
    _retain(broker.port, "h/1", b"kept")
    sub = Client(broker.port, "rh")
    assert sub.connect() is False
    assert sub.connack_properties.RetainAvailable == 1
    # Subscription Identifiers tell which SUBSCRIBE a retained message answers.
    sub.subscribe("h/#", retain_handling=1, identifier=1)
    assert [m.payload for m in sub.wait_for(1)] == [b"kept"]
    sub.subscribe("h/#", retain_handling=1, identifier=2)  # exists already: not again
    sub.subscribe("h/+", retain_handling=2, identifier=3)  # never
    sub.subscribe("h/1", retain_handling=0, identifier=4)  # always
    # Answering the last SUBSCRIBE, after the two before had their turn.
    eventually(lambda: any(m.identifiers == (4,) for m in sub.received_now()), what="h/1's")
    assert [(m.payload, m.identifiers) for m in sub.received_now()] == [
        (b"kept", (1,)),
        (b"kept", (4,)),
    ]

    live = Client(broker.port, "rap")
    live.connect()
    live.subscribe("h/1", retain_as_published=True)
    live.wait_for(1)  # the retained one
    plain = Client(broker.port, "norap")
    plain.connect()
    plain.subscribe("h/1", retain_handling=2)
    _retain(broker.port, "h/1", b"new")
    assert live.wait_for(2)[-1].retain is True  # Retain As Published
    assert plain.wait_for(1)[-1].retain is False  # [MQTT-3.3.1-12]
    for client in (sub, live, plain):
        client.disconnect()


def test_dollar_topics_are_not_matched_by_leading_wildcards(broker: BrokerProcess) -> None:
    _retain(broker.port, "$app/x", b"dollar")
    _retain(broker.port, "plain", b"p")
    sub = Client(broker.port, "dollar")
    sub.connect()
    # Each SUBSCRIBE's retained messages go out together, in topic name order
    # ("$app/x" before "plain"): had "#" matched "$app/x", it would be here
    # before "plain" came for "#".
    sub.subscribe("#", identifier=1)
    sub.subscribe("$app/#", identifier=2)
    eventually(
        lambda: (
            {(b"p", (1,)), (b"dollar", (2,))}
            <= {(m.payload, m.identifiers) for m in sub.received_now()}
        ),
        what="the retained messages",
    )
    assert sorted((m.payload, m.identifiers) for m in sub.received_now()) == [
        (b"dollar", (2,)),
        (b"p", (1,)),
    ]
    sub.disconnect()


def test_retain_can_be_switched_off(sqlite_url: str, tmp_path: Path) -> None:
    config = tmp_path / "riverbed.toml"
    config.write_text("[limits]\nretain_available = false\n")
    with BrokerProcess(sqlite_url, extra_args=("--config", str(config))) as off:
        sub = Client(off.port, "off")
        sub.connect()
        assert sub.connack_properties.RetainAvailable == 0
        sub.subscribe("o/#")
        pub = Client(off.port, "off-pub")
        pub.connect()
        pub.publish("o/1", b"r", retain=True)  # never acknowledged:
        # [MQTT-3.2.2-14]: a retained PUBLISH is then a protocol error (0x9A).
        assert pub.wait_disconnected(30) and pub.disconnects[0] == 0x9A
        pub.close()
        sub.disconnect()


def test_no_local_live_and_retained(broker: BrokerProcess) -> None:
    # [MQTT-3.8.3-3]: a No Local subscription gets nothing its own client id
    # published, neither live nor from the retained store; others get it all.
    me = Client(broker.port, "nl-me")
    me.connect()
    me.publish("nl/kept", b"mine, retained", qos=1, retain=True).wait_for_publish(30)
    _retain(broker.port, "nl/other", b"theirs, retained")
    me.subscribe("nl/#", no_local=True)
    me.subscribe("marker/#")  # without No Local
    other = Client(broker.port, "nl-other")
    other.connect()
    other.subscribe("nl/#")
    assert sorted(m.payload for m in other.wait_for(2)) == [b"mine, retained", b"theirs, retained"]
    me.publish("nl/live", b"mine, live", qos=1).wait_for_publish(30)
    _retain(broker.port, "nl/other", b"theirs, live")
    assert [m.payload for m in other.wait_for(4)][2:] == [b"mine, live", b"theirs, live"]
    # A marker of its own (its key, so its stream), after "mine, live".
    me.publish("marker/1", b"marker", qos=1).wait_for_publish(30)
    me.wait_payloads(b"theirs, live", b"marker")
    assert me.payloads() == [b"theirs, retained", b"theirs, live", b"marker"]
    me.disconnect()
    other.disconnect()


def test_a_subscribe_whose_retained_lookup_fails_is_acknowledged_and_served(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails to say whether a new filter has retained messages: the
    failure is logged, and the SUBSCRIBE is acknowledged and delivers what is
    published after it, as if there were none."""

    def fails(self: RetainedStore, topic_filter: str) -> bool:
        raise StorageError(f"reading the retained messages under {topic_filter!r} failed")

    monkeypatch.setattr(RetainedStore, "any_under", fails)

    async def go() -> bytes:
        async with running_broker(sqlite_url) as broker:
            holder = await AsyncRawClient.open(broker.port)
            await holder.connect("holder", expiry=300)
            suback = await holder.subscribe("held/#", 1)
            assert suback.reason_codes == (SubackReason.GRANTED_QOS_1,)
            publisher = await AsyncRawClient.open(broker.port)
            await publisher.connect("pub", expiry=0)
            publisher.send(Publish("held/x", b"after", qos=1, packet_id=1))
            await publisher.expect(Puback)
            delivered = await holder.expect(Publish)
            publisher.close()
            holder.close()
            return delivered.payload

    assert asyncio.run(go()) == b"after"


RETAINED = 30
"""Retained messages under `r/` in the tests of pages below."""


PAGING = Limits(session_queue_limit=8, max_inflight=3)
"""Pages of four retained messages, three in flight."""


async def _reader(broker: Broker) -> tuple[AsyncRawClient, Connection, Session]:
    """RETAINED retained messages `r/00` ... (sorted as topic names sort), and
    a client "reader" connected: its connection and session in the broker."""
    for i in range(RETAINED):
        broker.retained.put(Message(b"%d" % i, mqtt_topic=f"r/{i:02d}", qos=1), 1)
    reader = await AsyncRawClient.open(broker.port)
    await reader.connect("reader", expiry=300)
    (conn,) = [c for c in broker.connections.values() if c.client_id == "reader"]
    assert conn.session is not None
    return reader, conn, conn.session


async def _take_all(client: AsyncRawClient, count: int) -> list[str]:
    """Acknowledge and return the topics of the next `count` PUBLISHes."""
    topics: list[str] = []
    for _ in range(count):
        publish = await client.expect(Publish)
        assert publish.retain and publish.packet_id is not None
        client.send(Puback(publish.packet_id))
        topics.append(publish.topic)
    return topics


def test_retained_messages_go_a_page_at_a_time(sqlite_url: str) -> None:
    """A `#` over many retained messages holds no more of them in memory than
    the session's queue allows: read a page (half of `session_queue_limit`)
    at a time, the next once most of the last is sent; a client that does not
    acknowledge stops the reading. Once it does, it gets them all, in topic
    name order, once."""

    async def go() -> list[str]:
        async with running_broker(sqlite_url, limits=PAGING) as broker:
            reader, conn, session = await _reader(broker)
            await reader.subscribe("r/#", 1)
            # Three in flight; pages of four, the next read once at most two
            # wait: at most six queued, and the reading waits for room.
            await eventually_async(
                lambda: conn._room is not None and session.inflight == 3,
                what="the reading of retained messages waiting for room",
            )
            assert session.retained_queued <= 6
            topics = await _take_all(reader, RETAINED)
            reader.close()
            return topics

    assert asyncio.run(go()) == [f"r/{i:02d}" for i in range(RETAINED)]


def test_subscribing_again_and_again_queues_one_more_send_of_the_retained(
    sqlite_url: str,
) -> None:
    """A client that SUBSCRIBEs to the same filter over and over while its
    retained messages are still being sent gets them once more, not once per
    SUBSCRIBE: what the broker holds for it stays bounded."""

    async def go() -> list[str]:
        async with running_broker(sqlite_url, limits=PAGING) as broker:
            reader, conn, session = await _reader(broker)
            for packet_id in range(1, 21):
                reader.send(Subscribe(packet_id, (SubscribeTopic("r/#", 1),)))
            taken = []
            for _ in range(20):  # the PUBLISHes in flight come between the SUBACKs
                packet = await reader.next()
                while isinstance(packet, Publish):
                    taken.append(packet)
                    packet = await reader.next()
                assert isinstance(packet, Suback)
            await eventually_async(lambda: conn._room is not None, what="waiting for room")
            assert session.retained_queued <= 6
            assert conn.following._retain_queue is not None
            assert len(conn.following._retain_queue) == 1
            for publish in taken:
                assert publish.packet_id is not None
                reader.send(Puback(publish.packet_id))
            topics = [p.topic for p in taken]
            topics += await _take_all(reader, 2 * RETAINED - len(taken))
            reader.close()
            return topics

    once = [f"r/{i:02d}" for i in range(RETAINED)]
    assert asyncio.run(go()) == once + once
