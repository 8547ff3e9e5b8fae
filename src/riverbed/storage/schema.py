"""Versioned schema migrations, applied in order when a storage opens.

Each migration is a list of statements written once with type placeholders
that each backend fills in (`{text}`, `{blob}`, `{int}`, `{stream_pk}`,
`{messages_suffix}`), so the two schemas cannot drift apart.

Text compares and sorts by code point on both backends (`{text}` carries
`COLLATE "C"` on PostgreSQL, SQLite's default is binary): listings come back in
the same order whatever collation a PostgreSQL database was created with.
"""

from __future__ import annotations

MIGRATIONS: list[list[str]] = [
    # 1: the log, subscriptions and the key-value namespace.
    [
        "CREATE TABLE meta (name {text} PRIMARY KEY, value {int} NOT NULL)",
        "INSERT INTO meta (name, value) VALUES ('meta_version', 0)",
        """CREATE TABLE topics (
            name {text} PRIMARY KEY,
            binding {text},
            retention_us {int},
            retention_policy {text} NOT NULL,
            produce_pointer INTEGER NOT NULL,
            created_us {int} NOT NULL)""",
        """CREATE TABLE storage_topics (
            topic {text} NOT NULL,
            generation INTEGER NOT NULL,
            partitions INTEGER NOT NULL,
            k INTEGER NOT NULL,
            PRIMARY KEY (topic, generation))""",
        # The small heads table readers poll instead of scanning messages.
        """CREATE TABLE streams (
            id {stream_pk},
            topic {text} NOT NULL,
            generation INTEGER NOT NULL,
            part INTEGER NOT NULL,
            start_offset {int} NOT NULL,
            next_offset {int} NOT NULL,
            sealed INTEGER NOT NULL,
            UNIQUE (topic, generation, part))""",
        """CREATE TABLE messages (
            stream {int} NOT NULL,
            off {int} NOT NULL,
            id {blob} NOT NULL,
            ts {int} NOT NULL,
            mqtt_topic {text} NOT NULL,
            key {text},
            payload {blob} NOT NULL,
            properties {blob},
            qos SMALLINT NOT NULL,
            retain SMALLINT NOT NULL,
            PRIMARY KEY (stream, off)){messages_suffix}""",
        """CREATE TABLE subscriptions (
            name {text} PRIMARY KEY,
            topic {text} NOT NULL,
            topic_filter {text},
            start_kind {text} NOT NULL,
            start_us {int},
            created_us {int} NOT NULL)""",
        """CREATE TABLE cursors (
            subscription {text} NOT NULL,
            stream {int} NOT NULL,
            committed {int} NOT NULL,
            PRIMARY KEY (subscription, stream))""",
        "CREATE INDEX cursors_by_stream ON cursors (stream)",
        """CREATE TABLE kv (
            namespace {text} NOT NULL,
            key {text} NOT NULL,
            value {blob} NOT NULL,
            version {int} NOT NULL,
            PRIMARY KEY (namespace, key))""",
    ],
    # 2: idempotency markers. A writer that must not write twice (a Spark sink task,
    # retried or replayed; an MQTT QoS 2 PUBLISH) records a marker in the transaction
    # of its rows, and a second attempt with the same marker writes nothing.
    [
        """CREATE TABLE markers (
            marker {text} PRIMARY KEY,
            created_us {int} NOT NULL)""",
    ],
    # 3: partition locks with leases and fencing (seed 004, "Locks"): the default
    # lock service on SQLite (`riverbed.storage.locks.LeaseLocks`). A row outlives
    # its release so that `fence` only ever grows.
    [
        """CREATE TABLE partition_locks (
            subscription {text} NOT NULL,
            stream {int} NOT NULL,
            owner {text} NOT NULL,
            expires_us {int} NOT NULL,
            fence {int} NOT NULL,
            PRIMARY KEY (subscription, stream))""",
    ],
    # 4: limits retention applies whoever has not consumed: a maximum
    # age (Pulsar's message TTL) and a maximum of messages per stream (its
    # backlog quota). NULL: no limit, what every existing topic keeps.
    [
        "ALTER TABLE topics ADD COLUMN max_age_us {int}",
        "ALTER TABLE topics ADD COLUMN max_messages {int}",
    ],
    # 5: a maximum of payload bytes per stream, the third limit retention applies
    # whoever has not consumed (Pulsar's backlog quota counted in bytes). NULL: no
    # limit, what every existing topic keeps.
    [
        "ALTER TABLE topics ADD COLUMN max_bytes {int}",
    ],
    # 6: the ordering key of the MQTT publishes a topic's binding brings
    # (`log.topics.KeyMode`, as text). Topics made before it keep the key they
    # had: the publisher's client id. New topics always write it.
    [
        "ALTER TABLE topics ADD COLUMN key_mode {text} NOT NULL DEFAULT 'client-id'",
    ],
    # 7: no index of cursors by stream. Retention's one query by stream names
    # the subscriptions too (`subscription IN (...)`), which the primary key
    # answers; and the index cost every new subscription a leaf page per
    # stream: on SQLite, 16 of the 20-odd pages a session's first SUBSCRIBE
    # wrote for `mqtt`'s 16 partitions.
    [
        "DROP INDEX IF EXISTS cursors_by_stream",
    ],
    # 8: a subscription's cursors packed in its own row: a JSON object of
    # committed offsets by stream key (`SubscriptionRecord.packed`). A
    # session's cursors on a topic are read and written whole, by one
    # connection at a time: one row for a SUBSCRIBE to `mqtt` where its 16
    # partitions took 16 rows of `cursors` (and their B-tree pages). NULL:
    # the cursors are rows of `cursors`, as every subscription made before
    # keeps them, and as named subscriptions keep them (their workers commit
    # streams apart, each with a compare-and-set of its own row).
    [
        "ALTER TABLE subscriptions ADD COLUMN offsets {text}",
    ],
]

MESSAGE_COLUMNS = "off, id, ts, mqtt_topic, key, payload, properties, qos, retain"
"""The columns of a `StoredMessage`, in its field order."""
