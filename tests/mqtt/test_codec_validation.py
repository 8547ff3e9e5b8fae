"""Validation: each rule the codec enforces, broken once, with the reason code expected.

Wire cases are a valid packet with one thing wrong, fed to a decoder of the
packet's level; the error must carry the reason code a receiver answers with
(0x81 Malformed Packet, 0x82 Protocol Error, 0x84 Unsupported Protocol Version,
0x85 Client Identifier not valid, 0x94 Topic Alias invalid, 0x95 Packet too
large) and a message naming the rule. Then the same rules on packets built in
code, what `encode` refuses at level 4, and the decoder's own rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from riverbed.errors import InvalidConfig, InvalidInput, ProtocolError, RiverbedError
from riverbed.mqtt.codec import (
    AckProperties,
    Auth,
    AuthProperties,
    Connack,
    ConnackProperties,
    Connect,
    ConnectProperties,
    ConnectReason,
    Decoder,
    Disconnect,
    DisconnectProperties,
    DisconnectReason,
    Packet,
    Pingreq,
    Puback,
    PubackReason,
    Publish,
    PublishProperties,
    Pubrel,
    RetainHandling,
    Suback,
    SubackReason,
    Subscribe,
    SubscribeProperties,
    SubscribeTopic,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
    Will,
    WillProperties,
    encode,
)
from riverbed.mqtt.codec.wire import MAX_VBI, encode_vbi

MALFORMED = 0x81
PROTOCOL = 0x82
VERSION = 0x84
CLIENT_ID = 0x85
ALIAS = 0x94
TOO_LARGE = 0x95


def hx(text: str) -> bytes:
    return bytes.fromhex(text)


def connect(level: int, flags: str, payload: str, props: str = "00") -> bytes:
    """A CONNECT with the given flags byte and payload (hex), keep alive 10."""
    body = hx(f"00044d515454 {level:02x} {flags} 000a") + (hx(props) if level == 5 else b"")
    body += hx(payload)
    return bytes((0x10, len(body))) + body


def publish5(props: str, topic: str = "0001 61") -> bytes:
    """An MQTT 5 QoS 0 PUBLISH to "a" with the given properties (hex, without length)."""
    raw = hx(props)
    body = hx(topic) + bytes((len(raw),)) + raw
    return bytes((0x30, len(body))) + body


@dataclass(frozen=True)
class Case:
    name: str
    level: int | None
    wire: bytes
    reason: int
    rule: str


CASES = [
    # ----------------------------------------------------------------- fixed header
    Case("packet type 0 is reserved", 5, hx("0000"), MALFORMED, "[2.1.2]"),
    Case("AUTH does not exist in 3.1.1", 4, hx("f000"), MALFORMED, "[2.1.2]"),
    Case("PUBREL flags 0000", 5, hx("6002000a"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("SUBSCRIBE flags 0000", 4, hx("8008000a0003612f6201"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("UNSUBSCRIBE flags 0011", 4, hx("a307000a0003612f62"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("PINGREQ flags 0001", 4, hx("c100"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("CONNACK flags 1000", 5, hx("2803000000"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("DISCONNECT flags 0001 [MQTT-3.14.1-1]", 5, hx("e100"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("AUTH flags 0001 [MQTT-3.15.1-1]", 5, hx("f100"), MALFORMED, "[MQTT-2.1.3-1]"),
    Case("Remaining Length of five bytes", 5, hx("30ffffffff01"), MALFORMED, "four bytes"),
    # ----------------------------------------------------------------- CONNECT
    Case("first packet not CONNECT", None, hx("c000"), PROTOCOL, "[MQTT-3.1.0-1]"),
    Case("first packet a PUBLISH", None, hx("3003000161"), PROTOCOL, "[MQTT-3.1.0-1]"),
    Case(
        "second CONNECT",
        None,
        connect(4, "02", "000163") * 2,
        PROTOCOL,
        "[MQTT-3.1.0-2]",
    ),
    Case(
        "protocol name not MQTT",
        None,
        hx("100d 00044d515458 04 02 000a 000163"),
        VERSION,
        "[MQTT-3.1.2-1]",
    ),
    Case("protocol level 6", None, connect(6, "02", "000163"), VERSION, "[MQTT-3.1.2-2]"),
    Case(
        "protocol level 3 named MQTT", None, connect(3, "02", "000163"), VERSION, "[MQTT-3.1.2-2]"
    ),
    Case(
        "MQTT 3.1 (MQIsdp)",
        None,
        hx("100f 00064d514973647003 02 000a 000163"),
        VERSION,
        "MQTT 3.1",
    ),
    Case("no Protocol Version", None, hx("1006 00044d515454"), MALFORMED, "Protocol Version"),
    Case("no Connect Flags", None, hx("1007 00044d515454 04"), MALFORMED, "Connect Flags"),
    Case("reserved flag", 4, connect(4, "03", "000163"), MALFORMED, "[MQTT-3.1.2-3]"),
    Case("reserved flag 5.0", 5, connect(5, "03", "000163"), MALFORMED, "[MQTT-3.1.2-3]"),
    Case("Will QoS without Will", 4, connect(4, "0a", "000163"), MALFORMED, "[MQTT-3.1.2-11"),
    Case("Will Retain without Will", 5, connect(5, "22", "000163"), MALFORMED, "-13]"),
    Case("Will QoS 3", 4, connect(4, "1e", "000163"), MALFORMED, "[MQTT-3.1.2-12]"),
    Case(
        "3.1.1 password without user name",
        4,
        connect(4, "42", "000163 000170"),
        PROTOCOL,
        "[MQTT-3.1.2-22] (3.1.1)",
    ),
    Case(
        "3.1.1 empty Client Identifier without CleanSession",
        4,
        connect(4, "00", "0000"),
        CLIENT_ID,
        "[MQTT-3.1.3-8] (3.1.1)",
    ),
    Case("User Name flag, no User Name", 4, connect(4, "82", "000163"), MALFORMED, "User Name"),
    Case("Will flag, no Will Topic", 4, connect(4, "06", "000163"), MALFORMED, "Will Topic"),
    Case(
        "bytes after the Password",
        4,
        connect(4, "c2", "000163 000175 000170 ff"),
        MALFORMED,
        "after",
    ),
    Case(
        "Authentication Data without Method",
        5,
        connect(5, "02", "000163", props="04 16000178"),
        PROTOCOL,
        "[3.1.2.11.10]",
    ),
    Case(
        "Receive Maximum 0", 5, connect(5, "02", "000163", "03 210000"), PROTOCOL, "RECEIVE_MAXIMUM"
    ),
    Case(
        "Maximum Packet Size 0",
        5,
        connect(5, "02", "000163", "05 2700000000"),
        PROTOCOL,
        "MAXIMUM_PACKET_SIZE",
    ),
    Case(
        "Request Problem Information 2",
        5,
        connect(5, "02", "000163", "02 1702"),
        PROTOCOL,
        "REQUEST_PROBLEM_INFORMATION",
    ),
    Case(
        "Session Expiry Interval twice",
        5,
        connect(5, "02", "000163", "0a 1100000001 1100000002"),
        PROTOCOL,
        "twice",
    ),
    Case(
        "a PUBLISH property in CONNECT",
        5,
        connect(5, "02", "000163", "03 230001"),
        MALFORMED,
        "may not carry property TOPIC_ALIAS",
    ),
    Case(
        "a CONNECT property in the Will properties",
        5,
        connect(5, "06", "000163 05 1100000001 000177 000178"),
        MALFORMED,
        "Will may not carry property SESSION_EXPIRY_INTERVAL",
    ),
    Case(
        "Will Topic with a wildcard",
        4,
        connect(4, "06", "000163 000123 000178"),
        PROTOCOL,
        "[MQTT-3.3.2-2]",
    ),
    Case(
        "Client Identifier with U+0000", 4, connect(4, "02", "000100"), MALFORMED, "[MQTT-1.5.4-2]"
    ),
    # ----------------------------------------------------------------- CONNACK
    Case("CONNACK reserved bits", 5, hx("2003020000"), MALFORMED, "[MQTT-3.2.2-1]"),
    Case("CONNACK reserved bits 3.1.1", 4, hx("20020200"), MALFORMED, "[MQTT-3.2.2-1]"),
    Case("Session Present on a refusal", 5, hx("2003018700"), PROTOCOL, "[MQTT-3.2.2-6]"),
    Case("Session Present on a refusal 3.1.1", 4, hx("20020105"), PROTOCOL, "[MQTT-3.2.2-6]"),
    Case("CONNACK reason 0x01", 5, hx("2003000100"), PROTOCOL, "reason code"),
    Case("3.1.1 CONNACK return code 6", 4, hx("20020006"), PROTOCOL, "reserved"),
    Case("3.1.1 CONNACK of 3 bytes", 4, hx("2003000000"), MALFORMED, "after"),
    Case("Maximum QoS 2", 5, hx("2005 0000 02 2402"), PROTOCOL, "MAXIMUM_QOS"),
    Case("Retain Available 2", 5, hx("2005 0000 02 2502"), PROTOCOL, "RETAIN_AVAILABLE"),
    # ----------------------------------------------------------------- PUBLISH
    Case("QoS 3", 4, hx("3605 000161 0001"), MALFORMED, "[MQTT-3.3.1-4]"),
    Case("DUP on QoS 0", 4, hx("3803 000161"), MALFORMED, "[MQTT-3.3.1-2]"),
    Case("Packet Identifier 0", 4, hx("3205 000161 0000"), PROTOCOL, "[MQTT-2.2.1-3]"),
    Case("'#' in the Topic Name", 4, hx("3005 0003612f23"), PROTOCOL, "[MQTT-3.3.2-2]"),
    Case("'+' in the Topic Name", 5, hx("3006 0003612f2b 00"), PROTOCOL, "[MQTT-3.3.2-2]"),
    Case("empty Topic Name 3.1.1", 4, hx("30020000"), PROTOCOL, "[MQTT-4.7.3-1]"),
    Case("empty Topic Name, no alias", 5, hx("3003000000"), PROTOCOL, "[MQTT-4.7.3-1]"),
    Case("ill-formed UTF-8", 4, hx("3004 0002c328"), MALFORMED, "[MQTT-1.5.4-1]"),
    Case("UTF-8 of a surrogate", 4, hx("3005 0003eda080"), MALFORMED, "[MQTT-1.5.4-1]"),
    Case("overlong UTF-8", 4, hx("3004 0002c0af"), MALFORMED, "[MQTT-1.5.4-1]"),
    Case("code point above U+10FFFF", 4, hx("3006 0004f4908080"), MALFORMED, "[MQTT-1.5.4-1]"),
    Case("U+0000 in the Topic Name", 4, hx("3004 00026100"), MALFORMED, "[MQTT-1.5.4-2]"),
    Case("Topic Name past the end", 4, hx("3003 000561"), MALFORMED, "past the end"),
    Case("no Packet Identifier", 4, hx("3203 000161"), MALFORMED, "Packet Identifier"),
    Case("no Property Length", 5, hx("3003 000161"), MALFORMED, "Property Length"),
    Case(
        "a CONNECT property in PUBLISH",
        5,
        publish5("110000000a"),
        MALFORMED,
        "may not carry property SESSION_EXPIRY_INTERVAL [2.2.2.2]",
    ),
    Case("unknown property 0x7F", 5, publish5("7f00"), MALFORMED, "unknown property"),
    Case("property id of two bytes", 5, publish5("8101 00"), MALFORMED, "unknown property"),
    Case("Message Expiry twice", 5, publish5("0200000001 0200000002"), PROTOCOL, "twice"),
    Case("Topic Alias twice", 5, publish5("230001 230002"), PROTOCOL, "twice"),
    Case("Topic Alias 0", 5, publish5("230000"), ALIAS, "[MQTT-3.3.2-8]"),
    Case("Payload Format Indicator 2", 5, publish5("0102"), PROTOCOL, "PAYLOAD_FORMAT_INDICATOR"),
    Case("Response Topic with a wildcard", 5, publish5("08000123"), PROTOCOL, "RESPONSE_TOPIC"),
    Case("Subscription Identifier 0", 5, publish5("0b00"), PROTOCOL, "SUBSCRIPTION_IDENTIFIER"),
    Case(
        "Subscription Identifier of 5 bytes", 5, publish5("0b8080808001"), MALFORMED, "four bytes"
    ),
    Case("properties past the end", 5, hx("3005 000161 0501"), MALFORMED, "past the end"),
    Case("a value past the properties", 5, publish5("020000") + b"", MALFORMED, "runs past"),
    Case("User Property value past the end", 5, publish5("26000161 0005"), MALFORMED, "past"),
    Case("User Property with U+0000", 5, publish5("26000100 000176"), MALFORMED, "[MQTT-1.5.4-2]"),
    Case("Content Type ill-formed", 5, publish5("030001ff"), MALFORMED, "[MQTT-1.5.4-1]"),
    # ----------------------------------------------------------------- acknowledgements
    Case("PUBACK reason 0x01", 5, hx("4003000a01"), PROTOCOL, "reason code"),
    Case("PUBREL with a PUBACK reason", 5, hx("6203000a10"), PROTOCOL, "reason code"),
    Case("PUBACK Packet Identifier 0", 5, hx("40020000"), PROTOCOL, "[MQTT-2.2.1-3]"),
    Case("PUBACK of 1 byte", 5, hx("400100"), MALFORMED, "Packet Identifier"),
    Case("3.1.1 PUBACK of 3 bytes", 4, hx("4003000a00"), MALFORMED, "Remaining Length 2"),
    Case("PUBACK bytes after properties", 5, hx("4005000a0000ff"), MALFORMED, "after"),
    Case("PUBACK with a PUBLISH property", 5, hx("4007000a00 03 230001"), MALFORMED, "TOPIC_ALIAS"),
    Case("PUBCOMP Reason String twice", 5, hx("700a000a00 06 1f0000 1f0000"), PROTOCOL, "twice"),
    # ----------------------------------------------------------------- SUBSCRIBE
    Case("SUBSCRIBE without filters", 5, hx("8203000a00"), PROTOCOL, "[MQTT-3.8.3-2]"),
    Case("SUBSCRIBE without filters 3.1.1", 4, hx("8202000a"), PROTOCOL, "[MQTT-3.8.3-2]"),
    Case("SUBSCRIBE Packet Identifier 0", 4, hx("82060000000161 00"), PROTOCOL, "[MQTT-2.2.1-3]"),
    Case("options reserved bits", 5, hx("8207000a00 000161 c0"), MALFORMED, "[MQTT-3.8.3-5]"),
    Case("options QoS 3", 5, hx("8207000a00 000161 03"), PROTOCOL, "[3.8.3.1]"),
    Case("3.1.1 Requested QoS 3", 4, hx("8206000a 000161 03"), MALFORMED, "[MQTT-3.8.3-4] (3.1.1)"),
    Case("3.1.1 No Local bit", 4, hx("8206000a 000161 04"), MALFORMED, "(3.1.1)"),
    Case("Retain Handling 3", 5, hx("8207000a00 000161 30"), PROTOCOL, "[3.8.3.1]"),
    Case("filter without options", 5, hx("8206000a00 000161"), MALFORMED, "options"),
    Case("'#' not last", 4, hx("820a000a 0005612f232f62 00"), PROTOCOL, "[MQTT-4.7.1-1]"),
    Case("'+' inside a level", 4, hx("8207000a 0002612b 00"), PROTOCOL, "[MQTT-4.7.1-2]"),
    Case("empty filter", 4, hx("8205000a 0000 00"), PROTOCOL, "[MQTT-4.7.3-1]"),
    Case(
        "shared subscription without ShareName",
        5,
        hx("820f000a00 0009 2473686172652f2f61 00"),
        PROTOCOL,
        "[MQTT-4.8.2-1]",
    ),
    Case(
        "shared subscription without filter",
        5,
        hx("820e000a00 0008 2473686172652f67 00"),
        PROTOCOL,
        "[MQTT-4.8.2-2]",
    ),
    Case(
        "No Local on a shared subscription",
        5,
        hx("8210000a00 000a 2473686172652f672f61 04"),
        PROTOCOL,
        "[MQTT-3.8.3-4]",
    ),
    Case(
        "two Subscription Identifiers",
        5,
        hx("820b000a 04 0b01 0b02 000161 00"),
        PROTOCOL,
        "twice",
    ),
    Case(
        "Subscription Identifier 0 in SUBSCRIBE",
        5,
        hx("8209000a 02 0b00 000161 00"),
        PROTOCOL,
        "[3.8.2.1.2]",
    ),
    # ----------------------------------------------------------------- UNSUBSCRIBE
    Case("UNSUBSCRIBE without filters", 5, hx("a203000a00"), PROTOCOL, "[MQTT-3.10.3-2]"),
    Case("UNSUBSCRIBE without filters 3.1.1", 4, hx("a202000a"), PROTOCOL, "[MQTT-3.10.3-2]"),
    Case("UNSUBSCRIBE bad filter", 4, hx("a206000a 00026123"), PROTOCOL, "[MQTT-4.7.1-1]"),
    Case("UNSUBSCRIBE filter past end", 4, hx("a205000a 000261"), MALFORMED, "past the end"),
    # ----------------------------------------------------------------- SUBACK, UNSUBACK
    Case("3.1.1 SUBACK code 0x87", 4, hx("9003000a87"), PROTOCOL, "[MQTT-3.9.3-2]"),
    Case("SUBACK code 0x03", 5, hx("9004000a0003"), PROTOCOL, "reason code"),
    Case("SUBACK without codes", 5, hx("9003000a00"), PROTOCOL, "[MQTT-3.8.4-6]"),
    Case("UNSUBACK 5.0 without codes", 5, hx("b003000a00"), PROTOCOL, "[MQTT-3.11.3-1]"),
    Case("3.1.1 UNSUBACK with a payload", 4, hx("b003000a00"), MALFORMED, "after"),
    Case("UNSUBACK code 0x10", 5, hx("b004000a0010"), PROTOCOL, "reason code"),
    # ----------------------------------------------------------------- the rest
    Case("PINGREQ with a body", 5, hx("c00100"), MALFORMED, "after"),
    Case("PINGRESP with a body", 4, hx("d00100"), MALFORMED, "after"),
    Case("3.1.1 DISCONNECT with a body", 4, hx("e00100"), MALFORMED, "Remaining Length 0"),
    Case("DISCONNECT reason 0x03", 5, hx("e00103"), PROTOCOL, "reason code"),
    Case(
        "DISCONNECT with a CONNACK property",
        5,
        hx("e005 00 03 130001"),
        MALFORMED,
        "SERVER_KEEP_ALIVE",
    ),
    Case("AUTH without a method", 5, hx("f000"), PROTOCOL, "[3.15.2.2.2]"),
    Case("AUTH with reason only", 5, hx("f00118"), MALFORMED, "property length"),
    Case("AUTH reason 0x01", 5, hx("f008 01 06 1500036d6574"), PROTOCOL, "reason code"),
    Case("AUTH with empty properties", 5, hx("f0021800"), PROTOCOL, "[3.15.2.2.2]"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_decoder_refuses(case: Case) -> None:
    decoder = Decoder(case.level)
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(case.wire)
    assert caught.value.reason_code == case.reason, str(caught.value)
    assert case.rule in str(caught.value)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_decoder_refuses_byte_by_byte(case: Case) -> None:
    """The same error when the bytes come one at a time."""
    decoder = Decoder(case.level)
    with pytest.raises(ProtocolError) as caught:
        for index in range(len(case.wire)):
            decoder.feed(case.wire[index : index + 1])
    assert caught.value.reason_code == case.reason
    assert case.rule in str(caught.value)


def test_error_type() -> None:
    """One codec error, in the project's tree, a ValueError, carrying a reason code."""
    with pytest.raises(ProtocolError) as caught:
        Decoder(5).feed(hx("0000"))
    error = caught.value
    assert isinstance(error, InvalidInput)
    assert isinstance(error, RiverbedError)
    assert isinstance(error, ValueError)
    assert error.reason_code == MALFORMED


def test_reason_codes_exist_where_they_are_sent() -> None:
    """An error on the CONNECT goes out in a CONNACK, any later one in a DISCONNECT:
    every code the codec raises is a member of the enum it will be sent as."""
    for code in (MALFORMED, PROTOCOL, VERSION, CLIENT_ID, TOO_LARGE):
        assert ConnectReason(code)
    for code in (MALFORMED, PROTOCOL, ALIAS, TOO_LARGE):
        assert DisconnectReason(code)


# --------------------------------------------------------------------- valid edge cases

ACCEPTED = [
    ("User Property repeated with the same name", 5, publish5("2600016b000176 2600016b000177")),
    ("Subscription Identifiers repeated in PUBLISH", 5, publish5("0b01 0b01 0bffffff7f")),
    ("empty Topic Name with a Topic Alias", 5, publish5("230001", topic="0000")),
    ("password without user name in 5.0", 5, connect(5, "42", "000163 000170")),
    ("empty Client Identifier, Clean Start 0, 5.0", 5, connect(5, "00", "0000")),
    ("Remaining Length not minimal", 4, hx("c08000")),
    ("property length not minimal", 5, hx("3005 000161 8000")),
    ("control characters in a topic (a SHOULD NOT)", 4, hx("3004 00020107")),
    ("noncharacter U+FFFF in a topic (a SHOULD NOT)", 4, hx("3005 0003efbfbf")),
    ("Unsubscribe of a shared filter", 5, hx("a20f000a00 000a 2473686172652f672f61")),
    ("PUBACK with reason and no Property Length", 5, hx("4003000a80")),
    ("DISCONNECT with reason and no Property Length", 5, hx("e0018b")),
    ("Payload Format Indicator 1 with a non-UTF-8 payload", 5, publish5("0101") + b""),
]


@pytest.mark.parametrize(("name", "level", "wire"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_decoder_accepts(name: str, level: int, wire: bytes) -> None:
    packets = Decoder(level).feed(wire)
    assert len(packets) == 1
    assert Decoder(level).feed(encode(packets[0], level)) == packets


# --------------------------------------------------------------------- packets built in code


def build_cases() -> list[tuple[str, Callable[[], object], int, str]]:
    big = "a" * 65_536
    return [
        ("PUBLISH QoS 3", lambda: Publish("a", qos=3, packet_id=1), MALFORMED, "[MQTT-3.3.1-4]"),
        ("PUBLISH DUP on QoS 0", lambda: Publish("a", dup=True), MALFORMED, "[MQTT-3.3.1-2]"),
        ("PUBLISH QoS 1 without id", lambda: Publish("a", qos=1), PROTOCOL, "[MQTT-2.2.1-3]"),
        (
            "PUBLISH id 65536",
            lambda: Publish("a", qos=1, packet_id=65536),
            PROTOCOL,
            "[MQTT-2.2.1-3]",
        ),
        ("PUBLISH QoS 0 with id", lambda: Publish("a", packet_id=1), PROTOCOL, "[MQTT-2.2.1-2]"),
        ("PUBLISH to a/#", lambda: Publish("a/#"), PROTOCOL, "[MQTT-3.3.2-2]"),
        ("PUBLISH to ''", lambda: Publish(""), PROTOCOL, "[MQTT-4.7.3-1]"),
        ("PUBLISH str payload", lambda: Publish("a", "x"), PROTOCOL, "bytes"),  # type: ignore[arg-type]
        ("PUBLISH topic with surrogate", lambda: Publish("\udc00"), MALFORMED, "[MQTT-1.5.4-1]"),
        ("PUBLISH topic too long", lambda: Publish(big), MALFORMED, "65,535"),
        ("Topic Alias 0", lambda: PublishProperties(topic_alias=0), ALIAS, "[MQTT-3.3.2-8]"),
        ("Topic Alias 65536", lambda: PublishProperties(topic_alias=65536), ALIAS, "TOPIC_ALIAS"),
        (
            "Message Expiry 2**32",
            lambda: PublishProperties(message_expiry_interval=2**32),
            PROTOCOL,
            "MESSAGE_EXPIRY",
        ),
        (
            "Subscription Identifier 0",
            lambda: PublishProperties(subscription_identifiers=(0,)),
            PROTOCOL,
            "SUBSCRIPTION_IDENTIFIER",
        ),
        (
            "Subscription Identifier too big",
            lambda: PublishProperties(subscription_identifiers=(MAX_VBI + 1,)),
            PROTOCOL,
            "SUBSCRIPTION_IDENTIFIER",
        ),
        (
            "Response Topic a/+",
            lambda: PublishProperties(response_topic="a/+"),
            PROTOCOL,
            "RESPONSE_TOPIC",
        ),
        (
            "Correlation Data too long",
            lambda: PublishProperties(correlation_data=bytes(65_536)),
            MALFORMED,
            "CORRELATION_DATA",
        ),
        (
            "User Property with U+0000",
            lambda: PublishProperties(user_properties=(("a", "\x00"),)),
            MALFORMED,
            "[MQTT-1.5.4-2]",
        ),
        (
            "User Property not a pair",
            lambda: PublishProperties(user_properties=(("a",),)),
            PROTOCOL,
            "pair",
        ),  # type: ignore[arg-type]
        (
            "Payload Format Indicator 2",
            lambda: PublishProperties(payload_format_indicator=2),
            PROTOCOL,
            "PAYLOAD_FORMAT",
        ),
        (
            "Receive Maximum 0",
            lambda: ConnectProperties(receive_maximum=0),
            PROTOCOL,
            "RECEIVE_MAXIMUM",
        ),
        ("Maximum QoS 2", lambda: ConnackProperties(maximum_qos=2), PROTOCOL, "MAXIMUM_QOS"),
        (
            "Retain Available 2",
            lambda: ConnackProperties(retain_available=2),
            PROTOCOL,
            "RETAIN_AVAILABLE",
        ),  # type: ignore[arg-type]
        ("Keep Alive 65536", lambda: Connect("c", keep_alive=65536), PROTOCOL, "Keep Alive"),
        ("Client Identifier too long", lambda: Connect(big), MALFORMED, "65,535"),
        ("Password too long", lambda: Connect("c", password=bytes(65_536)), MALFORMED, "Password"),
        (
            "Auth Data without Method",
            lambda: Connect("c", properties=ConnectProperties(authentication_data=b"x")),
            PROTOCOL,
            "[3.1.2.11.10]",
        ),
        ("Will QoS 3", lambda: Will("a", qos=3), MALFORMED, "[MQTT-3.1.2-12]"),
        ("Will Topic a/#", lambda: Will("a/#"), PROTOCOL, "[MQTT-3.3.2-2]"),
        ("Will Payload too long", lambda: Will("a", bytes(65_536)), MALFORMED, "Will Payload"),
        (
            "Session Present on refusal",
            lambda: Connack(True, ConnectReason.BANNED),
            PROTOCOL,
            "[MQTT-3.2.2-6]",
        ),
        ("CONNACK reason 1", lambda: Connack(reason_code=1), PROTOCOL, "CONNACK reason code"),  # type: ignore[arg-type]
        ("PUBACK id 0", lambda: Puback(0), PROTOCOL, "[MQTT-2.2.1-3]"),
        ("PUBACK reason 5", lambda: Puback(1, 5), PROTOCOL, "PUBACK reason code"),  # type: ignore[arg-type]
        ("PUBREL reason 0x10", lambda: Pubrel(1, 0x10), PROTOCOL, "PUBREL reason code"),  # type: ignore[arg-type]
        ("SUBSCRIBE nothing", lambda: Subscribe(1, ()), PROTOCOL, "[MQTT-3.8.3-2]"),
        ("SUBSCRIBE filter a#", lambda: SubscribeTopic("a#"), PROTOCOL, "[MQTT-4.7.1-1]"),
        ("SUBSCRIBE QoS 3", lambda: SubscribeTopic("a", qos=3), PROTOCOL, "[3.8.3.1]"),
        (
            "SUBSCRIBE Retain Handling 3",
            lambda: SubscribeTopic("a", retain_handling=3),
            PROTOCOL,
            "[3.8.3.1]",
        ),  # type: ignore[arg-type]
        (
            "No Local on shared",
            lambda: SubscribeTopic("$share/g/a", no_local=True),
            PROTOCOL,
            "[MQTT-3.8.3-4]",
        ),
        (
            "shared without ShareName",
            lambda: SubscribeTopic("$share//a"),
            PROTOCOL,
            "[MQTT-4.8.2-1]",
        ),
        ("ShareName with +", lambda: SubscribeTopic("$share/+/a"), PROTOCOL, "[MQTT-4.8.2-1]"),
        ("shared without filter", lambda: SubscribeTopic("$share/g/"), PROTOCOL, "[MQTT-4.8.2-2]"),
        (
            "Subscription Identifier 0 in SUBSCRIBE",
            lambda: SubscribeProperties(subscription_identifier=0),
            PROTOCOL,
            "SUBSCRIPTION_IDENTIFIER",
        ),
        ("SUBACK nothing", lambda: Suback(1, ()), PROTOCOL, "[MQTT-3.8.4-6]"),
        ("UNSUBSCRIBE nothing", lambda: Unsubscribe(1, ()), PROTOCOL, "[MQTT-3.10.3-2]"),
        ("UNSUBSCRIBE bad filter", lambda: Unsubscribe(1, ("a/#/b",)), PROTOCOL, "[MQTT-4.7.1-1]"),
        ("UNSUBACK reason 0x10", lambda: Unsuback(1, (0x10,)), PROTOCOL, "UNSUBACK reason code"),  # type: ignore[arg-type]
        ("DISCONNECT reason 1", lambda: Disconnect(1), PROTOCOL, "DISCONNECT reason code"),  # type: ignore[arg-type]
        ("AUTH without method", lambda: Auth(), PROTOCOL, "[3.15.2.2.2]"),
    ]


@pytest.mark.parametrize(
    ("name", "build", "reason", "rule"), build_cases(), ids=[c[0] for c in build_cases()]
)
def test_building_refuses(name: str, build: Callable[[], object], reason: int, rule: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        build()
    assert caught.value.reason_code == reason, str(caught.value)
    assert rule in str(caught.value)


def test_building_normalizes() -> None:
    """Plain ints become the packet's reason enum; lists become tuples."""
    assert Puback(1, 0x10).reason_code is PubackReason.NO_MATCHING_SUBSCRIBERS  # type: ignore[arg-type]
    assert Suback(1, [0, 0x80]).reason_codes == (  # type: ignore[arg-type]
        SubackReason.GRANTED_QOS_0,
        SubackReason.UNSPECIFIED_ERROR,
    )
    assert Unsuback(1, [0x11]).reason_codes == (UnsubackReason.NO_SUBSCRIPTION_EXISTED,)  # type: ignore[arg-type]
    assert SubscribeTopic("a", retain_handling=2).retain_handling is RetainHandling.DO_NOT_SEND  # type: ignore[arg-type]
    props = PublishProperties(user_properties=[["k", "v"]])  # type: ignore[arg-type]
    assert props.user_properties == (("k", "v"),)
    assert hash(props) == hash(PublishProperties(user_properties=(("k", "v"),)))
    assert Subscribe(1, [SubscribeTopic("a")]).topics == (SubscribeTopic("a"),)  # type: ignore[arg-type]
    assert Unsubscribe(1, ["a"]).topic_filters == ("a",)  # type: ignore[arg-type]


def test_absent_and_default_properties_differ() -> None:
    """A property sent with its default value is not the same as one not sent."""
    sent = Connect("c", properties=ConnectProperties(session_expiry_interval=0))
    assert sent != Connect("c")
    assert Decoder(5).feed(encode(sent, 5)) == [sent]
    assert repr(sent.properties) == "ConnectProperties(session_expiry_interval=0)"


# --------------------------------------------------------------------- encode refuses at 3.1.1

V311_REFUSED: list[tuple[str, Packet]] = [
    ("PUBLISH properties", Publish("a", properties=PublishProperties(message_expiry_interval=1))),
    ("PUBLISH with a Topic Alias", Publish("", properties=PublishProperties(topic_alias=1))),
    ("PUBACK reason", Puback(1, PubackReason.QUOTA_EXCEEDED)),
    ("PUBACK properties", Puback(1, properties=AckProperties(reason_string="x"))),
    ("SUBACK 0x87", Suback(1, (SubackReason.NOT_AUTHORIZED,))),
    (
        "SUBACK properties",
        Suback(1, (SubackReason.GRANTED_QOS_0,), AckProperties(reason_string="x")),
    ),
    ("UNSUBACK reason codes", Unsuback(1, (UnsubackReason.SUCCESS,))),
    ("UNSUBACK properties", Unsuback(1, properties=AckProperties(reason_string="x"))),
    ("SUBSCRIBE No Local", Subscribe(1, (SubscribeTopic("a", no_local=True),))),
    (
        "SUBSCRIBE Retain As Published",
        Subscribe(1, (SubscribeTopic("a", retain_as_published=True),)),
    ),
    (
        "SUBSCRIBE Retain Handling",
        Subscribe(1, (SubscribeTopic("a", retain_handling=RetainHandling.DO_NOT_SEND),)),
    ),
    (
        "SUBSCRIBE properties",
        Subscribe(1, (SubscribeTopic("a"),), SubscribeProperties(subscription_identifier=1)),
    ),
    ("CONNACK Banned", Connack(reason_code=ConnectReason.BANNED)),
    ("CONNACK properties", Connack(properties=ConnackProperties(maximum_qos=1))),
    ("CONNECT properties", Connect("c", properties=ConnectProperties(session_expiry_interval=1))),
    (
        "Will properties",
        Connect("c", will=Will("w", properties=WillProperties(will_delay_interval=1))),
    ),
    ("password without user name", Connect("c", password=b"p")),
    ("empty Client Identifier, no CleanSession", Connect("", clean_start=False)),
    ("DISCONNECT reason", Disconnect(DisconnectReason.SERVER_SHUTTING_DOWN)),
    ("DISCONNECT properties", Disconnect(properties=DisconnectProperties(reason_string="x"))),
    ("AUTH", Auth(properties=AuthProperties(authentication_method="m"))),
]


@pytest.mark.parametrize(("name", "packet"), V311_REFUSED, ids=[c[0] for c in V311_REFUSED])
def test_encode_refuses_what_3_1_1_cannot_carry(name: str, packet: Packet) -> None:
    with pytest.raises(ProtocolError, match=r"MQTT 3\.1\.1 cannot carry"):
        encode(packet, 4)
    if not isinstance(packet, Unsuback) or packet.reason_codes:
        assert Decoder(5).feed(encode(packet, 5)) == [packet]


def test_encode_refuses_other_levels_and_sizes() -> None:
    for level in (3, 6, None):
        with pytest.raises(ProtocolError) as caught:
            encode(Pingreq(), level)  # type: ignore[arg-type]
        assert caught.value.reason_code == VERSION
    with pytest.raises(ProtocolError) as caught:
        encode(Unsuback(1), 5)
    assert "[MQTT-3.11.3-1]" in str(caught.value)
    with pytest.raises(ProtocolError) as caught:
        encode_vbi(MAX_VBI + 1)
    assert caught.value.reason_code == TOO_LARGE


def test_encode_uses_the_short_forms() -> None:
    assert encode(Puback(10), 5) == hx("4002000a")
    assert encode(Puback(10, properties=AckProperties()), 5) == hx("4002000a")
    assert encode(Pubrel(10, 0x92), 5) == hx("6203000a92")  # type: ignore[arg-type]
    assert encode(Disconnect(), 5) == hx("e000")
    assert encode(Disconnect(DisconnectReason.SERVER_BUSY), 5) == hx("e00189")


# --------------------------------------------------------------------- the decoder's own rules


def test_maximum_packet_size_is_refused_before_buffering() -> None:
    """The fixed header is enough: 0x95 before any of the body has arrived."""
    decoder = Decoder(5, max_packet_size=100)
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(hx("30 63"))  # Remaining Length 99: 101 bytes in all
    assert caught.value.reason_code == TOO_LARGE
    assert "101 bytes" in str(caught.value)
    exact = Decoder(4, max_packet_size=101)
    packet = Publish("a", bytes(96))
    assert exact.feed(encode(packet, 4)) == [packet]


def test_maximum_packet_size_applies_before_the_connect() -> None:
    decoder = Decoder(max_packet_size=64)
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(hx("10ffff7f"))
    assert caught.value.reason_code == TOO_LARGE


def test_five_byte_remaining_length_is_refused_at_its_fifth_byte() -> None:
    decoder = Decoder(5)
    assert decoder.feed(hx("30ffffff")) == []
    with pytest.raises(ProtocolError, match="four bytes"):
        decoder.feed(hx("ff"))


def test_level_is_known_even_when_the_connect_is_broken() -> None:
    """The connection answers in the client's protocol version (CONNACK or close)."""
    decoder = Decoder()
    with pytest.raises(ProtocolError):
        decoder.feed(connect(4, "03", "000163"))
    assert decoder.protocol_level == 4


def test_unsupported_level_stays_unknown() -> None:
    decoder = Decoder()
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(connect(3, "02", "000163"))
    assert caught.value.reason_code == VERSION
    assert decoder.protocol_level is None


def test_a_fixed_level_decoder_refuses_a_connect_of_another_level() -> None:
    with pytest.raises(ProtocolError) as caught:
        Decoder(5).feed(connect(4, "02", "000163"))
    assert caught.value.reason_code == VERSION


def test_a_fixed_level_decoder_takes_several_connects() -> None:
    """Only the server's side (level learned from the first packet) refuses a second."""
    wire = connect(5, "02", "000163")
    assert len(Decoder(5).feed(wire * 2)) == 2


def test_the_decoder_stays_broken() -> None:
    decoder = Decoder(4)
    with pytest.raises(ProtocolError) as first:
        decoder.feed(hx("c000 c100"))  # the PINGREQ before the broken one is dropped too
    for more in (b"", hx("c000")):
        with pytest.raises(ProtocolError) as again:
            decoder.feed(more)
        assert again.value.reason_code == first.value.reason_code
        assert str(again.value) == str(first.value)


def test_other_byte_types_are_accepted() -> None:
    packet = Publish("a", b"x")
    wire = encode(packet, 4)
    assert Decoder(4).feed(bytearray(wire)) == [packet]  # type: ignore[arg-type]
    assert Decoder(4).feed(memoryview(wire)) == [packet]  # type: ignore[arg-type]
    out = Decoder(4).feed(memoryview(wire))  # type: ignore[arg-type]
    assert type(out[0].payload) is bytes  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"protocol_level": 3},
        {"protocol_level": 6},
        {"max_packet_size": 1},
        {"max_packet_size": 268_435_461},
        {"max_packet_size": 10.5},
    ],
)
def test_decoder_settings_are_checked(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig):
        Decoder(**kwargs)  # type: ignore[arg-type]


def test_errors_pickle() -> None:
    import pickle

    error = ProtocolError(PROTOCOL, "a rule [MQTT-0.0.0-0]")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ProtocolError
    assert (copy.reason_code, str(copy)) == (PROTOCOL, str(error))


def test_packets_are_frozen_and_slotted() -> None:
    packet = Publish("a")
    with pytest.raises(AttributeError):
        packet.topic = "b"  # type: ignore[misc]
    assert not hasattr(packet, "__dict__")
    assert replace(packet, topic="b").topic == "b"
    with pytest.raises(ProtocolError):
        replace(packet, qos=1)
