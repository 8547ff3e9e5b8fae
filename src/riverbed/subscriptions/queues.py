"""What a retry or dead-letter queue holds: the failed message as it
was, plus where it came from and how it failed.

A queued message is a log message of the queue topic with the original
payload, key (the group id), MQTT topic, QoS, retain flag and properties, and
these properties first (names reserved by Riverbed, stripped again when read):

    riverbed.id       the original message id (text)
    riverbed.main     main topic position: "STORAGE_TOPIC_INDEX:PARTITION:OFFSET"
    riverbed.attempt  the attempt it is due for (2 after the first failure)
    riverbed.due      when that attempt is due (µs since the epoch)
    riverbed.failed   when it last failed (µs since the epoch)
    riverbed.reason   why (`HTTP 503`, `TimeoutError: ...`)

`QueuedMessage.from_stored` refuses a row without them (`InvalidInput` naming
what is missing), so the queues' readers and `riverbed dlq` see only what the
pipeline wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.errors import InvalidInput
from riverbed.model import Message, MessageId, Properties, StoredMessage

PREFIX = "riverbed."
FIELDS = ("id", "main", "attempt", "due", "failed", "reason")


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    message_id: MessageId
    main_topic_idx: int
    main_partition: int
    main_offset: int
    attempt: int
    due_us: int
    failed_us: int
    reason: str
    key: str | None
    payload: bytes
    mqtt_topic: str
    properties: Properties = ()
    qos: int = 0
    retain: bool = False

    def to_message(self) -> Message:
        """The log message to write to the queue topic (keyed by its group)."""
        own: Properties = (
            (PREFIX + "id", str(self.message_id)),
            (PREFIX + "main", f"{self.main_topic_idx}:{self.main_partition}:{self.main_offset}"),
            (PREFIX + "attempt", self.attempt),
            (PREFIX + "due", self.due_us),
            (PREFIX + "failed", self.failed_us),
            (PREFIX + "reason", self.reason),
        )
        return Message(
            self.payload,
            key=self.key,
            mqtt_topic=self.mqtt_topic,
            properties=own + tuple(self.properties),
            qos=self.qos,
            retain=self.retain,
        )

    @classmethod
    def from_stored(cls, row: StoredMessage) -> QueuedMessage:
        """Read back what `to_message` wrote."""
        found: dict[str, object] = {}
        rest: list[tuple[str, str | bytes | int]] = []
        for name, value in row.properties:
            field = name[len(PREFIX) :] if name.startswith(PREFIX) else None
            if field in FIELDS and field not in found:
                found[field] = value
            else:
                rest.append((name, value))
        missing = [f for f in FIELDS if f not in found]
        if missing:
            names = ", ".join(PREFIX + f for f in missing)
            raise InvalidInput(
                f"queue message at offset {row.offset} lacks {names}:"
                " not written by a delivering subscription"
            )
        try:
            idx, partition, offset = (int(x) for x in str(found["main"]).split(":"))
            return cls(
                MessageId.parse(str(found["id"])),
                idx,
                partition,
                offset,
                _int(found["attempt"]),
                _int(found["due"]),
                _int(found["failed"]),
                str(found["reason"]),
                row.key,
                row.payload,
                row.mqtt_topic,
                tuple(rest),
                row.qos,
                bool(row.retain),
            )
        except (ValueError, TypeError) as exc:
            raise InvalidInput(
                f"queue message at offset {row.offset} is malformed: {exc}"
            ) from None


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value
