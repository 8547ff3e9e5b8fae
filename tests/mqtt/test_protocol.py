"""The connection core (`mqtt/protocol.py`) on its own: bytes and a fake clock
in, effects out, in milliseconds, with no broker, socket or event loop."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import LocalProtocolError
from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    Connack,
    ConnackProperties,
    ConnectProperties,
    ConnectReason,
    Decoder,
    Disconnect,
    DisconnectProperties,
    DisconnectReason,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    PubackReason,
    Pubcomp,
    PubcompReason,
    Publish,
    PublishProperties,
    Pubrec,
    Pubrel,
    Subscribe,
    SubscribeTopic,
    Will,
    WillProperties,
    encode,
)
from riverbed.mqtt.codec.packets import Connect
from riverbed.mqtt.protocol import (
    ConnectionCore,
    ProtocolLimits,
    State,
)
from riverbed.mqtt.protocol_effects import (
    Append,
    Authenticate,
    Authenticated,
    Close,
    Effect,
    ForgetPacketId,
    OpenSession,
    Released,
    ScheduleWill,
    Send,
    ServerClose,
    SessionOpened,
    SessionRefused,
    TakenOver,
    ToSession,
)

LIMITS = ProtocolLimits()


def new_core(
    limits: ProtocolLimits = LIMITS, *, now: float = 0.0, **kwargs: object
) -> ConnectionCore:
    ids = itertools.count(1)
    return ConnectionCore(limits, now, new_client_id=lambda: f"auto-{next(ids)}", **kwargs)  # type: ignore[arg-type]


def sent(effects: list[Effect], level: int = MQTT_5) -> list[Packet]:
    """The packets the effects send, decoded as the client reads them."""
    decoder = Decoder(protocol_level=level)
    return [p for e in effects if isinstance(e, Send) for p in decoder.feed(e.data)]


def others(effects: list[Effect]) -> list[Effect]:
    return [e for e in effects if not isinstance(e, Send)]


def appended(effects: list[Effect]) -> list[tuple[str, bytes]]:
    """(topic, payload) of each PUBLISH the effects append: an `Append`, or the
    `Publish` itself under its own topic name (the hot path)."""
    return [
        (e.topic, e.publish.payload) if isinstance(e, Append) else (e.topic, e.payload)
        for e in effects
        if isinstance(e, Append | Publish)
    ]


def feed(core: ConnectionCore, *packets: Packet, now: float = 0.0) -> list[Effect]:
    return core.receive(b"".join(encode(p, core.level) for p in packets), now)


def connected(
    connect: Connect | None = None,
    *,
    level: int = MQTT_5,
    limits: ProtocolLimits = LIMITS,
    now: float = 0.0,
    **kwargs: object,
) -> ConnectionCore:
    """A core through CONNECT, authentication and the session, CONNACK sent."""
    core = new_core(limits, now=now, **kwargs)
    connect = connect or Connect("c1", keep_alive=0)
    effects = core.receive(encode(connect, level), now)
    assert isinstance(effects[-1], Authenticate)
    effects = core.handle(Authenticated(ConnectReason.SUCCESS, "user"), now)
    assert isinstance(effects[-1], OpenSession)
    effects = core.handle(SessionOpened(present=False), now)
    (connack,) = sent(effects, level)
    assert isinstance(connack, Connack) and connack.reason_code is ConnectReason.SUCCESS
    assert core.state is State.CONNECTED
    return core


def closed_with(effects: list[Effect]) -> object:
    closes = [e for e in effects if isinstance(e, Close)]
    assert len(closes) == 1, effects
    return closes[0].reason


# --------------------------------------------------------------------------- CONNECT


def test_connect_authenticates_then_opens_the_session_then_sends_connack() -> None:
    core = new_core()
    effects = core.receive(encode(Connect("c1", username="u", password=b"pw"), MQTT_5), 0.0)
    assert effects == [Authenticate("c1", "u", b"pw")]
    assert core.state is State.AUTHENTICATING
    effects = core.handle(Authenticated(ConnectReason.SUCCESS, "u"), 0.001)
    assert effects == [OpenSession("c1", True, MQTT_5, 0, None)]
    effects = core.handle(SessionOpened(present=True), 0.002)
    (connack,) = sent(effects)
    assert isinstance(connack, Connack)
    assert connack.session_present
    props = connack.properties
    assert props.receive_maximum == LIMITS.receive_maximum
    assert props.topic_alias_maximum == LIMITS.topic_alias_maximum
    assert props.maximum_packet_size == LIMITS.maximum_packet_size
    assert props.assigned_client_identifier is None
    assert props.session_expiry_interval is None  # granted as asked
    assert core.state is State.CONNECTED and core.username == "u"


@given(
    present=st.booleans(),
    requested=st.integers(0, 2**32 - 1),
    most=st.integers(0, 10**6),
    receive_maximum=st.integers(1, 65535),
    alias_maximum=st.integers(0, 65535),
    keep_alive=st.none() | st.integers(0, 65535),
    own_id=st.booleans(),
)
def test_connack_says_what_the_limits_and_the_session_grant(
    present: bool,
    requested: int,
    most: int,
    receive_maximum: int,
    alias_maximum: int,
    keep_alive: int | None,
    own_id: bool,
) -> None:
    """Whatever the limits, the session expiry asked for and whether the client
    brought its client id, the CONNACK's bytes are those of the CONNACK built
    from them (those of clients with their own id are encoded once, and shared)."""
    limits = ProtocolLimits(
        receive_maximum=receive_maximum,
        topic_alias_maximum=alias_maximum,
        server_keep_alive=keep_alive,
        max_session_expiry=most,
    )
    core = new_core(limits)
    props = ConnectProperties(session_expiry_interval=requested)
    core.receive(encode(Connect("c1" if own_id else "", properties=props), MQTT_5), 0.0)
    core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    effects = core.handle(SessionOpened(present), 0.0)
    granted = min(requested, most)
    expected = Connack(
        present,
        properties=ConnackProperties(
            session_expiry_interval=granted if granted != requested else None,
            receive_maximum=receive_maximum,
            retain_available=limits.retain_available,
            maximum_packet_size=limits.maximum_packet_size,
            assigned_client_identifier=None if own_id else "auto-1",
            topic_alias_maximum=alias_maximum,
            shared_subscription_available=limits.shared_subscription_available,
            server_keep_alive=keep_alive,
        ),
    )
    assert [e.data for e in effects if isinstance(e, Send)] == [encode(expected, MQTT_5)]


def test_connect_fed_byte_by_byte_and_with_trailing_data_gives_the_same_effects() -> None:
    data = encode(Connect("c1", clean_start=False), MQTT_5)
    whole = new_core().receive(data, 0.0)
    core = new_core()
    by_byte = [e for i in range(len(data)) for e in core.receive(data[i : i + 1], 0.0)]
    assert whole == by_byte == [Authenticate("c1", None, None)]
    core = new_core()
    ping = encode(Pingreq(), MQTT_5)
    assert core.receive(data + ping[:1], 0.0) == whole
    assert core.receive(ping[1:], 0.0) == []  # held until the CONNACK


def test_an_empty_client_id_gets_an_assigned_one_told_in_connack() -> None:
    core = new_core()
    effects = core.receive(encode(Connect(""), MQTT_5), 0.0)
    assert effects == [Authenticate("auto-1", None, None)]
    core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    (connack,) = sent(core.handle(SessionOpened(False), 0.0))
    assert isinstance(connack, Connack)
    assert connack.properties.assigned_client_identifier == "auto-1"
    assert core.client_id == "auto-1"


def test_v311_empty_client_id_needs_clean_session() -> None:
    core = new_core()
    data = bytearray(encode(Connect("", clean_start=True), 4))
    assert data[9] == 0x02  # the Connect Flags: CleanSession
    data[9] = 0
    effects = core.receive(bytes(data), 0.0)
    (connack,) = sent(effects, 4)
    assert isinstance(connack, Connack)
    assert connack.reason_code is ConnectReason.CLIENT_IDENTIFIER_NOT_VALID
    assert closed_with(effects) is ConnectReason.CLIENT_IDENTIFIER_NOT_VALID
    assert core.state is State.CLOSING
    ok = new_core()
    assert ok.receive(encode(Connect("", clean_start=True), 4), 0.0) == [
        Authenticate("auto-1", None, None)
    ]


@pytest.mark.parametrize("level", [4, MQTT_5])
def test_refused_credentials_get_a_connack_refusal_and_close(level: int) -> None:
    core = new_core()
    core.receive(encode(Connect("c1", username="u", password=b"bad"), level), 0.0)
    effects = core.handle(Authenticated(ConnectReason.BAD_USER_NAME_OR_PASSWORD, None), 0.0)
    (connack,) = sent(effects, level)
    assert isinstance(connack, Connack)
    assert connack.reason_code is ConnectReason.BAD_USER_NAME_OR_PASSWORD
    assert closed_with(effects) is ConnectReason.BAD_USER_NAME_OR_PASSWORD
    assert not core.connack_sent
    assert core.receive(encode(Pingreq(), level), 0.1) == []  # nothing after the close


def test_enhanced_authentication_is_refused_before_any_check() -> None:
    core = new_core()
    connect = Connect("c1", properties=ConnectProperties(authentication_method="SCRAM"))
    effects = core.receive(encode(connect, MQTT_5), 0.0)
    (connack,) = sent(effects)
    assert isinstance(connack, Connack)
    assert connack.reason_code is ConnectReason.BAD_AUTHENTICATION_METHOD
    assert not any(isinstance(e, Authenticate) for e in effects)


def test_clean_start_and_expiry_reach_the_session_and_the_grant_is_capped() -> None:
    limits = ProtocolLimits(max_session_expiry=3600)
    core = new_core(limits)
    connect = Connect(
        "c1", clean_start=False, properties=ConnectProperties(session_expiry_interval=86400)
    )
    core.receive(encode(connect, MQTT_5), 0.0)
    (open_session,) = core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    assert open_session == OpenSession("c1", False, MQTT_5, 3600, None)
    (connack,) = sent(core.handle(SessionOpened(True), 0.0))
    assert isinstance(connack, Connack)
    assert connack.properties.session_expiry_interval == 3600


def test_v311_clean_session_0_gets_the_default_expiry() -> None:
    limits = ProtocolLimits(v311_session_expiry=600)
    core = connected(Connect("c1", clean_start=False), level=4, limits=limits)
    assert core.expiry == 600
    assert connected(Connect("c2", clean_start=True), level=4, limits=limits).expiry == 0


def test_a_session_that_cannot_be_opened_refuses_the_connect() -> None:
    core = new_core()
    core.receive(encode(Connect("c1"), MQTT_5), 0.0)
    core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    effects = core.handle(SessionRefused(ConnectReason.SERVER_BUSY), 0.0)
    (connack,) = sent(effects)
    assert isinstance(connack, Connack) and connack.reason_code is ConnectReason.SERVER_BUSY
    assert closed_with(effects) is ConnectReason.SERVER_BUSY


@pytest.mark.parametrize("level", [4, MQTT_5])
def test_takeover_closes_with_session_taken_over(level: int) -> None:
    core = connected(level=level)
    effects = core.handle(TakenOver(), 1.0)
    assert closed_with(effects) is DisconnectReason.SESSION_TAKEN_OVER
    if level == MQTT_5:
        assert sent(effects) == [Disconnect(DisconnectReason.SESSION_TAKEN_OVER)]
    else:
        assert sent(effects, 4) == []  # 3.1.1 has no DISCONNECT from the server


def test_packets_read_while_authenticating_wait_for_the_connack() -> None:
    core = new_core()
    data = encode(Connect("c1"), MQTT_5) + encode(Pingreq(), MQTT_5)
    data += encode(Publish("a/b", b"x", qos=1, packet_id=1), MQTT_5)
    assert core.receive(data, 0.0) == [Authenticate("c1", None, None)]
    core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    effects = core.handle(SessionOpened(False), 0.0)
    assert [type(p) for p in sent(effects)] == [Connack, Pingresp]
    assert [type(e) for e in effects] == [Send, Publish]  # appended as it is


def test_an_answer_after_the_connection_closed_is_ignored() -> None:
    core = new_core()
    core.receive(encode(Connect("c1"), MQTT_5), 0.0)
    core.handle(ServerClose(DisconnectReason.SERVER_SHUTTING_DOWN), 0.0)
    assert core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0) == []
    assert core.handle(SessionOpened(False), 0.0) == []


@pytest.mark.parametrize(
    ("reason", "level", "answer"),
    [
        (DisconnectReason.USE_ANOTHER_SERVER, MQTT_5, ConnectReason.USE_ANOTHER_SERVER),
        (DisconnectReason.SERVER_MOVED, MQTT_5, ConnectReason.SERVER_MOVED),
        (DisconnectReason.SERVER_SHUTTING_DOWN, MQTT_5, None),  # no CONNACK says so
        (DisconnectReason.USE_ANOTHER_SERVER, 4, None),  # 3.1.1 has no such return code
    ],
)
def test_a_node_told_to_move_its_clients_answers_a_connect_in_hand_with_where_to_go(
    reason: DisconnectReason, level: int, answer: ConnectReason | None
) -> None:
    """A draining node closes a connection whose CONNECT it is still working on
    (authenticating, opening its session): no DISCONNECT may precede a
    successful CONNACK, so a CONNACK refusal tells the client to move, with the
    server reference; then the answers still to come are ignored."""
    core = new_core()
    core.receive(encode(Connect("c1"), level), 0.0)
    effects = core.handle(ServerClose(reason, "node-b:1883"), 0.0)
    assert closed_with(effects) is reason
    if answer is None:
        assert sent(effects, level) == []
    else:
        (connack,) = sent(effects, level)
        assert isinstance(connack, Connack)
        assert connack.reason_code is answer and not connack.session_present
        assert connack.properties.server_reference == "node-b:1883"
    assert core.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0) == []


def test_an_event_in_the_wrong_state_is_the_runtimes_fault() -> None:
    with pytest.raises(LocalProtocolError, match="SessionOpened in state awaiting CONNECT"):
        new_core().handle(SessionOpened(False), 0.0)


# --------------------------------------------------------------------------- keep alive


def test_no_connect_in_time_closes_without_a_word() -> None:
    core = new_core(now=100.0)
    assert core.next_deadline() == 110.0
    assert core.timer(109.999) == []
    assert core.timer(110.0) == [Close(None)]


def test_no_keep_alive_while_authenticating() -> None:
    core = new_core()
    core.receive(encode(Connect("c1", keep_alive=1), MQTT_5), 0.0)
    assert core.next_deadline() is None
    assert core.timer(1000.0) == []


def test_keep_alive_closes_after_one_and_a_half_times_without_a_packet() -> None:
    core = connected(Connect("c1", keep_alive=10), now=0.0)
    assert core.next_deadline() == 15.0
    assert core.timer(14.9) == []
    feed(core, Pingreq(), now=14.9)  # any packet resets it
    assert core.next_deadline() == pytest.approx(29.9)
    effects = core.timer(29.9)
    assert sent(effects) == [Disconnect(DisconnectReason.KEEP_ALIVE_TIMEOUT)]
    assert closed_with(effects) is DisconnectReason.KEEP_ALIVE_TIMEOUT
    assert core.next_deadline() is None


def test_keep_alive_0_never_times_out() -> None:
    core = connected(Connect("c1", keep_alive=0))
    assert core.next_deadline() is None


def test_server_keep_alive_replaces_a_v5_clients_own_but_not_a_v311_clients() -> None:
    limits = ProtocolLimits(server_keep_alive=4)
    v5 = new_core(limits)
    v5.receive(encode(Connect("c1", keep_alive=100), MQTT_5), 0.0)
    v5.handle(Authenticated(ConnectReason.SUCCESS, None), 0.0)
    (connack,) = sent(v5.handle(SessionOpened(False), 0.0))
    assert isinstance(connack, Connack) and connack.properties.server_keep_alive == 4
    assert v5.next_deadline() == 6.0
    v311 = connected(Connect("c1", keep_alive=100), level=4, limits=limits)
    assert v311.next_deadline() == 150.0


# --------------------------------------------------------------------------- topic aliases


def test_an_inbound_alias_is_set_then_used() -> None:
    core = connected()
    set_it = Publish("a/b", b"1", properties=PublishProperties(topic_alias=3))
    use_it = Publish("", b"2", properties=PublishProperties(topic_alias=3))
    effects = feed(core, set_it, use_it)
    # The first under its own name (the `Publish` itself), the second under the alias's.
    assert [type(e) for e in effects] == [Publish, Append]
    assert appended(effects) == [("a/b", b"1"), ("a/b", b"2")]


def test_an_unknown_inbound_alias_is_a_protocol_error() -> None:
    core = connected()
    effects = feed(core, Publish("", b"2", properties=PublishProperties(topic_alias=3)))
    assert sent(effects) == [Disconnect(DisconnectReason.PROTOCOL_ERROR)]
    assert closed_with(effects) is DisconnectReason.PROTOCOL_ERROR


def test_an_inbound_alias_above_the_maximum_is_invalid() -> None:
    core = connected(limits=ProtocolLimits(topic_alias_maximum=2))
    effects = feed(core, Publish("a", b"", properties=PublishProperties(topic_alias=3)))
    assert closed_with(effects) is DisconnectReason.TOPIC_ALIAS_INVALID


def deliver(
    core: ConnectionCore, topic: str, qos: int = 0, packet_id: int | None = None
) -> Publish | None:
    data = core.publish(topic, b"m", qos, False, False, packet_id, NO_PUBLISH_PROPERTIES, None)
    if data is None:
        return None
    (packet,) = Decoder(protocol_level=core.level).feed(data)
    assert isinstance(packet, Publish)
    return packet


def test_outbound_aliases_up_to_the_clients_maximum() -> None:
    core = connected(Connect("c1", properties=ConnectProperties(topic_alias_maximum=1)))
    first = deliver(core, "a")
    again = deliver(core, "a")
    other = deliver(core, "b")
    assert first is not None and again is not None and other is not None
    assert (first.topic, first.properties.topic_alias) == ("a", 1)
    assert (again.topic, again.properties.topic_alias) == ("", 1)
    assert (other.topic, other.properties.topic_alias) == ("b", None)  # none left


def test_no_outbound_aliases_unless_the_client_asks() -> None:
    core = connected()
    for _ in range(2):
        packet = deliver(core, "a")
        assert packet is not None and packet.topic == "a" and packet.properties.topic_alias is None


# --------------------------------------------------------------------------- Receive Maximum


def test_inbound_receive_maximum_counts_unacknowledged_qos_1_and_2() -> None:
    core = connected(limits=ProtocolLimits(receive_maximum=2))
    effects = feed(
        core,
        Publish("t", b"", qos=1, packet_id=1),
        Publish("t", b"", qos=2, packet_id=2),
        Publish("t", b"", qos=0),  # QoS 0 never counts
    )
    assert appended(effects) == [("t", b""), ("t", b"")] and core.waiting  # the QoS 2 one last
    core.committed(2)  # PUBREC sent, but QoS 2 counts until PUBCOMP
    (qos0,) = core.resume(0.0)
    assert isinstance(qos0, Publish)
    core.committed()
    assert others(feed(core, Publish("t", b"", qos=1, packet_id=3))) != []
    effects = feed(core, Publish("t", b"", qos=1, packet_id=4))
    assert sent(effects) == [Disconnect(DisconnectReason.RECEIVE_MAXIMUM_EXCEEDED)]


def test_inbound_receive_maximum_frees_a_slot_on_pubcomp() -> None:
    core = connected(limits=ProtocolLimits(receive_maximum=1))
    (append,) = others(feed(core, Publish("t", b"", qos=2, packet_id=9)))
    assert isinstance(append, Append)
    assert sent(core.committed()) == [Pubrec(9)]
    core.resume(0.0)
    assert others(feed(core, Pubrel(9))) == [ForgetPacketId(9)]
    assert sent(core.handle(Released(9, known=True), 0.0)) == [Pubcomp(9)]
    core.resume(0.0)
    assert appended(feed(core, Publish("t", b"", qos=1, packet_id=10))) == [("t", b"")]


def test_what_follows_a_packet_that_waits_is_held_until_resume() -> None:
    core = connected()
    effects = feed(
        core,
        Publish("t", b"", qos=2, packet_id=1),
        Pingreq(),
        Publish("t", b"", qos=1, packet_id=2),
    )
    (append,) = effects
    assert isinstance(append, Append) and append.waits
    assert core.waiting and core.held == 2
    assert feed(core, Pingreq()) == []  # still held
    effects = core.resume(0.0)
    assert sent(effects) == [Pingresp(), Pingresp()]
    assert [e.packet_id for e in effects if isinstance(e, Publish)] == [2]
    assert not core.waiting and core.held == 0


def test_outbound_window_is_the_smaller_of_the_clients_and_ours() -> None:
    core = connected(
        Connect("c1", properties=ConnectProperties(receive_maximum=2)),
        limits=ProtocolLimits(max_inflight=10),
    )
    assert core.window == 2
    assert deliver(core, "t", 1, 1) is not None
    assert deliver(core, "t", 1, 2) is not None
    assert deliver(core, "t", 1, 2) is not None  # a resend is not a new one
    with pytest.raises(LocalProtocolError, match="beyond the in-flight window of 2"):
        deliver(core, "t", 1, 3)
    assert others(feed(core, Puback(1))) == [Puback(1)]  # the session's, as it is
    assert deliver(core, "t", 1, 3) is not None
    assert connected(limits=ProtocolLimits(max_inflight=10)).window == 10


def test_a_dup_resend_goes_out_beyond_a_smaller_window() -> None:
    core = connected(Connect("c1", properties=ConnectProperties(receive_maximum=1)))
    assert deliver(core, "t", 1, 1) is not None
    # What a previous connection left in flight is owed, whatever the window.
    data = core.publish("t", b"m", 1, False, True, 2, NO_PUBLISH_PROPERTIES, None)
    assert data is not None and core.outbound == {1, 2}
    with pytest.raises(LocalProtocolError):
        deliver(core, "t", 1, 3)


def test_outbound_qos_2_stays_in_flight_until_pubcomp() -> None:
    core = connected(Connect("c1", properties=ConnectProperties(receive_maximum=1)))
    assert deliver(core, "t", 2, 5) is not None
    feed(core, Pubrec(5))
    (pubrel,) = Decoder(protocol_level=MQTT_5).feed(core.pubrel(5))
    assert pubrel == Pubrel(5)
    with pytest.raises(LocalProtocolError):
        deliver(core, "t", 1, 6)
    feed(core, Pubcomp(5))
    assert core.outbound == set()


# --------------------------------------------------------------------------- expiry, size


def test_an_expired_message_is_not_delivered() -> None:
    core = connected()
    props = PublishProperties(message_expiry_interval=5)
    assert core.publish("t", b"", 1, False, False, 1, props, 0) is None
    assert core.outbound == set()  # nothing in flight for it
    data = core.publish("t", b"", 1, False, False, 1, props, 5)
    assert data is not None


def test_a_delivery_larger_than_the_clients_maximum_packet_size_is_dropped() -> None:
    core = connected(Connect("c1", properties=ConnectProperties(maximum_packet_size=64)))
    assert core.publish("t", b"x" * 100, 1, False, False, 1, NO_PUBLISH_PROPERTIES, None) is None
    assert core.outbound == set()
    assert core.publish("t", b"x" * 10, 1, False, False, 1, NO_PUBLISH_PROPERTIES, None)


def test_an_inbound_packet_above_our_maximum_packet_size_is_too_large() -> None:
    core = connected(limits=ProtocolLimits(maximum_packet_size=128))
    effects = feed(core, Publish("t", b"x" * 200))
    assert sent(effects) == [Disconnect(DisconnectReason.PACKET_TOO_LARGE)]
    assert closed_with(effects) is DisconnectReason.PACKET_TOO_LARGE


# --------------------------------------------------------------------------- PUBLISH in


def test_acknowledgements_go_out_in_arrival_order() -> None:
    core = connected()
    effects = feed(
        core, Publish("t", b"", qos=1, packet_id=1), Publish("u", b"", qos=1, packet_id=2)
    )
    assert appended(effects) == [("t", b""), ("u", b"")]
    # One call for the commit of both, their PUBACKs in one bytes object.
    assert core.committed(2) == [Send(b"\x40\x02\x00\x01\x40\x02\x00\x02")]
    with pytest.raises(LocalProtocolError):
        core.committed()  # none pending


def test_commits_are_acknowledged_up_to_the_next_one_pending() -> None:
    core = connected()
    feed(core, *(Publish("t", b"", qos=1, packet_id=i) for i in range(1, 13)))
    assert sent(core.committed(11)) == [Puback(i) for i in range(1, 12)]
    assert sent(core.committed()) == [Puback(12)]


@pytest.mark.parametrize(("level", "code"), [(MQTT_5, 0x87), (4, 0)])
def test_a_refused_publish_is_answered_in_order(level: int, code: int) -> None:
    core = connected(level=level, may_publish=lambda user, client, topic: topic != "no")
    effects = feed(
        core, Publish("t", b"", qos=1, packet_id=1), Publish("no", b"", qos=1, packet_id=2)
    )
    assert appended(effects) == [("t", b"")]
    assert sent(effects, level) == []  # the refusal waits for the commit before it
    assert sent(core.committed(), level) == [Puback(1), Puback(2, PubackReason(code))]


def test_sys_topics_are_refused_to_clients() -> None:
    core = connected()
    effects = feed(core, Publish("$SYS/broker/uptime", b"", qos=1, packet_id=1))
    assert sent(effects) == [Puback(1, PubackReason.NOT_AUTHORIZED)]
    assert others(effects) == []


def test_a_subscription_identifier_from_a_client_is_a_protocol_error() -> None:
    core = connected()
    props = PublishProperties(subscription_identifiers=(1,))
    effects = feed(core, Publish("t", b"", properties=props))
    assert closed_with(effects) is DisconnectReason.PROTOCOL_ERROR


def test_retain_when_unavailable_is_refused_at_v5() -> None:
    core = connected(limits=ProtocolLimits(retain_available=False))
    effects = feed(core, Publish("t", b"", retain=True))
    assert closed_with(effects) is DisconnectReason.RETAIN_NOT_SUPPORTED


def test_qos_2_in_exactly_once() -> None:
    core = connected()
    (append,) = others(feed(core, Publish("t", b"", qos=2, packet_id=7)))
    assert isinstance(append, Append)
    assert sent(core.committed()) == [Pubrec(7)]
    core.resume(0.0)
    # Its PUBREC lost, the client sends it again: answered, not appended again.
    effects = feed(core, Publish("t", b"", qos=2, packet_id=7, dup=True))
    assert sent(effects) == [Pubrec(7)] and others(effects) == []
    assert others(feed(core, Pubrel(7))) == [ForgetPacketId(7)]
    assert sent(core.handle(Released(7, known=False), 0.0)) == [Pubcomp(7)]
    assert core.qos2 == set()


@pytest.mark.parametrize(
    ("level", "expected"),
    [(MQTT_5, [Pubcomp(3, PubcompReason.PACKET_IDENTIFIER_NOT_FOUND)]), (4, [Pubcomp(3)])],
)
def test_a_pubrel_for_an_unknown_packet_id(level: int, expected: list[Packet]) -> None:
    core = connected(level=level)
    feed(core, Pubrel(3))
    assert sent(core.handle(Released(3, known=False), 0.0), level) == expected


def test_a_store_refusal_refuses_what_follows_and_closes_at_v5() -> None:
    core = connected()
    effects = feed(
        core, Publish("t", b"", qos=1, packet_id=1), Publish("t", b"", qos=1, packet_id=2)
    )
    assert len(appended(effects)) == 2
    effects = core.refused(0x97, store_refused=True)
    assert sent(effects) == [Puback(1, PubackReason.QUOTA_EXCEEDED)]
    effects = feed(core, Publish("t", b"", qos=1, packet_id=3))
    assert others(effects) == []  # not appended
    effects = core.refused(0x97, store_refused=True)
    assert sent(effects) == [
        Puback(2, PubackReason.QUOTA_EXCEEDED),
        Puback(3, PubackReason.QUOTA_EXCEEDED),
        Disconnect(DisconnectReason.QUOTA_EXCEEDED),
    ]
    assert closed_with(effects) is DisconnectReason.QUOTA_EXCEEDED


def test_a_failed_commit_closes_a_v311_connection_without_an_acknowledgement() -> None:
    core = connected(level=4)
    assert appended(feed(core, Publish("t", b"", qos=1, packet_id=1))) == [("t", b"")]
    effects = core.refused(0x97, store_refused=True)
    assert sent(effects, 4) == []
    assert closed_with(effects) is DisconnectReason.UNSPECIFIED_ERROR


def test_a_commit_reported_twice_is_the_runtimes_fault() -> None:
    core = connected()
    feed(core, Publish("t", b"", qos=1, packet_id=1))
    core.committed()
    with pytest.raises(LocalProtocolError):
        core.committed()
    with pytest.raises(LocalProtocolError):
        core.refused(0x80)


# --------------------------------------------------------------------------- the rest


def test_acknowledgements_subscribe_and_ping() -> None:
    core = connected()
    subscribe = Subscribe(1, (SubscribeTopic("a/#", 1),))
    effects = feed(core, subscribe, Pingreq(), Pubrec(4))
    assert effects == [ToSession(subscribe)]  # the rest waits for the SUBACK
    effects = core.resume(0.0)
    assert others(effects) == [Pubrec(4)]
    assert sent(effects) == [Pingresp()]


def test_disconnect_0_discards_the_will() -> None:
    will = Will("w", b"bye")
    core = connected(Connect("c1", will=will))
    effects = feed(core, Disconnect())
    assert effects == [Close(DisconnectReason.NORMAL_DISCONNECTION, by_client=True)]
    assert core.connection_lost() == []


def test_a_lost_connection_schedules_the_will_within_the_session_expiry() -> None:
    will = Will("w", b"bye", properties=WillProperties(will_delay_interval=60))
    props = ConnectProperties(session_expiry_interval=30)
    core = connected(Connect("c1", will=will, properties=props))
    assert core.connection_lost() == [ScheduleWill("c1", "user", will, 30)]
    assert core.connection_lost() == []  # once


def test_disconnect_cannot_set_an_expiry_where_connect_had_0() -> None:
    core = connected()
    effects = feed(core, Disconnect(properties=DisconnectProperties(session_expiry_interval=5)))
    assert closed_with(effects) is DisconnectReason.PROTOCOL_ERROR
    core = connected(Connect("c1", properties=ConnectProperties(session_expiry_interval=10)))
    feed(core, Disconnect(properties=DisconnectProperties(session_expiry_interval=5)))
    assert core.expiry == 5


def test_garbage_before_connect_gets_a_connack_refusal_when_the_level_is_known() -> None:
    core = new_core()
    effects = core.receive(b"\x30\x00", 0.0)  # a PUBLISH first [MQTT-3.1.0-1]
    assert closed_with(effects) is ConnectReason.PROTOCOL_ERROR
    assert sent(effects, 4) == []  # 3.1.1 has no such return code
