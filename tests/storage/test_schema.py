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
            subs = Subscriptions(log.storage)
            subs.create("fast", "t")
            subs.create("slow", "t")
            log.produce("t", [Message(b"m%d" % i, key="k") for i in range(10)])
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
