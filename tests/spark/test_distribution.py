"""`by_stream`: a DataFrame's partitions planned so that each stream of the sink's
topic is written by one Spark task, computed in Spark as the router computes it;
the sink writes such a DataFrame exactly as any other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.log.partitioning import key_hash, route
from riverbed.spark import by_stream
from riverbed.spark.distribution import stream_index

pytestmark = pytest.mark.spark


@pytest.fixture
def log(storage_url: str) -> Iterator[Log]:
    opened = Log.open(storage_url)
    try:
        yield opened
    finally:
        opened.close()


def test_each_stream_is_in_one_partition_after_a_scale_up(
    spark: Any, log: Log, storage_url: str
) -> None:
    from pyspark.sql import functions as F

    log.topics.create("out", partitions=3)
    log.topics.add_storage_topic("out", 6)  # K = 2: the formula's second term counts
    log.topics.switch_produce("out")
    generation = log.storage.list_storage_topics("out")[-1]
    assert (generation.partitions, generation.k) == (6, 2)
    frame = spark.range(3000).selectExpr(
        "IF(id % 10 = 0, NULL, concat('k', cast(id % 97 AS string))) AS key",
        "cast(id AS string) AS payload",
    )

    planned = by_stream(frame, "out", storage_url)
    rows = planned.withColumn("task", F.spark_partition_id()).collect()

    assert planned.rdd.getNumPartitions() == 6
    tasks: dict[int, set[int]] = {}
    for row in rows:
        if row.key is not None:
            tasks.setdefault(route(key_hash(row.key), 6, 2), set()).add(row.task)
    assert len(tasks) == 6
    assert all(len(t) == 1 for t in tasks.values()), tasks
    assert {row.task for row in rows if row.key is None} == {0}

    planned.write.format("riverbed").option("db", storage_url).option("topic", "out").mode(
        "append"
    ).save()
    written: list[int] = []
    for head in log.storage.list_streams("out"):
        for m in log.storage.read(head.key, 0, 10_000):
            written.append(int(m.payload))
            if m.key is not None:
                assert head.stream.generation == generation.generation
                assert head.stream.partition == route(key_hash(m.key), 6, 2)
    assert sorted(written) == list(range(3000))


LAYOUTS = [(1, 1), (3, 1), (6, 2), (7, 3), (64, 8)]
"""(partitions, K) of storage topics: scale-ups with K > 1 among them."""


@settings(max_examples=25, deadline=None)
@given(keys=st.lists(st.text(max_size=12), min_size=1, max_size=40))
def test_the_spark_expression_routes_as_the_router(spark: Any, keys: list[str]) -> None:
    frame = spark.createDataFrame([(key,) for key in keys], "key string")
    columns = [stream_index(p, k).alias(f"s{i}") for i, (p, k) in enumerate(LAYOUTS)]

    rows = frame.select("key", *columns).collect()

    for row in rows:
        for i, (p, k) in enumerate(LAYOUTS):
            assert row[f"s{i}"] == route(key_hash(row.key), p, k), (row.key, p, k)


def test_by_stream_refuses_no_partitions_and_an_unknown_topic(spark: Any, sqlite_url: str) -> None:
    from riverbed.errors import TopicNotFound

    frame = spark.range(1).selectExpr("'k' AS key", "'p' AS payload")
    with Log.open(sqlite_url) as log:
        log.topics.create("out", partitions=2)
    with pytest.raises(InvalidInput, match="at least 1 partition; got 0"):
        by_stream(frame, "out", sqlite_url, partitions=0)
    with pytest.raises(TopicNotFound, match="nope"):
        by_stream(frame, "nope", sqlite_url)
