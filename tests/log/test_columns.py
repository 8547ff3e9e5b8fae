"""Produce for Arrow columns (`log/columns.py`, `Appender.append_arrow_once`):
the same ids, hashes and streams as the per-message path, exactly once."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.clock import FakeClock
from riverbed.log import columns
from riverbed.log.log import Log
from riverbed.log.partitioning import key_hash, route
from riverbed.model import Message, MessageIdGenerator
from riverbed.storage import bulk

pa = pytest.importorskip("pyarrow")

valid_partitions = st.one_of(
    st.sampled_from([1, 2, 3]),
    st.integers(1, 32).map(lambda n: 4 * n),
    st.integers(1, 32).map(lambda n: 6 * n),
)
keys = st.lists(st.one_of(st.none(), st.text(max_size=8), st.sampled_from(["a", "b"])))


@given(keys, valid_partitions, st.integers(1, 8), st.integers(0, 1000))
def test_routes_are_the_routers_for_every_key(
    values: list[str | None], partitions: int, k: int, spread_from: int
) -> None:
    hashes = columns.key_hashes(pa.array(values, pa.string()), itertools.count(spread_from))

    spread = itertools.count(spread_from)
    want = [key_hash(v) if v is not None else next(spread) for v in values]
    assert hashes.to_pylist() == want
    got = columns.routes(hashes, partitions, k).to_pylist()
    assert got == [route(h, partitions, k) for h in want]


@given(st.lists(st.integers(0, 5)))
def test_grouping_keeps_row_order_within_a_partition(targets: list[int]) -> None:
    order, found = columns.group(pa.array(targets, pa.int64()))

    assert found == sorted((t, targets.count(t)) for t in set(targets))
    rows = list(range(len(targets))) if order is None else order.to_pylist()
    assert [targets[i] for i in rows] == sorted(targets)
    for t in set(targets):
        within = [i for i in rows if targets[i] == t]
        assert within == sorted(within)


@pytest.mark.parametrize("count", [0, 1, 1000, 65_536 * 2 + 3])
def test_stamped_ids_are_the_ones_reserve_mints(count: int) -> None:
    clock = FakeClock(ns=1_700_000_000_000_000_000).ns  # standing still
    expected = MessageIdGenerator(node=0xABCDEF012345, clock=clock).reserve(count)
    ids, stamps = columns.stamp(MessageIdGenerator(node=0xABCDEF012345, clock=clock), count)

    assert ids.type == pa.binary()
    assert list(zip(ids.to_pylist(), stamps.to_pylist(), strict=True)) == expected


def message_rows(values: list[tuple[str | None, bytes]]) -> Any:
    n = len(values)
    return pa.table(
        {
            "mqtt_topic": pa.array(["t"] * n, pa.string()),
            "key": pa.array([k for k, _ in values], pa.string()),
            "payload": pa.array([p for _, p in values], pa.binary()),
            "properties": pa.nulls(n, pa.binary()),
            "qos": pa.array([1] * n, pa.int16()),
            "retain": pa.array([0] * n, pa.int16()),
        }
    )


@pytest.fixture(params=["bulk", "tuples"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(bulk, "MIN_ROWS", 1 if request.param == "bulk" else 10**9)
    return str(request.param)


def placement(log: Log, topic: str) -> dict[bytes, tuple[int, int]]:
    """payload -> (partition, offset)."""
    out = {}
    for head in log.storage.list_streams(topic):
        for m in log.storage.read(head.key, 0, 100_000):
            out[m.payload] = (head.stream.partition, m.offset)
    return out


def test_rows_go_where_produce_sends_the_same_keys(log: Log, path: str) -> None:
    log.topics.create("produced", partitions=12)
    log.topics.create("columns", partitions=12)
    values = [(None if n % 9 == 0 else f"key-{n % 37}", str(n).encode()) for n in range(3000)]
    # Each through a fresh appender: keyless rows take the appender's spread
    # counter, which both start at 0.
    producer = Log(log.storage)
    try:
        producer.produce("produced", [Message(p, key=k) for k, p in values])
    finally:
        producer.appender.close()

    firsts = log.appender.append_arrow_once("columns", message_rows(values), "m")

    assert firsts is not None
    assert placement(log, "columns") == placement(log, "produced")
    heads = {h.stream.partition: h.next_offset for h in log.storage.list_streams("columns")}
    assert sum(heads.values()) == 3000
    produced = log.storage.list_streams("produced")
    assert heads == {h.stream.partition: h.next_offset for h in produced}


def test_a_retried_write_appends_nothing(log: Log, path: str) -> None:
    log.topics.create("t", partitions=4)
    table = message_rows([(f"k{n % 5}", str(n).encode()) for n in range(2000)])

    assert log.appender.append_arrow_once("t", table, "task/0") is not None
    assert log.appender.append_arrow_once("t", table, "task/0") is None

    assert sum(h.next_offset for h in log.storage.list_streams("t")) == 2000
    assert len(placement(log, "t")) == 2000


def test_rows_after_switch_produce_go_to_the_new_generation(log: Log, path: str) -> None:
    log.topics.create("t", partitions=2)
    table = message_rows([(f"k{n}", str(n).encode()) for n in range(1500)])
    assert log.appender.append_arrow_once("t", table, "before") is not None
    # Another process scaled the topic up: the appender's layout is stale.
    log.storage.add_storage_topic("t", lambda last: (4, 2))
    log.storage.switch_produce("t")

    assert log.appender.append_arrow_once("t", table, "after") is not None

    by_generation = {}
    for head in log.storage.list_streams("t"):
        by_generation.setdefault(head.stream.generation, 0)
        by_generation[head.stream.generation] += head.next_offset
    assert by_generation == {0: 1500, 1: 1500}
