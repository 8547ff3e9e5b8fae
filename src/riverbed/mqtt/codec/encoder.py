"""`encode(packet, protocol_level)`: a packet's bytes on the wire.

Encoding is lossless or refuses: `Decoder(level).feed(encode(p, level)) == [p]`
for every packet `encode` accepts. A packet that MQTT 3.1.1 cannot carry (any
property, a reason code other than success, an AUTH, the MQTT 5 subscription
options, a password without user name) raises `ProtocolError` at level 4
instead of losing the part that does not fit; the caller builds the 3.1.1 form
it means (for example `dataclasses.replace(publish, properties=...)`).

Where MQTT 5 allows a short form (an acknowledgement without reason code and
properties, §3.4.2.1; a DISCONNECT of Remaining Length 0, §3.14.2.1) the
encoder writes the shortest one. Packets were validated when they were built,
so only the rules that depend on the protocol level are checked here.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import assert_never, cast

from riverbed.errors import ProtocolError

from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .properties import (
    EMPTY_PROPERTIES,
    NO_ACK_PROPERTIES,
    NO_PUBLISH_PROPERTIES,
    AckProperties,
    AnyProperties,
    PropertySpec,
    PublishProperties,
    is_empty,
)
from .reasons import (
    CONNACK_REASONS_V311,
    SUBACK_REASONS_V311,
    PubackReason,
    PubcompReason,
    PubrecReason,
    PubrelReason,
)
from .wire import (
    MAX_VBI,
    PACKET_TOO_LARGE,
    UNSUPPORTED_PROTOCOL_VERSION,
    encode_binary,
    encode_string,
    encode_vbi,
    protocol_error,
)

_ONE_BYTE = tuple(bytes((value,)) for value in range(256))
_LITTLE_ENDIAN = sys.byteorder == "little"
_SPLICE_FROM = 10
_PROTOCOL_NAME = b"\x00\x04MQTT"

_CACHE_LIMIT = 4096
_CACHEABLE_LENGTH = 256
_encoded_topics: dict[str, bytes] = {}
"""Topic name -> its length-prefixed UTF-8, for the names a broker publishes to
again and again. Bounded like the decoder's name cache."""
_encoded_properties: dict[PublishProperties, bytes] = {}
"""PUBLISH properties -> their encoded form, for the property sets a broker
delivers again and again (a publisher's user properties on each of its messages:
one lookup instead of encoding each property). Small encodings only, bounded."""


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The bytes of `packet` at `protocol_level` (4: MQTT 3.1.1, 5: MQTT 5.0).

    Raises `ProtocolError` when the packet cannot be written at that level
    without losing something, or is larger than the protocol allows (0x95).
    """
    if protocol_level == 5:
        v5 = True
    elif protocol_level == 4:
        v5 = False
    else:
        raise ProtocolError(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"protocol level {protocol_level!r} is not supported: 4 (MQTT 3.1.1) or 5 (MQTT 5.0)",
        )
    match packet:
        case Publish():
            return _publish(packet, v5)
        case Puback():
            return _ack(0x40, packet.packet_id, packet.reason_code, packet.properties, v5)
        case Pubrec():
            return _ack(0x50, packet.packet_id, packet.reason_code, packet.properties, v5)
        case Pubrel():
            # [MQTT-3.6.1-1] PUBREL's fixed header flags are 0010.
            return _ack(0x62, packet.packet_id, packet.reason_code, packet.properties, v5)
        case Pubcomp():
            return _ack(0x70, packet.packet_id, packet.reason_code, packet.properties, v5)
        case Pingreq():
            return b"\xc0\x00"
        case Pingresp():
            return b"\xd0\x00"
        case Subscribe():
            return _subscribe(packet, v5)
        case Suback():
            return _suback(packet, v5)
        case Unsubscribe():
            return _unsubscribe(packet, v5)
        case Unsuback():
            return _unsuback(packet, v5)
        case Connect():
            return _connect(packet, protocol_level)
        case Connack():
            return _connack(packet, v5)
        case Disconnect():
            return _disconnect(packet, v5)
        case Auth():
            return _auth(packet, v5)
        case _:
            assert_never(packet)


def _frame(first: int, parts: list[bytes]) -> bytes:
    """Fixed header (type and flags, Remaining Length) and the parts after it."""
    length = sum(map(len, parts))
    if length < 0x80:
        parts.insert(0, bytes((first, length)))
    else:
        if length > MAX_VBI:
            raise ProtocolError(
                PACKET_TOO_LARGE,
                f"a packet of Remaining Length {length} is larger than MQTT allows ({MAX_VBI})",
            )
        parts.insert(0, _ONE_BYTE[first] + encode_vbi(length))
    return b"".join(parts)


def _v311_refuses(what: str) -> ProtocolError:
    return protocol_error(f"MQTT 3.1.1 cannot carry {what}; build the packet without it")


def _properties(props: AnyProperties, v5: bool, packet: str) -> bytes:
    """Encoded properties at level 5; at level 4 nothing, if there are none."""
    if v5:
        return encode_properties(props)
    if not is_empty(props):
        raise _v311_refuses(f"properties (the {packet} has {props})")
    return b""


# --------------------------------------------------------------------- PUBLISH


def _publish(packet: Publish, v5: bool) -> bytes:
    return encode_publish(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        packet.properties,
        v5,
    )


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: PublishProperties,
    v5: bool,
) -> bytes:
    """A PUBLISH's bytes from its fields, without building the packet: for a
    broker delivering what it already checked on the way in (a stored message's
    valid topic name, a packet id of its own). Anything else goes through
    `Publish`, which validates, and `encode`."""
    encoded_topic = _encoded_topics.get(topic)
    if encoded_topic is None:
        encoded_topic = encode_string(topic)
        if len(topic) <= _CACHEABLE_LENGTH:
            if len(_encoded_topics) >= _CACHE_LIMIT:
                _encoded_topics.clear()
            _encoded_topics[topic] = encoded_topic
    first = 0x30 | (qos << 1)
    if dup:
        first |= 0x08
    if retain:
        first |= 0x01
    parts = [encoded_topic]
    if qos:
        parts.append(packet_id.to_bytes(2, "big"))  # type: ignore[union-attr]
    if v5:
        if properties is NO_PUBLISH_PROPERTIES:
            parts.append(b"\x00")
        else:
            encoded = _encoded_properties.get(properties)
            if encoded is None:
                encoded = encode_properties(properties)
                if len(encoded) <= _CACHEABLE_LENGTH:
                    if len(_encoded_properties) >= _CACHE_LIMIT:
                        _encoded_properties.clear()
                    _encoded_properties[properties] = encoded
            parts.append(encoded)
    elif not is_empty(properties):
        # Also refuses an empty Topic Name: a Publish has one only with a Topic
        # Alias, which 3.1.1 does not know [MQTT-4.7.3-1].
        raise _v311_refuses(f"PUBLISH properties ({properties})")
    parts.append(payload)
    return _frame(first, parts)


# --------------------------------------------------------------------- acknowledgements


def _ack(first: int, packet_id: int, reason: int, props: AckProperties, v5: bool) -> bytes:
    """PUBACK, PUBREC, PUBREL, PUBCOMP (§3.4-§3.7): the reason code and property
    length are left out when they are Success and none (Remaining Length 2)."""
    pid = packet_id.to_bytes(2, "big")
    if props is NO_ACK_PROPERTIES or is_empty(props):
        if not reason:
            return bytes((first, 2)) + pid
        if not v5:
            raise _v311_refuses(f"a reason code ({reason!r})")
        # Remaining Length 3: "If the Remaining Length is less than 4 there is no
        # Property Length and the value of 0 is used" (§3.4.2.2.1).
        return bytes((first, 3)) + pid + _ONE_BYTE[reason]
    if not v5:
        raise _v311_refuses(f"acknowledgement properties ({props})")
    return _frame(first, [pid, _ONE_BYTE[reason], encode_properties(props)])


# The acknowledgements a broker sends for every QoS 1 and 2 PUBLISH, as bytes
# from their fields, so that nobody writes their fixed headers by hand. The
# success form is two fixed bytes and the packet id, the same at both levels.
_REASONS = {
    0x40: frozenset(PubackReason),
    0x50: frozenset(PubrecReason),
    0x62: frozenset(PubrelReason),
    0x70: frozenset(PubcompReason),
}
_ACK_NAMES = {0x40: "PUBACK", 0x50: "PUBREC", 0x62: "PUBREL", 0x70: "PUBCOMP"}


def encode_puback(packet_id: int, reason: int = 0, v5: bool = True) -> bytes:
    """A PUBACK's bytes (§3.4) without building a `Puback`: Remaining Length 2
    for Success, 3 with another reason code (MQTT 5 only; no properties).

    Raises `ProtocolError` for a packet id outside 1..65535 [MQTT-2.2.1-3], a
    reason code that is not a PUBACK's [MQTT-3.4.2-1], or one that MQTT 3.1.1
    cannot carry (`v5` False)."""
    if not reason and type(packet_id) is int and 0 < packet_id < 0x10000:
        return b"\x40\x02" + packet_id.to_bytes(2, "big")
    return _short_ack(0x40, packet_id, reason, v5)


def encode_pubrec(packet_id: int, reason: int = 0, v5: bool = True) -> bytes:
    """A PUBREC's bytes (§3.5), as `encode_puback` writes a PUBACK."""
    if not reason and type(packet_id) is int and 0 < packet_id < 0x10000:
        return b"\x50\x02" + packet_id.to_bytes(2, "big")
    return _short_ack(0x50, packet_id, reason, v5)


def encode_pubrel(packet_id: int, reason: int = 0, v5: bool = True) -> bytes:
    """A PUBREL's bytes (§3.6; fixed header flags 0010 [MQTT-3.6.1-1])."""
    if not reason and type(packet_id) is int and 0 < packet_id < 0x10000:
        return b"\x62\x02" + packet_id.to_bytes(2, "big")
    return _short_ack(0x62, packet_id, reason, v5)


def encode_pubcomp(packet_id: int, reason: int = 0, v5: bool = True) -> bytes:
    """A PUBCOMP's bytes (§3.7), as `encode_puback` writes a PUBACK."""
    if not reason and type(packet_id) is int and 0 < packet_id < 0x10000:
        return b"\x70\x02" + packet_id.to_bytes(2, "big")
    return _short_ack(0x70, packet_id, reason, v5)


def encode_pubacks(packet_ids: Sequence[int]) -> bytes:
    """Successful PUBACKs for `packet_ids`, back to back in one bytes object (the
    same bytes at both levels): what a broker writes after a commit that
    acknowledges many PUBLISHes of one connection at once."""
    if len(packet_ids) < _SPLICE_FROM:
        return b"".join([encode_puback(packet_id) for packet_id in packet_ids])
    try:
        ids = array("H", packet_ids)
        valid = 0 not in ids
    except (OverflowError, TypeError):
        valid = False
    if not valid:
        bad = next(i for i in packet_ids if type(i) is not int or not 0 < i < 0x10000)
        raise protocol_error(
            f"a PUBACK's Packet Identifier must be 1..65535, not {bad!r} [MQTT-2.2.1-3]"
        )
    # Splice the big-endian ids into a run of "40 02 00 00": cheaper from about
    # ten acknowledgements on than a bytes object per PUBACK (bench/mqtt_codec.py).
    if _LITTLE_ENDIAN:
        ids.byteswap()
    raw = ids.tobytes()
    out = bytearray(b"\x40\x02\x00\x00" * len(ids))
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return bytes(out)


def _short_ack(first: int, packet_id: int, reason: int, v5: bool) -> bytes:
    """The checked way of `encode_puback` and its siblings: anything but a
    Success with a valid packet id."""
    name = _ACK_NAMES[first]
    if type(packet_id) is not int or not 0 < packet_id < 0x10000:
        raise protocol_error(
            f"a {name}'s Packet Identifier must be 1..65535, not {packet_id!r} [MQTT-2.2.1-3]"
        )
    if reason not in _REASONS[first]:
        raise protocol_error(f"{name} has reason code {_hex(reason)}, not one of its reason codes")
    if not reason:
        return bytes((first, 2)) + packet_id.to_bytes(2, "big")
    if not v5:
        raise _v311_refuses(f"a {name} reason code ({_hex(reason)})")
    # Remaining Length 3, no Property Length (§3.4.2.2.1).
    return bytes((first, 3)) + packet_id.to_bytes(2, "big") + _ONE_BYTE[reason]


def _hex(reason: object) -> str:
    return f"0x{reason:02X}" if isinstance(reason, int) else repr(reason)


# --------------------------------------------------------------------- subscriptions


def _subscribe(packet: Subscribe, v5: bool) -> bytes:
    parts = [packet.packet_id.to_bytes(2, "big"), _properties(packet.properties, v5, "SUBSCRIBE")]
    for topic in packet.topics:
        options = topic.qos
        if topic.no_local:
            options |= 0x04
        if topic.retain_as_published:
            options |= 0x08
        options |= topic.retain_handling << 4
        if not v5 and options > 0x03:
            # 3.1.1 §3.8.3.1: bits 7-2 of the Requested QoS byte are reserved.
            raise _v311_refuses(
                f"No Local, Retain As Published or Retain Handling ({topic.topic_filter!r})"
            )
        parts.append(encode_string(topic.topic_filter))
        parts.append(_ONE_BYTE[options])
    # [MQTT-3.8.1-1] SUBSCRIBE's fixed header flags are 0010.
    return _frame(0x82, parts)


def _suback(packet: Suback, v5: bool) -> bytes:
    if not v5:
        for code in packet.reason_codes:
            if code not in SUBACK_REASONS_V311:
                # 3.1.1 [MQTT-3.9.3-2]: only 0x00, 0x01, 0x02 and 0x80.
                raise _v311_refuses(f"SUBACK reason {code.name}")
    parts = [packet.packet_id.to_bytes(2, "big"), _properties(packet.properties, v5, "SUBACK")]
    parts.append(bytes(packet.reason_codes))
    return _frame(0x90, parts)


def _unsubscribe(packet: Unsubscribe, v5: bool) -> bytes:
    parts = [
        packet.packet_id.to_bytes(2, "big"),
        _properties(packet.properties, v5, "UNSUBSCRIBE"),
    ]
    for topic_filter in packet.topic_filters:
        parts.append(encode_string(topic_filter))
    # [MQTT-3.10.1-1] UNSUBSCRIBE's fixed header flags are 0010.
    return _frame(0xA2, parts)


def _unsuback(packet: Unsuback, v5: bool) -> bytes:
    pid = packet.packet_id.to_bytes(2, "big")
    if not v5:
        if packet.reason_codes:
            raise _v311_refuses("UNSUBACK reason codes (its UNSUBACK has no payload)")
        _properties(packet.properties, v5, "UNSUBACK")
        return b"\xb0\x02" + pid
    if not packet.reason_codes:
        # [MQTT-3.11.3-1] one reason code per Topic Filter of the UNSUBSCRIBE.
        raise protocol_error("an MQTT 5 UNSUBACK needs a reason code per filter [MQTT-3.11.3-1]")
    parts = [pid, encode_properties(packet.properties), bytes(packet.reason_codes)]
    return _frame(0xB0, parts)


# --------------------------------------------------------------------- connection


def _connect(packet: Connect, level: int) -> bytes:
    v5 = level == 5
    will = packet.will
    flags = 0x02 if packet.clean_start else 0x00
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if packet.password is not None:
        flags |= 0x40
    if packet.username is not None:
        flags |= 0x80
    if not v5:
        if packet.password is not None and packet.username is None:
            raise _v311_refuses("a password without a user name [MQTT-3.1.2-22]")
        if not packet.client_id and not packet.clean_start:
            raise _v311_refuses(
                "an empty Client Identifier without CleanSession [MQTT-3.1.3-7] (3.1.1)"
            )
    parts = [
        _PROTOCOL_NAME,
        bytes((level, flags)),
        packet.keep_alive.to_bytes(2, "big"),
        _properties(packet.properties, v5, "CONNECT"),
        encode_string(packet.client_id),
    ]
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties))
        elif not is_empty(will.properties):
            raise _v311_refuses(f"Will properties ({will.properties})")
        parts.append(encode_string(will.topic))
        parts.append(encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_string(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return _frame(0x10, parts)


def _connack(packet: Connack, v5: bool) -> bytes:
    flags = b"\x01" if packet.session_present else b"\x00"
    if v5:
        return _frame(
            0x20, [flags, _ONE_BYTE[packet.reason_code], encode_properties(packet.properties)]
        )
    code = CONNACK_REASONS_V311.get(packet.reason_code)
    if code is None:
        # 3.1.1 [MQTT-3.2.2-6]: with none of its six return codes, a 3.1.1 server
        # closes the connection without a CONNACK.
        raise _v311_refuses(f"CONNACK reason {packet.reason_code.name}")
    _properties(packet.properties, v5, "CONNACK")
    return b"\x20\x02" + flags + _ONE_BYTE[code]


def _disconnect(packet: Disconnect, v5: bool) -> bytes:
    reason = packet.reason_code
    if is_empty(packet.properties):
        if not reason:
            # §3.14.2.1: Remaining Length 0 means Normal disconnection.
            return b"\xe0\x00"
        if not v5:
            raise _v311_refuses(f"a DISCONNECT reason ({reason.name})")
        # §3.14.2.2.1: "If the Remaining Length is less than 2, a value of 0 is used".
        return b"\xe0\x01" + _ONE_BYTE[reason]
    if not v5:
        raise _v311_refuses(f"DISCONNECT properties ({packet.properties})")
    return _frame(0xE0, [_ONE_BYTE[reason], encode_properties(packet.properties)])


def _auth(packet: Auth, v5: bool) -> bytes:
    if not v5:
        raise _v311_refuses("AUTH (MQTT 5 only)")
    # The Authentication Method is mandatory (§3.15.2.2.2), so the short form of
    # Remaining Length 0 never applies.
    return _frame(0xF0, [_ONE_BYTE[packet.reason_code], encode_properties(packet.properties)])


# --------------------------------------------------------------------- properties


def encode_properties(props: AnyProperties) -> bytes:
    """Property Length and Properties (§2.2.2); a lone zero byte when none [MQTT-2.2.2-1]."""
    if props is EMPTY_PROPERTIES[type(props)]:
        return b"\x00"
    parts: list[bytes] = []
    for spec in props.SPECS:
        value = getattr(props, spec.attr)
        if spec.repeatable:
            for item in value:
                parts.append(_encode_value(spec, item))
        elif value is not None:
            parts.append(_encode_value(spec, value))
    body = b"".join(parts)
    return encode_vbi(len(body)) + body


def _encode_value(spec: PropertySpec, value: object) -> bytes:
    """One property: identifier and value. The value was checked when its
    properties object was built, so only its wire form is computed here."""
    head = _ONE_BYTE[spec.id]
    kind = spec.kind
    if kind == "str" or kind == "topic":
        return head + encode_string(cast(str, value))
    if kind == "bin":
        return head + encode_binary(cast(bytes, value))
    if kind == "pair":
        name, text = cast(tuple[str, str], value)
        return head + encode_string(name) + encode_string(text)
    number = int(cast(int, value))
    if kind == "byte" or kind == "bool":
        return head + _ONE_BYTE[number]
    if kind == "u16":
        return head + number.to_bytes(2, "big")
    if kind == "u32":
        return head + number.to_bytes(4, "big")
    return head + encode_vbi(number)
