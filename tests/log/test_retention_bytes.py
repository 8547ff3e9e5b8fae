"""The per-topic maximum of payload bytes per stream (`max_bytes`), which
retention applies whoever has not consumed; `Topics.alter`, which changes a
topic's retention and limits; and a database made before the limit existed
(docs/storage.md)."""

from __future__ import annotations

import pytest

from harness.storage import raw_connection
from riverbed.errors import InvalidInput, TopicNotFound
from riverbed.log.log import Log
from riverbed.log.partitioning import key_hash, route
from riverbed.log.retention import RetentionResult, apply_retention, run_retention
from riverbed.model import Message, StreamId
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import RetentionPolicy
from riverbed.storage.schema import MIGRATIONS
from riverbed.storage.sql import core as sql_core
from riverbed.storage.sql import messages as sql_messages
from riverbed.subscriptions.named import Subscriptions

HOUR = 3_600_000_000
S0 = StreamId("t", 0, 0)


def fill(log: Log, payloads: list[bytes], topic: str = "t") -> None:
    log.produce(topic, [Message(p, key="k") for p in payloads])


def kept(storage: Storage, topic: str = "t") -> list[bytes]:
    (head,) = storage.list_streams(topic)
    if head.next_offset == head.start_offset:
        return []
    return [m.payload for m in storage.read(head.key, head.start_offset, 1000)]


# --------------------------------------------------------------------- the limit


def test_max_bytes_keeps_the_newest_messages_that_fit_whoever_has_not_consumed(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_bytes=350)
    Subscriptions(log.storage).create("idle", "t")  # never reads
    fill(log, [b"%03d" % i + b"x" * 97 for i in range(10)])  # 100 bytes each

    assert run_retention(log.storage) == [RetentionResult(S0, 7, 7)]
    assert [p[:3] for p in kept(log.storage)] == [b"007", b"008", b"009"]  # 300 bytes
    assert run_retention(log.storage) == []  # at rest under the limit


def test_a_stream_exactly_at_the_limit_keeps_everything(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_bytes=400)
    Subscriptions(log.storage).create("idle", "t")
    fill(log, [b"x" * 100] * 4)

    assert run_retention(log.storage) == []
    assert len(kept(log.storage)) == 4


def test_the_newest_message_stays_even_when_it_alone_is_larger(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_bytes=100)
    fill(log, [b"a" * 10, b"b" * 10, b"c" * 1000])

    assert run_retention(log.storage) == [RetentionResult(S0, 2, 2)]
    assert kept(log.storage) == [b"c" * 1000]
    assert run_retention(log.storage) == []  # and it stays


def test_bytes_are_counted_per_stream(log: Log) -> None:
    log.topics.create("t", 2, retention_us=None, max_bytes=25)
    keys = {route(key_hash(k), 2, 1): k for k in ("a", "b", "c", "d", "e", "f")}
    log.produce("t", [Message(b"x" * 10, key=keys[0]) for _ in range(5)])
    log.produce("t", [Message(b"y" * 10, key=keys[1]) for _ in range(2)])
    assert [h.next_offset for h in log.storage.list_streams("t")] == [5, 2]

    results = run_retention(log.storage)

    assert [(r.deleted, r.start_offset) for r in results] == [(3, 3)]
    assert sorted(h.next_offset - h.start_offset for h in log.storage.list_streams("t")) == [2, 2]


def test_the_strictest_limit_wins(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_messages=8, max_bytes=50)
    fill(log, [b"x" * 10] * 10)

    assert run_retention(log.storage) == [RetentionResult(S0, 5, 5)]  # bytes: 5 kept
    log.topics.alter("t", max_bytes=None)
    fill(log, [b"x" * 10] * 5)

    assert run_retention(log.storage) == [RetentionResult(S0, 2, 7)]  # messages: 8 kept


def test_the_limit_deletes_in_bounded_batches(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    log.topics.create("t", 1, retention_us=None, max_bytes=20)
    Subscriptions(log.storage).create("idle", "t")
    fill(log, [b"x" * 10] * 10)
    calls: list[int] = []
    delete_before = log.storage.delete_before

    def one_transaction(stream_key: int, offset: int, *, keep_uncommitted: bool = False) -> int:
        calls.append(offset)
        return delete_before(stream_key, offset, keep_uncommitted=keep_uncommitted)

    monkeypatch.setattr(log.storage, "delete_before", one_transaction)
    run = apply_retention(log.storage, batch=3)

    assert calls == [3, 6, 8]
    assert run.results == [RetentionResult(S0, 8, 8)]


def test_a_subscription_behind_the_limit_reads_on_from_the_oldest_message_left(log: Log) -> None:
    log.topics.create("t", 1, retention_us=None, max_bytes=30)
    subs = Subscriptions(log.storage)
    subs.create("slow", "t")
    fill(log, [b"%02d" % i + b"x" * 8 for i in range(6)])
    run_retention(log.storage)

    got = [d.message.payload[:2] for d in subs.consumer("slow").poll(10)]

    assert got == [b"03", b"04", b"05"]


@pytest.mark.parametrize("page", [1, 2, 3, 10_000])
@pytest.mark.parametrize("sizes", [[5, 1, 7, 3, 3, 0, 4], [6, 0, 0], [0, 9]])
def test_first_offset_within_bytes_across_pages(
    storage: Storage, page: int, sizes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_messages, "SIZES_PAGE", page)
    log = Log(storage)
    try:
        log.topics.create("t", 1, retention_us=None)
        (head,) = storage.list_streams("t")
        assert storage.first_offset_within_bytes(head.key, 10) == 0  # empty: the next
        fill(log, [b"z" * n for n in sizes])
        for limit in range(0, sum(sizes) + 3):
            expected = len(sizes) - 1  # the newest stays whatever its size
            while expected > 0 and sum(sizes[expected - 1 :]) <= limit:
                expected -= 1
            assert storage.first_offset_within_bytes(head.key, limit) == expected, limit
        storage.delete_before(head.key, 1)
        assert storage.first_offset_within_bytes(head.key, 1000) == 1  # the oldest left
        storage.delete_before(head.key, len(sizes))
        assert storage.first_offset_within_bytes(head.key, 1000) == len(sizes)  # the next
    finally:
        log.appender.close()


# --------------------------------------------------------------------- Topics.alter


def test_alter_changes_what_is_given_and_keeps_the_rest(log: Log) -> None:
    log.topics.create("t", 1, retention_us=HOUR, max_age_us=2 * HOUR, max_messages=10)

    altered = log.topics.alter("t", max_bytes=1 << 20, max_messages=None)

    assert altered == log.topics.get("t")
    assert (altered.retention_us, altered.retention_policy) == (
        HOUR,
        RetentionPolicy.CONSUMED_AND_EXPIRED,
    )
    assert (altered.max_age_us, altered.max_messages, altered.max_bytes) == (
        2 * HOUR,
        None,
        1 << 20,
    )
    altered = log.topics.alter("t", retention_us=None, retention_policy=RetentionPolicy.EXPIRED)
    assert (altered.retention_us, altered.retention_policy) == (None, RetentionPolicy.EXPIRED)
    assert (altered.max_age_us, altered.max_bytes) == (2 * HOUR, 1 << 20)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_bytes": 0}, "maximum of 0 bytes per stream must be at least 1"),
        ({"max_bytes": -1}, "maximum of -1 bytes per stream must be at least 1"),
        ({"max_bytes": 1.5}, "maximum of 1.5 bytes per stream must be at least 1"),
        ({"max_messages": 0}, "maximum of 0 messages per stream must be at least 1"),
        ({"max_age_us": 0}, "maximum age 0us must be a positive duration"),
        ({"retention_us": -1}, "retention -1us must not be negative"),
        ({"retention_policy": "soon"}, "retention policy 'soon' is not one of"),
        # A good value beside a bad one is not applied either.
        ({"max_age_us": HOUR, "max_bytes": 0}, "maximum of 0 bytes"),
    ],
)
def test_alter_refuses_bad_values_and_changes_nothing(
    log: Log, change: dict[str, object], message: str
) -> None:
    before = log.topics.create("t", 1, max_messages=5, max_bytes=1000)
    version = log.storage.meta_version()

    with pytest.raises(InvalidInput, match=message):
        log.topics.alter("t", **change)  # type: ignore[arg-type]

    assert log.topics.get("t") == before
    assert log.storage.meta_version() == version


def test_alter_of_an_unknown_topic(log: Log) -> None:
    with pytest.raises(TopicNotFound, match="topic 'x' does not exist"):
        log.topics.alter("x", max_bytes=10)


def test_set_limits_keeps_the_byte_limit(log: Log) -> None:
    log.topics.create("t", 1, max_bytes=1000)
    updated = log.topics.set_limits("t", HOUR, 5)
    assert (updated.max_age_us, updated.max_messages, updated.max_bytes) == (HOUR, 5, 1000)


def test_create_refuses_a_bad_byte_limit_and_creates_nothing(log: Log) -> None:
    with pytest.raises(InvalidInput, match="maximum of 0 bytes per stream must be at least 1"):
        log.topics.create("t", 1, max_bytes=0)
    with pytest.raises(TopicNotFound):
        log.topics.get("t")


# --------------------------------------------------------------------- an older database


def _mine() -> int:
    """How many migrations precede the one that adds `max_bytes`."""
    return next(i for i, m in enumerate(MIGRATIONS) if any("max_bytes" in s for s in m))


def test_a_database_from_before_the_byte_limit_opens_and_takes_it(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(sql_core, "MIGRATIONS", MIGRATIONS[: _mine()])
        open_storage(storage_url).close()  # the schema as it was before
    with raw_connection(storage_url) as conn:
        for statement in (
            "INSERT INTO topics (name, binding, retention_us, retention_policy, produce_pointer,"
            " created_us, max_age_us, max_messages)"
            " VALUES ('t', NULL, NULL, 'consumed-and-expired', 0, 1, 7200000000, 6)",
            "INSERT INTO storage_topics (topic, generation, partitions, k) VALUES ('t', 0, 1, 1)",
            "INSERT INTO streams (topic, generation, part, start_offset, next_offset, sealed)"
            " VALUES ('t', 0, 0, 0, 0, 0)",
        ):
            conn.execute(statement)

    with Log.open(storage_url) as log:
        record = log.topics.get("t")
        assert (record.max_age_us, record.max_messages, record.max_bytes) == (2 * HOUR, 6, None)
        fill(log, [b"x" * 10] * 8)
        assert run_retention(log.storage) == [RetentionResult(S0, 2, 2)]  # its old limit
        log.topics.alter("t", max_bytes=30)
        assert run_retention(log.storage) == [RetentionResult(S0, 3, 5)]
    with Log.open(storage_url) as log:  # and opens again as it is now
        assert log.topics.get("t").max_bytes == 30
