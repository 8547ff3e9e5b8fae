"""Readers: the body of each packet type, from bytes to a packet (MQTT 5.0 §3).

Each reader gets the packet's bytes as `data[pos:end]` (the part after the fixed
header) and the protocol level, and returns the packet or raises
`ProtocolError`. Every read is bounded by `end`, never by `len(data)`: the
bytes after `end` belong to the next packet. Readers check what only the wire
shows (lengths, reserved bits, which fields a flag says are present, bytes left
over); the packet classes check the rest when the reader builds them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar, cast

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
    RetainHandling,
    Suback,
    Subscribe,
    SubscribeTopic,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import (
    EMPTY_PROPERTIES,
    NO_ACK_PROPERTIES,
    NO_CONNECT_PROPERTIES,
    NO_PUBLISH_PROPERTIES,
    NO_SUBSCRIBE_PROPERTIES,
    NO_UNSUBSCRIBE_PROPERTIES,
    NO_WILL_PROPERTIES,
    PROPERTY_NAMES,
    AckProperties,
    AnyProperties,
    AuthProperties,
    ConnackProperties,
    ConnectProperties,
    DisconnectProperties,
    PropertySpec,
    PublishProperties,
    SubscribeProperties,
    UnsubscribeProperties,
    WillProperties,
    check_range,
)
from .reasons import (
    CONNACK_RETURN_CODES,
    SUBACK_REASONS_V311,
    AuthReason,
    ConnectReason,
    DisconnectReason,
    PubackReason,
    PubcompReason,
    PubrecReason,
    PubrelReason,
    SubackReason,
    UnsubackReason,
)
from .wire import (
    CLIENT_IDENTIFIER_NOT_VALID,
    UNSUPPORTED_PROTOCOL_VERSION,
    check_topic_name,
    decode_binary,
    decode_string,
    decode_utf8,
    decode_vbi,
    malformed,
    protocol_error,
)

E = TypeVar("E", bound=IntEnum)


def _members(enum: type[E]) -> dict[int, E]:
    return {member.value: member for member in enum}


_PUBACK = _members(PubackReason)
_PUBREC = _members(PubrecReason)
_PUBREL = _members(PubrelReason)
_PUBCOMP = _members(PubcompReason)
_SUBACK = _members(SubackReason)
_UNSUBACK = _members(UnsubackReason)
_CONNACK = _members(ConnectReason)
_DISCONNECT = _members(DisconnectReason)
_AUTH = _members(AuthReason)
_RETAIN_HANDLING = tuple(RetainHandling)


def _reason(table: dict[int, E], value: int, packet: str) -> E:
    member = table.get(value)
    if member is None:
        # e.g. [MQTT-3.4.2-1] "MUST use one of the PUBACK Reason Codes".
        raise protocol_error(f"{packet} has reason code 0x{value:02X}, not one of its reason codes")
    return member


def _end_check(pos: int, end: int, packet: str) -> None:
    if pos != end:
        raise malformed(f"{packet} has {end - pos} bytes after its last field")


def _packet_id(data: bytes, pos: int, end: int, packet: str) -> int:
    if pos + 2 > end:
        raise malformed(f"{packet} ends before its Packet Identifier")
    return (data[pos] << 8) | data[pos + 1]


# --------------------------------------------------------------------- PUBLISH

_CACHE_LIMIT = 4096
_CACHEABLE_LENGTH = 256
_topic_names: dict[bytes, str] = {}
"""A PUBLISH Topic Name's UTF-8 -> its text, for the names a client publishes to
again and again (decoding is checked once per name; bounded like the encoder's
cache). Whether the name is valid is the `Publish`'s check, cached too."""


def read_publish(level: int, first: int, data: bytes, pos: int, end: int) -> Publish:
    """PUBLISH (§3.3), the packet a broker reads most: written out flat. Its
    fixed header flags are DUP, QoS and RETAIN (§3.3.1), so it gets the first byte."""
    qos = (first >> 1) & 0x03
    if qos == 3:
        raise malformed("PUBLISH has both QoS bits set [MQTT-3.3.1-4]")
    if pos + 2 > end:
        raise malformed("PUBLISH ends before its Topic Name")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise malformed("PUBLISH Topic Name runs past the end of the packet")
    raw = data[pos + 2 : stop]
    topic = _topic_names.get(raw)
    if topic is None:
        topic = decode_utf8(raw, "PUBLISH Topic Name")
        if len(raw) <= _CACHEABLE_LENGTH:
            if len(_topic_names) >= _CACHE_LIMIT:
                _topic_names.clear()
            _topic_names[raw] = topic
    pos = stop
    packet_id = None
    if qos:
        if pos + 2 > end:
            raise malformed("PUBLISH ends before its Packet Identifier")
        packet_id = (data[pos] << 8) | data[pos + 1]
        pos += 2
    props = NO_PUBLISH_PROPERTIES
    if level == 5:
        if pos >= end:
            raise malformed("PUBLISH ends before its Property Length")
        if data[pos]:
            props, pos = read_properties(PublishProperties, data, pos, end, "PUBLISH")
        else:
            pos += 1
    return Publish(
        topic, data[pos:end], qos, bool(first & 0x01), bool(first & 0x08), packet_id, props
    )


# --------------------------------------------------------------------- CONNECT


def read_protocol(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The CONNECT's Protocol Name and Version (§3.1.2.1, §3.1.2.2): (level, next position).

    Read apart from the rest so that the decoder knows the level (and so how to
    answer) even when something later in the CONNECT is wrong.
    """
    name, pos = decode_string(data, pos, end, "CONNECT Protocol Name")
    if pos >= end:
        raise malformed("CONNECT ends before its Protocol Version")
    level = data[pos]
    if name == "MQIsdp" and level == 3:
        # MQTT 3.1 predates the OASIS standard; Riverbed does not speak it.
        raise ProtocolError(
            UNSUPPORTED_PROTOCOL_VERSION,
            "MQTT 3.1 (MQIsdp, level 3) is not supported; use MQTT 3.1.1 or 5.0",
        )
    if name != "MQTT":
        raise ProtocolError(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"CONNECT Protocol Name is {name!r}, not 'MQTT' [MQTT-3.1.2-1]",
        )
    if level != 4 and level != 5:
        raise ProtocolError(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"CONNECT Protocol Version {level} is not supported: 4 (MQTT 3.1.1) or"
            " 5 (MQTT 5.0) [MQTT-3.1.2-2]",
        )
    return level, pos + 1


def read_connect(level: int, data: bytes, pos: int, end: int) -> Connect:
    """The CONNECT after its Protocol Version (§3.1.2.3 on), at `level`."""
    v5 = level == 5
    if pos + 3 > end:
        raise malformed("CONNECT ends before its Connect Flags and Keep Alive")
    flags = data[pos]
    keep_alive = (data[pos + 1] << 8) | data[pos + 2]
    pos += 3
    if flags & 0x01:
        raise malformed("CONNECT reserved flag is 1 [MQTT-3.1.2-3]")
    has_will = flags & 0x04
    will_qos = (flags >> 3) & 0x03
    will_retain = flags & 0x20
    if not has_will and (will_qos or will_retain):
        # 5.0 [MQTT-3.1.2-11], [MQTT-3.1.2-13]; 3.1.1 [MQTT-3.1.2-13], [MQTT-3.1.2-15].
        raise malformed("CONNECT without a Will sets Will QoS or Will Retain [MQTT-3.1.2-11, -13]")
    if will_qos == 3:
        # 5.0 [MQTT-3.1.2-12] and §3.1.2.6: a Malformed Packet; 3.1.1 [MQTT-3.1.2-14].
        raise malformed("CONNECT Will QoS is 3 [MQTT-3.1.2-12]")
    has_username = flags & 0x80
    has_password = flags & 0x40
    if has_password and not has_username and not v5:
        raise protocol_error(
            "MQTT 3.1.1 CONNECT with a password but no user name [MQTT-3.1.2-22] (3.1.1)"
        )
    props = NO_CONNECT_PROPERTIES
    if v5:
        props, pos = read_properties(ConnectProperties, data, pos, end, "CONNECT")
    # [MQTT-3.1.3-1] payload order: ClientID, Will Properties, Will Topic, Will
    # Payload, User Name, Password, each present exactly when its flag says so.
    client_id, pos = decode_string(data, pos, end, "CONNECT Client Identifier")
    will = None
    if has_will:
        will_props = NO_WILL_PROPERTIES
        if v5:
            will_props, pos = read_properties(WillProperties, data, pos, end, "Will")
        will_topic, pos = decode_string(data, pos, end, "CONNECT Will Topic")
        will_payload, pos = decode_binary(data, pos, end, "CONNECT Will Payload")
        will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
    username = password = None
    if has_username:
        username, pos = decode_string(data, pos, end, "CONNECT User Name")
    if has_password:
        password, pos = decode_binary(data, pos, end, "CONNECT Password")
    _end_check(pos, end, "CONNECT")
    clean_start = bool(flags & 0x02)
    if not v5 and not client_id and not clean_start:
        raise ProtocolError(
            CLIENT_IDENTIFIER_NOT_VALID,
            "MQTT 3.1.1 CONNECT with an empty Client Identifier must set CleanSession"
            " [MQTT-3.1.3-8] (3.1.1)",
        )
    return Connect(client_id, clean_start, keep_alive, username, password, will, props)


# --------------------------------------------------------------------- server to client


def read_connack(level: int, data: bytes, pos: int, end: int) -> Packet:
    if end - pos < 2:
        raise malformed("CONNACK ends before its reason code")
    flags = data[pos]
    if flags & 0xFE:
        raise malformed("CONNACK reserved flag bits are set [MQTT-3.2.2-1]")
    code = data[pos + 1]
    if level == 4:
        _end_check(pos + 2, end, "MQTT 3.1.1 CONNACK")
        reason = CONNACK_RETURN_CODES.get(code)
        if reason is None:
            raise protocol_error(f"MQTT 3.1.1 CONNACK return code {code} is reserved")
        return Connack(bool(flags), reason)
    reason = _reason(_CONNACK, code, "CONNACK")
    props, pos = read_properties(ConnackProperties, data, pos + 2, end, "CONNACK")
    _end_check(pos, end, "CONNACK")
    return Connack(bool(flags), reason, props)


def read_suback(level: int, data: bytes, pos: int, end: int) -> Packet:
    packet_id = _packet_id(data, pos, end, "SUBACK")
    pos += 2
    props = NO_ACK_PROPERTIES
    if level == 5:
        props, pos = read_properties(AckProperties, data, pos, end, "SUBACK")
    codes = []
    for code in data[pos:end]:
        reason = _reason(_SUBACK, code, "SUBACK")
        if level == 4 and reason not in SUBACK_REASONS_V311:
            raise protocol_error(
                f"MQTT 3.1.1 SUBACK return code 0x{code:02X} is reserved [MQTT-3.9.3-2]"
            )
        codes.append(reason)
    return Suback(packet_id, tuple(codes), props)


def read_unsuback(level: int, data: bytes, pos: int, end: int) -> Packet:
    packet_id = _packet_id(data, pos, end, "UNSUBACK")
    if level == 4:
        _end_check(pos + 2, end, "MQTT 3.1.1 UNSUBACK")
        return Unsuback(packet_id)
    props, pos = read_properties(AckProperties, data, pos + 2, end, "UNSUBACK")
    codes = tuple(_reason(_UNSUBACK, code, "UNSUBACK") for code in data[pos:end])
    if not codes:
        raise protocol_error("UNSUBACK needs a reason code per Topic Filter [MQTT-3.11.3-1]")
    return Unsuback(packet_id, codes, props)


def read_pingresp(level: int, data: bytes, pos: int, end: int) -> Packet:
    _end_check(pos, end, "PINGRESP")
    return Pingresp()


# --------------------------------------------------------------------- client to server


def read_subscribe(level: int, data: bytes, pos: int, end: int) -> Packet:
    packet_id = _packet_id(data, pos, end, "SUBSCRIBE")
    pos += 2
    v5 = level == 5
    props = NO_SUBSCRIBE_PROPERTIES
    if v5:
        props, pos = read_properties(SubscribeProperties, data, pos, end, "SUBSCRIBE")
    topics = []
    while pos < end:
        topic_filter, pos = decode_string(data, pos, end, "SUBSCRIBE Topic Filter")
        if pos >= end:
            raise malformed(f"SUBSCRIBE Topic Filter {topic_filter!r} has no options byte")
        options = data[pos]
        pos += 1
        if not v5:
            if options > 2:
                raise malformed(
                    "MQTT 3.1.1 SUBSCRIBE Requested QoS byte must be 0, 1 or 2"
                    " [MQTT-3.8.3-4] (3.1.1)"
                )
            topics.append(SubscribeTopic(topic_filter, options))
            continue
        if options & 0xC0:
            raise malformed("SUBSCRIBE options reserved bits are set [MQTT-3.8.3-5]")
        retain_handling = options >> 4
        if retain_handling == 3:
            # §3.8.3.1: "It is a Protocol Error to send a Retain Handling value of 3".
            raise protocol_error("SUBSCRIBE Retain Handling is 3 [3.8.3.1]")
        topics.append(
            SubscribeTopic(
                topic_filter,
                options & 0x03,
                bool(options & 0x04),
                bool(options & 0x08),
                _RETAIN_HANDLING[retain_handling],
            )
        )
    return Subscribe(packet_id, tuple(topics), props)


def read_unsubscribe(level: int, data: bytes, pos: int, end: int) -> Packet:
    packet_id = _packet_id(data, pos, end, "UNSUBSCRIBE")
    pos += 2
    props = NO_UNSUBSCRIBE_PROPERTIES
    if level == 5:
        props, pos = read_properties(UnsubscribeProperties, data, pos, end, "UNSUBSCRIBE")
    filters = []
    while pos < end:
        topic_filter, pos = decode_string(data, pos, end, "UNSUBSCRIBE Topic Filter")
        filters.append(topic_filter)
    return Unsubscribe(packet_id, tuple(filters), props)


def read_pingreq(level: int, data: bytes, pos: int, end: int) -> Packet:
    _end_check(pos, end, "PINGREQ")
    return Pingreq()


# --------------------------------------------------------------------- either way


def _ack(
    level: int, data: bytes, pos: int, end: int, table: dict[int, E], packet: str
) -> tuple[int, E, AckProperties]:
    """PUBACK, PUBREC, PUBREL, PUBCOMP: Packet Identifier, then in MQTT 5 an
    optional reason code (Remaining Length 2: Success) and optional properties
    (Remaining Length 3: none), §3.4.2.1 and §3.4.2.2.1. MQTT 3.1.1: exactly 2."""
    packet_id = _packet_id(data, pos, end, packet)
    length = end - pos
    if length == 2:
        return packet_id, table[0], NO_ACK_PROPERTIES
    if level == 4:
        raise malformed(f"an MQTT 3.1.1 {packet} has Remaining Length 2, not {length}")
    reason = _reason(table, data[pos + 2], packet)
    if length == 3:
        return packet_id, reason, NO_ACK_PROPERTIES
    props, pos = read_properties(AckProperties, data, pos + 3, end, packet)
    _end_check(pos, end, packet)
    return packet_id, reason, props


def read_puback(level: int, data: bytes, pos: int, end: int) -> Packet:
    if end - pos == 2:  # Success without properties: the common form at both levels
        return Puback((data[pos] << 8) | data[pos + 1])
    return Puback(*_ack(level, data, pos, end, _PUBACK, "PUBACK"))


def read_pubrec(level: int, data: bytes, pos: int, end: int) -> Packet:
    if end - pos == 2:  # Success without properties: the common form at both levels
        return Pubrec((data[pos] << 8) | data[pos + 1])
    return Pubrec(*_ack(level, data, pos, end, _PUBREC, "PUBREC"))


def read_pubrel(level: int, data: bytes, pos: int, end: int) -> Packet:
    if end - pos == 2:  # Success without properties: the common form at both levels
        return Pubrel((data[pos] << 8) | data[pos + 1])
    return Pubrel(*_ack(level, data, pos, end, _PUBREL, "PUBREL"))


def read_pubcomp(level: int, data: bytes, pos: int, end: int) -> Packet:
    if end - pos == 2:  # Success without properties: the common form at both levels
        return Pubcomp((data[pos] << 8) | data[pos + 1])
    return Pubcomp(*_ack(level, data, pos, end, _PUBCOMP, "PUBCOMP"))


def read_disconnect(level: int, data: bytes, pos: int, end: int) -> Packet:
    if pos == end:
        return Disconnect()
    if level == 4:
        raise malformed("an MQTT 3.1.1 DISCONNECT has Remaining Length 0")
    reason = _reason(_DISCONNECT, data[pos], "DISCONNECT")
    if pos + 1 == end:
        return Disconnect(reason)
    props, pos = read_properties(DisconnectProperties, data, pos + 1, end, "DISCONNECT")
    _end_check(pos, end, "DISCONNECT")
    return Disconnect(reason, props)


def read_auth(level: int, data: bytes, pos: int, end: int) -> Packet:
    if pos == end:
        # The short form (Success, no properties) lacks the mandatory
        # Authentication Method (§3.15.2.2.2).
        raise protocol_error("AUTH without an Authentication Method [3.15.2.2.2]")
    reason = _reason(_AUTH, data[pos], "AUTH")
    props, pos = read_properties(AuthProperties, data, pos + 1, end, "AUTH")
    _end_check(pos, end, "AUTH")
    return Auth(reason, props)


Reader = Callable[[int, bytes, int, int], Packet]
READERS: dict[int, Reader] = {
    2: read_connack,
    4: read_puback,
    5: read_pubrec,
    6: read_pubrel,
    7: read_pubcomp,
    8: read_subscribe,
    9: read_suback,
    10: read_unsubscribe,
    11: read_unsuback,
    12: read_pingreq,
    13: read_pingresp,
    14: read_disconnect,
    15: read_auth,
}
"""Packet type -> reader, for all but CONNECT and PUBLISH, which the decoder
reads itself (CONNECT sets the level; PUBLISH needs its flags)."""


# --------------------------------------------------------------------- properties

_BY_ID: dict[type, dict[int, PropertySpec]] = {
    type(empty): {spec.id.value: spec for spec in empty.SPECS}
    for empty in EMPTY_PROPERTIES.values()
}
_SLOTS: dict[type, tuple[tuple[str, object, Callable[[object, object], None]], ...]] = {
    type(empty): tuple(
        (spec.attr, spec.default, type(empty).__dict__[spec.attr].__set__) for spec in empty.SPECS
    )
    for empty in EMPTY_PROPERTIES.values()
}
"""Per properties class: each attribute, its value when absent, and its slot's setter."""

PropertiesT = TypeVar("PropertiesT", bound=AnyProperties)


def read_properties(
    cls: type[PropertiesT], data: bytes, pos: int, end: int, where: str
) -> tuple[PropertiesT, int]:
    """Read Property Length and Properties at `pos` into a `cls`: (properties, next position).

    An identifier the packet does not allow, or that no property has, is a
    Malformed Packet (§2.2.2.2); a non-repeatable property that appears twice is
    a Protocol Error (each property's section: "It is a Protocol Error to
    include ... more than once"); a value out of its range is a Protocol Error
    (0x94 for Topic Alias 0, [MQTT-3.3.2-8] and §3.3.4).
    """
    try:
        return _read(cls, data, pos, end)
    except ProtocolError as exc:
        raise ProtocolError(exc.reason_code, f"{where} {exc}") from None


def _read(cls: type[PropertiesT], data: bytes, pos: int, end: int) -> tuple[PropertiesT, int]:
    length, pos = decode_vbi(data, pos, end, "property length")
    if length == 0:
        return cast(PropertiesT, EMPTY_PROPERTIES[cls]), pos
    stop = pos + length
    if stop > end:
        raise malformed("has properties that run past the end of the packet")
    specs = _BY_ID[cls]
    values: dict[str, Any] = {}
    while pos < stop:
        pid = data[pos]
        pos += 1
        spec = specs.get(pid)
        if spec is None:
            if pid in PROPERTY_NAMES:
                raise malformed(f"may not carry property {PROPERTY_NAMES[pid]} [2.2.2.2]")
            raise malformed(f"has unknown property identifier 0x{pid:02X} [2.2.2.2]")
        value, pos = _read_value(spec, data, pos, stop)
        if spec.repeatable:
            values[spec.attr] = (*values.get(spec.attr, ()), value)
        elif spec.attr in values:
            raise protocol_error(f"carries property {spec.name} twice [2.2.2.2]")
        else:
            values[spec.attr] = value
    # Every value is checked now (strings while decoding, ranges and topic names
    # in _read_value), so the object is built without checking it again.
    props = object.__new__(cls)
    get = values.get
    for attr, default, set_slot in _SLOTS[cls]:
        set_slot(props, get(attr, default))
    return props, stop


def _read_value(spec: PropertySpec, data: bytes, pos: int, stop: int) -> tuple[object, int]:
    kind = spec.kind
    if kind == "str":
        return decode_string(data, pos, stop, spec.label)
    if kind == "topic":
        topic, pos = decode_string(data, pos, stop, spec.label)
        check_topic_name(topic, spec.label)
        return topic, pos
    if kind == "bin":
        return decode_binary(data, pos, stop, spec.label)
    if kind == "pair":
        name, pos = decode_string(data, pos, stop, spec.label)
        text, pos = decode_string(data, pos, stop, spec.label)
        return (name, text), pos
    if kind == "vbi":
        value, pos = decode_vbi(data, pos, stop, spec.label)
    else:
        size = 1 if kind == "byte" or kind == "bool" else 2 if kind == "u16" else 4
        if pos + size > stop:
            raise malformed(f"property {spec.name} runs past the end of the properties")
        value = int.from_bytes(data[pos : pos + size], "big")
        pos += size
        if kind == "bool":
            if value > 1:
                raise protocol_error(
                    f"property {spec.name} is {value}; it must be 0 or 1 [{spec.rule}]"
                )
            return value == 1, pos
    if spec.ranged:
        check_range(spec, value)
    return value, pos
