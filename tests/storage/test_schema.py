"""Schema migrations that change no behaviour: a database made before them
opens, is migrated, and answers as before (docs/architecture.md, Storage)."""

from __future__ import annotations

import pytest

from harness.storage import raw_connection
from riverbed.clock import now_us
from riverbed.log.log import Log
from riverbed.log.retention import RetentionResult, run_retention
from riverbed.model import Message, StreamId
from riverbed.storage import open_storage
from riverbed.storage.base import StartKind, SubscriptionRecord
from riverbed.storage.schema import MIGRATIONS
from riverbed.storage.sql import core as sql_core
from riverbed.subscriptions.named import Subscriptions

S0 = StreamId("t", 0, 0)
HOUR = 3_600_000_000


def _before(statement: str) -> int:
    """How many migrations precede the one with `statement`."""
    return next(i for i, m in enumerate(MIGRATIONS) if statement in m)


def _indexes_of_cursors(url: str) -> set[str]:
    with raw_connection(url) as conn:
        if url.startswith("sqlite"):
            query = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'cursors'"
        else:
            query = "SELECT indexname FROM pg_indexes WHERE tablename = 'cursors'"
        return {row[0] for row in conn.execute(query).fetchall()}


def _old_subscription(url: str, name: str, topic: str, cursors: dict[int, int]) -> None:
    """A subscription as the schema before packed cursors stored it: its row
    without `offsets`, a row of `cursors` per stream (behind the storage's back:
    today's code writes the column the old schema lacks)."""
    mark = "?" if url.startswith("sqlite") else "%s"
    with raw_connection(url) as conn:
        conn.execute(
            "INSERT INTO subscriptions (name, topic, topic_filter, start_kind, start_us,"
            f" created_us) VALUES ({mark}, {mark}, NULL, 'earliest', NULL, 1)",
            (name, topic),
        )
        for stream, committed in cursors.items():
            conn.execute(
                "INSERT INTO cursors (subscription, stream, committed)"
                f" VALUES ({mark}, {mark}, {mark})",
                (name, stream, committed),
            )


def test_cursors_lose_their_index_by_stream_and_retention_still_waits_for_them(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 7 drops `cursors_by_stream`: every new subscription wrote a
    leaf page of it per stream. Retention's lowest committed offset of a
    stream, which looked cursors up by stream, comes from the primary key."""
    with monkeypatch.context() as patch:
        patch.setattr(
            sql_core, "MIGRATIONS", MIGRATIONS[: _before("DROP INDEX IF EXISTS cursors_by_stream")]
        )
        with Log.open(storage_url) as log:  # the schema as it was before
            log.topics.create("t", 1, retention_us=HOUR)
            key = log.storage.list_streams("t")[0].key
            log.produce("t", [Message(b"m%d" % i, key="k") for i in range(10)])
    for name in ("fast", "slow"):
        _old_subscription(storage_url, name, "t", {key: 0})
    assert "cursors_by_stream" in _indexes_of_cursors(storage_url)

    with Log.open(storage_url) as log:
        assert "cursors_by_stream" not in _indexes_of_cursors(storage_url)
        subs = Subscriptions(log.storage)
        for name, count in (("fast", 8), ("slow", 3)):
            consumer = subs.consumer(name)
            assert len(consumer.poll(count)) == count
            consumer.commit()
        far_future = now_us() + 100 * HOUR
        assert run_retention(log.storage, now_us=far_future) == [RetentionResult(S0, 3, 3)]
    open_storage(storage_url).close()  # and opens again as it is now


def test_cursors_kept_as_rows_before_packed_ones_still_count(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 8 adds packed cursors (`subscriptions.offsets`). A session's
    cursors made before it stay rows, and read, commit and hold retention back
    as they did, beside a packed subscription on the same topic."""
    with monkeypatch.context() as patch:
        patch.setattr(
            sql_core,
            "MIGRATIONS",
            MIGRATIONS[: _before("ALTER TABLE subscriptions ADD COLUMN offsets {text}")],
        )
        with Log.open(storage_url) as log:
            log.topics.create("t", 1, retention_us=HOUR)
            key = log.storage.list_streams("t")[0].key
            log.produce("t", [Message(b"m%d" % i, key="k") for i in range(10)])
    _old_subscription(storage_url, "$session.old.t", "t", {key: 2})

    with Log.open(storage_url) as log:
        storage = log.storage
        old = storage.get_subscription("$session.old.t")
        assert not old.packed
        assert storage.get_cursors(old.name) == {key: 2}
        packed = SubscriptionRecord("$session.new.t", "t", None, StartKind.LATEST, None, 1, True)
        storage.create_subscription(packed, lambda heads: {h.key: 4 for h in heads})
        assert storage.get_subscription(packed.name).packed
        assert storage.min_cursors("t") == {key: 2}

        storage.commit_cursors(old.name, {key: 6})
        storage.commit_cursors(old.name, {key: 5})  # never back
        assert storage.get_cursors(old.name) == {key: 6}
        assert storage.get_cursors(packed.name) == {key: 4}
        assert storage.min_cursors("t") == {key: 4}
        far_future = now_us() + 100 * HOUR
        assert run_retention(storage, now_us=far_future) == [RetentionResult(S0, 4, 4)]
