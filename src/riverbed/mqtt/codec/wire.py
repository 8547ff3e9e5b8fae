"""Wire primitives shared by the packets, the encoder and the decoder.

Data representation from MQTT 5.0 §1.5 (3.1.1 §1.5 is the same minus the
Variable Byte Integer outside the fixed header): Two and Four Byte Integers are
big-endian; a Variable Byte Integer (VBI) takes at most four bytes; UTF-8 Encoded
Strings and Binary Data carry a Two Byte length prefix, so at most 65,535 bytes.

Every check here raises `ProtocolError` with the reason code the receiver
answers with (MQTT 5.0 §4.13): 0x81 Malformed Packet when the bytes cannot be
parsed as MQTT, 0x82 Protocol Error when they parse but carry something the
protocol forbids.
"""

from __future__ import annotations

from riverbed.errors import InvalidTopicFilter, InvalidTopicName, ProtocolError
from riverbed.topics.filters import validate_filter, validate_topic_name

MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95

MAX_VBI = 268_435_455
"""The largest Variable Byte Integer: four bytes of seven bits (MQTT 5.0 §1.5.5)."""

MAX_PACKET_SIZE = 1 + 4 + MAX_VBI
"""The largest packet the protocol can express: one type byte, a four-byte
Remaining Length and 268,435,455 bytes after it (MQTT 5.0 §2.1.4)."""

MAX_UINT16 = 0xFFFF
MAX_UINT32 = 0xFFFF_FFFF

SHARE_PREFIX = "$share/"


def malformed(message: str) -> ProtocolError:
    """0x81 Malformed Packet: the bytes cannot be parsed (MQTT 5.0 §1.2, §4.13)."""
    return ProtocolError(MALFORMED_PACKET, message)


def protocol_error(message: str) -> ProtocolError:
    """0x82 Protocol Error: parsed, but not allowed (MQTT 5.0 §1.2, §4.13)."""
    return ProtocolError(PROTOCOL_ERROR, message)


# --------------------------------------------------------------------- integers

_ONE_BYTE = tuple(bytes((value,)) for value in range(256))


def encode_vbi(value: int) -> bytes:
    """The Variable Byte Integer encoding of `value`, minimal as [MQTT-1.5.5-1] asks."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value > MAX_VBI:
        raise ProtocolError(
            PACKET_TOO_LARGE, f"{value} does not fit a Variable Byte Integer (max {MAX_VBI})"
        )
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_vbi(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """Read a Variable Byte Integer at `pos`, not past `end`: (value, next position).

    A fifth byte (the fourth still has its continuation bit) is malformed (MQTT
    5.0 §1.5.5). Non-minimal encodings are accepted: [MQTT-1.5.5-1] binds the
    sender, and the value is the same.
    """
    if pos < end and data[pos] < 0x80:
        return data[pos], pos + 1  # one byte: the usual case
    value = 0
    shift = 0
    for index in range(pos, min(pos + 4, end)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    if end - pos >= 4:
        raise malformed(f"{what}: a Variable Byte Integer is longer than four bytes [1.5.5]")
    raise malformed(f"{what}: the packet ends inside a Variable Byte Integer")


# --------------------------------------------------------------------- strings


def check_string(value: object, what: str) -> None:
    """Raise unless `value` can travel as an MQTT UTF-8 Encoded String.

    Well-formed UTF-8 without surrogates [MQTT-1.5.4-1], no U+0000
    [MQTT-1.5.4-2], at most 65,535 bytes (§1.5.4). The disallowed code points
    (controls, non-characters) are a SHOULD NOT that a receiver MAY refuse; the
    codec lets them through and leaves that policy to the broker.
    """
    if type(value) is not str:
        raise protocol_error(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise malformed(f"{what} {value[:40]!r} contains U+0000 [MQTT-1.5.4-2]")
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise malformed(
                f"{what} {value[:40]!r} contains a surrogate code point [MQTT-1.5.4-1]"
            ) from None
    if size > MAX_UINT16:
        raise malformed(f"{what} is {size} bytes of UTF-8; the limit is 65,535 [1.5.4]")


def check_binary(value: object, what: str) -> None:
    """Raise unless `value` can travel as MQTT Binary Data (at most 65,535 bytes, §1.5.6)."""
    if not isinstance(value, bytes):
        raise protocol_error(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_UINT16:
        raise malformed(f"{what} is {len(value)} bytes; Binary Data holds at most 65,535 [1.5.6]")


def encode_string(value: str) -> bytes:
    """A checked string with its Two Byte length prefix."""
    raw = value.encode("utf-8")
    return len(raw).to_bytes(2, "big") + raw


def encode_binary(value: bytes) -> bytes:
    return len(value).to_bytes(2, "big") + value


def decode_string(data: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    """Read a UTF-8 Encoded String at `pos`, not past `end`: (text, next position)."""
    if pos + 2 > end:
        raise malformed(f"{what}: the packet ends inside a string length")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise malformed(f"{what}: a string runs past the end of its packet")
    return decode_utf8(data[pos + 2 : stop], what), stop


def decode_utf8(raw: bytes, what: str) -> str:
    """Decode string bytes, refusing what [MQTT-1.5.4-1] and [MQTT-1.5.4-2] forbid.

    Python's strict UTF-8 decoder refuses overlong forms, surrogates (ED A0 80 ..
    ED BF BF) and code points above U+10FFFF, which is exactly "well-formed UTF-8"
    as RFC 3629 defines it; and it keeps a leading EF BB BF as U+FEFF instead of
    stripping it [MQTT-1.5.4-3].
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed(f"{what} is not well-formed UTF-8 ({exc.reason}) [MQTT-1.5.4-1]") from None
    if "\x00" in text:
        raise malformed(f"{what} contains U+0000 [MQTT-1.5.4-2]")
    return text


def decode_binary(data: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    """Read Binary Data at `pos`, not past `end`: (bytes, next position)."""
    if pos + 2 > end:
        raise malformed(f"{what}: the packet ends inside a length")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise malformed(f"{what}: Binary Data runs past the end of its packet")
    return data[pos + 2 : stop], stop


# --------------------------------------------------------------------- topics

_CACHE_LIMIT = 4096
_CACHEABLE_LENGTH = 256
_valid_topic_names: set[str] = set()
"""Topic names already found valid. A broker sees the same names over and over;
checking a name once and remembering it keeps the PUBLISH path short. Bounded:
only short names, and the set is emptied when it fills up."""


def check_topic_name(name: object, what: str) -> None:
    """Raise unless `name` is a valid topic name ([MQTT-4.7], [MQTT-3.3.2-2]).

    Breaking a topic rule is a Protocol Error: the packet parsed, but holds a
    name the protocol forbids. (0x90 Topic Name invalid is for names that are
    well formed but refused by policy.)
    """
    if name in _valid_topic_names:
        return
    check_string(name, what)
    assert isinstance(name, str)  # check_string refused anything else
    try:
        validate_topic_name(name)
    except InvalidTopicName as exc:
        raise protocol_error(f"{what}: {exc}") from None
    if len(name) <= _CACHEABLE_LENGTH:
        if len(_valid_topic_names) >= _CACHE_LIMIT:
            _valid_topic_names.clear()
        _valid_topic_names.add(name)


def check_topic_filter(topic_filter: object, what: str) -> bool:
    """Raise unless `topic_filter` is a valid filter; return whether it is shared.

    A filter that starts with `$share/` names a Shared Subscription and must be
    `$share/{ShareName}/{filter}`: a ShareName of at least one character without
    "/", "+" or "#" [MQTT-4.8.2-1], then "/" and a valid filter [MQTT-4.8.2-2].
    Riverbed applies this to MQTT 3.1.1 too, where `$share/` is only a naming
    convention, because the broker treats such filters as shared at both levels.
    """
    check_string(topic_filter, what)
    assert isinstance(topic_filter, str)  # check_string refused anything else
    try:
        validate_filter(topic_filter)
    except InvalidTopicFilter as exc:
        raise protocol_error(f"{what}: {exc}") from None
    if not topic_filter.startswith(SHARE_PREFIX):
        return False
    share_name, slash, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not share_name or "+" in share_name or "#" in share_name:
        raise protocol_error(
            f"{what} {topic_filter!r}: a shared subscription needs a ShareName of at least"
            " one character without '+' or '#' [MQTT-4.8.2-1]"
        )
    if not slash or not rest:
        raise protocol_error(
            f"{what} {topic_filter!r}: the ShareName must be followed by '/' and a topic"
            " filter [MQTT-4.8.2-2]"
        )
    return True
