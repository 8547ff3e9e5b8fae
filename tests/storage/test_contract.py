"""The storage contract: every `Storage` method, run against SQLite and PostgreSQL.

Each test gets an empty database through the `storage` fixture (tests/conftest.py),
once per backend. Concurrency, wake-ups and URLs have their own modules.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.storage import (
    accept_any,
    create_topic,
    head,
    make_rows,
    numbered_rows,
    topic_record,
)
from riverbed.errors import (
    AlreadyExists,
    BindingOverlap,
    InvalidInput,
    InvalidOffset,
    PreconditionFailed,
    StreamSealed,
    SubscriptionNotFound,
    TopicNotFound,
)
from riverbed.model import MessageId, StoredMessage, StreamId, encode_properties
from riverbed.storage import Storage
from riverbed.storage.base import (
    RetentionPolicy,
    StartKind,
    StorageTopicRecord,
    StreamHead,
    SubscriptionRecord,
    TopicRecord,
)
from riverbed.storage.sql import FIRST_OFFSET_AT


def subscription(
    name: str, topic: str, start: StartKind = StartKind.EARLIEST, packed: bool = False
) -> SubscriptionRecord:
    return SubscriptionRecord(name, topic, None, start, None, 1_700_000_000_000_000, packed)


PACKED = pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
"""A cursor test for both ways cursors are kept (`SubscriptionRecord.packed`)."""


def no_cursors(heads: list[StreamHead]) -> dict[int, int]:
    return {}


def payloads(messages: list[StoredMessage]) -> list[bytes]:
    return [m.payload for m in messages]


# --------------------------------------------------------------------------- topics


def test_create_topic_makes_generation_zero_with_open_streams(storage: Storage) -> None:
    record = topic_record(
        "orders",
        binding="orders/#",
        retention_us=3_600_000_000,
        retention_policy=RetentionPolicy.EXPIRED,
    )
    storage.create_topic(record, 3, accept_any)

    assert storage.get_topic("orders") == record
    assert storage.list_topics() == [record]
    assert storage.list_storage_topics("orders") == [StorageTopicRecord("orders", 0, 3, 1)]
    heads = storage.list_streams("orders")
    assert [h.stream for h in heads] == [StreamId("orders", 0, p) for p in range(3)]
    assert all((h.start_offset, h.next_offset, h.sealed) == (0, 0, False) for h in heads)
    assert len({h.key for h in heads}) == 3


def test_create_topic_with_a_taken_name_raises_already_exists(storage: Storage) -> None:
    create_topic(storage, "orders", 2)
    version = storage.meta_version()

    with pytest.raises(AlreadyExists, match="orders"):
        storage.create_topic(topic_record("orders", binding="x/#"), 4, accept_any)

    assert storage.get_topic("orders").binding is None
    assert len(storage.list_streams("orders")) == 2
    assert storage.meta_version() == version


def test_create_topic_validate_sees_the_existing_topics(storage: Storage) -> None:
    first = topic_record("a", binding="a/#")
    storage.create_topic(first, 1, accept_any)
    seen: list[list[TopicRecord]] = []

    storage.create_topic(topic_record("b"), 1, seen.append)

    assert seen == [[first]]


def test_create_topic_refused_by_validate_writes_nothing(storage: Storage) -> None:
    create_topic(storage, "a")
    version = storage.meta_version()
    streams = storage.list_streams()

    def refuse(existing: list[TopicRecord]) -> None:
        raise BindingOverlap("b/# overlaps a/#")

    with pytest.raises(BindingOverlap):
        storage.create_topic(topic_record("b", binding="b/#"), 2, refuse)

    with pytest.raises(TopicNotFound):
        storage.get_topic("b")
    with pytest.raises(TopicNotFound):
        storage.list_storage_topics("b")
    assert [t.name for t in storage.list_topics()] == ["a"]
    assert storage.list_streams() == streams
    assert storage.meta_version() == version
    # The name is still free.
    create_topic(storage, "b")


def test_unknown_topic_raises_topic_not_found(storage: Storage) -> None:
    with pytest.raises(TopicNotFound, match="nope"):
        storage.get_topic("nope")
    with pytest.raises(LookupError):
        storage.get_topic("nope")
    with pytest.raises(TopicNotFound):
        storage.update_topic("nope", None, RetentionPolicy.CONSUMED)
    with pytest.raises(TopicNotFound):
        storage.delete_topic("nope")
    with pytest.raises(TopicNotFound):
        storage.list_storage_topics("nope")
    with pytest.raises(TopicNotFound):
        storage.add_storage_topic("nope", lambda last: (2, 1))
    with pytest.raises(TopicNotFound):
        storage.switch_produce("nope")
    assert storage.list_streams("nope") == []
    assert storage.list_topics() == []


def test_names_sort_in_code_point_order_on_every_backend(storage: Storage) -> None:
    # The two backends must agree on order; PostgreSQL's default collation (e.g.
    # en-US) would put "a" before "B" and ignore punctuation.
    names = ["B", "a", "a%", "a/1", "a_x", "ab", "é"]
    for name in reversed(names):
        create_topic(storage, name)

    assert [t.name for t in storage.list_topics()] == sorted(names)
    assert [h.stream.topic for h in storage.list_streams()] == sorted(names)


def test_update_topic_changes_retention_only(storage: Storage) -> None:
    created = topic_record("orders", binding="orders/#")
    storage.create_topic(created, 2, accept_any)

    updated = storage.update_topic("orders", 60_000_000, RetentionPolicy.CONSUMED)

    assert updated.retention_us == 60_000_000
    assert updated.retention_policy is RetentionPolicy.CONSUMED
    assert (updated.name, updated.binding, updated.produce_pointer, updated.created_us) == (
        created.name,
        created.binding,
        created.produce_pointer,
        created.created_us,
    )
    assert storage.get_topic("orders") == updated
    assert storage.update_topic("orders", None, RetentionPolicy.EXPIRED).retention_us is None


def test_delete_topic_removes_streams_messages_subscriptions_and_cursors(
    storage: Storage,
) -> None:
    doomed = create_topic(storage, "doomed", 2)
    kept = create_topic(storage, "kept", 1)
    storage.append({doomed[0].key: numbered_rows(3), doomed[1].key: numbered_rows(2)})
    storage.append({kept[0].key: numbered_rows(4)})
    storage.create_subscription(subscription("s-doomed", "doomed"), lambda h: {h[0].key: 1})
    storage.create_subscription(subscription("s-kept", "kept"), lambda h: {h[0].key: 2})

    assert storage.delete_topic("doomed") == 5

    with pytest.raises(TopicNotFound):
        storage.get_topic("doomed")
    assert storage.list_streams("doomed") == []
    assert all(storage.read(h.key, 0, 100) == [] for h in doomed)
    assert [s.name for s in storage.list_subscriptions()] == ["s-kept"]
    with pytest.raises(SubscriptionNotFound):
        storage.get_subscription("s-doomed")
    assert storage.get_cursors("s-doomed") == {}
    # The other topic is untouched.
    assert payloads(storage.read(kept[0].key, 0, 100)) == [b"0", b"1", b"2", b"3"]
    assert storage.get_cursors("s-kept") == {kept[0].key: 2}
    with pytest.raises(StreamSealed):
        storage.append({doomed[0].key: numbered_rows(1)})


def test_stream_keys_of_a_deleted_topic_are_never_reused(storage: Storage) -> None:
    # An appender with a stale view must get StreamSealed for a deleted topic's
    # streams, not write into whatever stream took over the key.
    old = create_topic(storage, "old", 2)
    storage.delete_topic("old")

    new = create_topic(storage, "new", 4)

    assert {h.key for h in old}.isdisjoint(h.key for h in new)
    with pytest.raises(StreamSealed):
        storage.append({old[0].key: numbered_rows(1)})
    assert all(h.next_offset == 0 for h in storage.list_streams("new"))


def test_a_deleted_topic_name_can_be_used_again(storage: Storage) -> None:
    old = create_topic(storage, "orders", 1)
    storage.append({old[0].key: numbered_rows(3)})
    storage.delete_topic("orders")

    new = create_topic(storage, "orders", 2)

    assert [(h.start_offset, h.next_offset) for h in new] == [(0, 0), (0, 0)]
    assert storage.append({new[0].key: numbered_rows(1)}) == {new[0].key: 0}
    assert storage.list_storage_topics("orders") == [StorageTopicRecord("orders", 0, 2, 1)]


# --------------------------------------------------------------------------- storage topics


def test_add_storage_topic_stores_what_plan_returns(storage: Storage) -> None:
    create_topic(storage, "orders", 2)
    seen: list[StorageTopicRecord] = []

    def plan(last: StorageTopicRecord) -> tuple[int, int]:
        seen.append(last)
        return last.partitions * 2, 2

    added = storage.add_storage_topic("orders", plan)

    assert seen == [StorageTopicRecord("orders", 0, 2, 1)]
    assert added == StorageTopicRecord("orders", 1, 4, 2)
    assert added.base_partitions == 2
    assert storage.list_storage_topics("orders") == [
        StorageTopicRecord("orders", 0, 2, 1),
        StorageTopicRecord("orders", 1, 4, 2),
    ]
    heads = storage.list_streams("orders")
    assert [h.stream for h in heads] == [StreamId("orders", 0, p) for p in range(2)] + [
        StreamId("orders", 1, p) for p in range(4)
    ]
    assert all((h.start_offset, h.next_offset, h.sealed) == (0, 0, False) for h in heads)
    assert storage.get_topic("orders").produce_pointer == 0

    storage.add_storage_topic("orders", plan)
    assert seen[-1] == StorageTopicRecord("orders", 1, 4, 2)


def test_add_storage_topic_refused_by_plan_writes_nothing(storage: Storage) -> None:
    create_topic(storage, "orders", 2)
    version = storage.meta_version()

    def refuse(last: StorageTopicRecord) -> tuple[int, int]:
        raise ValueError("K must divide P")

    with pytest.raises(ValueError, match="K must divide P"):
        storage.add_storage_topic("orders", refuse)

    assert len(storage.list_storage_topics("orders")) == 1
    assert len(storage.list_streams("orders")) == 2
    assert storage.meta_version() == version


def test_switch_produce_seals_earlier_generations_and_stays_at_the_last(
    storage: Storage,
) -> None:
    create_topic(storage, "orders", 1)
    storage.add_storage_topic("orders", lambda last: (2, 2))
    storage.add_storage_topic("orders", lambda last: (4, 2))

    def sealed_generations() -> list[tuple[int, bool]]:
        return [(h.stream.generation, h.sealed) for h in storage.list_streams("orders")]

    assert storage.switch_produce("orders").produce_pointer == 1
    assert sealed_generations() == [(0, True)] + [(1, False)] * 2 + [(2, False)] * 4

    assert storage.switch_produce("orders").produce_pointer == 2
    assert sealed_generations() == [(0, True)] + [(1, True)] * 2 + [(2, False)] * 4
    assert storage.get_topic("orders").produce_pointer == 2

    version = storage.meta_version()
    assert storage.switch_produce("orders").produce_pointer == 2
    assert sealed_generations() == [(0, True)] + [(1, True)] * 2 + [(2, False)] * 4
    assert storage.meta_version() == version


def test_switch_produce_with_one_generation_changes_nothing(storage: Storage) -> None:
    heads = create_topic(storage, "orders", 2)

    assert storage.switch_produce("orders").produce_pointer == 0

    assert storage.list_streams("orders") == heads


def test_list_streams_orders_by_topic_generation_partition(storage: Storage) -> None:
    create_topic(storage, "b", 2)
    create_topic(storage, "a", 3)
    storage.add_storage_topic("b", lambda last: (4, 2))
    storage.add_storage_topic("a", lambda last: (1, 1))

    everything = [h.stream for h in storage.list_streams()]

    expected = (
        [StreamId("a", 0, p) for p in range(3)]
        + [StreamId("a", 1, 0)]
        + [StreamId("b", 0, p) for p in range(2)]
        + [StreamId("b", 1, p) for p in range(4)]
    )
    assert everything == expected
    assert [h.stream for h in storage.list_streams("b")] == expected[4:]


# --------------------------------------------------------------------------- append and read


def test_append_gives_dense_offsets_from_zero_across_calls(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)

    assert storage.append({stream.key: numbered_rows(3)}) == {stream.key: 0}
    assert storage.append({stream.key: numbered_rows(2, first=3)}) == {stream.key: 3}
    assert storage.append({stream.key: numbered_rows(1, first=5)}) == {stream.key: 5}

    messages = storage.read(stream.key, 0, 100)
    assert [m.offset for m in messages] == list(range(6))
    assert payloads(messages) == [str(n).encode() for n in range(6)]
    assert (head(storage, stream.key).start_offset, head(storage, stream.key).next_offset) == (0, 6)


def test_append_to_several_streams_in_one_call(storage: Storage) -> None:
    a, b, c = create_topic(storage, "orders", 3)

    assert storage.append({a.key: numbered_rows(2), b.key: numbered_rows(3)}) == {
        a.key: 0,
        b.key: 0,
    }
    assert storage.append({b.key: numbered_rows(1, first=3), a.key: numbered_rows(1, first=2)}) == {
        a.key: 2,
        b.key: 3,
    }

    assert payloads(storage.read(a.key, 0, 10)) == [b"0", b"1", b"2"]
    assert payloads(storage.read(b.key, 0, 10)) == [b"0", b"1", b"2", b"3"]
    assert storage.read(c.key, 0, 10) == []
    assert [head(storage, s.key).next_offset for s in (a, b, c)] == [3, 4, 0]


def test_append_of_nothing(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    storage.append({stream.key: numbered_rows(2)})

    assert storage.append({}) == {}
    assert storage.append({stream.key: []}) == {stream.key: 2}
    assert head(storage, stream.key).next_offset == 2


def test_append_to_an_unknown_stream_writes_nothing_anywhere(storage: Storage) -> None:
    a, b = create_topic(storage, "orders", 2)
    storage.append({a.key: numbered_rows(1)})
    unknown = max(a.key, b.key) + 1000

    with pytest.raises(StreamSealed) as raised:
        storage.append(
            {a.key: numbered_rows(2), unknown: numbered_rows(1), b.key: numbered_rows(3)}
        )

    assert raised.value.stream_keys == (unknown,)
    assert payloads(storage.read(a.key, 0, 10)) == [b"0"]
    assert storage.read(b.key, 0, 10) == []
    assert [head(storage, s.key).next_offset for s in (a, b)] == [1, 0]


def test_append_to_a_sealed_stream_writes_nothing_anywhere(storage: Storage) -> None:
    (old,) = create_topic(storage, "orders", 1)
    storage.add_storage_topic("orders", lambda last: (1, 1))
    storage.switch_produce("orders")
    new = storage.list_streams("orders")[1]
    other = create_topic(storage, "other", 1)[0]

    with pytest.raises(StreamSealed) as raised:
        storage.append({new.key: numbered_rows(1), old.key: numbered_rows(1), other.key: []})

    assert raised.value.stream_keys == (old.key,)
    assert [head(storage, s.key).next_offset for s in (old, new, other)] == [0, 0, 0]
    assert storage.read(new.key, 0, 10) == []
    # The open stream still takes writes.
    assert storage.append({new.key: numbered_rows(1)}) == {new.key: 0}


def test_read_limit_middle_and_beyond_the_head(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    storage.append({stream.key: numbered_rows(10)})

    assert [m.offset for m in storage.read(stream.key, 0, 4)] == [0, 1, 2, 3]
    assert [m.offset for m in storage.read(stream.key, 4, 4)] == [4, 5, 6, 7]
    assert [m.offset for m in storage.read(stream.key, 8, 4)] == [8, 9]
    assert [m.offset for m in storage.read(stream.key, 9, 1)] == [9]
    assert storage.read(stream.key, 10, 4) == []
    assert storage.read(stream.key, 1000, 4) == []
    assert storage.read(stream.key + 1000, 0, 4) == []


def test_read_refuses_a_negative_offset_or_a_limit_below_one(storage: Storage) -> None:
    # The databases disagree here (SQLite reads everything for LIMIT -1); the
    # storage refuses before asking either.
    (stream,) = create_topic(storage, "orders", 1)
    storage.append({stream.key: numbered_rows(3)})

    with pytest.raises(InvalidOffset, match="offset -1"):
        storage.read(stream.key, -1, 10)
    for limit in (0, -1):
        with pytest.raises(InvalidInput, match=f"limit {limit}") as raised:
            storage.read(stream.key, 0, limit)
        assert isinstance(raised.value, ValueError)


def test_stored_message_round_trips_every_field(storage: Storage) -> None:
    a, b = create_topic(storage, "orders", 2)
    message_id = MessageId.compose(1_700_000_000_123_456, 0xABCDEF123456, 7)
    properties = (
        ("content_type", "application/json"),
        ("user", "ärger"),
        ("user", "again"),
        ("correlation_data", b"\x00\xff\x10"),
        ("message_expiry_interval", 3600),
    )
    payload = bytes(range(256)) * 4 + b"\x00"
    row = (
        message_id.to_bytes(),
        1_700_000_000_123_456,
        "sensors/ø/🌡",
        "clé-🔑",
        payload,
        encode_properties(properties),
        2,
        1,
    )
    bare = (MessageId.compose(5, 1, 0).to_bytes(), 5, "", None, b"", None, 0, 0)

    storage.append({a.key: [row, bare]})
    first, second = storage.read(a.key, 0, 10)

    assert first == StoredMessage(0, *row)
    assert first.message_id == message_id
    assert first.properties == properties
    assert first.key == "clé-🔑"
    assert type(first.payload) is bytes and type(first.id_bytes) is bytes
    assert second == StoredMessage(1, *bare)
    assert second.key is None and second.properties_blob is None and second.properties == ()
    assert type(second.payload) is bytes
    assert storage.read(b.key, 0, 10) == []


def test_large_payload_round_trips(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    payload = bytes(range(256)) * 4096  # 1 MiB

    storage.append({stream.key: make_rows([payload])})

    assert storage.read(stream.key, 0, 1)[0].payload == payload


def test_first_offset_at(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    storage.append(
        {stream.key: make_rows([b"a", b"b", b"c", b"d"], timestamps=[100, 200, 200, 300])}
    )

    assert storage.first_offset_at(stream.key, 0) == 0
    assert storage.first_offset_at(stream.key, 100) == 0
    assert storage.first_offset_at(stream.key, 150) == 1
    assert storage.first_offset_at(stream.key, 200) == 1
    assert storage.first_offset_at(stream.key, 201) == 3
    assert storage.first_offset_at(stream.key, 301) == 4  # none: the next offset

    storage.delete_before(stream.key, 2)
    assert storage.first_offset_at(stream.key, 0) == 2


def test_first_offset_at_of_an_empty_stream_is_its_next_offset(storage: Storage) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    assert storage.first_offset_at(stream.key, 0) == 0
    storage.append({stream.key: make_rows([b"a"], timestamps=[100])})
    storage.delete_before(stream.key, 1)
    assert storage.first_offset_at(stream.key, 0) == 1


def test_first_offset_at_does_not_pass_over_a_message_appended_meanwhile(
    storage: Storage,
) -> None:
    """An append committing while `first_offset_at` runs (here: right after its
    first read) is either seen or not, never passed over: the answer is its
    offset, not the head behind it (a group or a session starting then would
    never get it; retention would delete it)."""
    (stream,) = create_topic(storage, "orders", 1)
    storage.append({stream.key: make_rows([b"old"], timestamps=[100])})
    real = storage._q  # type: ignore[attr-defined]
    appended: list[bool] = []

    def query(sql: str, params: Sequence[Any] = ()) -> Any:
        cursor = real(sql, params)
        if not appended:
            appended.append(True)  # from another thread: its own connection, committed
            writer = threading.Thread(
                target=storage.append, args=({stream.key: make_rows([b"new"], timestamps=[500])},)
            )
            writer.start()
            writer.join()
        return cursor

    storage._q = query  # type: ignore[attr-defined]
    try:
        assert storage.first_offset_at(stream.key, 200) == 1
    finally:
        del storage._q  # type: ignore[attr-defined]
    assert appended and storage.first_offset_at(stream.key, 200) == 1


def test_first_offset_at_walks_the_primary_key_and_stops_at_the_first_match(
    storage: Storage, storage_url: str
) -> None:
    a, b = create_topic(storage, "orders", 2)
    count = 2000
    for stream in (a, b):
        storage.append({stream.key: make_rows([b"x"] * count, timestamps=range(count))})
    assert storage.first_offset_at(a.key, 5) == 5
    assert storage.first_offset_at(a.key, count) == count

    if storage_url.startswith("sqlite"):
        path = storage_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            plan = conn.execute(f"EXPLAIN QUERY PLAN {FIRST_OFFSET_AT}", (a.key, 5)).fetchall()
            details = " / ".join(row[3] for row in plan)
            assert "USING PRIMARY KEY (stream=?)" in details
            assert "B-TREE" not in details  # no sort: offset order is the key's order
            steps = [0]

            def count_step() -> int:
                steps[0] += 1
                return 0

            conn.set_progress_handler(count_step, 1)
            assert conn.execute(FIRST_OFFSET_AT, (a.key, 5)).fetchone() == (5,)
            assert steps[0] < 200  # VM instructions; a scan of the stream takes 10000s
    else:
        with psycopg.connect(storage_url, autocommit=True) as conn:
            conn.execute("ANALYZE messages")  # as autovacuum would: the planner's statistics
            sql = FIRST_OFFSET_AT.replace("?", "%s")
            (plan,) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", (a.key, 5)).fetchone()
        top = plan[0]["Plan"]
        assert top["Node Type"] == "Limit"
        (scan,) = top["Plans"]
        assert scan["Node Type"] == "Index Scan" and scan["Index Name"] == "messages_pkey"
        assert scan["Scan Direction"] == "Forward"
        assert scan["Actual Rows"] == 1 and scan["Rows Removed by Filter"] == 5


def test_delete_before(storage: Storage) -> None:
    a, b = create_topic(storage, "orders", 2)
    storage.append({a.key: numbered_rows(10), b.key: numbered_rows(3)})

    assert storage.delete_before(a.key, 4) == 4
    assert (head(storage, a.key).start_offset, head(storage, a.key).next_offset) == (4, 10)
    assert [m.offset for m in storage.read(a.key, 0, 100)] == list(range(4, 10))

    # At or below the start: nothing to do.
    assert storage.delete_before(a.key, 4) == 0
    assert storage.delete_before(a.key, 2) == 0
    assert head(storage, a.key).start_offset == 4

    # Never past the head.
    assert storage.delete_before(a.key, 1000) == 6
    assert (head(storage, a.key).start_offset, head(storage, a.key).next_offset) == (10, 10)
    assert storage.read(a.key, 0, 100) == []
    assert storage.append({a.key: numbered_rows(1, first=10)}) == {a.key: 10}
    assert [m.offset for m in storage.read(a.key, 0, 100)] == [10]

    # The other stream is untouched; an unknown stream is a no-op.
    assert [m.offset for m in storage.read(b.key, 0, 100)] == [0, 1, 2]
    assert head(storage, b.key).start_offset == 0
    assert storage.delete_before(max(a.key, b.key) + 1000, 5) == 0


# --------------------------------------------------------------------------- subscriptions


@PACKED
def test_create_subscription_with_initial_cursors(storage: Storage, packed: bool) -> None:
    a, b = create_topic(storage, "orders", 2)
    create_topic(storage, "other", 1)
    storage.append({a.key: numbered_rows(5)})
    seen: list[list[StreamHead]] = []

    def initial(heads: list[StreamHead]) -> dict[int, int]:
        seen.append(heads)
        return {h.key: h.next_offset for h in heads}

    record = subscription("latest", "orders", StartKind.LATEST, packed)
    storage.create_subscription(record, initial)

    assert [[h.stream for h in heads] for heads in seen] == [
        [StreamId("orders", 0, 0), StreamId("orders", 0, 1)]
    ]
    assert [h.next_offset for h in seen[0]] == [5, 0]
    assert storage.get_subscription("latest") == record
    assert storage.get_cursors("latest") == {a.key: 5, b.key: 0}


@PACKED
def test_create_subscription_errors_write_nothing(storage: Storage, packed: bool) -> None:
    (stream,) = create_topic(storage, "orders", 1)
    storage.create_subscription(
        subscription("s", "orders", packed=packed), lambda h: {stream.key: 1}
    )

    with pytest.raises(AlreadyExists, match="'s'"):
        storage.create_subscription(
            subscription("s", "orders", packed=packed), lambda h: {stream.key: 9}
        )
    with pytest.raises(TopicNotFound):
        storage.create_subscription(subscription("t", "nope", packed=packed), no_cursors)

    def refuse(heads: list[StreamHead]) -> dict[int, int]:
        raise ValueError("no start time")

    with pytest.raises(ValueError, match="no start time"):
        storage.create_subscription(subscription("u", "orders", packed=packed), refuse)

    assert [s.name for s in storage.list_subscriptions()] == ["s"]
    assert storage.get_cursors("s") == {stream.key: 1}
    assert storage.get_cursors("u") == {}


def test_get_list_and_delete_subscriptions(storage: Storage) -> None:
    create_topic(storage, "orders", 1)
    create_topic(storage, "audit", 1)
    records = [
        subscription("b", "orders"),
        subscription("a", "orders", StartKind.LATEST),
        SubscriptionRecord("c", "audit", "audit/+/x", StartKind.TIME, 123, 456),
    ]
    for record in records:
        storage.create_subscription(record, no_cursors)

    assert storage.get_subscription("c") == records[2]
    assert storage.list_subscriptions() == sorted(records, key=lambda r: r.name)
    assert storage.list_subscriptions("orders") == [records[1], records[0]]
    assert storage.list_subscriptions("nope") == []
    # The broker's `$`-named cursors (a session's) are left out when asked;
    # a name with `%` or `_` in it is no pattern.
    broker_owned = SubscriptionRecord(
        "$session.s1.orders", "orders", None, StartKind.LATEST, None, 1
    )
    odd = SubscriptionRecord("x%_y", "orders", None, StartKind.LATEST, None, 1)
    for record in (broker_owned, odd):
        storage.create_subscription(record, no_cursors)
    assert [s.name for s in storage.list_subscriptions("orders")] == [
        "$session.s1.orders",
        "a",
        "b",
        "x%_y",
    ]
    assert [s.name for s in storage.list_subscriptions(named_only=True)] == ["a", "b", "c", "x%_y"]
    assert [s.name for s in storage.list_subscriptions("orders", named_only=True)] == [
        "a",
        "b",
        "x%_y",
    ]
    for record in (broker_owned, odd):
        storage.delete_subscription(record.name)

    storage.commit_cursors("a", {1: 1})
    storage.delete_subscription("a")
    with pytest.raises(SubscriptionNotFound, match="'a'"):
        storage.get_subscription("a")
    with pytest.raises(SubscriptionNotFound):
        storage.delete_subscription("a")
    assert storage.get_cursors("a") == {}
    assert [s.name for s in storage.list_subscriptions()] == ["b", "c"]
    # The name is free again.
    storage.create_subscription(subscription("a", "audit"), no_cursors)


@PACKED
def test_commit_cursors_never_moves_backwards(storage: Storage, packed: bool) -> None:
    a, b = create_topic(storage, "orders", 2)
    storage.create_subscription(subscription("s", "orders", packed=packed), no_cursors)

    storage.commit_cursors("s", {a.key: 5})
    assert storage.get_cursors("s") == {a.key: 5}
    storage.commit_cursors("s", {a.key: 3, b.key: 2})
    assert storage.get_cursors("s") == {a.key: 5, b.key: 2}
    storage.commit_cursors("s", {a.key: 7})
    assert storage.get_cursors("s") == {a.key: 7, b.key: 2}
    storage.commit_cursors("s", {})
    assert storage.get_cursors("s") == {a.key: 7, b.key: 2}

    with pytest.raises(SubscriptionNotFound):
        storage.commit_cursors("nope", {a.key: 1})
    assert storage.get_cursors("nope") == {}


@PACKED
def test_find_cursors_tells_a_subscription_without_cursors_from_none(
    storage: Storage, packed: bool
) -> None:
    a, b = create_topic(storage, "orders", 2)
    storage.create_subscription(subscription("empty", "orders", packed=packed), no_cursors)
    storage.create_subscription(
        subscription("placed", "orders", packed=packed), lambda h: {a.key: 3, b.key: 4}
    )

    assert storage.find_cursors("empty") == {}
    assert storage.find_cursors("placed") == {a.key: 3, b.key: 4}
    assert storage.find_cursors("nope") is None
    assert storage.get_cursors("nope") == {}
    storage.delete_subscription("placed")
    assert storage.find_cursors("placed") is None


def test_find_cursors_many_answers_as_find_cursors_does(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed and row cursors alike, in one read per part of the names (two
    names a part here, so that the parts are seen to join up)."""
    monkeypatch.setattr("riverbed.storage.sql.core.IN_PART", 2)
    a, b = create_topic(storage, "orders", 2)
    for name, packed, cursors in [
        ("rows", False, {a.key: 3, b.key: 4}),
        ("packed", True, {a.key: 5}),
        ("empty", True, {}),
        ("bare", False, {}),
    ]:
        storage.create_subscription(
            subscription(name, "orders", packed=packed),
            lambda h, cursors=cursors: dict(cursors),
        )
    names = ["rows", "nope", "packed", "empty", "bare", "rows"]
    found = storage.find_cursors_many(names)
    assert found == {n: storage.find_cursors(n) for n in names if n != "nope"}
    assert found["rows"] == {a.key: 3, b.key: 4} and found["packed"] == {a.key: 5}
    assert storage.find_cursors_many([]) == {} and storage.find_cursors_many(["nope"]) == {}


@PACKED
def test_reset_cursors_replaces_and_may_rewind(storage: Storage, packed: bool) -> None:
    a, b = create_topic(storage, "orders", 2)
    storage.create_subscription(
        subscription("s", "orders", packed=packed), lambda h: {a.key: 5, b.key: 6}
    )

    storage.reset_cursors("s", {a.key: 1})
    assert storage.get_cursors("s") == {a.key: 1}
    storage.reset_cursors("s", {})
    assert storage.get_cursors("s") == {}

    with pytest.raises(SubscriptionNotFound):
        storage.reset_cursors("nope", {a.key: 1})


@PACKED
def test_min_cursors(storage: Storage, packed: bool) -> None:
    """`packed`: the first subscription's cursors are packed, the second's rows."""
    a, b = create_topic(storage, "orders", 2)
    (other,) = create_topic(storage, "other", 1)
    assert storage.min_cursors("orders") == {}

    first = subscription("first", "orders", packed=packed)
    storage.create_subscription(first, lambda h: {a.key: 5})
    assert storage.min_cursors("orders") == {a.key: 5, b.key: -1}

    storage.create_subscription(subscription("second", "orders"), lambda h: {a.key: 3, b.key: 4})
    assert storage.min_cursors("orders") == {a.key: 3, b.key: -1}

    storage.commit_cursors("first", {b.key: 6})
    assert storage.min_cursors("orders") == {a.key: 3, b.key: 4}

    # Subscriptions of another topic do not count.
    storage.create_subscription(
        subscription("elsewhere", "other", packed=packed), lambda h: {other.key: 9}
    )
    assert storage.min_cursors("orders") == {a.key: 3, b.key: 4}
    assert storage.min_cursors("other") == {other.key: 9}

    # A new generation's streams are not committed by anyone yet.
    storage.add_storage_topic("orders", lambda last: (1, 1))
    (new,) = storage.list_streams("orders")[2:]
    assert storage.min_cursors("orders") == {a.key: 3, b.key: 4, new.key: -1}

    storage.delete_subscription("first")
    storage.delete_subscription("second")
    assert storage.min_cursors("orders") == {}
    assert storage.min_cursors("nope") == {}


def test_packed_commits_from_threads_at_once_all_count(storage: Storage) -> None:
    """Commits of one packed subscription from several threads at once (on
    PostgreSQL, transactions that each read the row before the other wrote it)
    all count: none writes its merge over another's."""
    keys = [h.key for h in create_topic(storage, "orders", 4)]
    storage.create_subscription(subscription("s", "orders", packed=True), no_cursors)
    errors: list[BaseException] = []

    def commit(key: int) -> None:
        try:
            for offset in range(1, 31):
                storage.commit_cursors("s", {key: offset})
        except BaseException as exc:  # the assertion below says which
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert storage.get_cursors("s") == {key: 30 for key in keys}


_CURSOR_OPS = st.lists(
    st.tuples(
        st.sampled_from(["packed", "rows"]),
        st.sampled_from(["commit", "reset"]),
        st.dictionaries(st.integers(0, 2), st.integers(0, 40), max_size=3),
    ),
    max_size=10,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_CURSOR_OPS)
def test_packed_cursors_answer_as_rows_do(
    storage: Storage, ops: list[tuple[str, str, dict[int, int]]]
) -> None:
    """Whatever the commits and resets, a packed subscription's cursors read as a
    model of them says, the same as a subscription kept as rows given the same
    ones; and retention's lowest committed offsets (`min_cursors`, and
    `delete_before` keeping what is not consumed) take both kinds into account."""
    topic = f"prop-{uuid.uuid4().hex}"
    keys = [h.key for h in create_topic(storage, topic, 3)]
    storage.append({key: numbered_rows(40) for key in keys})
    names = {"packed": f"{topic}.packed", "rows": f"{topic}.rows", "mirror": f"{topic}.mirror"}
    for kind, name in names.items():
        storage.create_subscription(subscription(name, topic, packed=kind != "rows"), no_cursors)
    model: dict[str, dict[int, int]] = {"packed": {}, "rows": {}}
    for which, op, picked in ops:
        offsets = {keys[i]: offset for i, offset in picked.items()}
        targets = [which, "mirror"] if which == "rows" else [which]
        for target in targets:
            if op == "commit":
                storage.commit_cursors(names[target], offsets)
            else:
                storage.reset_cursors(names[target], offsets)
        if op == "commit":
            for key, offset in offsets.items():
                model[which][key] = max(offset, model[which].get(key, -1))
        else:
            model[which] = dict(offsets)
        assert storage.get_cursors(names[which]) == model[which]
        assert storage.get_cursors(names["mirror"]) == model["rows"]

    lowest = {
        key: min(model["packed"][key], model["rows"][key])
        if key in model["packed"] and key in model["rows"]
        else -1
        for key in keys
    }
    assert storage.min_cursors(topic) == lowest
    for key in keys:
        assert storage.delete_before(key, 40, keep_uncommitted=True) == max(lowest[key], 0)


# --------------------------------------------------------------------------- key-value


def test_kv_put_get_and_versions(storage: Storage) -> None:
    assert storage.kv_get("ns", "k") is None

    first = storage.kv_put("ns", "k", b"one")
    assert (first.namespace, first.key, first.value, first.version) == ("ns", "k", b"one", 1)
    assert storage.kv_get("ns", "k") == first

    second = storage.kv_put("ns", "k", b"\x00two\xff")
    assert second.version == 2
    assert storage.kv_get("ns", "k") == second
    assert type(second.value) is bytes


def test_kv_put_if_absent(storage: Storage) -> None:
    created = storage.kv_put_if_absent("ns", "k", b"mine")
    assert (created.value, created.version) == (b"mine", 1)

    with pytest.raises(PreconditionFailed):
        storage.kv_put_if_absent("ns", "k", b"theirs")

    assert storage.kv_get("ns", "k") == created


def test_kv_compare_and_set(storage: Storage) -> None:
    storage.kv_put("ns", "k", b"v1")

    updated = storage.kv_compare_and_set("ns", "k", 1, b"v2")
    assert (updated.value, updated.version) == (b"v2", 2)
    assert storage.kv_get("ns", "k") == updated

    with pytest.raises(PreconditionFailed):
        storage.kv_compare_and_set("ns", "k", 1, b"stale")
    assert storage.kv_get("ns", "k") == updated

    with pytest.raises(PreconditionFailed):
        storage.kv_compare_and_set("ns", "absent", 0, b"x")
    with pytest.raises(PreconditionFailed):
        storage.kv_compare_and_set("ns", "absent", 1, b"x")
    assert storage.kv_get("ns", "absent") is None


def test_kv_delete_if_version(storage: Storage) -> None:
    storage.kv_put("ns", "k", b"v1")
    storage.kv_put("ns", "k", b"v2")

    with pytest.raises(PreconditionFailed):
        storage.kv_delete_if_version("ns", "k", 1)
    assert storage.kv_get("ns", "k") is not None

    storage.kv_delete_if_version("ns", "k", 2)
    assert storage.kv_get("ns", "k") is None

    with pytest.raises(PreconditionFailed):
        storage.kv_delete_if_version("ns", "k", 2)
    # A deleted key starts again at version 1.
    assert storage.kv_put_if_absent("ns", "k", b"again").version == 1


def test_kv_list_by_prefix_including_like_wildcards(storage: Storage) -> None:
    keys = ["%", "a", "a%", "a%x", "a/1", "a/2", "aB", "a_x", "ab", "abc", "b", "é/1", "Z"]
    for key in keys:
        storage.kv_put("ns", key, key.encode())

    def listed(prefix: str) -> list[str]:
        return [e.key for e in storage.kv_list("ns", prefix)]

    assert listed("") == sorted(keys)
    assert listed("a/") == ["a/1", "a/2"]
    assert listed("a%") == ["a%", "a%x"]
    assert listed("%") == ["%"]
    assert listed("a_") == ["a_x"]
    assert listed("_") == []
    assert listed("ab") == ["ab", "abc"]
    assert listed("é/") == ["é/1"]
    assert listed("abcd") == []
    entry = storage.kv_list("ns", "b")[0]
    assert (entry.namespace, entry.key, entry.value, entry.version) == ("ns", "b", b"b", 1)


def test_kv_get_many_reads_several_keys_at_once(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("riverbed.storage.sql.core.IN_PART", 2)
    for key in ["a", "b", "c", "%", "é"]:
        storage.kv_put("ns", key, key.encode())
    storage.kv_put("ns", "b", b"again")
    storage.kv_put("other", "a", b"elsewhere")
    found = storage.kv_get_many("ns", ["a", "b", "nope", "%", "é", "a", "_"])
    assert found == {k: storage.kv_get("ns", k) for k in ["a", "b", "%", "é"]}
    assert found["b"].value == b"again" and found["b"].version == 2
    assert storage.kv_get_many("ns", []) == {} and storage.kv_get_many("empty", ["a"]) == {}


def test_kv_any_looks_for_a_key_by_prefix(storage: Storage) -> None:
    assert not storage.kv_any("ns") and not storage.kv_any("ns", "a")
    for key in ["%", "a/1", "a_x", "ab", "é/1", "\U0010ffff"]:
        storage.kv_put("ns", key, b"v")
    storage.kv_put("other", "zz", b"v")
    assert storage.kv_any("ns") and storage.kv_any("other")
    for prefix in ["%", "a", "a/", "a/1", "a_", "ab", "é", "\U0010ffff"]:
        assert storage.kv_any("ns", prefix), prefix
    for prefix in ["_", "a%", "a/2", "abc", "b", "z", "zz", "é/2"]:
        assert not storage.kv_any("ns", prefix), prefix
    assert storage.kv_any("other", "z") and not storage.kv_any("empty")


def test_kv_page_reads_a_namespace_a_page_at_a_time(storage: Storage) -> None:
    keys = ["%", "a", "a%", "a/1", "a_x", "ab", "b", "é/1", "Z"]
    for key in keys:
        storage.kv_put("ns", key, key.encode())
    storage.kv_put("other", "aa", b"x")
    pages: list[list[str]] = []
    after: str | None = None
    while page := storage.kv_page("ns", after, 4):
        pages.append([e.key for e in page])
        after = page[-1].key
    assert [len(p) for p in pages] == [4, 4, 1]
    assert [k for p in pages for k in p] == [e.key for e in storage.kv_list("ns")]
    (entry,) = storage.kv_page("ns", "a_x", 1)
    assert (entry.namespace, entry.key, entry.value, entry.version) == ("ns", "ab", b"ab", 1)
    assert storage.kv_page("empty", None, 10) == []
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidInput, match="page size"):
            storage.kv_page("ns", None, bad)  # type: ignore[arg-type]


def test_kv_namespaces_are_separate(storage: Storage) -> None:
    storage.kv_put("one", "k", b"1")
    storage.kv_put("two", "k", b"2")
    storage.kv_put("two", "k", b"22")

    one, two = storage.kv_get("one", "k"), storage.kv_get("two", "k")
    assert one is not None and (one.value, one.version) == (b"1", 1)
    assert two is not None and (two.value, two.version) == (b"22", 2)
    assert [e.namespace for e in storage.kv_list("one")] == ["one"]

    storage.kv_delete_if_version("two", "k", 2)
    assert storage.kv_get("one", "k") == one
    with pytest.raises(PreconditionFailed):
        storage.kv_put_if_absent("one", "k", b"x")
    assert storage.kv_list("two") == []


def test_kv_count_counts_the_keys_of_one_namespace(storage: Storage) -> None:
    assert storage.kv_count("one") == 0
    storage.kv_put("one", "a", b"1")
    storage.kv_put("one", "a", b"11")  # written over: still one key
    storage.kv_put("one", "b", b"2")
    storage.kv_put("two", "a", b"3")
    assert (storage.kv_count("one"), storage.kv_count("two")) == (2, 1)
    storage.kv_delete_if_version("one", "a", 2)
    assert storage.kv_count("one") == 1


# --------------------------------------------------------------------------- meta version


def test_meta_version_goes_up_with_every_metadata_change(storage: Storage) -> None:
    versions = [storage.meta_version()]

    def changed() -> None:
        versions.append(storage.meta_version())
        assert versions[-1] > versions[-2]

    create_topic(storage, "orders", 1)
    changed()
    storage.update_topic("orders", 1_000_000, RetentionPolicy.EXPIRED)
    changed()
    storage.add_storage_topic("orders", lambda last: (2, 2))
    changed()
    storage.switch_produce("orders")
    changed()
    storage.delete_topic("orders")
    changed()


def test_meta_version_is_shared_by_every_instance(storage: Storage, storage_url: str) -> None:
    from riverbed.storage import open_storage

    other = open_storage(storage_url)
    try:
        before = other.meta_version()
        create_topic(storage, "orders", 1)
        assert other.meta_version() > before
        assert [t.name for t in other.list_topics()] == ["orders"]
    finally:
        other.close()


_KEY_CHARS = st.sampled_from(
    ["a", "b", "/", "%", "_", "é", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"]
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.sets(st.text(_KEY_CHARS, max_size=4), max_size=12),
    prefix=st.text(_KEY_CHARS, max_size=3),
)
def test_kv_list_is_every_key_that_starts_with_the_prefix(
    storage: Storage, keys: set[str], prefix: str
) -> None:
    """Whatever the keys and the prefix, near the ends of the code points too
    (U+D7FF before the surrogates, U+FFFF, U+10FFFF): `kv_list` answers from a
    range of the primary key, and that range is exactly the prefix."""
    namespace = f"prop-{uuid.uuid4().hex}"
    for key in keys:
        storage.kv_put(namespace, key, b"")
    listed = [e.key for e in storage.kv_list(namespace, prefix)]
    assert listed == sorted(k for k in keys if k.startswith(prefix))
