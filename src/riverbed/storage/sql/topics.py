"""Topics, their generations (storage topics) and their streams' heads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from riverbed.errors import AlreadyExists
from riverbed.storage.base import RetentionPolicy, StorageTopicRecord, StreamHead, TopicRecord
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.sql.core import (
    _HEAD_COLUMNS,
    _TOPIC_COLUMNS,
    SqlCore,
    _found_topic,
    _head,
    _topic,
)

_STORAGE_TOPICS = (
    "SELECT topic, generation, partitions, k FROM storage_topics"
    " WHERE topic = ? ORDER BY generation"
)


class TopicQueries(SqlCore):
    """The metadata queries of `SqlStorage`."""

    # --- metadata -----------------------------------------------------------
    @operation
    def meta_version(self) -> int:
        row = self._q("SELECT value FROM meta WHERE name = 'meta_version'").fetchone()
        return int(row[0])

    @operation
    def create_topic(
        self,
        topic: TopicRecord,
        partitions: int,
        validate: Callable[[list[TopicRecord]], None],
    ) -> None:
        with self._write() as cur:
            self._lock_meta(cur)
            existing = [_topic(r) for r in self._x(cur, f"SELECT {_TOPIC_COLUMNS} FROM topics")]
            if any(t.name == topic.name for t in existing):
                raise AlreadyExists(f"topic {topic.name!r} exists already")
            validate(existing)
            self._x(
                cur,
                f"INSERT INTO topics ({_TOPIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    topic.name,
                    topic.binding,
                    topic.retention_us,
                    topic.retention_policy.value,
                    topic.produce_pointer,
                    topic.created_us,
                    topic.max_age_us,
                    topic.max_messages,
                    topic.max_bytes,
                    topic.key_mode,
                ),
            )
            self._insert_generation(cur, StorageTopicRecord(topic.name, 0, partitions, 1))
            self._bump_meta(cur)

    def _insert_generation(self, cur: Cursor, st: StorageTopicRecord) -> None:
        self._x(
            cur,
            "INSERT INTO storage_topics (topic, generation, partitions, k) VALUES (?, ?, ?, ?)",
            (st.topic, st.generation, st.partitions, st.k),
        )
        cur.executemany(
            self._sql(
                "INSERT INTO streams (topic, generation, part, start_offset, next_offset, sealed)"
                " VALUES (?, ?, ?, 0, 0, 0)"
            ),
            [(st.topic, st.generation, p) for p in range(st.partitions)],
        )

    @operation
    def get_topic(self, name: str) -> TopicRecord:
        return self._read_topic(name)

    def _read_topic(self, name: str) -> TopicRecord:
        row = self._q(f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = ?", (name,)).fetchone()
        return _found_topic(row, name)

    @operation
    def list_topics(self) -> list[TopicRecord]:
        rows = self._q(f"SELECT {_TOPIC_COLUMNS} FROM topics ORDER BY name").fetchall()
        return [_topic(r) for r in rows]

    @operation
    def update_topic(
        self, name: str, retention_us: int | None, retention_policy: RetentionPolicy
    ) -> TopicRecord:
        return self._set_topic(
            name, "retention_us = ?, retention_policy = ?", (retention_us, retention_policy.value)
        )

    @operation
    def set_topic_limits(
        self, name: str, max_age_us: int | None, max_messages: int | None
    ) -> TopicRecord:
        return self._set_topic(name, "max_age_us = ?, max_messages = ?", (max_age_us, max_messages))

    @operation
    def alter_topic(self, name: str, change: Callable[[TopicRecord], TopicRecord]) -> TopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            wanted = change(self._get_topic(cur, name))
            self._x(
                cur,
                "UPDATE topics SET retention_us = ?, retention_policy = ?, max_age_us = ?,"
                " max_messages = ?, max_bytes = ?, key_mode = ? WHERE name = ?",
                (
                    wanted.retention_us,
                    wanted.retention_policy.value,
                    wanted.max_age_us,
                    wanted.max_messages,
                    wanted.max_bytes,
                    wanted.key_mode,
                    name,
                ),
            )
            self._bump_meta(cur)
            return self._get_topic(cur, name)

    def _set_topic(self, name: str, assignments: str, values: Sequence[Any]) -> TopicRecord:
        """Change columns of a topic's row (`assignments`: `col = ?, ...`)."""
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, name)
            self._x(cur, f"UPDATE topics SET {assignments} WHERE name = ?", (*values, name))
            self._bump_meta(cur)
            return self._get_topic(cur, name)

    @operation
    def delete_topic(self, name: str) -> int:
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, name)
            deleted = self._x(
                cur,
                "DELETE FROM messages WHERE stream IN (SELECT id FROM streams WHERE topic = ?)",
                (name,),
            ).rowcount
            self._x(
                cur,
                "DELETE FROM cursors WHERE subscription IN"
                " (SELECT name FROM subscriptions WHERE topic = ?)",
                (name,),
            )
            self._x(cur, "DELETE FROM subscriptions WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM streams WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM storage_topics WHERE topic = ?", (name,))
            self._x(cur, "DELETE FROM topics WHERE name = ?", (name,))
            self._bump_meta(cur)
            # Readers of its streams (in other processes too) learn they are gone.
            self._notify_in_tx(cur)
        self.wakeups.notify()
        return int(deleted)

    def _storage_topics(self, cur: Cursor, topic: str) -> list[StorageTopicRecord]:
        rows = self._x(cur, _STORAGE_TOPICS, (topic,)).fetchall()
        return [StorageTopicRecord(*r) for r in rows]

    @operation
    def list_storage_topics(self, topic: str) -> list[StorageTopicRecord]:
        self._read_topic(topic)
        return [StorageTopicRecord(*r) for r in self._q(_STORAGE_TOPICS, (topic,)).fetchall()]

    @operation
    def add_storage_topic(
        self, topic: str, plan: Callable[[StorageTopicRecord], tuple[int, int]]
    ) -> StorageTopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            self._get_topic(cur, topic)
            last = self._storage_topics(cur, topic)[-1]
            partitions, k = plan(last)
            added = StorageTopicRecord(topic, last.generation + 1, partitions, k)
            self._insert_generation(cur, added)
            self._bump_meta(cur)
            return added

    @operation
    def switch_produce(self, topic: str) -> TopicRecord:
        with self._write() as cur:
            self._lock_meta(cur)
            record = self._get_topic(cur, topic)
            last = len(self._storage_topics(cur, topic)) - 1
            pointer = min(record.produce_pointer + 1, last)
            if pointer != record.produce_pointer:
                self._x(
                    cur, "UPDATE topics SET produce_pointer = ? WHERE name = ?", (pointer, topic)
                )
                # Sealing happens in the same transaction that moves the pointer. An
                # append holds the lock on the heads it writes (SQLite: the database
                # write lock; PostgreSQL: row locks), so no write is in flight to a
                # stream once it reads as sealed (DESIGN.md, Stream).
                self._x(
                    cur,
                    "UPDATE streams SET sealed = 1 WHERE topic = ? AND generation < ?",
                    (topic, pointer),
                )
                self._bump_meta(cur)
                self._notify_in_tx(cur)
            result = self._get_topic(cur, topic)
        self.wakeups.notify()
        return result

    @operation
    def list_streams(self, topic: str | None = None) -> list[StreamHead]:
        if topic is None:
            rows = self._q(
                f"SELECT {_HEAD_COLUMNS} FROM streams ORDER BY topic, generation, part"
            ).fetchall()
        else:
            rows = self._q(
                f"SELECT {_HEAD_COLUMNS} FROM streams WHERE topic = ? ORDER BY generation, part",
                (topic,),
            ).fetchall()
        return [_head(r) for r in rows]
