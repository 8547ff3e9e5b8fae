"""An idle connection holds what it needs and no more: the per-connection
objects have `__slots__`, and a connected, idle connection (its `Connection`,
connection core and session) has no deque, set, dict or list of its own, nor
the helpers it makes on first use (`Inbound`, `Following`, the record lock,
the TCP_QUICKACK socket). `bench/idle_connections.py` measures the memory this
saves (docs/benchmarks.md); these checks are structural, not a threshold.

Containers an idle object may point at are the empty ones every object of its
class shares; so "of its own" is: not the same object in another idle one.
Using one connection must leave those shared empties empty.
"""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from typing import Any

import pytest

from harness.inprocess import running_broker
from harness.waiting import eventually_async
from riverbed.model import StoredMessage
from riverbed.mqtt.codec import (
    MQTT_5,
    ConnectProperties,
    ConnectReason,
    Decoder,
    Disconnect,
    Packet,
    Puback,
    Publish,
    PublishProperties,
    Pubrel,
    Subscribe,
    SubscribeTopic,
    encode,
)
from riverbed.mqtt.codec.packets import Connect
from riverbed.mqtt.connection import Connection
from riverbed.mqtt.following import Following
from riverbed.mqtt.inbound import Inbound
from riverbed.mqtt.pacer import TopicBatch
from riverbed.mqtt.protocol import ConnectionCore, ProtocolLimits
from riverbed.mqtt.protocol_effects import Authenticated, SessionOpened
from riverbed.mqtt.sharing import Sharing
from riverbed.mqtt.websocket import WebSocket
from riverbed.sessions.session import (
    Acked,
    Completed,
    FetchMany,
    Follow,
    Offered,
    Persisted,
    Received,
    Session,
    Subscription,
    Tick,
)

CONTAINERS = (deque, dict, list, set)
COUNTERS = "_publish_in"
"""The core's slot for the broker's PUBLISH counts: shared, and counting."""
V311 = 4
CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
SUBACK_QOS1 = b"\x90\x03\x00\x01\x01"


def _slots(obj: object) -> list[str]:
    return [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]


def own_containers(obj: object, other: object) -> list[str]:
    """The slots of `obj` holding a container that `other` (of the same class,
    in the same state) does not hold too."""
    return [
        name
        for name in _slots(obj)
        if isinstance(value := getattr(obj, name, None), CONTAINERS)
        and value is not getattr(other, name, None)
    ]


def shared_not_empty(obj: object) -> list[str]:
    """The slots of an idle `obj` holding a container that is not empty (a
    shared empty one written to)."""
    return [
        name
        for name in _slots(obj)
        if isinstance(value := getattr(obj, name, None), CONTAINERS) and value and name != COUNTERS
    ]


@pytest.mark.parametrize(
    "cls",
    [
        Connection,
        ConnectionCore,
        Session,
        Inbound,
        Following,
        Sharing,
        WebSocket,
        Decoder,
        TopicBatch,
    ],
)
def test_per_connection_classes_have_no_instance_dict(cls: type) -> None:
    assert cls.__dictoffset__ == 0, f"{cls.__name__} instances have a __dict__"


# ------------------------------------------------------------------ the connection core


PUBLISH_IN = [0, 0, 0]
"""PUBLISHes read per QoS, for every core here (a broker's are its counts)."""


def connected_core(client_id: str) -> ConnectionCore:
    """A core through CONNECT (the client takes topic aliases), idle."""
    core = ConnectionCore(ProtocolLimits(), 0.0, new_client_id=str, publish_in=PUBLISH_IN)
    properties = ConnectProperties(topic_alias_maximum=4)
    core.receive(encode(Connect(client_id, properties=properties), MQTT_5), 0.0)
    core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    core.handle(SessionOpened(present=False), 0.0)
    return core


def test_an_idle_core_has_no_containers_of_its_own() -> None:
    idle, other = connected_core("idle"), connected_core("other")
    assert own_containers(idle, other) == []
    assert own_containers(other, idle) == []
    assert shared_not_empty(idle) == []


def test_using_a_core_leaves_the_shared_empties_empty() -> None:
    busy, idle = connected_core("busy"), connected_core("idle")
    alias = PublishProperties(topic_alias=1)
    packets: list[Packet] = [
        Publish("t/1", b"a", qos=1, packet_id=1),
        Publish("t/2", b"b", qos=2, packet_id=2),  # waits: what follows is held
        Publish("t/3", b"c", qos=1, packet_id=3, properties=alias),
        Subscribe(4, (SubscribeTopic("t/#", 1),)),
    ]
    busy.receive(b"".join(encode(p, MQTT_5) for p in packets), 1.0)
    busy.committed(2)
    busy.resume(1.0)
    busy.committed(1)
    busy.resume(1.0)
    busy.receive(encode(Pubrel(2), MQTT_5), 1.0)
    # Deliveries: QoS 1 in flight, and an outbound topic alias.
    assert busy.publish("t/x", b"d", 1, False, False, 7, PublishProperties(), None)
    assert busy.outbound == {7} and busy.qos2 == {2}
    busy.receive(encode(Puback(7), MQTT_5), 1.0)
    assert own_containers(busy, idle)  # it made its own
    assert shared_not_empty(idle) == []
    assert own_containers(idle, connected_core("third")) == []


# ------------------------------------------------------------------ the session


def idle_session(client_id: str) -> Session:
    session = Session(client_id)
    session.handle_all([Tick()], 0.0)
    return session


def test_an_idle_session_has_no_containers_of_its_own() -> None:
    idle, other = idle_session("idle"), idle_session("other")
    assert own_containers(idle, other) == []
    assert shared_not_empty(idle) == []


def test_using_a_session_leaves_the_shared_empties_empty() -> None:
    busy, idle = Session("busy", [Subscription("t/#", 2)]), idle_session("idle")
    busy.handle(Follow(0, 0), 0.0)
    messages = [StoredMessage(i, b"", 0, "t/x", "k", b"m", None, 1 + i % 2, 0) for i in range(4)]
    effects = busy.handle(Offered(0, messages, 4), 0.0)
    effects += busy.handle(Persisted(1), 0.0)
    busy.handle_all([Acked(1), Received(2), Acked(3)], 0.0)
    busy.handle_all([Persisted(2), Completed(2)], 0.0)
    busy.grant(busy.grant_key(), 0, Subscription("t/#", 1), 0.0)
    assert effects and own_containers(busy, idle)
    assert shared_not_empty(idle) == []
    assert own_containers(idle, idle_session("third")) == []


def test_a_caught_up_subscribers_streams_hold_no_containers_of_their_own() -> None:
    """A subscriber follows a stream per partition: one that has delivered and
    had everything acknowledged keeps no queue, no in-flight dict and no
    grant lists of its own (an empty deque alone is 760 bytes)."""
    session = Session("sub", [Subscription("t/#", 2)])
    session.handle_all([Follow(key, 0) for key in range(16)], 0.0)
    # Every stream answered once (a stream has state of its own from then on).
    session.handle_all([Offered(key, (), 0) for key in range(16)], 0.0)
    messages = [StoredMessage(i, b"", 0, "t/x", "k", b"m", None, 1 + i % 2, 0) for i in range(4)]
    session.handle(Offered(3, messages, 4), 0.0)
    session.handle(Persisted(1), 0.0)
    session.handle_all([Acked(1), Received(2), Acked(3)], 0.0)
    session.handle_all([Persisted(2), Completed(2)], 0.0)
    session.handle(Persisted(3), 0.0)
    session.handle_all([Received(4)], 0.0)
    session.handle_all([Persisted(4), Completed(4)], 0.0)
    assert session.inflight == 0 and session.queued == 0
    streams: dict[int, Any] = getattr(session, "_streams")  # noqa: B009 (the private one)
    first = streams[0]
    for key, stream in streams.items():
        if key == 0:
            continue
        assert own_containers(stream, first) == [], f"stream {key}"
    assert shared_not_empty(first) == []


def test_a_resumed_subscriber_holds_a_cursor_per_stream_until_one_is_answered() -> None:
    """Streams followed from stored cursors are dormant: one fetch effect for
    all of them, no stream state, until the first answer of one of them."""
    session = Session("sub", [Subscription("t/#", 2)])
    effects = session.handle_all([Follow(key, 10 + key) for key in range(16)], 0.0)
    assert effects == [FetchMany({key: 10 + key for key in range(16)}, 1000 // 16)]
    assert getattr(session, "_streams") is getattr(idle_session("idle"), "_streams")  # noqa: B009
    assert session.streams == frozenset(range(16))
    assert session.cursors() == {key: 10 + key for key in range(16)}
    session.handle(Offered(3, (), 20), 0.0)
    streams: dict[int, Any] = getattr(session, "_streams")  # noqa: B009 (the private one)
    assert list(streams) == [3] and session.cursors()[3] == 20


def test_the_shared_empty_mapping_refuses_writes() -> None:
    shared: Any = getattr(idle_session("idle"), "_streams")  # noqa: B009 (the private one)
    with pytest.raises(TypeError):
        shared[1] = None
    assert not shared


# ------------------------------------------------------------------ a real connection


async def _connect(port: int, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(client_id, True, 0), V311))
    assert await asyncio.wait_for(reader.readexactly(4), 30) == CONNACK_ACCEPTED
    return reader, writer


def test_an_idle_connection_makes_nothing_until_it_is_used(sqlite_url: str) -> None:
    """In process, over TCP: two idle MQTT 3.1.1 clients; then one publishes
    and subscribes, and the other stays as it was."""

    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            clients = [await _connect(broker.port, name) for name in ("a", "b", "c")]
            await eventually_async(
                lambda: all(broker.connections[n].session for n in "abc"), 30, "sessions"
            )
            a, b, c = (broker.connections[n] for n in "abc")
            for one, other in ((a, b), (b, c)):
                assert own_containers(one, other) == []
                assert own_containers(one.core, other.core) == []
                assert own_containers(one.session, other.session) == []
            lazy = ("_inbound", "_following", "_record_lock", "_sock", "_acked", "_out")
            assert [name for name in lazy if getattr(a, name) is not None] == []

            # `a` publishes (QoS 1, PUBACKed once committed) and subscribes.
            reader, writer = clients[0]
            writer.write(encode(Publish("t/x", b"hi", qos=1, packet_id=1), V311))
            assert await asyncio.wait_for(reader.readexactly(4), 30) == b"\x40\x02\x00\x01"
            writer.write(encode(Subscribe(2, (SubscribeTopic("t/#", 1),)), V311))
            assert await asyncio.wait_for(reader.readexactly(5), 30) == b"\x90\x03\x00\x02\x01"
            assert getattr(a, "_inbound") is not None  # noqa: B009 (made on the PUBLISH)
            assert getattr(a, "_following") is not None  # noqa: B009 (on the SUBSCRIBE)

            assert [name for name in lazy if getattr(b, name) is not None] == []
            for obj in (b, b.core, b.session):
                assert shared_not_empty(obj) == []
            assert own_containers(b, c) == []
            assert own_containers(b.core, c.core) == []
            assert own_containers(b.session, c.session) == []
            for _, writer in clients:
                writer.close()
                await writer.wait_closed()
            await eventually_async(lambda: not broker.connections, 30, "the teardowns")

    asyncio.run(scenario())


def test_a_closed_connection_is_freed_without_the_cycle_collector(sqlite_url: str) -> None:
    """A connection that closed leaves nothing of its own in reference cycles:
    its session, streams and helpers are freed as soon as the broker lets go
    (a fleet's closed sessions otherwise pile up until a full collection
    walks them all; seen in `bench/sessions.py` as seconds of collections)."""

    async def scenario() -> None:
        async with running_broker(sqlite_url) as broker:
            try:
                gc.collect()
                gc.disable()
                for name in ("a", "b", "c"):
                    reader, writer = await _connect(broker.port, name)
                    writer.write(encode(Subscribe(1, (SubscribeTopic("t/#", 1),)), V311))
                    assert await asyncio.wait_for(reader.readexactly(5), 30) == SUBACK_QOS1
                    writer.write(encode(Disconnect(), V311))
                    assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the broker
                    writer.close()
                    await writer.wait_closed()
                await eventually_async(lambda: not broker.connections, 30, "the teardowns")
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                ours = (Connection, ConnectionCore, Session, Following, Inbound, Sharing)
                left = sorted({type(o).__name__ for o in gc.garbage if isinstance(o, ours)})
                assert left == [], f"closed connections' objects in reference cycles: {left}"
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()

    asyncio.run(scenario())
