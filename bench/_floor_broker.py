"""The `floor` broker of `bench/mqtt.py`: a minimal MQTT broker in Python on uvloop.

It answers one question: what does a broker written in Python cost per message
for the benchmark's traffic before it does anything durable? Riverbed's CPU per
message beside mosquitto's mixes what Python and the event loop cost with what
durability and Riverbed's own checks cost; this broker has only the first part.

What it does, the way a careful minimal broker would: one `asyncio.Protocol` per
connection, Riverbed's codec (`riverbed.mqtt.codec`) for the packets and its
topic trie (`riverbed.topics.trie`) for the routing; MQTT 5 and 3.1.1; any user
name and password; sessions that outlive their connection (Session Expiry
Interval, or Clean Session 0), with their subscriptions, their in-flight
messages (resent with DUP on resume) and the messages queued beyond the
client's Receive Maximum; QoS 0 and 1; each connection's writes gathered into
one per loop turn. Everything is in memory: a SIGKILL loses it all.

Left out: QoS 2 and retained messages (refused: the connection is closed),
wills, topic aliases, shared subscriptions, subscription options beyond the
QoS, message expiry, keep-alive timeouts.

    python bench/_floor_broker.py --port N      # listens on 127.0.0.1:N
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from collections import deque
from typing import Any

import uvloop

from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    Connack,
    ConnackProperties,
    Connect,
    Decoder,
    Disconnect,
    Pingreq,
    Pingresp,
    ProtocolError,
    Puback,
    Publish,
    PublishProperties,
    Suback,
    SubackReason,
    Subscribe,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
    encode,
    encode_pubacks,
    encode_publish,
)
from riverbed.topics.trie import TopicTrie
from riverbed.tuning import tune_process

MAX_INFLIGHT = 100
"""Deliveries awaiting their PUBACK per session, at most (Riverbed's
`limits.max_inflight`, mosquitto's `max_inflight_messages` in the benchmark);
the client's Receive Maximum can lower it."""
RECEIVE_MAXIMUM = 100
"""The Receive Maximum told to MQTT 5 clients, as Riverbed and the benchmark's
mosquitto do."""
NEVER = 0xFFFFFFFF
"""A Session Expiry Interval that never ends (MQTT 5.0 §3.1.2.11.2)."""

Message = tuple[str, bytes, int, PublishProperties]
"""A delivery: topic name, payload, QoS, the publisher's properties."""


class Session:
    """A client's state, online or not: its subscriptions (filter -> granted
    QoS), the QoS 1 messages sent and not yet acknowledged (packet id ->
    message, in the order sent) and those waiting for room in the window."""

    __slots__ = (
        "client_id",
        "connection",
        "expiry",
        "expiry_timer",
        "inflight",
        "next_id",
        "queue",
        "subscriptions",
        "window",
    )

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.connection: Connection | None = None
        self.expiry = 0
        self.expiry_timer: asyncio.TimerHandle | None = None
        self.subscriptions: dict[str, int] = {}
        self.inflight: dict[int, Message] = {}
        self.queue: deque[Message] = deque()
        self.next_id = 1
        self.window = MAX_INFLIGHT

    def deliver(self, message: Message) -> None:
        """Send now if online and the window has room, else queue; QoS 0 to
        an offline session is dropped (which QoS 0 allows)."""
        connection = self.connection
        if message[2] == 0:
            if connection is not None:
                connection.publish(message, None, False)
        elif connection is not None and len(self.inflight) < self.window:
            self._send(connection, message)
        else:
            self.queue.append(message)

    def acknowledged(self, packet_id: int) -> None:
        """A PUBACK frees its place in the window for the next queued message."""
        if self.inflight.pop(packet_id, None) is not None:
            self._fill()

    def attach(self, connection: Connection, window: int) -> None:
        """Go online: resend what is in flight (DUP, same packet ids), then
        send from the queue as far as the window allows."""
        self.connection = connection
        self.window = window
        for packet_id, message in self.inflight.items():
            connection.publish(message, packet_id, True)
        self._fill()

    def _fill(self) -> None:
        connection = self.connection
        queue = self.queue
        while connection is not None and queue and len(self.inflight) < self.window:
            self._send(connection, queue.popleft())

    def _send(self, connection: Connection, message: Message) -> None:
        inflight = self.inflight
        packet_id = self.next_id
        while packet_id in inflight:
            packet_id = packet_id % 0xFFFF + 1
        self.next_id = packet_id % 0xFFFF + 1
        inflight[packet_id] = message
        connection.publish(message, packet_id, False)


class Broker:
    """The sessions by client id and the subscriptions of all of them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sessions: dict[str, Session] = {}
        self.trie: TopicTrie[tuple[Session, int]] = TopicTrie()
        self._client_ids = itertools.count(1)

    def assign_client_id(self) -> str:
        """For a client that sent an empty one [MQTT-3.1.3-6]."""
        return f"floor-{next(self._client_ids)}"

    def open(self, connection: Connection, client_id: str, clean: bool) -> tuple[Session, bool]:
        """The client's session and whether it existed (Session Present). A
        connection still holding it is closed: the newest wins [MQTT-3.1.4-3]."""
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            session.connection.transport.close()
            session.connection = None
        if session is not None and clean:
            self._discard(session)
            session = None
        if session is None:
            session = self.sessions[client_id] = Session(client_id)
            return session, False
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
            session.expiry_timer = None
        return session, True

    def detach(self, session: Session) -> None:
        """The session's connection is gone: keep it for its expiry interval."""
        session.connection = None
        if session.expiry == 0:
            self._discard(session)
        elif session.expiry != NEVER:
            session.expiry_timer = self.loop.call_later(session.expiry, self._discard, session)

    def subscribe(self, session: Session, topic_filter: str, qos: int) -> None:
        old = session.subscriptions.get(topic_filter)
        if old is not None:
            self.trie.remove(topic_filter, (session, old))
        session.subscriptions[topic_filter] = qos
        self.trie.add(topic_filter, (session, qos))

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        qos = session.subscriptions.pop(topic_filter, None)
        if qos is None:
            return False
        self.trie.remove(topic_filter, (session, qos))
        return True

    def route(self, packet: Publish) -> None:
        """Deliver to every session with a matching filter, once per session,
        at the lower of the message's QoS and the highest one granted to it."""
        matches = self.trie.match(packet.topic)
        if not matches:
            return
        granted: dict[Session, int] = {}
        for session, qos in matches:
            if qos >= granted.get(session, 0):
                granted[session] = qos
        topic, payload, properties = packet.topic, packet.payload, packet.properties
        for session, qos in granted.items():
            session.deliver((topic, payload, min(packet.qos, qos), properties))

    def _discard(self, session: Session) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for topic_filter in list(session.subscriptions):
            self.unsubscribe(session, topic_filter)


class Connection(asyncio.Protocol):
    """One client connection: decodes its packets, answers them, and sends
    what its session delivers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = Decoder()
        self.session: Session | None = None
        self.v5 = True
        self._out: list[bytes] = []
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        session = self.session
        if session is not None and session.connection is self:
            self.broker.detach(session)

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except ProtocolError:
            self.transport.close()
            return
        acks: list[int] = []
        session = self.session
        for packet in packets:
            if type(packet) is Publish:
                if packet.qos == 2 or packet.retain:
                    self.transport.close()  # not supported (CONNACK says so to MQTT 5)
                    return
                self.broker.route(packet)
                if packet.packet_id is not None:  # QoS 1
                    acks.append(packet.packet_id)
            elif type(packet) is Puback:
                if session is not None:
                    session.acknowledged(packet.packet_id)
            elif type(packet) is Connect:
                session = self._connect(packet)
            elif type(packet) is Subscribe and session is not None:
                self._subscribe(session, packet)
            elif type(packet) is Unsubscribe and session is not None:
                self._unsubscribe(session, packet)
            elif type(packet) is Pingreq:
                self.send(encode(Pingresp(), self._level))
            elif type(packet) is Disconnect and session is not None:
                interval = packet.properties.session_expiry_interval
                if interval is not None:
                    session.expiry = interval
                self._close()
                return
            else:
                self.transport.close()
                return
        if acks:
            self.send(encode_pubacks(acks))

    @property
    def _level(self) -> int:
        level = self.decoder.protocol_level
        assert level is not None  # known since the CONNECT
        return level

    def _connect(self, packet: Connect) -> Session:
        self.v5 = v5 = self._level == MQTT_5
        client_id = packet.client_id or self.broker.assign_client_id()
        props = packet.properties
        if v5:
            expiry = props.session_expiry_interval or 0
            window = min(props.receive_maximum or 0xFFFF, MAX_INFLIGHT)
        else:
            expiry = 0 if packet.clean_start else NEVER
            window = MAX_INFLIGHT
        session, present = self.broker.open(self, client_id, packet.clean_start)
        session.expiry = expiry
        self.session = session
        if v5:
            properties = ConnackProperties(
                receive_maximum=RECEIVE_MAXIMUM,
                maximum_qos=1,
                retain_available=False,
                assigned_client_identifier=None if packet.client_id else client_id,
                shared_subscription_available=False,
                subscription_identifier_available=False,
            )
            self.send(encode(Connack(present, properties=properties), MQTT_5))
        else:
            self.send(encode(Connack(present), self._level))
        session.attach(self, window)
        return session

    def _subscribe(self, session: Session, packet: Subscribe) -> None:
        codes: list[SubackReason] = []
        for topic in packet.topics:
            if topic.topic_filter.startswith("$share/"):
                refused = SubackReason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                codes.append(refused if self.v5 else SubackReason.UNSPECIFIED_ERROR)
                continue
            qos = min(topic.qos, 1)
            self.broker.subscribe(session, topic.topic_filter, qos)
            codes.append(SubackReason(qos))
        self.send(encode(Suback(packet.packet_id, tuple(codes)), self._level))

    def _unsubscribe(self, session: Session, packet: Unsubscribe) -> None:
        codes = [
            UnsubackReason.SUCCESS
            if self.broker.unsubscribe(session, topic_filter)
            else UnsubackReason.NO_SUBSCRIPTION_EXISTED
            for topic_filter in packet.topic_filters
        ]
        # MQTT 3.1.1's UNSUBACK has no reason codes.
        unsuback = Unsuback(packet.packet_id, tuple(codes) if self.v5 else ())
        self.send(encode(unsuback, self._level))

    def publish(self, message: Message, packet_id: int | None, dup: bool) -> None:
        topic, payload, qos, properties = message
        if not self.v5:
            properties = NO_PUBLISH_PROPERTIES
        self.send(encode_publish(topic, payload, qos, False, dup, packet_id, properties, self.v5))

    def send(self, data: bytes) -> None:
        """Queue bytes for the client; they leave in one write at the end of
        this loop turn, with whatever else the turn adds."""
        if not self._out:
            self.broker.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.transport.is_closing():
            self.transport.writelines(out)

    def _close(self) -> None:
        self._flush()
        self.transport.close()


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    broker = Broker(loop)
    server = await loop.create_server(lambda: Connection(broker), "127.0.0.1", port)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    tune_process()  # the interpreter settings Riverbed's broker runs with
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
