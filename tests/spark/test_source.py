"""The `riverbed` source in Spark: batch reads and streaming reads of subscriptions,
on both backends (`storage_url`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage
from riverbed.subscriptions import Subscriptions

pytestmark = pytest.mark.spark


@pytest.fixture
def log(storage_url: str) -> Iterator[Log]:
    opened = Log.open(storage_url)
    try:
        yield opened
    finally:
        opened.close()


def produce(log: Log, topic: str, count: int, first: int = 0, keys: int = 7) -> None:
    for start in range(first, first + count, 10_000):
        stop = min(start + 10_000, first + count)
        log.produce(
            topic,
            [
                Message(
                    f"{n}".encode(),
                    key=f"k{n % keys}",
                    mqtt_topic=f"s/{n % 3}",
                    properties=(("n", n),) if n % 5 == 0 else (),
                )
                for n in range(start, stop)
            ],
        )


def read_topic(spark: Any, url: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("riverbed").option("db", url).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def stream(spark: Any, url: str, subscription: str, **options: str) -> Any:
    reader = spark.readStream.format("riverbed").option("db", url)
    reader = reader.option("subscription", subscription)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_equals_what_was_produced(spark: Any, log: Log, storage_url: str) -> None:
    log.topics.create("t", partitions=4, binding="s/#")
    produce(log, "t", 2000)
    expected = set()
    for head in log.storage.list_streams("t"):
        for m in log.storage.read(head.key, 0, 10_000):
            props = None if m.properties_blob is None else m.properties_blob.decode()
            expected.add(
                (str(head.stream), m.offset, m.id_bytes, m.mqtt_topic, m.key, m.payload, props)
            )

    rows = read_topic(spark, storage_url, "t").collect()

    got = {
        (
            f"{r.topic}/{r.generation}/{r.partition}",
            r.offset,
            bytes(r.id),
            r.mqtt_topic,
            r.key,
            bytes(r.payload),
            r.properties,
        )
        for r in rows
    }
    assert len(rows) == 2000
    assert got == expected
    assert all(r.qos == 0 and r.timestamp is not None for r in rows)


def test_batch_read_options_narrow_the_read(spark: Any, log: Log, storage_url: str) -> None:
    log.topics.create("t", partitions=2, binding="s/#")
    produce(log, "t", 300)
    heads = {str(h.stream): h for h in log.storage.list_streams("t")}

    def payloads(**options: str) -> set[int]:
        return {
            int(bytes(r.payload)) for r in read_topic(spark, storage_url, "t", **options).collect()
        }

    assert payloads(filter="s/1") == {n for n in range(300) if n % 3 == 1}
    assert payloads(filter="+/2", key="k3") == {n for n in range(300) if n % 3 == 2 and n % 7 == 3}
    first = {name: 10 for name in heads}
    ending = {"t/0/0": 20}
    narrowed = payloads(startingOffsets=json.dumps(first), endingOffsets=json.dumps(ending))
    assert len(narrowed) == 10 + heads["t/0/1"].next_offset - 10
    ts = sorted(m.timestamp_us for h in heads.values() for m in log.storage.read(h.key, 0, 1000))
    assert len(payloads(startTime=str(ts[100]), endTime=str(ts[-1] + 1))) == len(
        [t for t in ts if t >= ts[100]]
    )
    assert payloads(startTime="2100-01-01T00:00:00") == set()


def test_streaming_read_restarted_from_its_checkpoint_yields_every_message_once(
    spark: Any, log: Log, storage_url: str, tmp_path: Path
) -> None:
    log.topics.create("t", partitions=4, binding="s/#")
    produce(log, "t", 100_000)
    Subscriptions(log.storage).create("sub", "t")
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def start(**trigger: Any) -> Any:
        return (
            stream(spark, storage_url, "sub", maxMessagesPerTrigger="15000")
            .select("topic", "generation", "partition", "offset", "payload")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    first = start(processingTime="0 seconds")
    try:
        while (first.lastProgress or {}).get("batchId", -1) < 1:
            assert first.isActive, first.exception()
            first.awaitTermination(0.1)
    finally:
        first.stop()  # part-way: mid-batch or between batches
    # As if the driver died after the sink wrote its last batch but before Spark
    # recorded it: the restart replays that batch from the offset log.
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)

    second = start(availableNow=True)
    second.awaitTermination(120)
    assert second.exception() is None

    rows = spark.read.parquet(str(out)).collect()
    positions = [(r.topic, r.generation, r.partition, r.offset) for r in rows]
    assert len(positions) == len(set(positions)) == 100_000
    assert {int(bytes(r.payload)) for r in rows} == set(range(100_000))
    # commit() moved the subscription's cursors (one batch late: Spark's way).
    assert sum(lag.committed for lag in Subscriptions(log.storage).lag("sub")) > 0


def test_admission_control_splits_batches(spark: Any, sqlite_url: str) -> None:
    with Log.open(sqlite_url) as log:
        log.topics.create("t", partitions=3)
        produce(log, "t", 1000)
        Subscriptions(log.storage).create("sub", "t")
    query = (
        stream(spark, sqlite_url, "sub", maxMessagesPerTrigger="300")
        .writeStream.format("memory")
        .queryName("admission")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    assert spark.sql("SELECT count(DISTINCT payload) FROM admission").first()[0] == 1000


def test_a_new_generation_is_read_in_lineage_order(
    spark: Any, log: Log, storage_url: str, tmp_path: Path
) -> None:
    log.topics.create("t", partitions=2)
    produce(log, "t", 100, keys=8)
    Subscriptions(log.storage).create("sub", "t")
    seen: list[tuple[int, int, str, int]] = []  # (batch, generation, key, n)

    def collect(frame: Any, batch_id: int) -> None:
        for r in frame.select("generation", "key", "payload").collect():
            seen.append((batch_id, r.generation, r.key, int(bytes(r.payload))))

    def run() -> None:
        query = (
            stream(spark, storage_url, "sub", maxMessagesPerTrigger="40")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        assert query.exception() is None

    run()
    produce(log, "t", 100, first=100, keys=8)  # more in generation 0, unread
    log.topics.add_storage_topic("t", 4)  # K = 2: each lineage split in two
    log.topics.switch_produce("t")
    produce(log, "t", 200, first=200, keys=8)
    run()

    assert sorted(n for *_, n in seen) == list(range(400))
    for key in {k for _, _, k, _ in seen}:
        old = [b for b, g, k, _ in seen if k == key and g == 0]
        new = [b for b, g, k, _ in seen if k == key and g == 1]
        assert new and max(old) < min(new), f"key {key}: generation 1 overtook generation 0"
        in_order = [n for _, _, k, n in sorted(seen) if k == key]
        assert in_order == sorted(in_order)


def test_source_options_are_checked_before_the_query_starts(spark: Any, sqlite_url: str) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    bad = spark.readStream.format("riverbed").option("db", sqlite_url)
    with pytest.raises((PySparkException, Py4JJavaError), match="subscription"):
        bad.load().writeStream.format("noop").start().awaitTermination(10)
    with pytest.raises((PySparkException, Py4JJavaError), match="maxMessagesPerTrigger"):
        spark.read.format("riverbed").option("db", sqlite_url).option("topic", "t").option(
            "maxMessagesPerTrigger", "10"
        ).load().collect()
    with pytest.raises((PySparkException, Py4JJavaError), match="maxMessagesPerPartition"):
        spark.read.format("riverbed").option("db", sqlite_url).option("topic", "t").option(
            "maxMessagesPerPartition", "0"
        ).load().collect()


def test_reader_state_stays_on_the_driver() -> None:
    import pickle

    from riverbed.spark.options import Ordering, StreamOptions
    from riverbed.spark.source import StreamReader

    reader = StreamReader(StreamOptions("sqlite:///x.db", "s", Ordering.STRICT, None, 10))
    reader._storage = object()
    reader._target = {"t/0/0": 1}
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options
    assert copy._storage is None and copy._target is None
    open_storage  # noqa: B018 - imported for symmetry with the sink tests
