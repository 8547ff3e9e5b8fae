"""Named subscriptions and their cursors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from riverbed.errors import AlreadyExists, SubscriptionNotFound
from riverbed.storage.base import StartKind, StreamHead, SubscriptionRecord
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.sql.core import _HEAD_COLUMNS, SqlCore, _head

_SUB_COLUMNS = "name, topic, topic_filter, start_kind, start_us, created_us"


def _subscription(row: Sequence[Any]) -> SubscriptionRecord:
    return SubscriptionRecord(row[0], row[1], row[2], StartKind(row[3]), row[4], row[5])


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
    ) -> None:
        """`create_subscription` inside the transaction of `cur`."""
        self._lock_meta(cur)
        self._get_topic(cur, record.topic)
        found = self._x(
            cur, "SELECT 1 FROM subscriptions WHERE name = ?", (record.name,)
        ).fetchone()
        if found is not None:
            raise AlreadyExists(f"subscription {record.name!r} exists already")
        self._x(
            cur,
            f"INSERT INTO subscriptions ({_SUB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (
                record.name,
                record.topic,
                record.filter,
                record.start.value,
                record.start_us,
                record.created_us,
            ),
        )
        heads = [
            _head(r)
            for r in self._x(
                cur,
                f"SELECT {_HEAD_COLUMNS} FROM streams WHERE topic = ? ORDER BY generation, part",
                (record.topic,),
            ).fetchall()
        ]
        offsets = initial(heads)
        cur.executemany(
            self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
            [(record.name, k, v) for k, v in offsets.items()],
        )

    @operation
    def get_subscription(self, name: str) -> SubscriptionRecord:
        row = self._q(
            f"SELECT {_SUB_COLUMNS} FROM subscriptions WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")
        return _subscription(row)

    @operation
    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionRecord]:
        if topic is None:
            rows = self._q(f"SELECT {_SUB_COLUMNS} FROM subscriptions ORDER BY name").fetchall()
        else:
            rows = self._q(
                f"SELECT {_SUB_COLUMNS} FROM subscriptions WHERE topic = ? ORDER BY name",
                (topic,),
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
        rows = self._q(
            "SELECT stream, committed FROM cursors WHERE subscription = ?", (name,)
        ).fetchall()
        return {int(s): int(c) for s, c in rows}

    def _require_subscription(self, cur: Cursor, name: str) -> None:
        if self._x(cur, "SELECT 1 FROM subscriptions WHERE name = ?", (name,)).fetchone() is None:
            raise SubscriptionNotFound(f"subscription {name!r} does not exist")

    @operation
    def commit_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        if not offsets:
            return
        with self._write() as cur:
            self._require_subscription(cur, name)
            cur.executemany(
                self._sql(
                    "INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"
                    " ON CONFLICT (subscription, stream) DO UPDATE SET committed ="
                    " CASE WHEN excluded.committed > cursors.committed"
                    " THEN excluded.committed ELSE cursors.committed END"
                ),
                [(name, k, v) for k, v in offsets.items()],
            )

    @operation
    def reset_cursors(self, name: str, offsets: Mapping[int, int]) -> None:
        with self._write() as cur:
            self._require_subscription(cur, name)
            self._x(cur, "DELETE FROM cursors WHERE subscription = ?", (name,))
            cur.executemany(
                self._sql("INSERT INTO cursors (subscription, stream, committed) VALUES (?, ?, ?)"),
                [(name, k, v) for k, v in offsets.items()],
            )

    @operation
    def min_cursors(self, topic: str) -> dict[int, int]:
        subs = self._q("SELECT COUNT(*) FROM subscriptions WHERE topic = ?", (topic,)).fetchone()
        total = int(subs[0])
        rows = self._q(
            "SELECT s.id, MIN(c.committed), COUNT(c.committed) FROM streams s"
            " LEFT JOIN cursors c ON c.stream = s.id AND c.subscription IN"
            " (SELECT name FROM subscriptions WHERE topic = ?)"
            " WHERE s.topic = ? GROUP BY s.id",
            (topic, topic),
        ).fetchall()
        out: dict[int, int] = {}
        for stream, lowest, count in rows:
            if total == 0:
                continue
            out[int(stream)] = int(lowest) if int(count) == total else -1
        return out
