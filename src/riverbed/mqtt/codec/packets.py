"""MQTT control packets as frozen, slotted dataclasses that validate themselves.

One class per packet type of MQTT 5.0 (§3.1-§3.15); MQTT 3.1.1 uses the same
classes with no properties and success reason codes. Building a packet checks
every rule that does not depend on the protocol level and raises
`ProtocolError` with the reason code a receiver would answer with, so the
decoder builds its results through the same checks and an invalid packet can
neither be sent nor received. Rules that depend on the level (a property in a
3.1.1 packet, a password without user name in 3.1.1) are checked by `encode`
and by the `Decoder`.

Packet Identifiers are 1..65535 where a packet has one [MQTT-2.2.1-3]; a
PUBLISH has one exactly when its QoS is 1 or 2 [MQTT-2.2.1-2]. QoS is 0, 1 or 2.
Reason codes given as plain ints are turned into the packet's enum member.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from .properties import (
    NO_ACK_PROPERTIES,
    NO_AUTH_PROPERTIES,
    NO_CONNACK_PROPERTIES,
    NO_CONNECT_PROPERTIES,
    NO_DISCONNECT_PROPERTIES,
    NO_PUBLISH_PROPERTIES,
    NO_SUBSCRIBE_PROPERTIES,
    NO_UNSUBSCRIBE_PROPERTIES,
    NO_WILL_PROPERTIES,
    AckProperties,
    AuthProperties,
    ConnackProperties,
    ConnectProperties,
    DisconnectProperties,
    PublishProperties,
    SubscribeProperties,
    UnsubscribeProperties,
    WillProperties,
)
from .reasons import (
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
    MAX_UINT16,
    check_binary,
    check_string,
    check_topic_filter,
    check_topic_name,
    malformed,
    protocol_error,
)


class PacketType(IntEnum):
    """MQTT Control Packet type, bits 7-4 of the first byte (MQTT 5.0 §2.1.2).
    0 is reserved; AUTH (15) exists only in MQTT 5."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class RetainHandling(IntEnum):
    """Whether retained messages are sent when a subscription is made (MQTT 5.0
    §3.8.3.1, [MQTT-3.3.1-9..11])."""

    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


Reason = TypeVar("Reason", bound=IntEnum)


def _reason(enum: type[Reason], value: int, packet: str) -> Reason:
    """`value` as a member of `enum`; a value outside it is a Protocol Error
    (each packet's "MUST use one of the ... Reason Codes", e.g. [MQTT-3.4.2-1])."""
    if type(value) is enum:
        return value
    try:
        return enum(value)
    except ValueError:
        raise protocol_error(
            f"{packet} reason code {value!r} is not one of the {packet} reason codes"
        ) from None


def _set(obj: object, name: str, value: object) -> None:
    """Normalize a field of a frozen dataclass while it is being built."""
    object.__setattr__(obj, name, value)


def _check_packet_id(packet_id: object, packet: str) -> None:
    if type(packet_id) is not int or not 0 < packet_id <= MAX_UINT16:
        raise protocol_error(
            f"{packet} Packet Identifier must be 1..65535, not {packet_id!r} [MQTT-2.2.1-3]"
        )


def _check_qos(qos: object, what: str) -> None:
    if qos != 0 and qos != 1 and qos != 2:
        raise malformed(f"{what} QoS must be 0, 1 or 2, not {qos!r}")


# --------------------------------------------------------------------- CONNECT


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message of a CONNECT (MQTT 5.0 §3.1.2.5-§3.1.2.7, §3.1.3.2-§3.1.3.4)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: WillProperties = NO_WILL_PROPERTIES

    def __post_init__(self) -> None:
        # [MQTT-3.1.3-11] a UTF-8 Encoded String, published to: a topic name.
        check_topic_name(self.topic, "Will Topic")
        check_binary(self.payload, "Will Payload")
        # [MQTT-3.1.2-12] Will QoS 0, 1 or 2; 3 is a Malformed Packet (§3.1.2.6).
        _check_qos(self.qos, "Will [MQTT-3.1.2-12]")


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: the first packet a client sends (MQTT 5.0 §3.1).

    The protocol level is not a field: `encode(connect, level)` writes it and the
    `Decoder` reports it (`Decoder.protocol_level`). The user name is a UTF-8
    string [MQTT-3.1.3-12], the password Binary Data (§3.1.3.6).
    """

    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: ConnectProperties = NO_CONNECT_PROPERTIES

    def __post_init__(self) -> None:
        # [MQTT-3.1.3-4] the ClientID is a UTF-8 Encoded String; which ones a server
        # accepts beyond [MQTT-3.1.3-5] is the broker's policy, not the codec's.
        check_string(self.client_id, "Client Identifier [MQTT-3.1.3-4]")
        if type(self.keep_alive) is not int or not 0 <= self.keep_alive <= MAX_UINT16:
            raise protocol_error(f"Keep Alive must be 0..65535, not {self.keep_alive!r}")
        if self.username is not None:
            check_string(self.username, "User Name [MQTT-3.1.3-12]")
        if self.password is not None:
            check_binary(self.password, "Password")
        props = self.properties
        if props.authentication_data is not None and props.authentication_method is None:
            raise protocol_error(
                "CONNECT carries Authentication Data without an Authentication Method [3.1.2.11.10]"
            )


# --------------------------------------------------------------------- CONNACK


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK: the server's answer to CONNECT (MQTT 5.0 §3.2).

    In MQTT 3.1.1 only six reasons exist (`reasons.CONNACK_RETURN_CODES`).
    """

    session_present: bool = False
    reason_code: ConnectReason = ConnectReason.SUCCESS
    properties: ConnackProperties = NO_CONNACK_PROPERTIES

    def __post_init__(self) -> None:
        reason = _reason(ConnectReason, self.reason_code, "CONNACK")
        _set(self, "reason_code", reason)
        if self.session_present and reason:
            # [MQTT-3.2.2-6] (3.1.1: [MQTT-3.2.2-4]) a refusal never has a session.
            raise protocol_error(
                f"CONNACK with reason {reason.name} must not set Session Present [MQTT-3.2.2-6]"
            )


# --------------------------------------------------------------------- PUBLISH


@dataclass(frozen=True, slots=True, init=False)
class Publish:
    """PUBLISH: an Application Message, either way (MQTT 5.0 §3.3).

    `topic` may be empty only with a Topic Alias in the properties (MQTT 5.0
    §3.3.2.1); resolving the alias is the connection's job.
    """

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: PublishProperties = NO_PUBLISH_PROPERTIES

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: PublishProperties = NO_PUBLISH_PROPERTIES,
    ) -> None:
        # Written out instead of the dataclass's own: a frozen dataclass sets each
        # field through object.__setattr__, which is half the cost of building a
        # PUBLISH; the slots' setters take half as long. The decoder builds one
        # PUBLISH per message received, the broker one per delivery.
        _set_topic(self, topic)
        _set_payload(self, payload)
        _set_qos(self, qos)
        _set_retain(self, retain)
        _set_dup(self, dup)
        _set_packet_id(self, packet_id)
        _set_properties(self, properties)
        self.__post_init__()

    def __post_init__(self) -> None:
        qos = self.qos
        if qos:
            if qos != 1 and qos != 2:
                # [MQTT-3.3.1-4] both QoS bits set is a Malformed Packet.
                raise malformed(f"PUBLISH QoS must be 0, 1 or 2, not {qos!r} [MQTT-3.3.1-4]")
            _check_packet_id(self.packet_id, "PUBLISH")
        else:
            if self.dup:
                # [MQTT-3.3.1-2] DUP is 0 for every QoS 0 message; the flag is in the
                # fixed header, and invalid flags are a Malformed Packet (§2.1.3).
                raise malformed("PUBLISH with QoS 0 must not set DUP [MQTT-3.3.1-2]")
            if self.packet_id is not None:
                raise protocol_error("PUBLISH with QoS 0 has no Packet Identifier [MQTT-2.2.1-2]")
        topic = self.topic
        if topic or self.properties.topic_alias is None:
            # [MQTT-3.3.2-1] a UTF-8 string; [MQTT-3.3.2-2] without wildcards;
            # "" only with a Topic Alias (§3.3.2.1: otherwise a Protocol Error).
            check_topic_name(topic, "PUBLISH Topic Name")
        if type(self.payload) is not bytes:
            # The payload is the rest of the packet (§3.3.3): any length, but bytes.
            raise protocol_error(
                f"PUBLISH payload must be bytes, not {type(self.payload).__name__}"
            )


_set_topic, _set_payload, _set_qos, _set_retain, _set_dup, _set_packet_id, _set_properties = (
    Publish.__dict__[name].__set__
    for name in ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
)


# --------------------------------------------------------------------- acknowledgements


@dataclass(frozen=True, slots=True)
class Puback:
    """PUBACK: answer to a QoS 1 PUBLISH (MQTT 5.0 §3.4)."""

    packet_id: int
    reason_code: PubackReason = PubackReason.SUCCESS
    properties: AckProperties = NO_ACK_PROPERTIES

    def __init__(
        self,
        packet_id: int,
        reason_code: PubackReason = PubackReason.SUCCESS,
        properties: AckProperties = NO_ACK_PROPERTIES,
    ) -> None:
        # Written out through the slots' setters, as Publish's (a third of the cost
        # of the dataclass's own): a broker reads one per QoS 1 or 2 delivery.
        _PUBACK_SET[0](self, packet_id)
        _PUBACK_SET[1](self, reason_code)
        _PUBACK_SET[2](self, properties)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "PUBACK")
        if type(self.reason_code) is not PubackReason:
            _set(self, "reason_code", _reason(PubackReason, self.reason_code, "PUBACK"))


@dataclass(frozen=True, slots=True)
class Pubrec:
    """PUBREC: first answer to a QoS 2 PUBLISH (MQTT 5.0 §3.5)."""

    packet_id: int
    reason_code: PubrecReason = PubrecReason.SUCCESS
    properties: AckProperties = NO_ACK_PROPERTIES

    def __init__(
        self,
        packet_id: int,
        reason_code: PubrecReason = PubrecReason.SUCCESS,
        properties: AckProperties = NO_ACK_PROPERTIES,
    ) -> None:
        # Written out through the slots' setters, as Publish's (a third of the cost
        # of the dataclass's own): a broker reads one per QoS 1 or 2 delivery.
        _PUBREC_SET[0](self, packet_id)
        _PUBREC_SET[1](self, reason_code)
        _PUBREC_SET[2](self, properties)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "PUBREC")
        if type(self.reason_code) is not PubrecReason:
            _set(self, "reason_code", _reason(PubrecReason, self.reason_code, "PUBREC"))


@dataclass(frozen=True, slots=True)
class Pubrel:
    """PUBREL: answer to PUBREC (MQTT 5.0 §3.6)."""

    packet_id: int
    reason_code: PubrelReason = PubrelReason.SUCCESS
    properties: AckProperties = NO_ACK_PROPERTIES

    def __init__(
        self,
        packet_id: int,
        reason_code: PubrelReason = PubrelReason.SUCCESS,
        properties: AckProperties = NO_ACK_PROPERTIES,
    ) -> None:
        # Written out through the slots' setters, as Publish's (a third of the cost
        # of the dataclass's own): a broker reads one per QoS 1 or 2 delivery.
        _PUBREL_SET[0](self, packet_id)
        _PUBREL_SET[1](self, reason_code)
        _PUBREL_SET[2](self, properties)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "PUBREL")
        if type(self.reason_code) is not PubrelReason:
            _set(self, "reason_code", _reason(PubrelReason, self.reason_code, "PUBREL"))


@dataclass(frozen=True, slots=True)
class Pubcomp:
    """PUBCOMP: answer to PUBREL, the end of a QoS 2 exchange (MQTT 5.0 §3.7)."""

    packet_id: int
    reason_code: PubcompReason = PubcompReason.SUCCESS
    properties: AckProperties = NO_ACK_PROPERTIES

    def __init__(
        self,
        packet_id: int,
        reason_code: PubcompReason = PubcompReason.SUCCESS,
        properties: AckProperties = NO_ACK_PROPERTIES,
    ) -> None:
        # Written out through the slots' setters, as Publish's (a third of the cost
        # of the dataclass's own): a broker reads one per QoS 1 or 2 delivery.
        _PUBCOMP_SET[0](self, packet_id)
        _PUBCOMP_SET[1](self, reason_code)
        _PUBCOMP_SET[2](self, properties)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "PUBCOMP")
        if type(self.reason_code) is not PubcompReason:
            _set(self, "reason_code", _reason(PubcompReason, self.reason_code, "PUBCOMP"))


_PUBACK_SET, _PUBREC_SET, _PUBREL_SET, _PUBCOMP_SET = (
    tuple(cls.__dict__[name].__set__ for name in ("packet_id", "reason_code", "properties"))
    for cls in (Puback, Pubrec, Pubrel, Pubcomp)
)


# --------------------------------------------------------------------- SUBSCRIBE


@dataclass(frozen=True, slots=True)
class SubscribeTopic:
    """One Topic Filter of a SUBSCRIBE and its Subscription Options (MQTT 5.0 §3.8.3.1).

    MQTT 3.1.1 has only the QoS; the other options must keep their defaults there.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: RetainHandling = RetainHandling.SEND_ON_SUBSCRIBE

    def __post_init__(self) -> None:
        # [MQTT-3.8.3-1] a UTF-8 string, and a valid filter ([MQTT-4.7.1-1/2], [MQTT-4.8.2-1/2]).
        shared = check_topic_filter(self.topic_filter, "SUBSCRIBE Topic Filter")
        if self.qos != 0 and self.qos != 1 and self.qos != 2:
            # §3.8.3.1: "It is a Protocol Error if the Maximum QoS field has the value 3".
            raise protocol_error(
                f"SUBSCRIBE Maximum QoS must be 0, 1 or 2, not {self.qos!r} [3.8.3.1]"
            )
        if type(self.retain_handling) is not RetainHandling:
            try:
                _set(self, "retain_handling", RetainHandling(self.retain_handling))
            except ValueError:
                # §3.8.3.1: "It is a Protocol Error to send a Retain Handling value of 3".
                raise protocol_error(
                    f"SUBSCRIBE Retain Handling must be 0, 1 or 2, not {self.retain_handling!r}"
                    " [3.8.3.1]"
                ) from None
        if shared and self.no_local:
            raise protocol_error(
                f"No Local on the shared subscription {self.topic_filter!r} [MQTT-3.8.3-4]"
            )


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: one or more filters to subscribe to (MQTT 5.0 §3.8)."""

    packet_id: int
    topics: tuple[SubscribeTopic, ...]
    properties: SubscribeProperties = NO_SUBSCRIBE_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "SUBSCRIBE")
        if type(self.topics) is not tuple:
            _set(self, "topics", tuple(self.topics))
        if not self.topics:
            raise protocol_error("SUBSCRIBE needs at least one Topic Filter [MQTT-3.8.3-2]")
        for topic in self.topics:
            if type(topic) is not SubscribeTopic:
                raise protocol_error(f"SUBSCRIBE topics must be SubscribeTopic, not {topic!r}")


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK: one reason code per filter of the SUBSCRIBE, in order (MQTT 5.0 §3.9)."""

    packet_id: int
    reason_codes: tuple[SubackReason, ...]
    properties: AckProperties = NO_ACK_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "SUBACK")
        codes = tuple(_reason(SubackReason, code, "SUBACK") for code in self.reason_codes)
        _set(self, "reason_codes", codes)
        if not codes:
            # [MQTT-3.8.4-6] one reason code per Topic Filter, and there is at least one.
            raise protocol_error("SUBACK needs at least one reason code [MQTT-3.8.4-6]")


# --------------------------------------------------------------------- UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: one or more filters to drop (MQTT 5.0 §3.10)."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: UnsubscribeProperties = NO_UNSUBSCRIBE_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "UNSUBSCRIBE")
        if type(self.topic_filters) is not tuple:
            _set(self, "topic_filters", tuple(self.topic_filters))
        if not self.topic_filters:
            raise protocol_error("UNSUBSCRIBE needs at least one Topic Filter [MQTT-3.10.3-2]")
        for topic_filter in self.topic_filters:
            # [MQTT-3.10.3-1] UTF-8 strings; filters, so the filter rules apply.
            check_topic_filter(topic_filter, "UNSUBSCRIBE Topic Filter")


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK (MQTT 5.0 §3.11): one reason code per filter in MQTT 5
    [MQTT-3.11.3-1]; none in MQTT 3.1.1, whose UNSUBACK has no payload."""

    packet_id: int
    reason_codes: tuple[UnsubackReason, ...] = ()
    properties: AckProperties = NO_ACK_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "UNSUBACK")
        codes = tuple(_reason(UnsubackReason, code, "UNSUBACK") for code in self.reason_codes)
        _set(self, "reason_codes", codes)


# --------------------------------------------------------------------- the rest


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ: keep-alive probe from the client (MQTT 5.0 §3.12)."""


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP: the server's answer to PINGREQ (MQTT 5.0 §3.13)."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: the last packet either side sends (MQTT 5.0 §3.14). MQTT 3.1.1
    has only the client's, without reason or properties."""

    reason_code: DisconnectReason = DisconnectReason.NORMAL_DISCONNECTION
    properties: DisconnectProperties = NO_DISCONNECT_PROPERTIES

    def __post_init__(self) -> None:
        if type(self.reason_code) is not DisconnectReason:
            _set(self, "reason_code", _reason(DisconnectReason, self.reason_code, "DISCONNECT"))


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH: a step of enhanced authentication, MQTT 5 only (MQTT 5.0 §3.15)."""

    reason_code: AuthReason = AuthReason.SUCCESS
    properties: AuthProperties = NO_AUTH_PROPERTIES

    def __post_init__(self) -> None:
        if type(self.reason_code) is not AuthReason:
            _set(self, "reason_code", _reason(AuthReason, self.reason_code, "AUTH"))
        if self.properties.authentication_method is None:
            # §3.15.2.2.2: "It is a Protocol Error to omit the Authentication Method".
            raise protocol_error("AUTH must carry an Authentication Method [3.15.2.2.2]")


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
"""Any MQTT control packet."""
