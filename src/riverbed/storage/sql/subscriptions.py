"""Named subscriptions and their cursors.

A subscription's committed offsets are rows of `cursors` (one per stream), or,
for a packed one (`SubscriptionRecord.packed`), a JSON object in its own row
(`subscriptions.offsets`: `{"stream key": offset}`). Every operation here
reads and writes both the same way, so callers never tell them apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from riverbed.errors import AlreadyExists, StorageError, SubscriptionNotFound
from riverbed.storage.base import StartKind, StorageTopicRecord, StreamHead, SubscriptionRecord
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.sql.core import _HEAD_COLUMNS, SqlCore, _head, in_parts

_SUB_COLUMNS = "name, topic, topic_filter, start_kind, start_us, created_us"
_READ_COLUMNS = f"{_SUB_COLUMNS}, offsets IS NOT NULL"
_UPSERT_CURSOR = (
    "INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"
    " ON CONFLICT (subscription, stream) DO UPDATE SET committed ="
    " CASE WHEN excluded.committed > cursors.committed"
    " THEN excluded.committed ELSE cursors.committed END"
)
_HEADS_AND_SHAPE = (
    f"SELECT 0, {_HEAD_COLUMNS} FROM streams WHERE topic = ?"
    " UNION ALL SELECT 1, 0, topic, generation, partitions, k, 0, 0"
    " FROM storage_topics WHERE topic = ? ORDER BY 1, 4, 5"
)
"""A topic's stream heads (kind 0: by generation and part) and its
generations (kind 1: topic, generation, partitions, k), in one statement."""
_MERGE_TRIES = 100
"""Compare-and-set attempts of one packed commit before it gives up (each
lost attempt means another transaction committed the same row meanwhile)."""


def _subscription(row: Sequence[Any]) -> SubscriptionRecord:
    return SubscriptionRecord(
        row[0], row[1], row[2], StartKind(row[3]), row[4], row[5], bool(row[6])
    )


def pack_offsets(offsets: Mapping[int, int]) -> str:
    """A packed subscription's committed offsets as stored: a JSON object
    keyed by stream key (as text), in key order."""
    return orjson.dumps({str(k): int(offsets[k]) for k in sorted(offsets)}).decode()


def unpack_offsets(text: str) -> dict[int, int]:
    """`pack_offsets` read back."""
    return {int(k): int(v) for k, v in orjson.loads(text).items()}


class SubscriptionQueries(SqlCore):
    """The subscription and cursor queries of `SqlStorage`."""

    # --- subscriptions ------------------------------------------------------
    @operation
    def create_subscription(
        self,
        record: SubscriptionRecord,
        initial: Callable[[list[StreamHead]], dict[int, int]],
    ) -> None:
        with self._write() as cur:
            self._create_subscription_on(cur, record, initial)

    def _create_subscription_on(
        self,
        cur: Cursor,
        record: SubscriptionRecord,
        initial: Callable[[list[StreamHead]], dict[int, int]],
    ) -> list[StorageTopicRecord]:
        """`create_subscription` inside the transaction of `cur`; returns the
        topic's generations as it read them with its heads (one statement:
        what a session follows the new cursors by). Excluded by metadata
        changes (a topic scaled up or deleted) and by retention's deletion of
        what every subscription has consumed, which all take `_lock_meta`; not
        by other new subscriptions (sessions' SUBSCRIBEs on every node at
        once)."""
        self._lock_meta_shared(cur)
        rows = self._x(cur, _HEADS_AND_SHAPE, (record.topic, record.topic)).fetchall()
        heads = [_head(r[1:]) for r in rows if r[0] == 0]
        generations = [StorageTopicRecord(*r[2:6]) for r in rows if r[0] == 1]
        if not heads:  # every topic has streams
            self._get_topic(cur, record.topic)  # raises TopicNotFound
        offsets = initial(heads)
        inserted = self._x(
            cur,
            f"INSERT INTO subscriptions ({_SUB_COLUMNS}, offsets) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (name) DO NOTHING",
            (
                record.name,
                record.topic,
                record.filter,
                record.start.value,
                record.start_us,
                record.created_us,
                pack_offsets(offsets) if record.packed else None,
            ),
        ).rowcount
        if not inserted:
            raise AlreadyExists(f"subscription {record.name!r} exists already")
        if not record.packed:
            cur.executemany(
                self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
                [(record.name, k, v) for k, v in offsets.items()],
            )
        return generations

    @operation
    def get_subscription(self, name: str) -> SubscriptionRecord:
        row = self._q(
            f"SELECT {_READ_COLUMNS} FROM subscriptions WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")
        return _subscription(row)

    @operation
    def list_subscriptions(
        self, topic: str | None = None, *, named_only: bool = False
    ) -> list[SubscriptionRecord]:
        where: list[str] = []
        params: list[str] = []
        if topic is not None:
            where.append("topic = ?")
            params.append(topic)
        if named_only:
            where.append("name NOT LIKE ?")  # `$` is no wildcard of LIKE
            params.append("$%")
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._q(
            f"SELECT {_READ_COLUMNS} FROM subscriptions{condition} ORDER BY name", params
        ).fetchall()
        return [_subscription(r) for r in rows]

    @operation
    def delete_subscription(self, name: str) -> None:
        with self._write() as cur:
            if self._x(cur, "DELETE FROM subscriptions WHERE name = ?", (name,)).rowcount == 0:
                raise SubscriptionNotFound(f"subscription {name!r} does not exist")
            self._x(cur, "DELETE FROM cursors WHERE subscription = ?", (name,))

    @operation
    def get_cursors(self, name: str) -> dict[int, int]:
        return self._find_cursors(name) or {}

    @operation
    def find_cursors(self, name: str) -> dict[int, int] | None:
        return self._find_cursors(name)

    @operation
    def find_cursors_many(self, names: Sequence[str]) -> dict[str, dict[int, int]]:
        return self._find_cursors_many_on(None, names)

    def _find_cursors_many_on(
        self, cur: Cursor | None, names: Sequence[str]
    ) -> dict[str, dict[int, int]]:
        """`find_cursors_many`, inside the transaction of `cur` (None: a read of
        its own)."""
        out: dict[str, dict[int, int]] = {}
        for part in in_parts(names):
            marks = ", ".join("?" * len(part))
            sql = (
                f"SELECT 0, name, offsets, 0, 0 FROM subscriptions WHERE name IN ({marks})"
                " UNION ALL SELECT 1, subscription, NULL, stream, committed FROM cursors"
                f" WHERE subscription IN ({marks}) ORDER BY 1"
            )
            params = (*part, *part)
            rows = (self._q(sql, params) if cur is None else self._x(cur, sql, params)).fetchall()
            for kind, name, packed, stream, committed in rows:
                if kind == 0:
                    found = out[name] = {}
                    if packed is not None:
                        found.update(unpack_offsets(packed))
                elif name in out:  # its subscription's row came first (ORDER BY 1)
                    out[name][int(stream)] = int(committed)
        return out

    def _find_cursors(self, name: str) -> dict[int, int] | None:
        # The subscription's own row first (kind 0: it exists; its offsets if
        # packed), then its rows of `cursors` (kind 1).
        rows = self._q(
            "SELECT 0, offsets, 0, 0 FROM subscriptions WHERE name = ?"
            " UNION ALL SELECT 1, NULL, stream, committed FROM cursors WHERE subscription = ?",
            (name, name),
        ).fetchall()
        found = False
        out: dict[int, int] = {}
        for kind, packed, stream, committed in rows:
            if kind == 0:
                found = True
                if packed is not None:
                    out.update(unpack_offsets(packed))
            else:
                out[int(stream)] = int(committed)
        return out if found else None

    def _cursors_row(self, cur: Cursor, name: str) -> tuple[Any] | None:
        """The subscription's packed offsets as stored (`(None,)`: its cursors
        are rows; None: no such subscription)."""
        row = self._x(cur, "SELECT offsets FROM subscriptions WHERE name = ?", (name,)).fetchone()
        return None if row is None else (row[0],)

    def _commit_cursors_on(self, cur: Cursor, name: str, offsets: Mapping[int, int]) -> bool:
        """`commit_cursors` inside the transaction of `cur`; False (and nothing
        written) if there is no such subscription."""
        for _ in range(_MERGE_TRIES):
            found = self._cursors_row(cur, name)
            if found is None:
                return False
            stored = found[0]
            if stored is None:
                cur.executemany(
                    self._sql(_UPSERT_CURSOR), [(name, k, v) for k, v in offsets.items()]
                )
                return True
            merged = unpack_offsets(stored)
            moved = False
            for key, offset in offsets.items():
                if offset > merged.get(key, -1):
                    merged[key] = offset
                    moved = True
            if not moved:
                return True
            # A compare-and-set on the text read: a transaction that committed
            # the row meanwhile (PostgreSQL, another node) makes it match
            # nothing, and the merge starts again from what it wrote.
            written = self._x(
                cur,
                "UPDATE subscriptions SET offsets = ? WHERE name = ? AND offsets = ?",
                (pack_offsets(merged), name, stored),
            ).rowcount
            if written:
                return True
        raise StorageError(
            f"the cursors of subscription {name!r} kept changing under a commit"
            f" ({_MERGE_TRIES} attempts)"
        )

    @operation
    def commit_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        if not offsets:
            return
        with self._write() as cur:
            if not self._commit_cursors_on(cur, name, offsets):
                raise SubscriptionNotFound(f"subscription {name!r} does not exist")

    @operation
    def reset_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        with self._write() as cur:
            found = self._cursors_row(cur, name)
            if found is None:
                raise SubscriptionNotFound(f"subscription {name!r} does not exist")
            if found[0] is not None:
                self._x(
                    cur,
                    "UPDATE subscriptions SET offsets = ? WHERE name = ?",
                    (pack_offsets(offsets), name),
                )
                return
            self._x(cur, "DELETE FROM cursors WHERE subscription = ?", (name,))
            cur.executemany(
                self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
                [(name, k, v) for k, v in offsets.items()],
            )

    def _committed_of_topic(self) -> str:
        """A subquery of every committed offset on the topic's streams (`stream`,
        `committed`), rows and packed alike; its one parameter is the topic,
        given twice."""
        each = self.JSON_EACH.format("p.offsets")
        return (
            "SELECT stream, committed FROM cursors WHERE subscription IN"
            " (SELECT name FROM subscriptions WHERE topic = ? AND offsets IS NULL)"
            " UNION ALL SELECT CAST(j.key AS BIGINT), CAST(j.value AS BIGINT)"
            f" FROM subscriptions p, {each} j WHERE p.topic = ? AND p.offsets IS NOT NULL"
        )

    @operation
    def min_cursors(self, topic: str) -> dict[int, int]:
        subs = self._q("SELECT COUNT(*) FROM subscriptions WHERE topic = ?", (topic,)).fetchone()
        total = int(subs[0])
        if total == 0:
            return {}
        rows = self._q(
            "SELECT s.id, MIN(c.committed), COUNT(c.committed) FROM streams s"
            f" LEFT JOIN ({self._committed_of_topic()}) c ON c.stream = s.id"
            " WHERE s.topic = ? GROUP BY s.id",
            (topic, topic, topic),
        ).fetchall()
        return {
            int(stream): int(lowest) if int(count) == total else -1
            for stream, lowest, count in rows
        }
