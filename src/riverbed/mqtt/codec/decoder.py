"""`Decoder`: bytes in, packets out, however the bytes are cut.

The decoder keeps what it has not parsed yet and hands out each packet once all
of it has arrived: feed it a byte at a time or many packets at once, the
packets come out the same. It reads the fixed header as soon as it can, so a
packet with reserved flags set, a Remaining Length longer than four bytes or a
size above `max_packet_size` is refused before its body is buffered.

A decoder made with `protocol_level=None` is the server's side of a new
connection: the first packet must be a CONNECT [MQTT-3.1.0-1], whose protocol
level (4 for MQTT 3.1.1, 5 for MQTT 5.0) then applies to every later packet,
and a second CONNECT is a Protocol Error [MQTT-3.1.0-2]. A decoder made with a
level decodes any packet at that level (a client's side, tests). Which side may
send which packet, Topic Alias mappings, Receive Maximum and the other rules
that need the session's state belong to the connection, not here.

Errors: `feed` raises `ProtocolError` and nothing else, whatever the bytes.
After it has raised, the decoder is closed and raises the same error again;
packets that came before the broken one in the same `feed` call are dropped
with it. That is safe: the connection is closed with the error's reason code,
and anything not acknowledged is sent again by the client on its next
connection (QoS 1 and 2) or may be lost (QoS 0, which allows that).
"""

from __future__ import annotations

from riverbed.errors import InvalidConfig, ProtocolError

from .packets import Packet, Puback
from .readers import READERS, read_connect, read_protocol, read_publish
from .wire import (
    MAX_PACKET_SIZE,
    PACKET_TOO_LARGE,
    UNSUPPORTED_PROTOCOL_VERSION,
    malformed,
    protocol_error,
)

# Fixed header flags (bits 3-0 of the first byte) per packet type, MQTT 5.0
# §2.1.3 Table 2-2 (3.1.1 §2.2.2 Table 2.2 is the same without AUTH). None for
# type 0, which is reserved, and for PUBLISH, whose flags are DUP, QoS, RETAIN.
_FLAGS: tuple[int | None, ...] = (None, 0, 0, None, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_NAMES = (
    "reserved type 0",
    "CONNECT",
    "CONNACK",
    "PUBLISH",
    "PUBACK",
    "PUBREC",
    "PUBREL",
    "PUBCOMP",
    "SUBSCRIBE",
    "SUBACK",
    "UNSUBSCRIBE",
    "UNSUBACK",
    "PINGREQ",
    "PINGRESP",
    "DISCONNECT",
    "AUTH",
)


class Decoder:
    """Incremental MQTT decoder for one connection's byte stream (sans-I/O).

    `protocol_level`: None to learn it from the first packet, a CONNECT (the
    server side); 4 (MQTT 3.1.1) or 5 (MQTT 5.0) to fix it. `max_packet_size`:
    the largest packet accepted, counted like MQTT 5's Maximum Packet Size
    (fixed header included, §3.1.2.11.4); a larger one raises 0x95 Packet too
    large as soon as its fixed header has arrived.
    """

    __slots__ = ("_chunks", "_error", "_have", "_learns_level", "_level", "_max", "_need")

    def __init__(
        self, protocol_level: int | None = None, max_packet_size: int = MAX_PACKET_SIZE
    ) -> None:
        if protocol_level is not None and protocol_level != 4 and protocol_level != 5:
            raise InvalidConfig(
                "protocol_level must be None, 4 (MQTT 3.1.1) or 5 (MQTT 5.0),"
                f" not {protocol_level!r}"
            )
        if type(max_packet_size) is not int or not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise InvalidConfig(
                f"max_packet_size must be 2..{MAX_PACKET_SIZE} bytes, not {max_packet_size!r}"
            )
        self._level = protocol_level
        self._learns_level = protocol_level is None
        self._max = max_packet_size
        self._chunks: list[bytes] | None = None
        """The start of a packet not complete yet (None: none; most connections
        are idle most of the time, and an empty list costs 56 bytes)."""
        self._have = 0
        self._need = 0
        self._error: ProtocolError | None = None

    @property
    def protocol_level(self) -> int | None:
        """4 or 5 once known; a server-side decoder learns it from the CONNECT's
        Protocol Version byte, even when a later part of that CONNECT is broken."""
        return self._level

    def feed(self, data: bytes) -> list[Packet]:
        """Take the next bytes of the stream; return the packets they complete, in order.

        Raises `ProtocolError` (with the reason code to answer with) at the
        first broken packet, and again on every later call.
        """
        if self._error is not None:
            raise ProtocolError(self._error.reason_code, str(self._error))
        if type(data) is not bytes:
            data = bytes(data)
        chunks = self._chunks
        if chunks is not None:
            chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(chunks)
            self._chunks = None
        elif not data:
            return []
        try:
            return self._parse(data)
        except ProtocolError as exc:
            self._error = exc
            self._chunks = None
            raise

    def _parse(self, data: bytes) -> list[Packet]:
        packets: list[Packet] = []
        size = len(data)
        pos = 0
        while pos < size:
            first = data[pos]
            if (
                first == 0x40
                and pos + 4 <= size
                and data[pos + 1] == 2
                and self._level is not None
                and self._max >= 4
            ):
                # A successful PUBACK (40 02 + packet id), the packet a broker reads
                # once per QoS 1 delivery: read here, without the general path's calls.
                packets.append(Puback((data[pos + 2] << 8) | data[pos + 3]))
                pos += 4
                continue
            kind = first >> 4
            level = self._level
            if kind == 3 and level is not None:
                pass  # PUBLISH: flags are DUP, QoS, RETAIN, checked with the packet.
            elif level is None and kind != 1:
                raise protocol_error(
                    f"the first packet must be a CONNECT, not {_NAMES[kind]} [MQTT-3.1.0-1]"
                )
            elif kind == 1 and level is not None and self._learns_level:
                raise protocol_error("a second CONNECT on the connection [MQTT-3.1.0-2]")
            else:
                expected = _FLAGS[kind]
                if expected is None or (kind == 15 and level == 4):
                    raise malformed(
                        f"{_NAMES[kind]} is not an MQTT {_level_name(level)} packet type [2.1.2]"
                    )
                if first & 0x0F != expected:
                    raise malformed(
                        f"{_NAMES[kind]} fixed header flags are {first & 0x0F:04b}, must be"
                        f" {expected:04b} [MQTT-2.1.3-1]"
                    )
            # Remaining Length: a Variable Byte Integer of at most four bytes (§2.1.4).
            index = pos + 1
            length = 0
            shift = 0
            while True:
                if index - pos > 4:
                    raise malformed("the Remaining Length is longer than four bytes [2.1.4, 1.5.5]")
                if index >= size:
                    self._keep(data, pos, size - pos + 1)
                    return packets
                byte = data[index]
                index += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
            total = index - pos + length
            if total > self._max:
                raise ProtocolError(
                    PACKET_TOO_LARGE,
                    f"a {_NAMES[kind]} of {total} bytes is larger than the maximum packet"
                    f" size {self._max} [3.1.2.11.4]",
                )
            end = index + length
            if end > size:
                self._keep(data, pos, total)
                return packets
            if kind == 3 and level is not None:
                packets.append(read_publish(level, first, data, index, end))
            elif kind == 1:
                packets.append(self._connect(data, index, end))
            elif level is not None:
                packets.append(READERS[kind](level, data, index, end))
            else:  # pragma: no cover - the first byte of anything but a CONNECT was refused
                raise protocol_error(f"{_NAMES[kind]} before the CONNECT [MQTT-3.1.0-1]")
            pos = end
        return packets

    def _keep(self, data: bytes, pos: int, need: int) -> None:
        """Keep the unparsed tail and how many bytes it must grow to be worth a look."""
        rest = data[pos:] if pos else data
        self._chunks = [rest]
        self._have = len(rest)
        self._need = need

    def _connect(self, data: bytes, pos: int, end: int) -> Packet:
        level, pos = read_protocol(data, pos, end)
        if self._learns_level:
            # Known from here on, even if the rest of the CONNECT is broken: the
            # connection answers in the client's version (CONNACK, or closing).
            self._level = level
        elif level != self._level:
            raise ProtocolError(
                UNSUPPORTED_PROTOCOL_VERSION,
                f"CONNECT Protocol Version {level} on a level {self._level} decoder",
            )
        return read_connect(level, data, pos, end)


def _level_name(level: int | None) -> str:
    return "3.1.1" if level == 4 else "5.0" if level == 5 else ""
