"""Topics: seed 003 CompositeTopic operations and bindings, on both backends."""

from __future__ import annotations

import pytest

from riverbed.errors import (
    AlreadyExists,
    BindingOverlap,
    InvalidInput,
    InvalidPartitionCount,
    InvalidTopicFilter,
    InvalidTopicName,
    TopicNotFound,
)
from riverbed.log.log import Log
from riverbed.log.topics import BUILTIN_PARTITIONS, BUILTIN_TOPIC, DEFAULT_RETENTION_US, Topics
from riverbed.model import Message, StreamId
from riverbed.storage import Storage
from riverbed.storage.base import RetentionPolicy, StorageTopicRecord


@pytest.fixture
def topics(storage: Storage) -> Topics:
    return Topics(storage)


def snapshot(storage: Storage) -> tuple[object, ...]:
    """Everything a refused operation must leave unchanged."""
    topics = storage.list_topics()
    return (
        storage.meta_version(),
        topics,
        [storage.list_storage_topics(t.name) for t in topics],
        storage.list_streams(),
    )


# --------------------------------------------------------------------- create, describe


def test_create_describe_list(topics: Topics) -> None:
    record = topics.create("orders", 4, binding="orders/#", retention_us=3_600_000_000)
    assert record.name == "orders" and record.binding == "orders/#"
    assert record.produce_pointer == 0
    assert topics.get("orders") == record
    assert [t.name for t in topics.list()] == ["orders"]
    d = topics.describe("orders")
    assert d.topic == record
    assert d.storage_topics == [StorageTopicRecord("orders", 0, 4, 1)]
    assert [h.stream for h in d.streams] == [StreamId("orders", 0, p) for p in range(4)]
    assert all(h.start_offset == h.next_offset == 0 and not h.sealed for h in d.streams)
    as_dict = d.as_dict()
    assert as_dict["retention"] == "1h"
    assert as_dict["retention_policy"] == "consumed-and-expired"
    assert as_dict["storage_topics"] == [{"generation": 0, "partitions": 4, "k": 1}]
    assert len(as_dict["streams"]) == 4  # type: ignore[arg-type]


def test_create_defaults(topics: Topics) -> None:
    record = topics.create("plain", 1)
    assert record.binding is None
    assert record.retention_us == DEFAULT_RETENTION_US
    assert record.retention_policy is RetentionPolicy.CONSUMED_AND_EXPIRED
    topics.create("forever", 2, retention_us=None)
    assert topics.describe("forever").as_dict()["retention"] is None


@pytest.mark.parametrize(
    "name", ["", "-orders", ".x", "a b", "a/b", "ö", "a" * 201, "x\x00", "orders#"]
)
def test_create_refuses_bad_names(storage: Storage, topics: Topics, name: str) -> None:
    before = snapshot(storage)
    with pytest.raises(InvalidInput) as caught:
        topics.create(name, 4)
    assert repr(name) in str(caught.value)
    assert snapshot(storage) == before


def test_longest_name_is_allowed(topics: Topics) -> None:
    name = "a" * 200
    topics.create(name, 1)
    assert topics.get(name).name == name
    assert name in {t.name for t in topics.list()}


@pytest.mark.parametrize("partitions", [0, -4, 5, 7, 10, True, 4.0])
def test_create_refuses_bad_partition_counts(
    storage: Storage, topics: Topics, partitions: int
) -> None:
    before = snapshot(storage)
    with pytest.raises(InvalidPartitionCount, match=repr(partitions)):
        topics.create("t", partitions)
    assert snapshot(storage) == before


@pytest.mark.parametrize("binding", ["", "a/#/b", "a+", "#/x", "a\x00"])
def test_create_refuses_malformed_bindings(storage: Storage, topics: Topics, binding: str) -> None:
    before = snapshot(storage)
    with pytest.raises(InvalidTopicFilter):
        topics.create("t", 4, binding=binding)
    assert snapshot(storage) == before


def test_create_refuses_negative_retention(storage: Storage, topics: Topics) -> None:
    before = snapshot(storage)
    with pytest.raises(InvalidInput, match="-1"):
        topics.create("t", 4, retention_us=-1)
    assert snapshot(storage) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [("a/#", "a/b"), ("a/b", "a/#"), ("+/x", "y/+"), ("#", "x"), ("a/+", "a/b"), ("a", "a")],
)
def test_create_refuses_overlapping_bindings(
    storage: Storage, topics: Topics, first: str, second: str
) -> None:
    topics.create("first", 4, binding=first)
    before = snapshot(storage)
    with pytest.raises(BindingOverlap) as caught:
        topics.create("second", 4, binding=second)
    message = str(caught.value)
    assert repr(first) in message and repr(second) in message and "'first'" in message
    assert snapshot(storage) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [("$sys/#", "#"), ("a/b", "a/c"), ("a/+", "a/b/c"), ("+", "/#"), ("$share/+", "+/x")],
)
def test_non_overlapping_bindings_are_fine(topics: Topics, first: str, second: str) -> None:
    topics.create("first", 4, binding=first)
    topics.create("second", 4, binding=second)
    assert {t.binding for t in topics.list()} == {first, second}


def test_create_refuses_an_existing_name(storage: Storage, topics: Topics) -> None:
    topics.create("t", 4, binding="t/#")
    before = snapshot(storage)
    with pytest.raises(AlreadyExists, match="'t'"):
        topics.create("t", 8, binding="other/#")
    assert snapshot(storage) == before


def test_unknown_topics(topics: Topics) -> None:
    for call in (
        lambda: topics.get("nope"),
        lambda: topics.describe("nope"),
        lambda: topics.add_storage_topic("nope", 4),
        lambda: topics.switch_produce("nope"),
        lambda: topics.delete("nope"),
        lambda: topics.set_retention("nope", None, RetentionPolicy.EXPIRED),
    ):
        with pytest.raises(TopicNotFound, match="nope"):
            call()


# --------------------------------------------------------------------- AddStorageTopic


@pytest.mark.parametrize(
    ("first", "added", "k"),
    [
        (4, [8], [2]),  # seed 003: a multiple of the base count scales K
        (4, [6], [1]),  # not a multiple: K=1 reset
        (2, [12], [6]),
        (4, [8, 12], [2, 3]),  # the base count (4) stays while K grows
        (4, [8, 6, 12], [2, 1, 2]),  # after a reset the base is the new count (6)
        (8, [8], [1]),
    ],
)
def test_add_storage_topic_k_rule(topics: Topics, first: int, added: list[int], k: list[int]):
    topics.create("t", first)
    for generation, (partitions, expected_k) in enumerate(zip(added, k, strict=True), start=1):
        record = topics.add_storage_topic("t", partitions)
        assert record == StorageTopicRecord("t", generation, partitions, expected_k)
    d = topics.describe("t")
    assert [(s.partitions, s.k) for s in d.storage_topics] == [
        (first, 1),
        *zip(added, k, strict=True),
    ]
    assert len(d.streams) == first + sum(added)
    # AddStorageTopic does not move the produce pointer (seed 003).
    assert d.topic.produce_pointer == 0
    assert not any(h.sealed for h in d.streams)


def test_add_storage_topic_refuses_bad_counts(storage: Storage, topics: Topics) -> None:
    topics.create("t", 4)
    before = snapshot(storage)
    for bad in (0, 5, 7, -8):
        with pytest.raises(InvalidPartitionCount, match=str(bad)):
            topics.add_storage_topic("t", bad)
    assert snapshot(storage) == before


def test_switch_produce_seals_earlier_generations_and_stays_at_the_last(
    topics: Topics,
) -> None:
    topics.create("t", 2)
    # With one storage topic there is nowhere to switch to: nothing changes.
    assert topics.switch_produce("t").produce_pointer == 0
    assert not any(h.sealed for h in topics.describe("t").streams)

    topics.add_storage_topic("t", 4)
    topics.add_storage_topic("t", 8)
    assert topics.switch_produce("t").produce_pointer == 1
    sealed = {h.stream.generation: h.sealed for h in topics.describe("t").streams}
    assert sealed == {0: True, 1: False, 2: False}

    assert topics.switch_produce("t").produce_pointer == 2
    assert topics.switch_produce("t").produce_pointer == 2  # stays at the last index
    heads = topics.describe("t").streams
    assert [h.sealed for h in heads] == [True] * 6 + [False] * 8


def test_set_retention(storage: Storage, topics: Topics) -> None:
    topics.create("t", 1)
    updated = topics.set_retention("t", 1_000_000, RetentionPolicy.EXPIRED)
    assert updated.retention_us == 1_000_000
    assert updated.retention_policy is RetentionPolicy.EXPIRED
    before = snapshot(storage)
    with pytest.raises(InvalidInput):
        topics.set_retention("t", -5, RetentionPolicy.CONSUMED)
    assert snapshot(storage) == before


# --------------------------------------------------------------------- delete, builtin


def test_delete_topic_with_its_messages(log: Log) -> None:
    log.topics.create("t", 2, binding="t/#")
    log.produce("t", [Message(b"x", key=str(i), mqtt_topic="t/a") for i in range(5)])
    assert log.topics.delete("t") == 5
    assert [t.name for t in log.topics.list()] == [BUILTIN_TOPIC]
    assert log.storage.list_streams("t") == []
    with pytest.raises(TopicNotFound):
        log.topics.get("t")
    # The binding is free again.
    log.topics.create("t2", 2, binding="t/+")


def test_builtin_topic_exists_and_cannot_be_deleted(storage: Storage, log: Log) -> None:
    record = log.topics.get(BUILTIN_TOPIC)
    assert record.binding is None
    assert len(log.topics.describe(BUILTIN_TOPIC).streams) == BUILTIN_PARTITIONS
    before = snapshot(storage)
    with pytest.raises(InvalidInput, match="built in"):
        log.topics.delete(BUILTIN_TOPIC)
    assert snapshot(storage) == before
    # A second Log on the same storage finds it and does not fail.
    again = Log(storage)
    again.appender.close()
    assert [t.name for t in storage.list_topics()] == [BUILTIN_TOPIC]


# --------------------------------------------------------------------- Log: bindings, checks


def test_topic_for_resolves_by_binding_else_mqtt(log: Log) -> None:
    log.topics.create("orders", 4, binding="orders/#")
    log.topics.create("sensors", 4, binding="sensors/+/temp")
    assert log.topic_for("orders") == "orders"
    assert log.topic_for("orders/eu/1") == "orders"
    assert log.topic_for("sensors/kitchen/temp") == "sensors"
    assert log.topic_for("sensors/kitchen/humidity") == BUILTIN_TOPIC
    assert log.topic_for("ordersx") == BUILTIN_TOPIC
    assert log.topic_for("$SYS/load") == BUILTIN_TOPIC


def test_topic_for_dollar_topics(log: Log) -> None:
    log.topics.create("everything", 4, binding="#")
    log.topics.create("sys", 1, binding="$SYS/#")
    assert log.topic_for("a/b") == "everything"
    assert log.topic_for("$SYS/load") == "sys"
    assert log.topic_for("$other/x") == BUILTIN_TOPIC  # '#' does not match $-topics


def test_topic_for_sees_a_topic_created_through_the_log_at_once(log: Log) -> None:
    assert log.topic_for("late/x") == BUILTIN_TOPIC
    log.topics.create("late", 1, binding="late/#")
    assert log.topic_for("late/x") == "late"


def test_produce_places_messages_by_routing(log: Log) -> None:
    log.topics.create("orders", 4, binding="orders/#")
    positions = log.produce(
        "orders", [Message(b"1", key="k", mqtt_topic="orders/a"), Message(b"2", key="k")]
    )
    (s1, o1), (s2, o2) = positions
    assert s1 == s2 and s1.topic == "orders" and s1.generation == 0
    assert (o1, o2) == (0, 1)


@pytest.mark.parametrize(
    ("mqtt_topic", "error"),
    [
        ("other/x", InvalidInput),  # not matched by the binding
        ("orders/+", InvalidTopicName),  # wildcards are no topic names
        ("orders/#", InvalidTopicName),
        ("orders/\x00", InvalidTopicName),
    ],
)
def test_produce_refuses_topics_the_binding_does_not_match(
    storage: Storage, log: Log, mqtt_topic: str, error: type[Exception]
) -> None:
    log.topics.create("orders", 4, binding="orders/#")
    before = snapshot(storage)
    good = Message(b"ok", key="k", mqtt_topic="orders/1")
    bad = Message(b"bad", key="k", mqtt_topic=mqtt_topic)
    with pytest.raises(error):
        log.produce("orders", [good, bad])  # the good one is not written either
    with pytest.raises(error):
        log.check("orders", bad)
    assert snapshot(storage) == before
    assert all(h.next_offset == 0 for h in storage.list_streams("orders"))


def test_produce_to_an_unknown_topic(storage: Storage, log: Log) -> None:
    before = snapshot(storage)
    with pytest.raises(TopicNotFound):
        log.produce("nope", [Message(b"x")])
    assert snapshot(storage) == before


def test_builtin_topic_refuses_names_another_binding_claims(storage: Storage, log: Log) -> None:
    log.topics.create("orders", 4, binding="orders/#")
    before = snapshot(storage)
    claimed = Message(b"x", key="c1", mqtt_topic="orders/1")
    with pytest.raises(InvalidInput, match="belongs to topic 'orders'"):
        log.produce(BUILTIN_TOPIC, [Message(b"ok", mqtt_topic="free/1"), claimed])
    assert snapshot(storage) == before
    # A topic without a binding is no MQTT destination: any valid name is data there.
    log.topics.create("plain", 2)
    assert log.produce("plain", [claimed])[0][0].topic == "plain"


def test_builtin_topic_takes_any_valid_name(log: Log) -> None:
    positions = log.produce(BUILTIN_TOPIC, [Message(b"x", key="c1", mqtt_topic="a/b/c")])
    assert positions[0][0].topic == BUILTIN_TOPIC
    with pytest.raises(InvalidTopicName):
        log.produce(BUILTIN_TOPIC, [Message(b"x", mqtt_topic="a/+")])
