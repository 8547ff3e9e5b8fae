"""PUBLISH packets to log messages and back.

A PUBLISH becomes a `Message` with the MQTT topic name, the payload, QoS and
retain flag. Its key (the ordering key, DESIGN.md) is the user property `key`
if present, else what the key mode of the binding that stores the topic says
(`riverbed.log.topics.KeyMode`): the client id and topic name together
(`client-topic`, the default of created topics: the order MQTT promises), the
client id (`client-id`: per-publisher order; the built-in `mqtt` and topics made
before key modes), the topic name, another user property, or no key at all
(`none`: spread one by one). Messages with one key stay in one stream, in order.

MQTT 5 user properties are kept as they are, in order. The other properties a
subscriber must see again (Payload Format Indicator, Content Type, Response
Topic, Correlation Data, Message Expiry Interval) and the publisher's client id
(for No Local) are kept under names starting with U+0000: no MQTT client can
send such a name ([MQTT-1.5.4-2] forbids U+0000 in UTF-8 strings), so they never
clash with a user property, and they are taken out again on the way to a
subscriber.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence

from riverbed.log.appender import Position, Positions
from riverbed.log.log import Log
from riverbed.log.topics import KeyKind, KeyMode
from riverbed.model import (
    Message,
    PropertyValue,
    StoredMessage,
    StreamId,
    decode_properties,
    encode_properties,
    stored_message,
)
from riverbed.mqtt.codec import NO_PUBLISH_PROPERTIES, Publish, PublishProperties
from riverbed.storage.base import Row

KEY_PROPERTY = "key"
"""The user property that sets a message's ordering key, whatever the key mode."""
KEY_SEPARATOR = "#"
"""Between the topic name and the client id in a `client-topic` key: no topic
name holds it ([MQTT-4.7.1-1]), so the key names the pair unambiguously."""

_CLIENT = "\x00client"
_FORMAT = "\x00format"
_CONTENT_TYPE = "\x00content_type"
_RESPONSE_TOPIC = "\x00response_topic"
_CORRELATION = "\x00correlation"
_EXPIRY = "\x00expiry"
_EXPIRY_MARK = json.dumps(_EXPIRY).encode()[1:-1]
"""How the expiry property's name looks inside a stored properties blob (JSON),
so that messages without one are told apart without decoding."""


def message_from_publish(packet: Publish, topic: str, client_id: str, key_mode: KeyMode) -> Message:
    """The log message for a PUBLISH to `topic` (its alias resolved) from
    `client_id`, keyed as `key_mode` (that of the binding storing `topic`) says."""
    props = packet.properties
    kind = key_mode.kind
    key: str | None
    if kind is KeyKind.CLIENT_TOPIC:
        key = topic + KEY_SEPARATOR + client_id
    elif kind is KeyKind.CLIENT_ID or kind is KeyKind.PROPERTY:
        key = client_id  # property:NAME without that property: the client id
    elif kind is KeyKind.TOPIC:
        key = topic
    else:
        key = None
    properties: list[tuple[str, PropertyValue]] = [(_CLIENT, client_id)]
    if props is not NO_PUBLISH_PROPERTIES:
        wanted = key_mode.property  # None unless property:NAME
        chosen: str | None = None
        for name, value in props.user_properties:
            if name == KEY_PROPERTY:
                chosen = value
            elif name == wanted:
                key = value
            properties.append((name, value))
        if chosen is not None:
            key = chosen  # the publisher's own `key` wins over any mode
        if props.payload_format_indicator is not None:
            properties.append((_FORMAT, props.payload_format_indicator))
        if props.content_type is not None:
            properties.append((_CONTENT_TYPE, props.content_type))
        if props.response_topic is not None:
            properties.append((_RESPONSE_TOPIC, props.response_topic))
        if props.correlation_data is not None:
            properties.append((_CORRELATION, props.correlation_data))
        if props.message_expiry_interval is not None:
            properties.append((_EXPIRY, props.message_expiry_interval))
    return Message(
        packet.payload,
        key=key,
        mqtt_topic=topic,
        properties=tuple(properties),
        qos=packet.qos,
        retain=packet.retain,
    )


def publisher(message: StoredMessage) -> str | None:
    """The client id that published a stored message, if it came through MQTT."""
    blob = message.properties_blob
    if not blob:
        return None
    for name, value in decode_properties(blob):
        if name == _CLIENT and isinstance(value, str):
            return value
    return None


def remaining_expiry(message: StoredMessage, clock_us: Callable[[], int]) -> int | None:
    """Whole seconds left of the message's Message Expiry Interval now (rounded
    up; 0 or less: expired), counted from when it was stored; None if it has
    none. Cheap for a message without one: no decoding."""
    blob = message.properties_blob
    if not blob or _EXPIRY_MARK not in blob:
        return None
    for name, value in decode_properties(blob):
        if name == _EXPIRY and isinstance(value, int):
            waited = (clock_us() - message.timestamp_us) / 1_000_000
            return math.ceil(value - waited) if waited < value else 0
    return None


def publish_properties(
    message: StoredMessage,
    subscription_identifiers: tuple[int, ...],
    expiry: int | None = None,
) -> PublishProperties:
    """The MQTT 5 properties to deliver a stored message with; `expiry`: the
    Message Expiry Interval still left (MQTT 5.0 §3.3.2.3.3), if it has one."""
    blob = message.properties_blob
    if not blob and not subscription_identifiers:
        return NO_PUBLISH_PROPERTIES
    if expiry is None:
        return _properties_of(blob, subscription_identifiers)
    return _properties(blob, subscription_identifiers, expiry)


@functools.lru_cache(maxsize=4096)
def _properties_of(
    blob: bytes | None, subscription_identifiers: tuple[int, ...]
) -> PublishProperties:
    """`_properties` without an expiry, remembered: a publisher's messages share
    their properties blob (immutable, so one object serves them all)."""
    return _properties(blob, subscription_identifiers, None)


def _properties(
    blob: bytes | None, subscription_identifiers: tuple[int, ...], expiry: int | None
) -> PublishProperties:
    user: list[tuple[str, str]] = []
    fields: dict[str, object] = {}
    for name, value in decode_properties(blob):
        if name.startswith("\x00"):
            if name == _FORMAT:
                fields["payload_format_indicator"] = value
            elif name == _CONTENT_TYPE:
                fields["content_type"] = value
            elif name == _RESPONSE_TOPIC:
                fields["response_topic"] = value
            elif name == _CORRELATION:
                fields["correlation_data"] = value
            elif name == _EXPIRY:
                fields["message_expiry_interval"] = value if expiry is None else expiry
        elif isinstance(value, str):
            user.append((name, value))
        else:
            # Written by another producer (CLI, Spark) as bytes or an int: MQTT user
            # properties are strings.
            user.append(
                (name, value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
            )
    if not user and not fields and not subscription_identifiers:
        return NO_PUBLISH_PROPERTIES
    return PublishProperties(
        user_properties=tuple(user),
        subscription_identifiers=subscription_identifiers,
        **fields,  # type: ignore[arg-type]
    )


def committed_row(message: Message, offset: int, at_us: int) -> StoredMessage:
    """A message this broker just committed at `offset`, as the fan-out hands it to
    sessions without reading it back (the id is not needed for delivery; the
    time `at_us` is the commit's, within milliseconds of the stored one)."""
    return StoredMessage(
        offset,
        b"",
        at_us,
        message.mqtt_topic,
        message.key,
        message.payload,
        encode_properties(message.properties),
        message.qos,
        int(message.retain),
    )


def committed_runs(
    messages: Sequence[Message], positions: Sequence[Position], start: int = 0
) -> Iterator[tuple[StreamId, int, list[StoredMessage]]]:
    """Committed `messages` (message i at `positions[start + i]`) as the fan-out
    takes them (`Fanout.committed`): one run of rows per stream and
    consecutive offsets, a run given as soon as a gap ends it (others
    appended in between), the rest in the order their streams came. One run
    per stream, not one per message: a key mode that spreads (`none`, keys per
    topic) interleaves streams message by message, and routing each message
    alone costs a wake-up of each waiting session per message."""
    if not messages:
        return
    if isinstance(positions, Positions) and positions.rows:
        yield from _stored_runs(positions, start, len(messages))
        return
    at_us = time.time_ns() // 1000  # riverbed.clock.now_us, inline: once per commit
    one = positions.run(start, len(messages)) if isinstance(positions, Positions) else None
    if one is not None:  # one stream, in order: no lookup per message
        stream, first = one
        yield stream, first, [committed_row(m, first + i, at_us) for i, m in enumerate(messages)]
        return
    runs: dict[StreamId, tuple[int, list[StoredMessage]]] = {}
    for i, message in enumerate(messages, start):
        stream, offset = positions[i]
        run = runs.get(stream)
        if run is not None:
            if offset == run[0] + len(run[1]):
                run[1].append(committed_row(message, offset, at_us))
                continue
            yield stream, *run
        runs[stream] = (offset, [committed_row(message, offset, at_us)])
    for stream, (first, rows) in runs.items():
        yield stream, first, rows


def _stored_runs(
    positions: Positions, start: int, count: int
) -> Iterator[tuple[StreamId, int, list[StoredMessage]]]:
    """`committed_runs` from the rows as the appender stored them: each
    message as a reader would read it back (its id and time too), a tuple
    made from its row, nothing encoded again."""
    make = stored_message
    rows = positions.rows
    one = positions.run(start, count)
    if one is not None:
        stream, first = one
        if start == 0 and count == len(rows):
            yield stream, first, [make((first + i, *row)) for i, row in enumerate(rows)]
        else:
            part = rows[start : start + count]
            yield stream, first, [make((first + i, *row)) for i, row in enumerate(part)]
        return
    runs: dict[StreamId, tuple[int, list[StoredMessage]]] = {}
    for i in range(start, start + count):
        stream, offset = positions[i]
        run = runs.get(stream)
        if run is not None:
            if offset == run[0] + len(run[1]):
                run[1].append(make((offset, *rows[i])))
                continue
            yield stream, *run
        runs[stream] = (offset, [make((offset, *rows[i]))])
    for stream, (first, stored) in runs.items():
        yield stream, first, stored


def append_exactly_once(bus: Log, log_topic: str, message: Message, marker: str) -> Position | None:
    """Append `message` to `log_topic` with `marker`, blocking; its (stream,
    offset), or None if the marker was recorded before (already committed).
    How an incoming QoS 2 PUBLISH (`mqtt/inbound.py`) and a Will published by
    another node (`mqtt/wills.py`) are stored exactly once."""
    bus.check(log_topic, message)
    ((id_bytes, ts),) = bus.appender.ids.reserve(1)
    row: Row = (
        id_bytes,
        ts,
        message.mqtt_topic,
        message.key,
        message.payload,
        encode_properties(message.properties) if message.properties else None,
        message.qos,
        int(message.retain),
    )
    firsts = bus.appender.append_once(log_topic, [row], marker)
    if firsts is None:
        return None
    ((key, offset),) = firsts.items()
    stream = bus.appender.stream_of(log_topic, key)
    return None if stream is None else (stream, offset)
