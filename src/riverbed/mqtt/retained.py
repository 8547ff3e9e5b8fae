"""Retained messages (MQTT 5.0 §3.3.1.3), durable across restarts.

Kept in the KV namespace `retained`, key = topic name, one entry per topic: the
KV is in every storage already (no migration), a write is one transaction, and
a SUBSCRIBE lists the entries under the filter's literal prefix (`a/b/+` lists
`a/b...`) and matches the rest. A retained PUBLISH is stored before the
message is committed to the log and acknowledged; an empty payload deletes the
topic's entry [MQTT-3.3.1-6] (the message itself is still delivered normally).
Topic names starting with `$` are not matched by filters starting with a
wildcard [MQTT-4.7.2-1] (`topics.filters.matches`).

Blocking: the broker calls it from worker threads.
"""

from __future__ import annotations

import base64
import json

from riverbed.errors import PreconditionFailed
from riverbed.model import Message, StoredMessage, encode_properties
from riverbed.storage.base import Storage
from riverbed.topics.filters import matches

NAMESPACE = "retained"
_READ = 256
"""Entries per storage read of `page` (those under the prefix the filter does
not match are read and passed over)."""


def _prefix(topic_filter: str) -> str:
    """The literal levels of a filter before its first wildcard (`a/#` also
    matches `a`, so no trailing `/`)."""
    literal: list[str] = []
    for level in topic_filter.split("/"):
        if level in ("+", "#"):
            return "/".join(literal)
        literal.append(level)
    return topic_filter


class RetainedStore:
    """The retained message of every topic name that has one."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def put(self, message: Message, timestamp_us: int) -> None:
        """Retain `message` for its topic name; an empty payload deletes."""
        topic = message.mqtt_topic
        if not message.payload:
            self.delete(topic)
            return
        blob = encode_properties(message.properties) if message.properties else None
        value = json.dumps(
            {
                "ts": timestamp_us,
                "key": message.key,
                "qos": message.qos,
                "payload": base64.b64encode(message.payload).decode(),
                "properties": None if blob is None else base64.b64encode(blob).decode(),
            },
            separators=(",", ":"),
        ).encode()
        self.storage.kv_put(NAMESPACE, topic, value)

    def delete(self, topic: str) -> bool:
        """Forget the topic's retained message (what a retained PUBLISH with an
        empty payload does); whether there was one."""
        for _attempt in range(10):
            entry = self.storage.kv_get(NAMESPACE, topic)
            if entry is None:
                return False
            try:
                self.storage.kv_delete_if_version(NAMESPACE, topic, entry.version)
                return True
            except PreconditionFailed:
                continue  # written meanwhile: look again
        return False

    def get(self, topic: str) -> StoredMessage | None:
        """The retained message of one topic name, if it has one."""
        entry = self.storage.kv_get(NAMESPACE, topic)
        return None if entry is None else _stored(entry.key, entry.value)

    def any_under(self, topic_filter: str) -> bool:
        """Whether a topic name under the filter's literal prefix has a retained
        message: true whenever `matching` finds one (and sometimes when it does
        not), at the cost of one index look-up, where `matching` reads
        everything under the prefix. Most SUBSCRIBEs find none."""
        return self.storage.kv_any(NAMESPACE, _prefix(topic_filter))

    def page(
        self, topic_filter: str, after: str | None, limit: int
    ) -> tuple[list[StoredMessage], str | None]:
        """The retained messages `topic_filter` matches whose topic names sort
        after `after` (None: from the first), in topic name order: at most
        `limit` of them, and the name the next page goes on after (None: there
        are no more). A subscriber gets them a page at a time, as it takes
        them in, where `matching` holds them all at once."""
        if limit < 1:
            raise ValueError(f"page size {limit!r} must be at least 1")
        prefix = _prefix(topic_filter)
        found: list[StoredMessage] = []
        if after is None and prefix == topic_filter:
            # No wildcard: the one topic name it matches, one look-up (most
            # SUBSCRIBEs name a topic; no need to read the names under it).
            entry = self.storage.kv_get(NAMESPACE, topic_filter)
            if entry is not None and matches(topic_filter, entry.key):
                found.append(_stored(entry.key, entry.value))
            return found, None
        if after is None and prefix:
            # The prefix itself (`a/#` matches `a`), then the names after it.
            entry = self.storage.kv_get(NAMESPACE, prefix)
            if entry is not None and matches(topic_filter, prefix):
                found.append(_stored(entry.key, entry.value))
            after = prefix
        read = max(limit, _READ)
        while len(found) < limit:
            entries = self.storage.kv_page(NAMESPACE, after, read)
            for entry in entries:
                if not entry.key.startswith(prefix):
                    return found, None  # past the names under the prefix
                after = entry.key
                if matches(topic_filter, entry.key):
                    found.append(_stored(entry.key, entry.value))
                    if len(found) == limit:
                        return found, after
            if len(entries) < read:
                return found, None
        return found, after

    def matching(self, topic_filter: str, limit: int | None = None) -> list[StoredMessage]:
        """The retained messages whose topic names `topic_filter` matches, in
        topic name order (offsets 0; retain flag 1); the first `limit` if given."""
        found: list[StoredMessage] = []
        for entry in self.storage.kv_list(NAMESPACE, _prefix(topic_filter)):
            if limit is not None and len(found) >= limit:
                break
            if matches(topic_filter, entry.key):
                found.append(_stored(entry.key, entry.value))
        return found


def _stored(topic: str, value: bytes) -> StoredMessage:
    data = json.loads(value)
    properties = data["properties"]
    return StoredMessage(
        0,
        b"",
        data["ts"],
        topic,
        data["key"],
        base64.b64decode(data["payload"]),
        None if properties is None else base64.b64decode(properties),
        data["qos"],
        1,
    )
