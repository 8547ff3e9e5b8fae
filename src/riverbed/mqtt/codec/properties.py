"""MQTT 5 properties (MQTT 5.0 §2.2.2): one typed, frozen class per packet.

Each packet allows its own set of properties (§2.2.2.2, Table 2-4), so each gets
its own class and a property that a packet does not allow cannot be set on it:
`PublishProperties` has no `session_expiry_interval`. Absent is `None` (or `()`
for the repeatable ones), which is different from present with the default
value: a CONNECT that sends Session Expiry Interval 0 round-trips as 0.

User properties are a tuple of (name, value) pairs, in order, names may repeat
[MQTT-3.3.2-18]. Byte properties that can only be 0 or 1 are `bool`s.

One `PropertySpec` per property (and per class where the same identifier
differs: one Subscription Identifier in SUBSCRIBE, several in PUBLISH) drives
the classes' checks, the encoder and the decoder: identifier, attribute, wire
type, and the range its value must be in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Literal

from riverbed.errors import ProtocolError

from .wire import (
    MAX_UINT16,
    MAX_UINT32,
    MAX_VBI,
    PROTOCOL_ERROR,
    TOPIC_ALIAS_INVALID,
    check_binary,
    check_string,
    check_topic_name,
    protocol_error,
)


class PropertyId(IntEnum):
    """Property identifiers (MQTT 5.0 §2.2.2.2, Table 2-4)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


Kind = Literal["byte", "bool", "u16", "u32", "vbi", "str", "topic", "bin", "pair"]
"""Wire type of a property value: Byte (any value in a range, or a 0/1 flag),
Two/Four Byte Integer, Variable Byte Integer, UTF-8 String (a topic name for
Response Topic), Binary Data, UTF-8 String Pair."""


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """How one property travels and which values it may take."""

    id: PropertyId
    attr: str
    kind: Kind
    repeatable: bool = False
    low: int = 0
    high: int = 0
    """For integer kinds: the allowed range (`high` 0 means the type's maximum)."""
    reason: int = PROTOCOL_ERROR
    """Reason code for a value out of range: 0x82, or 0x94 for Topic Alias 0."""
    rule: str = ""
    """Where the range comes from, for the error message."""
    name: str = ""
    """The property's name, for error messages."""
    label: str = ""
    """"property NAME", for error messages."""
    ranged: bool = False
    """Whether a value decoded from the wire still needs its range checked."""
    default: object = None
    """The attribute's value when the property is absent: None, or () if repeatable."""


def _spec(
    pid: PropertyId,
    kind: Kind,
    *,
    attr: str = "",
    repeatable: bool = False,
    low: int = 0,
    high: int = 0,
    reason: int = PROTOCOL_ERROR,
    rule: str = "",
) -> PropertySpec:
    return PropertySpec(
        pid,
        attr or pid.name.lower(),
        kind,
        repeatable,
        low,
        high,
        reason,
        rule or "2.2.2.2",
        pid.name,
        f"property {pid.name}",
        bool(low or high),
        () if repeatable else None,
    )


P = PropertyId
PAYLOAD_FORMAT_INDICATOR = _spec(P.PAYLOAD_FORMAT_INDICATOR, "byte", high=1, rule="3.3.2.3.2")
MESSAGE_EXPIRY_INTERVAL = _spec(P.MESSAGE_EXPIRY_INTERVAL, "u32")
CONTENT_TYPE = _spec(P.CONTENT_TYPE, "str")
RESPONSE_TOPIC = _spec(P.RESPONSE_TOPIC, "topic")
CORRELATION_DATA = _spec(P.CORRELATION_DATA, "bin")
SUBSCRIPTION_IDENTIFIERS = _spec(
    P.SUBSCRIPTION_IDENTIFIER,
    "vbi",
    attr="subscription_identifiers",
    repeatable=True,
    low=1,
    rule="3.3.2.3.8",
)
SUBSCRIPTION_IDENTIFIER = _spec(P.SUBSCRIPTION_IDENTIFIER, "vbi", low=1, rule="3.8.2.1.2")
SESSION_EXPIRY_INTERVAL = _spec(P.SESSION_EXPIRY_INTERVAL, "u32")
ASSIGNED_CLIENT_IDENTIFIER = _spec(P.ASSIGNED_CLIENT_IDENTIFIER, "str")
SERVER_KEEP_ALIVE = _spec(P.SERVER_KEEP_ALIVE, "u16")
AUTHENTICATION_METHOD = _spec(P.AUTHENTICATION_METHOD, "str")
AUTHENTICATION_DATA = _spec(P.AUTHENTICATION_DATA, "bin")
REQUEST_PROBLEM_INFORMATION = _spec(P.REQUEST_PROBLEM_INFORMATION, "bool", rule="3.1.2.11.7")
WILL_DELAY_INTERVAL = _spec(P.WILL_DELAY_INTERVAL, "u32")
REQUEST_RESPONSE_INFORMATION = _spec(P.REQUEST_RESPONSE_INFORMATION, "bool", rule="3.1.2.11.6")
RESPONSE_INFORMATION = _spec(P.RESPONSE_INFORMATION, "str")
SERVER_REFERENCE = _spec(P.SERVER_REFERENCE, "str")
REASON_STRING = _spec(P.REASON_STRING, "str")
RECEIVE_MAXIMUM = _spec(P.RECEIVE_MAXIMUM, "u16", low=1, rule="3.1.2.11.3")
TOPIC_ALIAS_MAXIMUM = _spec(P.TOPIC_ALIAS_MAXIMUM, "u16")
TOPIC_ALIAS = _spec(P.TOPIC_ALIAS, "u16", low=1, reason=TOPIC_ALIAS_INVALID, rule="MQTT-3.3.2-8")
MAXIMUM_QOS = _spec(P.MAXIMUM_QOS, "byte", high=1, rule="3.2.2.3.4")
RETAIN_AVAILABLE = _spec(P.RETAIN_AVAILABLE, "bool", rule="3.2.2.3.5")
USER_PROPERTIES = _spec(P.USER_PROPERTY, "pair", attr="user_properties", repeatable=True)
MAXIMUM_PACKET_SIZE = _spec(P.MAXIMUM_PACKET_SIZE, "u32", low=1, rule="3.1.2.11.4")
WILDCARD_SUBSCRIPTION_AVAILABLE = _spec(
    P.WILDCARD_SUBSCRIPTION_AVAILABLE, "bool", rule="3.2.2.3.11"
)
SUBSCRIPTION_IDENTIFIER_AVAILABLE = _spec(
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, "bool", rule="3.2.2.3.12"
)
SHARED_SUBSCRIPTION_AVAILABLE = _spec(P.SHARED_SUBSCRIPTION_AVAILABLE, "bool", rule="3.2.2.3.13")
del P

PROPERTY_NAMES: dict[int, str] = {pid.value: pid.name for pid in PropertyId}

_ONE_BYTE = tuple(bytes((value,)) for value in range(256))
_TYPE_MAX = {"u16": MAX_UINT16, "u32": MAX_UINT32, "vbi": MAX_VBI, "byte": 0xFF}

UserProperties = tuple[tuple[str, str], ...]


# --------------------------------------------------------------------- validation


def _check_value(spec: PropertySpec, value: object) -> None:
    """Raise unless `value` is valid for `spec` (one value of a repeatable property)."""
    kind = spec.kind
    if kind == "str":
        check_string(value, f"property {spec.name}")
    elif kind == "topic":
        # [MQTT-3.3.2-13] a UTF-8 string; [MQTT-3.3.2-14] no wildcards: a topic name.
        check_topic_name(value, f"property {spec.name}")
    elif kind == "bin":
        check_binary(value, f"property {spec.name}")
    elif kind == "pair":
        # [MQTT-1.5.7-1] both strings of a pair are UTF-8 Encoded Strings.
        if type(value) is not tuple or len(value) != 2:
            raise protocol_error(f"property {spec.name} must be a (name, value) pair of strings")
        check_string(value[0], f"property {spec.name} name")
        check_string(value[1], f"property {spec.name} value")
    elif kind == "bool":
        if value is not True and value is not False and value != 0 and value != 1:
            raise protocol_error(
                f"property {spec.name} must be 0 or 1, not {value!r} [{spec.rule}]"
            )
    elif type(value) is not int:
        raise protocol_error(f"property {spec.name} must be an int, not {type(value).__name__}")
    else:
        check_range(spec, value)


def check_range(spec: PropertySpec, value: int) -> None:
    high = spec.high or _TYPE_MAX[spec.kind]
    if not spec.low <= value <= high:
        raise ProtocolError(
            spec.reason,
            f"property {spec.name} is {value}; it must be {spec.low}..{high} [{spec.rule}]",
        )


def _validate(props: object, specs: tuple[PropertySpec, ...]) -> None:
    """Check every present property of a properties object being built."""
    try:
        for spec in specs:
            value = getattr(props, spec.attr)
            if spec.repeatable:
                if type(value) is not tuple:
                    if not isinstance(value, list | tuple):
                        raise protocol_error(f"property {spec.name} must be a tuple")
                    value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                    object.__setattr__(props, spec.attr, value)
                for item in value:
                    _check_value(spec, item)
            elif value is not None:
                _check_value(spec, value)
    except ProtocolError as exc:
        where = type(props).__name__.removesuffix("Properties").upper()
        raise ProtocolError(exc.reason_code, f"{where} {exc}") from None


def _repr(props: object, specs: tuple[PropertySpec, ...]) -> str:
    """Like a dataclass repr, but only with the properties that are present."""
    present = (
        f"{spec.attr}={value!r}"
        for spec in specs
        if (value := getattr(props, spec.attr)) is not None and value != ()
    )
    return f"{type(props).__name__}({', '.join(present)})"


# --------------------------------------------------------------------- classes


class _Properties:
    """What every packet's properties class shares: it validates itself against
    its `SPECS` when built and prints only the properties that are present."""

    __slots__ = ()
    SPECS: ClassVar[tuple[PropertySpec, ...]] = ()

    def __post_init__(self) -> None:
        _validate(self, self.SPECS)

    def __repr__(self) -> str:
        return _repr(self, self.SPECS)


@dataclass(frozen=True, slots=True, repr=False)
class ConnectProperties(_Properties):
    """CONNECT properties (MQTT 5.0 §3.1.2.11)."""

    session_expiry_interval: int | None = None
    receive_maximum: int | None = None
    maximum_packet_size: int | None = None
    topic_alias_maximum: int | None = None
    request_response_information: bool | None = None
    request_problem_information: bool | None = None
    user_properties: UserProperties = ()
    authentication_method: str | None = None
    authentication_data: bytes | None = None

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        SESSION_EXPIRY_INTERVAL,
        RECEIVE_MAXIMUM,
        MAXIMUM_PACKET_SIZE,
        TOPIC_ALIAS_MAXIMUM,
        REQUEST_RESPONSE_INFORMATION,
        REQUEST_PROBLEM_INFORMATION,
        USER_PROPERTIES,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
    )


@dataclass(frozen=True, slots=True, repr=False)
class WillProperties(_Properties):
    """Will properties, in the CONNECT payload (MQTT 5.0 §3.1.3.2)."""

    will_delay_interval: int | None = None
    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: UserProperties = ()

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        WILL_DELAY_INTERVAL,
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        CONTENT_TYPE,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        USER_PROPERTIES,
    )


@dataclass(frozen=True, slots=True, repr=False)
class ConnackProperties(_Properties):
    """CONNACK properties (MQTT 5.0 §3.2.2.3)."""

    session_expiry_interval: int | None = None
    receive_maximum: int | None = None
    maximum_qos: int | None = None
    retain_available: bool | None = None
    maximum_packet_size: int | None = None
    assigned_client_identifier: str | None = None
    topic_alias_maximum: int | None = None
    reason_string: str | None = None
    user_properties: UserProperties = ()
    wildcard_subscription_available: bool | None = None
    subscription_identifier_available: bool | None = None
    shared_subscription_available: bool | None = None
    server_keep_alive: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        SESSION_EXPIRY_INTERVAL,
        RECEIVE_MAXIMUM,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        MAXIMUM_PACKET_SIZE,
        ASSIGNED_CLIENT_IDENTIFIER,
        TOPIC_ALIAS_MAXIMUM,
        REASON_STRING,
        USER_PROPERTIES,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
        SERVER_KEEP_ALIVE,
        RESPONSE_INFORMATION,
        SERVER_REFERENCE,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
    )


@dataclass(frozen=True, slots=True, repr=False)
class PublishProperties(_Properties):
    """PUBLISH properties (MQTT 5.0 §3.3.2.3).

    `subscription_identifiers` is only for PUBLISH packets a server sends; a
    client that sends one breaks [MQTT-3.3.4-6], which the connection checks.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    topic_alias: int | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: UserProperties = ()
    subscription_identifiers: tuple[int, ...] = ()
    content_type: str | None = None

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        TOPIC_ALIAS,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        USER_PROPERTIES,
        SUBSCRIPTION_IDENTIFIERS,
        CONTENT_TYPE,
    )


@dataclass(frozen=True, slots=True, repr=False)
class AckProperties(_Properties):
    """Properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK (MQTT 5.0
    §3.4.2.2, §3.5.2.2, §3.6.2.2, §3.7.2.2, §3.9.2.1, §3.11.2.1): all six allow the
    same two."""

    reason_string: str | None = None
    user_properties: UserProperties = ()

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (REASON_STRING, USER_PROPERTIES)


@dataclass(frozen=True, slots=True, repr=False)
class SubscribeProperties(_Properties):
    """SUBSCRIBE properties (MQTT 5.0 §3.8.2.1). At most one Subscription
    Identifier: a second one is a Protocol Error."""

    subscription_identifier: int | None = None
    user_properties: UserProperties = ()

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (SUBSCRIPTION_IDENTIFIER, USER_PROPERTIES)


@dataclass(frozen=True, slots=True, repr=False)
class UnsubscribeProperties(_Properties):
    """UNSUBSCRIBE properties (MQTT 5.0 §3.10.2.1)."""

    user_properties: UserProperties = ()

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (USER_PROPERTIES,)


@dataclass(frozen=True, slots=True, repr=False)
class DisconnectProperties(_Properties):
    """DISCONNECT properties (MQTT 5.0 §3.14.2.2). A server must not send Session
    Expiry Interval [MQTT-3.14.2-2]; the connection enforces that."""

    session_expiry_interval: int | None = None
    reason_string: str | None = None
    user_properties: UserProperties = ()
    server_reference: str | None = None

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        SESSION_EXPIRY_INTERVAL,
        REASON_STRING,
        USER_PROPERTIES,
        SERVER_REFERENCE,
    )


@dataclass(frozen=True, slots=True, repr=False)
class AuthProperties(_Properties):
    """AUTH properties (MQTT 5.0 §3.15.2.2). The AUTH packet itself requires the
    Authentication Method."""

    authentication_method: str | None = None
    authentication_data: bytes | None = None
    reason_string: str | None = None
    user_properties: UserProperties = ()

    SPECS: ClassVar[tuple[PropertySpec, ...]] = (
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
        REASON_STRING,
        USER_PROPERTIES,
    )


AnyProperties = (
    ConnectProperties
    | WillProperties
    | ConnackProperties
    | PublishProperties
    | AckProperties
    | SubscribeProperties
    | UnsubscribeProperties
    | DisconnectProperties
    | AuthProperties
)

NO_CONNECT_PROPERTIES = ConnectProperties()
NO_WILL_PROPERTIES = WillProperties()
NO_CONNACK_PROPERTIES = ConnackProperties()
NO_PUBLISH_PROPERTIES = PublishProperties()
NO_ACK_PROPERTIES = AckProperties()
NO_SUBSCRIBE_PROPERTIES = SubscribeProperties()
NO_UNSUBSCRIBE_PROPERTIES = UnsubscribeProperties()
NO_DISCONNECT_PROPERTIES = DisconnectProperties()
NO_AUTH_PROPERTIES = AuthProperties()

EMPTY_PROPERTIES: dict[type, AnyProperties] = {
    ConnectProperties: NO_CONNECT_PROPERTIES,
    WillProperties: NO_WILL_PROPERTIES,
    ConnackProperties: NO_CONNACK_PROPERTIES,
    PublishProperties: NO_PUBLISH_PROPERTIES,
    AckProperties: NO_ACK_PROPERTIES,
    SubscribeProperties: NO_SUBSCRIBE_PROPERTIES,
    UnsubscribeProperties: NO_UNSUBSCRIBE_PROPERTIES,
    DisconnectProperties: NO_DISCONNECT_PROPERTIES,
    AuthProperties: NO_AUTH_PROPERTIES,
}


def is_empty(props: AnyProperties) -> bool:
    """Whether no property is present (what MQTT 3.1.1 can carry)."""
    empty = EMPTY_PROPERTIES[type(props)]
    return props is empty or props == empty
