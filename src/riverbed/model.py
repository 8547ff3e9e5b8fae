"""The values every layer shares: messages, their ids, and stream names.

A message id is 128 bits, `timestamp µs : 64 | node : 48 | sequence : 16`
(seed 002): ids sort by time, are unique across nodes, and strictly increase
per node even when the wall clock steps back.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from riverbed.errors import InvalidInput
from riverbed.records import quick_init

PropertyValue = str | bytes | int
Properties = tuple[tuple[str, PropertyValue], ...]
"""Message properties as ordered (name, value) pairs; names may repeat (MQTT 5 user
properties)."""

NODE_BITS = 48
SEQUENCE_BITS = 16
_MAX_NODE = (1 << NODE_BITS) - 1
_MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
_MAX_TIMESTAMP = (1 << 64) - 1
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """A 128-bit message id; compares in time order."""

    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.value < 1 << 128:
            raise InvalidInput(f"message id {self.value!r} is not a 128-bit unsigned integer")

    @classmethod
    def compose(cls, timestamp_us: int, node: int, sequence: int) -> MessageId:
        if not 0 <= timestamp_us <= _MAX_TIMESTAMP:
            raise InvalidInput(f"timestamp {timestamp_us} does not fit in 64 bits")
        if not 0 <= node <= _MAX_NODE:
            raise InvalidInput(f"node {node} does not fit in {NODE_BITS} bits")
        if not 0 <= sequence <= _MAX_SEQUENCE:
            raise InvalidInput(f"sequence {sequence} does not fit in {SEQUENCE_BITS} bits")
        return cls((timestamp_us << 64) | (node << SEQUENCE_BITS) | sequence)

    @classmethod
    def from_bytes(cls, raw: bytes) -> MessageId:
        if len(raw) != 16:
            raise InvalidInput(f"a message id is 16 bytes, got {len(raw)}")
        return cls(int.from_bytes(raw, "big"))

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """Parse the 32-hex-digit form that `str()` prints."""
        # Check the digits ourselves: int(text, 16) also takes a sign, a 0x prefix,
        # underscores and surrounding whitespace, so other strings would parse too.
        if len(text) != 32 or not _HEX_DIGITS.issuperset(text):
            raise InvalidInput(f"message id {text!r} is not 32 hexadecimal digits")
        return cls(int(text, 16))

    @property
    def timestamp_us(self) -> int:
        return self.value >> 64

    @property
    def node(self) -> int:
        return (self.value >> SEQUENCE_BITS) & _MAX_NODE

    @property
    def sequence(self) -> int:
        return self.value & _MAX_SEQUENCE

    def to_bytes(self) -> bytes:
        """Big-endian, so byte order is id order (how storage keeps it)."""
        return self.value.to_bytes(16, "big")

    def __str__(self) -> str:
        return f"{self.value:032x}"


def random_node() -> int:
    """A random 48-bit node number, as a process's default identity."""
    return int.from_bytes(os.urandom(6), "big")


class MessageIdGenerator:
    """Mints ids that strictly increase for one node, whatever the clock does.

    When the clock stands still or steps back we keep the last timestamp and count
    the sequence up; when the sequence is spent we borrow the next microsecond.
    Ids therefore never repeat and never go backwards, and they catch up with the
    clock as soon as it passes the borrowed time again. Thread-safe.
    """

    __slots__ = ("_clock", "_last_ts", "_lock", "_node_bits", "_seq", "node")

    def __init__(self, node: int | None = None, clock: object = None) -> None:
        node = random_node() if node is None else node
        if not 0 <= node <= _MAX_NODE:
            raise InvalidInput(f"node {node} does not fit in {NODE_BITS} bits")
        self.node = node
        self._node_bits = node << SEQUENCE_BITS
        self._clock = clock if callable(clock) else time.time_ns
        self._lock = threading.Lock()
        self._last_ts = -1
        self._seq = 0

    def next_raw(self) -> tuple[int, int]:
        """Return (id as int, timestamp µs) of a fresh id."""
        now = self._clock() // 1000
        with self._lock:
            if now > self._last_ts:
                self._last_ts = now
                self._seq = 0
            elif self._seq < _MAX_SEQUENCE:
                self._seq += 1
            else:
                self._last_ts += 1
                self._seq = 0
            ts = self._last_ts
            return (ts << 64) | self._node_bits | self._seq, ts

    def reserve(self, count: int) -> list[tuple[bytes, int]]:
        """`count` fresh ids at once, as (16 id bytes, timestamp µs) pairs.

        One clock read and one lock for the lot: what a batch producer wants.
        """
        node_bits = self._node_bits
        out: list[tuple[bytes, int]] = []
        for ts, first, n in self.reserve_spans(count):
            base = (ts << 64) | node_bits
            out.extend(((base | s).to_bytes(16, "big"), ts) for s in range(first, first + n))
        return out

    def reserve_spans(self, count: int) -> list[tuple[int, int, int]]:
        """`count` fresh ids at once, as spans `(timestamp µs, first sequence, n)`:
        the ids `timestamp | node | sequence` for sequences `first .. first + n - 1`,
        in increasing order. For callers that build id columns without a Python
        object per id (the Spark sink)."""
        now = self._clock() // 1000
        with self._lock:
            if now > self._last_ts:
                ts, seq = now, -1
            else:
                ts, seq = self._last_ts, self._seq
            spans: list[tuple[int, int, int]] = []
            left = count
            while left > 0:
                take = min(left, _MAX_SEQUENCE - seq)
                if take <= 0:
                    ts, seq = ts + 1, -1
                    continue
                spans.append((ts, seq + 1, take))
                seq += take
                left -= take
            self._last_ts, self._seq = ts, seq
            return spans

    def next_id(self) -> MessageId:
        return MessageId(self.next_raw()[0])


@quick_init
@dataclass(frozen=True, slots=True)
class StreamId:
    """One partition of one storage topic: `(topic, generation, partition)`."""

    topic: str
    generation: int
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.generation}/{self.partition}"

    @classmethod
    def parse(cls, text: str) -> StreamId:
        """Parse `topic/generation/partition` (the form Spark offsets use)."""
        topic, sep, rest = text.rpartition("/")
        topic, sep2, gen = topic.rpartition("/")
        if not (sep and sep2 and topic and _ascii_digits(gen) and _ascii_digits(rest)):
            raise InvalidInput(f"stream {text!r} is not of the form topic/generation/partition")
        return cls(topic, int(gen), int(rest))


def _ascii_digits(text: str) -> bool:
    # str.isdigit alone also accepts digits that int() refuses, such as "²".
    return text.isascii() and text.isdigit()


@quick_init
@dataclass(frozen=True, slots=True)
class Message:
    """A message on its way into the log.

    `key` orders: messages with the same key on a topic are delivered in publish
    order. `None` means unordered (the router spreads such messages).
    """

    payload: bytes
    key: str | None = None
    mqtt_topic: str = ""
    properties: Properties = field(default=())
    qos: int = 0
    retain: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.payload, bytes):
            raise InvalidInput(f"payload must be bytes, got {type(self.payload).__name__}")
        if self.qos not in (0, 1, 2):
            raise InvalidInput(f"qos {self.qos!r} is not 0, 1 or 2")


class StoredMessage(NamedTuple):
    """A message as read back from one stream.

    A named tuple so that reading a batch costs one tuple per row: the id and the
    properties stay encoded until asked for (`message_id`, `properties`).
    """

    offset: int
    id_bytes: bytes
    timestamp_us: int
    mqtt_topic: str
    key: str | None
    payload: bytes
    properties_blob: bytes | None
    qos: int
    retain: int

    @property
    def message_id(self) -> MessageId:
        return MessageId.from_bytes(self.id_bytes)

    @property
    def properties(self) -> Properties:
        return decode_properties(self.properties_blob)


stored_message: Callable[[Iterable[Any]], StoredMessage] = StoredMessage._make
"""A `StoredMessage` from its fields in order: the offset, then those of the
row it is stored as (`riverbed.storage.base.Row`), one tuple and no call
per field."""


def encode_properties(properties: Properties) -> bytes | None:
    """Encode properties for storage; `None` for none (the common case)."""
    if not properties:
        return None
    if type(properties) is tuple and len(properties) <= 4:
        # The broker stores the same few string properties (the publisher's
        # client id, ...) with every message of a client: encode each set once.
        try:
            if all(type(name) is str and type(value) is str for name, value in properties):
                return _encode_strings(properties)
        except (TypeError, ValueError):
            pass  # not pairs: _encode_properties says what is wrong
    return _encode_properties(properties)


@functools.lru_cache(maxsize=4096)
def _encode_strings(properties: tuple[tuple[str, str], ...]) -> bytes:
    return json.dumps(properties, separators=(",", ":")).encode()


def _encode_properties(properties: Properties) -> bytes:
    items: list[list[object]] = []
    for name, value in properties:
        if not isinstance(name, str):
            raise InvalidInput(f"property name {name!r} is not a string")
        if isinstance(value, bytes):
            items.append([name, "b", base64.b64encode(value).decode("ascii")])
        elif isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidInput(
                f"property {name!r} has a value of type {type(value).__name__};"
                " allowed are str, bytes and int"
            )
        else:
            items.append([name, value])
    return json.dumps(items, separators=(",", ":")).encode()


def decode_properties(blob: bytes | None) -> Properties:
    if not blob:
        return ()
    out: list[tuple[str, PropertyValue]] = []
    for item in json.loads(blob):
        if len(item) == 3:
            out.append((item[0], base64.b64decode(item[2])))
        else:
            out.append((item[0], item[1]))
    return tuple(out)


_DURATION_UNITS = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}
_DURATION_UNITS["d"] = 24 * _DURATION_UNITS["h"]
_DURATION_UNITS["w"] = 7 * _DURATION_UNITS["d"]


def parse_duration(text: str) -> int:
    """Parse `500ms`, `30s`, `15m`, `12h`, `7d`, `2w` (or combinations like `1h30m`)
    into microseconds."""
    import re

    cleaned = text.strip().lower() if isinstance(text, str) else ""
    # [0-9], not \d: \d also takes other scripts' digits ("٣s").
    parts = re.findall(r"([0-9]+)(us|ms|s|m|h|d|w)", cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise InvalidInput(
            f"duration {text!r} is not a number followed by a unit (us, ms, s, m, h, d, w),"
            " e.g. 30s, 7d or 1h30m"
        )
    return sum(int(n) * _DURATION_UNITS[u] for n, u in parts)


def format_duration(micros: int) -> str:
    """The shortest exact form `parse_duration` reads back."""
    for unit in ("w", "d", "h", "m", "s", "ms"):
        size = _DURATION_UNITS[unit]
        if micros and micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros}us"
