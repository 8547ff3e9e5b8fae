"""Messages as JSON objects: what `riverbed produce` reads and `riverbed consume` prints.

In: `{"key", "mqtt_topic", "payload" | "payload_b64", "properties", "qos", "retain"}`,
exactly one of `payload` (UTF-8 text) and `payload_b64` (standard base64), the
rest optional. Out: the same fields plus `stream`, `offset`, `id` and
`timestamp`; `payload` is null and `payload_b64` added when the bytes are not
UTF-8. A property is `[name, value]` with a string, an integer, or `{"b64": ...}`
for bytes (MQTT 5 binary properties); on input an object `{name: value}` works
too when no name repeats.

Parsing is strict, since a bad line must be refused before anything is written:
unknown fields, wrong types and bad base64 raise `InvalidInput` naming the field,
the value and the rule.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

from riverbed.errors import InvalidInput
from riverbed.model import Message, Properties, PropertyValue, StoredMessage, StreamId

FIELDS = ("key", "mqtt_topic", "payload", "payload_b64", "properties", "qos", "retain")
"""The fields a message object may have on input."""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_time(micros: int) -> str:
    """µs since the epoch as ISO 8601 in UTC with microseconds."""
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def show(value: object, limit: int = 60) -> str:
    """A JSON value as an error message quotes it: shortened if long."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def message_from_json(line: str) -> Message:
    """Parse one JSON object into a message. Raises `InvalidInput`.

    `mqtt_topic` is only checked to be a non-empty string here; whether it is a
    valid topic name the topic's binding matches is `Log.check`'s business.
    """
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as exc:
        # Some of json's messages end in " at" ("Invalid control character at").
        reason = exc.msg.removesuffix(" at")
        raise InvalidInput(f"not valid JSON: {reason} at column {exc.colno}") from None
    if not isinstance(fields, dict):
        raise InvalidInput(f"{show(fields)} is not a JSON object")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}; known fields: {', '.join(FIELDS)}")
    if ("payload" in fields) == ("payload_b64" in fields):
        raise InvalidInput(
            "a message has exactly one of payload (UTF-8 text) and payload_b64 (base64),"
            + (" not both" if "payload" in fields else " found neither")
        )
    if "payload" in fields:
        payload = _text(fields["payload"], "payload").encode("utf-8")
    else:
        payload = _base64(fields["payload_b64"], "payload_b64")
    key = fields.get("key")
    mqtt_topic = fields.get("mqtt_topic")
    qos = fields.get("qos", 0)
    retain = fields.get("retain", False)
    if mqtt_topic == "":
        raise InvalidInput('mqtt_topic "" is empty: leave it out or use null for none')
    if not (isinstance(qos, int) and not isinstance(qos, bool) and 0 <= qos <= 2):
        raise InvalidInput(f"qos {show(qos)} is not 0, 1 or 2")
    if not isinstance(retain, bool):
        raise InvalidInput(f"retain {show(retain)} is not true or false")
    return Message(
        payload,
        key=None if key is None else _text(key, "key"),
        mqtt_topic="" if mqtt_topic is None else _text(mqtt_topic, "mqtt_topic"),
        properties=_properties(fields.get("properties", [])),
        qos=qos,
        retain=retain,
    )


def message_to_json(stream: StreamId, message: StoredMessage) -> dict[str, object]:
    """A message read from `stream` as a JSON-ready dict."""
    out: dict[str, object] = {
        "stream": str(stream),
        "offset": message.offset,
        "id": str(message.message_id),
        "timestamp": format_time(message.timestamp_us),
        "mqtt_topic": message.mqtt_topic or None,
        "key": message.key,
    }
    try:
        out["payload"] = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload"] = None
        out["payload_b64"] = _b64(message.payload)
    out["properties"] = [
        [name, {"b64": _b64(value)} if isinstance(value, bytes) else value]
        for name, value in message.properties
    ]
    out["qos"] = message.qos
    out["retain"] = bool(message.retain)
    return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} {show(value)} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # JSON's \ud800 escapes decode to lone surrogates, which UTF-8 cannot hold.
        raise InvalidInput(f"{what} {show(value)} is not valid UTF-8 (lone surrogate)") from None
    return value


def _base64(value: object, what: str) -> bytes:
    text = _text(value, what)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or a plain ValueError for non-ASCII text
        raise InvalidInput(
            f"{what} {show(value)} is not valid base64 (standard alphabet, padded)"
        ) from None


def _properties(value: object) -> Properties:
    if isinstance(value, dict):
        pairs: list[object] = [[name, v] for name, v in value.items()]
    elif isinstance(value, list):
        pairs = value
    else:
        raise InvalidInput(
            f"properties {show(value)} is not a list of [name, value] pairs or an object"
        )
    out: list[tuple[str, PropertyValue]] = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise InvalidInput(f"property {show(pair)} is not a [name, value] pair")
        name = _text(pair[0], "property name")
        out.append((name, _property_value(name, pair[1])))
    return tuple(out)


def _property_value(name: str, value: object) -> PropertyValue:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return _base64(value["b64"], f"property {name!r} b64 value")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, f"property {name!r} value")
    raise InvalidInput(
        f"property {name!r} value {show(value)} is not a string, an integer or"
        ' {"b64": BASE64} for bytes'
    )
