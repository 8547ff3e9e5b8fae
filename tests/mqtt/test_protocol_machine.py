"""A hypothesis state machine drives the connection core with random packet
sequences, runtime answers and clock steps, and checks the spec's invariants:

- nothing but a CONNACK goes out before the CONNACK (no PUBLISH, no ack);
- the outbound in-flight never exceeds the client's window;
- every QoS 1/2 PUBLISH the core accepted is acknowledged exactly once, in
  arrival order [MQTT-4.6.0-2], once its commit is reported;
- a protocol error always closes, with a reason code (MQTT 5 after the
  CONNACK: a DISCONNECT carrying it).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from riverbed.errors import LocalProtocolError
from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    Connack,
    Connect,
    ConnectProperties,
    ConnectReason,
    Decoder,
    Disconnect,
    Packet,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    PublishProperties,
    Pubrec,
    Pubrel,
    encode,
)
from riverbed.mqtt.protocol import ConnectionCore, ProtocolLimits, State
from riverbed.mqtt.protocol_effects import (
    Append,
    Authenticated,
    Close,
    Effect,
    ForgetPacketId,
    OpenSession,
    Released,
    Send,
    SessionOpened,
    TakenOver,
)

LIMITS = ProtocolLimits(receive_maximum=4, topic_alias_maximum=2, max_inflight=3)


class ConnectionMachine(RuleBasedStateMachine):
    """The client's side, the runtime's side and the clock, at random."""

    @initialize(
        level=st.sampled_from([4, MQTT_5]),
        receive_maximum=st.integers(1, 5),
        # Mostly connected from the start (that is where the rules are); a few
        # machines start earlier and go through CONNECT by the rules below.
        stage=st.sampled_from(["connected"] * 6 + ["authenticating", "new"]),
        keep_alive=st.sampled_from([0, 0, 5, 60]),
    )
    def start(self, level: int, receive_maximum: int, stage: str, keep_alive: int) -> None:
        ids = itertools.count(1)
        self.now = 0.0
        self.core = ConnectionCore(LIMITS, self.now, new_client_id=lambda: f"auto-{next(ids)}")
        self.level = level
        self.client_window = receive_maximum
        self.client = Decoder(protocol_level=level)
        self.received: list[Packet] = []
        """What the client read, in order."""
        self.closes: list[Close] = []
        self.pending = 0
        """Appends (`Append`, or a `Publish` as it is) whose commits are not
        reported yet: they are reported in order."""
        self.releasing: list[int] = []
        self.expected_acks: list[tuple[type, int]] = []
        """(PUBACK or PUBREC, packet id) the client is owed, in arrival order."""
        self.acks: list[tuple[type, int]] = []
        self.packet_ids = itertools.count(1)
        self.outbound_ids = itertools.count(1)
        self.protocol_error = False
        self.store_refused = False
        if stage != "new":
            self.connect("c1", keep_alive)
        if stage == "connected":
            self.authenticate_and_open(accepted=True, present=False)

    # ----------------------------------------------------------------- helpers

    def run(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                for packet in self.client.feed(effect.data):
                    self.received.append(packet)
                    if isinstance(packet, Puback | Pubrec):
                        self.acks.append((type(packet), packet.packet_id))
            elif isinstance(effect, Close):
                self.closes.append(effect)
            elif isinstance(effect, Append | Publish):
                self.pending += 1
            elif isinstance(effect, ForgetPacketId):
                self.releasing.append(effect.packet_id)

    def send(self, *packets: Packet) -> None:
        level = self.level
        before = self.core.state
        self.run(self.core.receive(b"".join(encode(p, level) for p in packets), self.now))
        if before is State.CONNECTED and self.core.state is State.CONNECTED:
            for packet in packets:
                if isinstance(packet, Publish) and packet.qos:
                    kind = Puback if packet.qos == 1 else Pubrec
                    self.expected_acks.append((kind, packet.packet_id or 0))

    # ----------------------------------------------------------------- the client

    @precondition(lambda self: self.core.state is State.AWAITING_CONNECT)
    @rule(client_id=st.sampled_from(["", "c1"]), keep_alive=st.sampled_from([0, 0, 5, 60]))
    def connect_later(self, client_id: str, keep_alive: int) -> None:
        self.connect(client_id, keep_alive)

    def connect(self, client_id: str, keep_alive: int) -> None:
        props = ConnectProperties(receive_maximum=self.client_window) if self.level == 5 else None
        connect = Connect(
            client_id, keep_alive=keep_alive, **({"properties": props} if props else {})
        )
        self.run(self.core.receive(encode(connect, self.level), self.now))

    @precondition(lambda self: self.core.state is State.AUTHENTICATING)
    @rule(accepted=st.booleans(), present=st.booleans())
    def authenticate_later(self, accepted: bool, present: bool) -> None:
        self.authenticate_and_open(accepted, present)

    def authenticate_and_open(self, accepted: bool, present: bool) -> None:
        reason = ConnectReason.SUCCESS if accepted else ConnectReason.NOT_AUTHORIZED
        effects = self.core.handle(Authenticated(reason, None), self.now)
        assert any(isinstance(e, OpenSession | Close) for e in effects)
        self.run(effects)
        if accepted:
            self.run(self.core.handle(SessionOpened(present), self.now))

    @precondition(lambda self: self.core.state is State.CONNECTED)
    @rule(
        qos=st.integers(0, 2),
        alias=st.sampled_from([None, 1, 2]),
        retain=st.booleans(),
        topic=st.sampled_from(["a/b", "a/b", "$SYS/x"]),  # $SYS: refused on arrival
    )
    def publish(self, qos: int, alias: int | None, retain: bool, topic: str) -> None:
        packet_id = next(self.packet_ids) if qos else None
        props = NO_PUBLISH_PROPERTIES
        if alias is not None and self.level == MQTT_5:
            props = PublishProperties(topic_alias=alias)
        self.send(
            Publish(topic, b"x", qos=qos, retain=retain, packet_id=packet_id, properties=props)
        )

    @precondition(lambda self: self.core.state is State.CONNECTED and bool(self.core.qos2))
    @rule(data=st.data())
    def resend_qos2(self, data: st.DataObject) -> None:
        packet_id = data.draw(st.sampled_from(sorted(self.core.qos2)))
        self.send(Publish("a/b", b"x", qos=2, dup=True, packet_id=packet_id))

    @precondition(lambda self: self.core.state is State.CONNECTED and bool(self.core.qos2))
    @rule(data=st.data())
    def pubrel(self, data: st.DataObject) -> None:
        self.send(Pubrel(data.draw(st.sampled_from(sorted(self.core.qos2)))))

    @precondition(lambda self: self.core.state is State.CONNECTED and self.core.waiting)
    @rule()
    def finish_waiting(self) -> None:
        """The effect the core waits for is done (the SUBACK sent, the QoS 2 commit...)."""
        self.run(self.core.resume(self.now))

    @precondition(lambda self: self.core.state is State.CONNECTED)
    @rule()
    def ping(self) -> None:
        self.send(Pingreq())

    # Not while waiting: the packet would be held, its error found later.
    @precondition(lambda self: self.core.state is State.CONNECTED and not self.core.waiting)
    @rule(
        kind=st.sampled_from(
            ["unknown alias", "subscription id", "garbage", "disconnect", "taken over"]
        )
    )
    def end(self, kind: str) -> None:
        """One rule for every way the connection ends, so that most runs live long."""
        if kind == "disconnect":
            self.send(Disconnect())
            return
        if kind == "taken over":
            self.run(self.core.handle(TakenOver(), self.now))
            return
        # After a store refusal every PUBLISH is refused before it is checked.
        self.protocol_error = kind == "garbage" or not self.store_refused
        if kind == "garbage":
            data = b"\xf0\x00"  # reserved packet type 15 at 3.1.1, AUTH at 5 (no auth)
            self.run(self.core.receive(data, self.now))
            return
        if self.level != MQTT_5:
            self.run(self.core.receive(b"\x00\x00", self.now))  # reserved type 0
            return
        if kind == "unknown alias":
            props = PublishProperties(topic_alias=LIMITS.topic_alias_maximum + 1)
        else:
            props = PublishProperties(subscription_identifiers=(1,))
        self.send(Publish("" if kind == "unknown alias" else "t", b"", properties=props))

    # ----------------------------------------------------------------- deliveries

    @precondition(lambda self: self.core.state is State.CONNECTED)
    @rule(qos=st.integers(0, 2))
    def deliver(self, qos: int) -> None:
        packet_id = next(self.outbound_ids) if qos else None
        if qos and len(self.core.outbound) >= self.core.window:
            # The session keeps to its window; a runtime that does not is told so.
            with pytest.raises(LocalProtocolError):
                self.core.publish(
                    "o/t", b"m", qos, False, False, packet_id, NO_PUBLISH_PROPERTIES, None
                )
            return
        data = self.core.publish(
            "o/t", b"m", qos, False, False, packet_id, NO_PUBLISH_PROPERTIES, None
        )
        assert data is not None
        self.run([Send(data)])

    @precondition(lambda self: self.core.state is State.CONNECTED and bool(self.core.outbound))
    @rule(data=st.data())
    def client_acknowledges(self, data: st.DataObject) -> None:
        packet_id = data.draw(st.sampled_from(sorted(self.core.outbound)))
        self.send(data.draw(st.sampled_from([Puback(packet_id), Pubcomp(packet_id)])))

    # ----------------------------------------------------------------- the runtime

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data(), ok=st.booleans())
    def commit(self, data: st.DataObject, ok: bool) -> None:
        if ok:
            count = data.draw(st.integers(1, self.pending))
            self.pending -= count
            self.run(self.core.committed(count))
        else:
            self.pending -= 1
            self.store_refused = True
            self.run(self.core.refused(0x97, store_refused=True))

    @precondition(lambda self: bool(self.releasing))
    @rule(known=st.booleans())
    def released(self, known: bool) -> None:
        self.run(self.core.handle(Released(self.releasing.pop(0), known), self.now))

    @rule(seconds=st.sampled_from([0.001, 0.01, 0.1, 0.5, 1.0, 1.0, 2.0, 2.0, 5.0, 20.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.run(self.core.timer(self.now))

    # ----------------------------------------------------------------- invariants

    @invariant()
    def nothing_before_the_connack(self) -> None:
        if self.received:
            assert isinstance(self.received[0], Connack), self.received
        assert all(isinstance(p, Connack) for p in self.received) or self.core.connack_sent

    @invariant()
    def in_flight_within_the_window(self) -> None:
        assert len(self.core.outbound) <= self.core.window
        if self.level == MQTT_5 and self.core.connack_sent:
            assert self.core.window <= self.client_window

    @invariant()
    def every_qos_1_and_2_acknowledged_exactly_once_in_order(self) -> None:
        # What went out is a prefix of what is owed: never twice, never out of order.
        assert self.acks == self.expected_acks[: len(self.acks)]
        idle = not self.pending and not self.core.waiting and not self.core.held
        if self.core.state is State.CONNECTED and idle:
            assert self.acks == self.expected_acks

    @invariant()
    def closed_once_and_for_a_reason(self) -> None:
        assert len(self.closes) <= 1
        if self.closes:
            assert self.core.state is State.CLOSING
        if self.protocol_error:
            assert self.closes, "a protocol error must close the connection"
            (close,) = self.closes
            assert (close.reason is not None and close.reason >= 0x80) or close.by_client
            if self.level == MQTT_5 and self.core.connack_sent and not close.by_client:
                assert isinstance(self.received[-1], Disconnect)
                assert self.received[-1].reason_code == close.reason


ConnectionMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestConnectionMachine = ConnectionMachine.TestCase
