"""MQTT 5 reason codes, one enum per packet that carries them (MQTT 5.0 §2.4).

The same number means the same thing wherever it appears (0x87 is always "Not
authorized"), but each packet allows its own subset, so each context gets its
own enum: a PUBACK cannot carry 0x8E Session taken over because `PubackReason`
has no such member. Values below 0x80 are successes, 0x80 and above failures.

MQTT 3.1.1 has reason codes only in two places, and the codec maps them:
the CONNACK return code (0-5, mapped to `ConnectReason` by `CONNACK_RETURN_CODES`)
and the SUBACK return code (0x00, 0x01, 0x02, 0x80: the same numbers as the
matching `SubackReason` members).
"""

from __future__ import annotations

from enum import IntEnum


class ConnectReason(IntEnum):
    """CONNACK Reason Code (MQTT 5.0 §3.2.2.2, Table 3-1)."""

    SUCCESS = 0x00
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    BAD_AUTHENTICATION_METHOD = 0x8C
    TOPIC_NAME_INVALID = 0x90
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    CONNECTION_RATE_EXCEEDED = 0x9F


class PubackReason(IntEnum):
    """PUBACK Reason Code (MQTT 5.0 §3.4.2.1, Table 3-4)."""

    SUCCESS = 0x00
    NO_MATCHING_SUBSCRIBERS = 0x10
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99


class PubrecReason(IntEnum):
    """PUBREC Reason Code (MQTT 5.0 §3.5.2.1, Table 3-5)."""

    SUCCESS = 0x00
    NO_MATCHING_SUBSCRIBERS = 0x10
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99


class PubrelReason(IntEnum):
    """PUBREL Reason Code (MQTT 5.0 §3.6.2.1, Table 3-6)."""

    SUCCESS = 0x00
    PACKET_IDENTIFIER_NOT_FOUND = 0x92


class PubcompReason(IntEnum):
    """PUBCOMP Reason Code (MQTT 5.0 §3.7.2.1, Table 3-7)."""

    SUCCESS = 0x00
    PACKET_IDENTIFIER_NOT_FOUND = 0x92


class SubackReason(IntEnum):
    """SUBACK Reason Code, one per requested filter (MQTT 5.0 §3.9.3, Table 3-8)."""

    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_FILTER_INVALID = 0x8F
    PACKET_IDENTIFIER_IN_USE = 0x91
    QUOTA_EXCEEDED = 0x97
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class UnsubackReason(IntEnum):
    """UNSUBACK Reason Code, one per filter (MQTT 5.0 §3.11.3, Table 3-9)."""

    SUCCESS = 0x00
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_FILTER_INVALID = 0x8F
    PACKET_IDENTIFIER_IN_USE = 0x91


class DisconnectReason(IntEnum):
    """DISCONNECT Reason Code (MQTT 5.0 §3.14.2.1, Table 3-10)."""

    NORMAL_DISCONNECTION = 0x00
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    SERVER_BUSY = 0x89
    SERVER_SHUTTING_DOWN = 0x8B
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class AuthReason(IntEnum):
    """AUTH Reason Code (MQTT 5.0 §3.15.2.1, Table 3-11)."""

    SUCCESS = 0x00
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19


CONNACK_RETURN_CODES: dict[int, ConnectReason] = {
    0x00: ConnectReason.SUCCESS,
    0x01: ConnectReason.UNSUPPORTED_PROTOCOL_VERSION,
    0x02: ConnectReason.CLIENT_IDENTIFIER_NOT_VALID,
    0x03: ConnectReason.SERVER_UNAVAILABLE,
    0x04: ConnectReason.BAD_USER_NAME_OR_PASSWORD,
    0x05: ConnectReason.NOT_AUTHORIZED,
}
"""MQTT 3.1.1 CONNACK return code (3.1.1 §3.2.2.3, Table 3.1) -> `ConnectReason`.

A CONNACK whose reason is not one of these six has no 3.1.1 form: the 3.1.1
server closes the connection without a CONNACK instead (3.1.1 [MQTT-3.2.2-6])."""

CONNACK_REASONS_V311: dict[ConnectReason, int] = {
    reason: code for code, reason in CONNACK_RETURN_CODES.items()
}
"""The inverse of `CONNACK_RETURN_CODES`."""

SUBACK_REASONS_V311: frozenset[SubackReason] = frozenset(
    {
        SubackReason.GRANTED_QOS_0,
        SubackReason.GRANTED_QOS_1,
        SubackReason.GRANTED_QOS_2,
        SubackReason.UNSPECIFIED_ERROR,
    }
)
"""The SUBACK return codes MQTT 3.1.1 has; others are reserved (3.1.1 [MQTT-3.9.3-2])."""
