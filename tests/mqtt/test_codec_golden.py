"""Golden bytes: the MQTT 5.0 and 3.1.1 specifications' examples, decoded and encoded.

Each fixture is the exact bytes of a packet built around one of the
specification's non-normative examples (the figure is named in the fixture),
parsed three ways: whole, a byte at a time, and followed by the first bytes of
the next packet (which must stay buffered until the rest arrives). A canonical
fixture is also what `encode` writes for the packet; a non-canonical one is a
longer form the decoder must accept (e.g. the DISCONNECT example with an
explicit reason code and property length).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from riverbed.errors import ProtocolError
from riverbed.mqtt.codec import (
    AckProperties,
    Auth,
    AuthProperties,
    AuthReason,
    Connack,
    ConnackProperties,
    Connect,
    ConnectProperties,
    ConnectReason,
    Decoder,
    Disconnect,
    DisconnectReason,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    PubackReason,
    Pubcomp,
    Publish,
    PublishProperties,
    Pubrec,
    Pubrel,
    Suback,
    SubackReason,
    Subscribe,
    SubscribeTopic,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
    Will,
    encode,
)
from riverbed.mqtt.codec.wire import MAX_PACKET_SIZE, decode_vbi, encode_string, encode_vbi


def hx(text: str) -> bytes:
    return bytes.fromhex(text)


@dataclass(frozen=True)
class Fixture:
    name: str
    level: int
    wire: bytes
    packet: Packet
    canonical: bool = True


A_B_C_D = (SubscribeTopic("a/b", 1), SubscribeTopic("c/d", 2))

FIXTURES = [
    # MQTT 5.0 §3.1.2.12 Figure 3-6, the CONNECT Variable Header example: protocol
    # name "MQTT", version 5, flags 0xCE (user name, password, Will QoS 1, Will,
    # Clean Start), Keep Alive 10, Session Expiry Interval 10; then a payload of
    # Client Identifier "c", no Will properties, Will Topic "w", Will Payload "x",
    # User Name "u", Password "p".
    Fixture(
        "5.0 CONNECT (Figure 3-6)",
        5,
        hx("1020 00044d515454 05 ce 000a 05 110000000a 000163 00 000177 000178 000175 000170"),
        Connect(
            "c",
            clean_start=True,
            keep_alive=10,
            username="u",
            password=b"p",
            will=Will("w", b"x", qos=1),
            properties=ConnectProperties(session_expiry_interval=10),
        ),
    ),
    # MQTT 3.1.1 §3.1.2.10 Figure 3.6, the same example at protocol level 4.
    Fixture(
        "3.1.1 CONNECT (Figure 3.6)",
        4,
        hx("1019 00044d515454 04 ce 000a 000163 000177 000178 000175 000170"),
        Connect("c", True, 10, "u", b"p", Will("w", b"x", qos=1)),
    ),
    Fixture("3.1.1 CONNACK", 4, hx("20020000"), Connack()),
    Fixture("3.1.1 CONNACK session present", 4, hx("20020100"), Connack(session_present=True)),
    Fixture(
        "3.1.1 CONNACK return code 5",
        4,
        hx("20020005"),
        Connack(reason_code=ConnectReason.NOT_AUTHORIZED),
    ),
    Fixture("5.0 CONNACK", 5, hx("2003000000"), Connack()),
    Fixture(
        "5.0 CONNACK with properties",
        5,
        hx("200b 00 9c 08 1c00056f74686572"),
        Connack(
            reason_code=ConnectReason.USE_ANOTHER_SERVER,
            properties=ConnackProperties(server_reference="other"),
        ),
    ),
    # MQTT 5.0 §3.3.2.3.9 Figure 3-9 / 3.1.1 §3.3.2.3 Figure 3.11: PUBLISH Variable
    # Header with Topic Name "a/b" and Packet Identifier 10 (and, in 5.0, no properties).
    Fixture(
        "5.0 PUBLISH (Figure 3-9)",
        5,
        hx("3208 0003612f62 000a 00"),
        Publish("a/b", qos=1, packet_id=10),
    ),
    Fixture(
        "3.1.1 PUBLISH (Figure 3.11)",
        4,
        hx("3207 0003612f62 000a"),
        Publish("a/b", qos=1, packet_id=10),
    ),
    # MQTT 5.0 §1.5.4 Figure 1-2 / 3.1.1 §1.5.3 Figure 1.1: the UTF-8 string "A𪛔"
    # (U+0041, U+2A6D4) is 00 05 41 F0 AA 9B 94; here it is a Topic Name.
    Fixture(
        "5.0 PUBLISH to 'A𪛔' (Figure 1-2)",
        5,
        hx("3008 0005 41f0aa9b94 00"),
        Publish("A\U0002a6d4"),
    ),
    Fixture(
        "3.1.1 PUBLISH to 'A𪛔' (Figure 1.1)",
        4,
        hx("3109 0005 41f0aa9b94 6869"),
        Publish("A\U0002a6d4", b"hi", retain=True),
    ),
    Fixture(
        "5.0 PUBLISH QoS 2 DUP with properties",
        5,
        hx("3d13 0000 0007 0c 230001 26 0001 6b 0001 76 0b05 7879"),
        Publish(
            "",
            b"xy",
            qos=2,
            retain=True,
            dup=True,
            packet_id=7,
            properties=PublishProperties(
                topic_alias=1, user_properties=(("k", "v"),), subscription_identifiers=(5,)
            ),
        ),
    ),
    Fixture("5.0 PUBACK, Remaining Length 2", 5, hx("4002000a"), Puback(10)),
    Fixture(
        "5.0 PUBACK with reason code",
        5,
        hx("4003000a10"),
        Puback(10, PubackReason.NO_MATCHING_SUBSCRIBERS),
    ),
    Fixture(
        "5.0 PUBACK with Reason String",
        5,
        hx("4008000a97 04 1f000171"),
        Puback(10, PubackReason.QUOTA_EXCEEDED, AckProperties(reason_string="q")),
    ),
    Fixture(
        "5.0 PUBACK, explicit Success and empty properties",
        5,
        hx("4004000a0000"),
        Puback(10),
        canonical=False,
    ),
    Fixture("3.1.1 PUBACK", 4, hx("4002000a"), Puback(10)),
    Fixture("3.1.1 PUBREC", 4, hx("5002000a"), Pubrec(10)),
    # [MQTT-3.6.1-1]: PUBREL's fixed header flags are 0010.
    Fixture("3.1.1 PUBREL", 4, hx("6202000a"), Pubrel(10)),
    Fixture("3.1.1 PUBCOMP", 4, hx("7002000a"), Pubcomp(10)),
    # MQTT 5.0 §3.8.2 Figure 3-19 (Packet Identifier 10, no properties) and §3.8.3
    # Figure 3-21 (Topic Filters "a/b" QoS 1 and "c/d" QoS 2); 3.1.1 Figures 3.21, 3.23.
    Fixture(
        "5.0 SUBSCRIBE (Figures 3-19, 3-21)",
        5,
        hx("820f 000a 00 0003612f62 01 0003632f64 02"),
        Subscribe(10, A_B_C_D),
    ),
    Fixture(
        "3.1.1 SUBSCRIBE (Figures 3.21, 3.23)",
        4,
        hx("820e 000a 0003612f62 01 0003632f64 02"),
        Subscribe(10, A_B_C_D),
    ),
    # 3.1.1 §3.9.3 Figure 3.26: return codes "Success - Maximum QoS 0", "Success -
    # Maximum QoS 2", "Failure".
    Fixture(
        "3.1.1 SUBACK (Figure 3.26)",
        4,
        hx("9005 000a 00 02 80"),
        Suback(
            10,
            (
                SubackReason.GRANTED_QOS_0,
                SubackReason.GRANTED_QOS_2,
                SubackReason.UNSPECIFIED_ERROR,
            ),
        ),
    ),
    Fixture(
        "5.0 SUBACK",
        5,
        hx("9006 000a 00 01 a2 8f"),
        Suback(
            10,
            (
                SubackReason.GRANTED_QOS_1,
                SubackReason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
                SubackReason.TOPIC_FILTER_INVALID,
            ),
        ),
    ),
    # MQTT 5.0 §3.10.3 Figure 3.30 / 3.1.1 §3.10.3 Figure 3.30: filters "a/b", "c/d".
    Fixture(
        "5.0 UNSUBSCRIBE (Figure 3.30)",
        5,
        hx("a20d 000a 00 0003612f62 0003632f64"),
        Unsubscribe(10, ("a/b", "c/d")),
    ),
    Fixture(
        "3.1.1 UNSUBSCRIBE (Figure 3.30)",
        4,
        hx("a20c 000a 0003612f62 0003632f64"),
        Unsubscribe(10, ("a/b", "c/d")),
    ),
    Fixture("3.1.1 UNSUBACK", 4, hx("b002000a"), Unsuback(10)),
    Fixture(
        "5.0 UNSUBACK",
        5,
        hx("b005 000a 00 00 11"),
        Unsuback(10, (UnsubackReason.SUCCESS, UnsubackReason.NO_SUBSCRIPTION_EXISTED)),
    ),
    Fixture("PINGREQ 5.0", 5, hx("c000"), Pingreq()),
    Fixture("PINGREQ 3.1.1", 4, hx("c000"), Pingreq()),
    Fixture("PINGRESP", 5, hx("d000"), Pingresp()),
    Fixture("3.1.1 DISCONNECT", 4, hx("e000"), Disconnect()),
    Fixture("5.0 DISCONNECT, Remaining Length 0", 5, hx("e000"), Disconnect()),
    # MQTT 5.0 §3.14.2.2.5 Figure 3-24: reason code 0 (Normal disconnection) and a
    # Property Length of 0, written out.
    Fixture("5.0 DISCONNECT (Figure 3-24)", 5, hx("e0020000"), Disconnect(), canonical=False),
    Fixture(
        "5.0 DISCONNECT with Will",
        5,
        hx("e00104"),
        Disconnect(DisconnectReason.DISCONNECT_WITH_WILL_MESSAGE),
    ),
    # MQTT 5.0 §4.12: a SCRAM exchange step, AUTH rc=0x18 Authentication Method="SCRAM".
    Fixture(
        "5.0 AUTH (§4.12)",
        5,
        hx("f00a 18 08 15000553435241 4d"),
        Auth(
            AuthReason.CONTINUE_AUTHENTICATION,
            AuthProperties(authentication_method="SCRAM"),
        ),
    ),
]

NEXT = Publish("n", b"next", qos=1, packet_id=1)
"""The packet whose first bytes trail each fixture."""


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_whole(fixture: Fixture) -> None:
    assert Decoder(fixture.level).feed(fixture.wire) == [fixture.packet]


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_byte_by_byte(fixture: Fixture) -> None:
    decoder = Decoder(fixture.level)
    out: list[Packet] = []
    for index in range(len(fixture.wire)):
        got = decoder.feed(fixture.wire[index : index + 1])
        if index < len(fixture.wire) - 1:
            assert got == [], f"a packet came out after {index + 1} bytes"
        out += got
    assert out == [fixture.packet]


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_with_trailing_data(fixture: Fixture) -> None:
    following = encode(NEXT, fixture.level)
    for cut in range(1, len(following)):
        decoder = Decoder(fixture.level)
        assert decoder.feed(fixture.wire + following[:cut]) == [fixture.packet]
        assert decoder.feed(following[cut:]) == [NEXT]


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_encode(fixture: Fixture) -> None:
    if fixture.canonical:
        assert encode(fixture.packet, fixture.level) == fixture.wire
    else:
        shorter = encode(fixture.packet, fixture.level)
        assert len(shorter) < len(fixture.wire)
        assert Decoder(fixture.level).feed(shorter) == [fixture.packet]


@pytest.mark.parametrize(
    "fixture", [f for f in FIXTURES if isinstance(f.packet, Connect)], ids=lambda f: f.name
)
def test_connect_on_a_server_side_decoder(fixture: Fixture) -> None:
    """A decoder without a level learns it from the CONNECT (the server's side)."""
    decoder = Decoder()
    assert decoder.protocol_level is None
    assert decoder.feed(fixture.wire + encode(NEXT, fixture.level)) == [fixture.packet, NEXT]
    assert decoder.protocol_level == fixture.level


# --------------------------------------------------------------------- Remaining Length

# MQTT 5.0 §1.5.5 Table 1-1 (3.1.1 §2.2.3 Table 2.4): Variable Byte Integer sizes,
# at the edges of each size.
REMAINING_LENGTHS = [
    (0, "00"),
    (127, "7f"),
    (128, "8001"),
    (16_383, "ff7f"),
    (16_384, "808001"),
    (2_097_151, "ffff7f"),
    (2_097_152, "80808001"),
    (268_435_455, "ffffff7f"),
]


@pytest.mark.parametrize(("value", "wire"), REMAINING_LENGTHS)
def test_variable_byte_integer(value: int, wire: str) -> None:
    assert encode_vbi(value) == hx(wire)
    assert decode_vbi(hx(wire) + b"\xaa", 0, len(wire) // 2 + 1, "test") == (value, len(wire) // 2)


@pytest.mark.parametrize(("value", "wire"), REMAINING_LENGTHS[:-1])
def test_remaining_length_in_a_packet(value: int, wire: str) -> None:
    """A packet of each Remaining Length: the header bytes are the table's."""
    packet: Packet = Pingreq() if value == 0 else Publish("a", b"x" * (value - 3))
    data = encode(packet, 4)
    first = b"\xc0" if value == 0 else b"\x30"
    assert data[: 1 + len(wire) // 2] == first + hx(wire)
    assert len(data) == 1 + len(wire) // 2 + value
    assert Decoder(4).feed(data) == [packet]
    decoder = Decoder(4)
    out: list[Packet] = []
    step = 1 if value < 20_000 else 65_536
    for index in range(0, len(data), step):
        out += decoder.feed(data[index : index + step])
    assert out == [packet]


def test_largest_remaining_length_is_read() -> None:
    """268,435,455: the header is accepted (the packet then needs 256 MiB more),
    and its size is counted exactly, as the maximum packet size check shows."""
    header = hx("30ffffff7f")
    assert Decoder(4).feed(header) == []
    too_small = Decoder(4, max_packet_size=MAX_PACKET_SIZE - 1)
    with pytest.raises(ProtocolError, match=f"of {MAX_PACKET_SIZE} bytes") as caught:
        too_small.feed(header)
    assert caught.value.reason_code == 0x95


def test_utf8_string_example() -> None:
    """MQTT 5.0 Figure 1-2: "A𪛔" is 00 05 41 F0 AA 9B 94."""
    assert encode_string("A\U0002a6d4") == hx("0005 41 f0aa9b94")


def test_byte_order_mark_is_kept() -> None:
    """[MQTT-1.5.4-3]: EF BB BF is U+FEFF wherever it is, never stripped."""
    data = hx("3006 0004 efbbbf61")
    assert Decoder(4).feed(data) == [Publish("\ufeffa")]
    assert encode(Publish("\ufeffa"), 4) == data
