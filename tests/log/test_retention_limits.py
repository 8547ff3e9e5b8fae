"""Retention in batches, per-topic limits that apply regardless of subscriptions
(max age, max messages per stream), who pins a topic's log, and the `Retainer`
thread the broker runs (issue 14 item 10; docs/storage.md)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from harness.cli import rb
from harness.clock import FakeClock
from harness.waiting import eventually
from riverbed.errors import InvalidInput, TopicNotFound
from riverbed.log.log import Log
from riverbed.log.retention import Retainer, RetentionResult, apply_retention, run_retention
from riverbed.model import Message, StreamId
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import RetentionPolicy, StartKind, SubscriptionRecord
from riverbed.subscriptions.named import Subscriptions

HOUR = 3_600_000_000
S0 = StreamId("t", 0, 0)


def fill(log: Log, count: int, topic: str = "t") -> int:
    """`count` messages in one stream; returns the last one's timestamp."""
    log.produce(topic, [Message(b"m%d" % i, key="k") for i in range(count)])
    (head,) = log.storage.list_streams(topic)
    return log.storage.read(head.key, head.next_offset - 1, 1)[0].timestamp_us


def start_of(storage: Storage, topic: str = "t") -> int:
    return storage.list_streams(topic)[0].start_offset


# --------------------------------------------------------------------- limits


def test_max_age_deletes_what_no_subscription_consumed(log: Log) -> None:
    log.topics.create("t", 1, max_age_us=HOUR)
    Subscriptions(log.storage).create("idle", "t")  # never reads
    last = fill(log, 10)
    assert run_retention(log.storage, now_us=last) == []  # nothing is an hour old
    assert run_retention(log.storage, now_us=last + HOUR + 1) == [RetentionResult(S0, 10, 10)]


def test_max_messages_keeps_the_newest_per_stream_whoever_has_not_consumed(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_messages=4)
    Subscriptions(log.storage).create("idle", "t")
    fill(log, 10)
    assert run_retention(log.storage) == [RetentionResult(S0, 6, 6)]
    assert [m.payload for m in log.storage.read(log.storage.list_streams("t")[0].key, 0, 10)] == [
        b"m6",
        b"m7",
        b"m8",
        b"m9",
    ]


def test_without_limits_an_idle_subscription_keeps_everything(log: Log) -> None:
    log.topics.create("t", 1)  # the default: consumed and a week old
    Subscriptions(log.storage).create("idle", "t")
    last = fill(log, 5)
    assert run_retention(log.storage, now_us=last + 1000 * HOUR) == []


def test_limits_are_validated_and_nothing_changes(log: Log) -> None:
    for bad in ({"max_age_us": 0}, {"max_age_us": -5}, {"max_messages": 0}):
        with pytest.raises(InvalidInput, match="must be"):
            log.topics.create("t", 1, **bad)  # type: ignore[arg-type]
        with pytest.raises(TopicNotFound):
            log.topics.get("t")
    log.topics.create("t", 1, max_age_us=HOUR)
    with pytest.raises(InvalidInput, match=r"maximum of -1 messages per stream must be at least 1"):
        log.topics.set_limits("t", HOUR, -1)
    with pytest.raises(InvalidInput, match=r"maximum age 0us must be a positive duration"):
        log.topics.set_limits("t", 0, None)
    record = log.topics.get("t")
    assert (record.max_age_us, record.max_messages) == (HOUR, None)
    updated = log.topics.set_limits("t", None, 100)
    assert (updated.max_age_us, updated.max_messages) == (None, 100)
    with pytest.raises(TopicNotFound):
        log.topics.set_limits("nope", None, 1)


def test_cli_sets_limits_and_refuses_bad_ones(sqlite_url: str) -> None:
    assert (
        rb(sqlite_url, "topic", "create", "t", "--partitions", "1", "--max-age", "30d").exit_code
        == 0
    )
    result = rb(sqlite_url, "topic", "set-limits", "t", "--max-messages", "1000")
    assert result.exit_code == 0, result.output
    assert "max age 30d, max messages 1000 per stream" in result.output  # the age kept
    bad = rb(sqlite_url, "topic", "set-limits", "t", "--max-messages", "0")
    assert bad.exit_code == 2
    assert "maximum of 0 messages per stream must be at least 1" in bad.output
    bad = rb(sqlite_url, "topic", "set-limits", "t", "--max-age", "soon")
    assert bad.exit_code == 2 and "duration 'soon'" in bad.output
    described = rb(sqlite_url, "topic", "describe", "t")
    assert "max age 30d, max messages 1000 per stream" in described.output
    result = rb(sqlite_url, "topic", "set-limits", "t", "--max-age", "none")
    assert "max age none, max messages 1000 per stream" in result.output


# --------------------------------------------------------------------- batches


def test_deletion_goes_in_batches_and_stops_between_them(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.topics.create("t", 1, retention_policy=RetentionPolicy.CONSUMED)
    fill(log, 10)
    stop = threading.Event()
    calls: list[int] = []
    delete_before = log.storage.delete_before

    def one_transaction(stream_key: int, offset: int, *, keep_uncommitted: bool = False) -> int:
        calls.append(offset)
        deleted = delete_before(stream_key, offset, keep_uncommitted=keep_uncommitted)
        if len(calls) == 2:
            stop.set()  # SIGTERM arrives during the second batch
        return deleted

    monkeypatch.setattr(log.storage, "delete_before", one_transaction)
    run = apply_retention(log.storage, batch=3, stop=stop)
    assert calls == [3, 6]
    assert not run.complete
    assert run.results == [RetentionResult(S0, 6, 6)]
    run = apply_retention(log.storage, batch=3)
    assert calls == [3, 6, 9, 10]
    assert run.complete and run.results == [RetentionResult(S0, 4, 10)]


def test_batches_stop_at_what_a_subscription_has_not_committed(log: Log) -> None:
    log.topics.create("t", 1, retention_policy=RetentionPolicy.CONSUMED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    fill(log, 10)
    consumer = subs.consumer("s")
    assert len(consumer.poll(7)) == 7
    consumer.commit()
    assert run_retention(log.storage, batch=2) == [RetentionResult(S0, 7, 7)]


def test_sqlite_reuses_the_pages_retention_frees(tmp_path: Path) -> None:
    """No auto_vacuum (docs/storage.md): the file keeps its size and later
    writes fill the freed pages instead of growing it."""
    path = tmp_path / "reuse.db"
    with Log(open_storage(f"sqlite:///{path}")) as log:
        log.topics.create("t", 1, retention_policy=RetentionPolicy.CONSUMED)
        batch = [Message(b"x" * 500, key="k")] * 500
        log.produce("t", batch)
        with sqlite3.connect(path) as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
        for _ in range(5):
            run_retention(log.storage)
            log.produce("t", batch)
        with sqlite3.connect(path) as conn:
            grown = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    assert grown <= pages * 1.1, (pages, grown, free)


# --------------------------------------------------------------------- pins and the thread


def test_a_subscription_holding_messages_past_retention_is_reported_once(
    log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    log.topics.create("t", 1, retention_us=HOUR)
    subs = Subscriptions(log.storage)
    subs.create("reader", "t")
    subs.create("idle", "t")
    last = fill(log, 5)
    consumer = subs.consumer("reader")
    assert len(consumer.poll(5)) == 5
    consumer.commit()
    clock = FakeClock(us=last + 30 * HOUR)
    retainer = Retainer(log.storage, 60, pin_warning_hours=24, clock=clock.us)
    with caplog.at_level(logging.INFO, logger="riverbed.log.retention"):
        retainer.run_once()
        retainer.run_once()
    assert [(p.stream, p.subscriptions) for p in retainer.pins] == [(S0, ("idle",))]
    assert 30 <= retainer.pinned_hours < 31
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "subscription idle holds messages of topic t" in warnings[0]
    subs.delete("idle")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="riverbed.log.retention"):
        retainer.run_once()
    assert retainer.pins == [] and retainer.pinned_hours == 0
    assert retainer.deleted == 5
    assert "subscription idle no longer holds topic t" in caplog.text


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        ("$session.s1.t", "delete the session (DELETE /api/v1/sessions/"),
        ("$share.g1.t", "delete the group (riverbed group delete)"),
    ],
)
def test_a_cursor_the_broker_owns_is_reported_with_what_lets_it_go(
    log: Log, caplog: pytest.LogCaptureFixture, name: str, advice: str
) -> None:
    """Such a cursor is not deleted by name (`refuse_broker_owned`): the
    warning says what does let it go, not "consume or delete it"."""
    log.topics.create("t", 1, retention_us=HOUR)
    log.storage.create_subscription(
        SubscriptionRecord(name, "t", None, StartKind.EARLIEST, None, 0), lambda heads: {}
    )
    last = fill(log, 3)
    retainer = Retainer(
        log.storage, 60, pin_warning_hours=24, clock=FakeClock(us=last + 30 * HOUR).us
    )
    with caplog.at_level(logging.WARNING, logger="riverbed.log.retention"):
        retainer.run_once()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"subscription {name} holds messages" in warnings[0]
    assert advice in warnings[0] and "consume or delete it" not in warnings[0]


def test_the_retainer_thread_deletes_by_itself_and_stops(log: Log) -> None:
    log.topics.create("t", 1, retention_policy=RetentionPolicy.CONSUMED)
    fill(log, 10)
    retainer = Retainer(log.storage, 0.05)
    retainer.start()
    try:
        eventually(lambda: start_of(log.storage) == 10, what="retention by itself")
        log.produce("t", [Message(b"more", key="k")])
        eventually(lambda: start_of(log.storage) == 11, what="the next pass")
    finally:
        retainer.stop(timeout=30)
    assert retainer._thread is not None and not retainer._thread.is_alive()
    assert retainer.deleted == 11
