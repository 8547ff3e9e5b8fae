"""Retention: what may be deleted, per policy, and readers after a deletion."""

from __future__ import annotations

import pytest

from harness.clock import moment_between
from riverbed.errors import TopicNotFound
from riverbed.log.log import Log
from riverbed.log.retention import RetentionResult, run_retention
from riverbed.model import Message, StoredMessage, StreamId
from riverbed.storage import Storage
from riverbed.storage.base import RetentionPolicy, StartKind
from riverbed.subscriptions.named import Consumer, Subscriptions

HOUR = 3_600_000_000
S0 = StreamId("t", 0, 0)


def make_topic(log: Log, policy: RetentionPolicy, retention_us: int | None = HOUR) -> None:
    log.topics.create("t", 1, retention_us=retention_us, retention_policy=policy)


def produce_spaced(log: Log, count: int, topic: str = "t") -> list[StoredMessage]:
    """`count` messages with distinct, increasing timestamps; returns them as stored."""
    for i in range(count):
        log.produce(topic, [Message(b"m%d" % i, key="k")])
        moment_between()  # the next one later
    head = log.storage.list_streams(topic)[0]
    return log.storage.read(head.key, 0, count)


def head_of(storage: Storage, stream: StreamId) -> tuple[int, int]:
    [h] = [h for h in storage.list_streams(stream.topic) if h.stream == stream]
    return h.start_offset, h.next_offset


def commit_up_to(subs: Subscriptions, name: str, count: int) -> Consumer:
    consumer = subs.consumer(name)
    assert len(consumer.poll(count)) == count
    consumer.commit()
    return consumer


def drain(consumer: Consumer) -> list[bytes]:
    out: list[bytes] = []
    while got := consumer.poll(100):
        out.extend(d.message.payload for d in got)
    return out


# --------------------------------------------------------------------- default policy


def test_default_never_deletes_what_a_subscription_has_not_committed(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED_AND_EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("fast", "t")
    subs.create("slow", "t")
    stored = produce_spaced(log, 10)
    far_future = stored[-1].timestamp_us + 100 * HOUR
    assert run_retention(log.storage, now_us=far_future) == []  # nobody committed
    commit_up_to(subs, "fast", 8)
    commit_up_to(subs, "slow", 3)
    assert run_retention(log.storage, now_us=far_future) == [RetentionResult(S0, 3, 3)]
    assert head_of(log.storage, S0) == (3, 10)
    assert run_retention(log.storage, now_us=far_future) == []  # idempotent


def test_default_keeps_consumed_messages_until_they_expire(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED_AND_EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 10)
    commit_up_to(subs, "s", 10)
    assert run_retention(log.storage, now_us=stored[-1].timestamp_us) == []
    # Messages 0..3 are older than the retention time, 4.. are not.
    now = stored[4].timestamp_us + HOUR
    assert run_retention(log.storage, now_us=now) == [RetentionResult(S0, 4, 4)]
    assert head_of(log.storage, S0) == (4, 10)


def test_without_subscriptions_expired_messages_go(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED_AND_EXPIRED)
    stored = produce_spaced(log, 6)
    assert run_retention(log.storage, now_us=stored[0].timestamp_us + HOUR) == []
    results = run_retention(log.storage, now_us=stored[2].timestamp_us + HOUR)
    assert results == [RetentionResult(S0, 2, 2)]
    remaining = log.storage.read(log.storage.list_streams("t")[0].key, 0, 10)
    assert [m.offset for m in remaining] == [2, 3, 4, 5]
    assert [m.payload for m in remaining] == [b"m2", b"m3", b"m4", b"m5"]


def test_no_retention_time_keeps_everything(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED_AND_EXPIRED, retention_us=None)
    stored = produce_spaced(log, 3)
    assert run_retention(log.storage, now_us=stored[-1].timestamp_us + 10**6 * HOUR) == []


# --------------------------------------------------------------------- other policies


def test_expired_policy_deletes_even_unconsumed(log: Log) -> None:
    make_topic(log, RetentionPolicy.EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 8)
    results = run_retention(log.storage, now_us=stored[5].timestamp_us + HOUR)
    assert results == [RetentionResult(S0, 5, 5)]


def test_consumed_policy_deletes_consumed_regardless_of_age(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 8)
    now = stored[-1].timestamp_us  # nothing is older than an hour
    assert run_retention(log.storage, now_us=now) == []
    commit_up_to(subs, "s", 6)
    assert run_retention(log.storage, now_us=now) == [RetentionResult(S0, 6, 6)]


def test_consumed_policy_without_subscriptions_deletes_everything(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED)
    stored = produce_spaced(log, 4)
    assert run_retention(log.storage, now_us=stored[-1].timestamp_us) == [RetentionResult(S0, 4, 4)]
    assert head_of(log.storage, S0) == (4, 4)
    # Offsets carry on after the deleted prefix.
    positions = log.produce("t", [Message(b"next", key="k")])
    assert positions[0] == (S0, 4)


def test_retention_for_one_topic_and_many_streams(log: Log) -> None:
    log.topics.create("t", 4, retention_policy=RetentionPolicy.CONSUMED)
    log.topics.create("u", 1, retention_policy=RetentionPolicy.CONSUMED)
    log.produce("t", [Message(b"x", key=str(i)) for i in range(40)])
    log.produce("u", [Message(b"y")])
    results = run_retention(log.storage, topic="t")
    assert sorted(r.stream.partition for r in results) == [0, 1, 2, 3]
    assert sum(r.deleted for r in results) == 40
    assert all(r.start_offset == head_of(log.storage, r.stream)[1] for r in results)
    assert head_of(log.storage, StreamId("u", 0, 0)) == (0, 1)
    with pytest.raises(TopicNotFound):
        run_retention(log.storage, topic="nope")


# --------------------------------------------------------------------- readers after deletion


def test_a_new_consumer_below_the_start_continues_from_the_start(log: Log) -> None:
    make_topic(log, RetentionPolicy.EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 8)
    commit_up_to(subs, "s", 2)
    run_retention(log.storage, now_us=stored[5].timestamp_us + HOUR)
    assert drain(subs.consumer("s")) == [b"m5", b"m6", b"m7"]
    assert {lag.stream: lag.committed for lag in subs.lag("s")} == {S0: 5}


def test_a_live_consumer_below_the_start_continues_from_the_start(log: Log) -> None:
    make_topic(log, RetentionPolicy.EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 8)
    consumer = subs.consumer("s")
    assert [d.message.payload for d in consumer.poll(2)] == [b"m0", b"m1"]
    run_retention(log.storage, now_us=stored[5].timestamp_us + HOUR)
    assert drain(consumer) == [b"m5", b"m6", b"m7"]


def test_a_live_consumer_whose_whole_stream_was_deleted_moves_on(log: Log) -> None:
    """A sealed stream emptied by retention before the reader got to its end must
    count as consumed, or the next generation would never open; and the reader must
    not keep polling the emptied stream instead of noticing new messages."""
    make_topic(log, RetentionPolicy.EXPIRED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t", start=StartKind.EARLIEST)
    stored = produce_spaced(log, 6)
    consumer = subs.consumer("s")
    assert [d.message.payload for d in consumer.poll(2)] == [b"m0", b"m1"]
    log.topics.add_storage_topic("t", 2)
    log.topics.switch_produce("t")
    [(gen1, offset)] = log.produce("t", [Message(b"gen1", key="k")])
    [gen1_head] = [h for h in log.storage.list_streams("t") if h.stream == gen1]
    [in_gen1] = log.storage.read(gen1_head.key, offset, 1)
    assert in_gen1.timestamp_us > stored[-1].timestamp_us
    run_retention(log.storage, now_us=in_gen1.timestamp_us + HOUR)  # all of gen0 expired
    assert head_of(log.storage, S0) == (6, 6)
    assert drain(consumer) == [b"gen1"]
    log.produce("t", [Message(b"more", key="k")])
    assert drain(consumer) == [b"more"]


def test_a_subscription_created_after_the_bound_was_computed_keeps_its_messages(
    storage: Storage, log: Log
) -> None:
    """The storage re-checks the cursors in the deleting transaction."""
    log.topics.create("late", 1, retention_us=None, retention_policy=RetentionPolicy.CONSUMED)
    log.produce("late", [Message(b"m", key="k")] * 10)
    (head,) = storage.list_streams("late")
    # Retention decided "no subscription: all of it may go"; then one appears.
    Subscriptions(storage).create("newcomer", "late")
    assert storage.delete_before(head.key, 10, keep_uncommitted=True) == 0
    consumer = Subscriptions(storage).consumer("newcomer")
    assert len(consumer.poll(100)) == 10
    consumer.commit()
    Subscriptions(storage).reset("newcomer", {head.stream: 4})
    assert storage.delete_before(head.key, 10, keep_uncommitted=True) == 4
    assert storage.list_streams("late")[0].start_offset == 4
    # Without the flag (the EXPIRED policy) the caller's bound stands.
    assert storage.delete_before(head.key, 10) == 6
