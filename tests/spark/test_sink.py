"""The `riverbed` sink: rows become messages through the router, exactly once per
(query, batch, partition), and they wake the log's readers in other processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.log.partitioning import key_hash, route
from riverbed.model import Message
from riverbed.spark.options import WriteOptions
from riverbed.spark.sink import write_batches
from riverbed.subscriptions import Subscriptions

pytestmark = pytest.mark.spark


@pytest.fixture
def log(storage_url: str) -> Iterator[Log]:
    opened = Log.open(storage_url)
    try:
        yield opened
    finally:
        opened.close()


def messages_of(log: Log, topic: str) -> list[Any]:
    out = []
    for head in log.storage.list_streams(topic):
        out += [(head.stream, m) for m in log.storage.read(head.key, 0, 1_000_000)]
    return out


def test_batch_write_routes_rows_by_key(spark: Any, log: Log, storage_url: str) -> None:
    log.topics.create("out", partitions=4, binding="o/#")
    frame = spark.createDataFrame(
        [
            (f"k{n % 5}", f"p{n}", f"o/{n % 2}", '[["a","x"]]' if n == 0 else None, 1)
            for n in range(50)
        ],
        "key string, payload string, mqtt_topic string, properties string, qos int",
    ).repartition(3)

    frame.write.format("riverbed").option("db", storage_url).option("topic", "out").mode(
        "append"
    ).save()

    got = messages_of(log, "out")
    assert sorted(m.payload for _, m in got) == sorted(f"p{n}".encode() for n in range(50))
    for stream, m in got:
        assert stream.partition == route(key_hash(m.key), 4, 1)
        assert m.qos == 1 and m.mqtt_topic == f"o/{int(m.payload[1:]) % 2}"
    assert [m.properties for _, m in got if m.payload == b"p0"] == [(("a", "x"),)]


def test_sink_refuses_what_it_cannot_write(spark: Any, sqlite_url: str) -> None:
    frame = spark.createDataFrame([("a", 1)], "value string, n int")
    with pytest.raises(Exception, match="payload"):
        frame.write.format("riverbed").option("db", sqlite_url).option("topic", "x").mode(
            "append"
        ).save()


def test_a_retried_task_writes_nothing_twice(log: Log, storage_url: str) -> None:
    import pyarrow as pa

    log.topics.create("out", partitions=2)
    batch = pa.record_batch({"key": ["a", None], "payload": [b"1", b"2"]})
    options = WriteOptions(storage_url, "out")

    first = write_batches(options, "spark/q/7/0", iter([batch]))
    again = write_batches(options, "spark/q/7/0", iter([batch]))

    assert (first.messages, first.duplicate) == (2, False)
    assert (again.messages, again.duplicate) == (0, True)
    assert len(messages_of(log, "out")) == 2
    with pytest.raises(InvalidInput, match="qos"):
        bad = pa.record_batch({"payload": [b"1"], "qos": pa.array([3], pa.int32())})
        write_batches(options, "spark/q/8/0", iter([bad]))


def test_a_large_task_writes_every_column_in_bulk_exactly_once(log: Log, storage_url: str) -> None:
    import pyarrow as pa

    log.topics.create("out", partitions=4, binding="s/#")
    n = 3000  # over bulk.MIN_ROWS: the columns are loaded in bulk (ADBC)
    batch = pa.record_batch(
        {
            "key": [None if i % 7 == 0 else f"k{i % 11}" for i in range(n)],
            "payload": [str(i) for i in range(n)],
            "mqtt_topic": [None if i % 2 else f"s/{i % 3}" for i in range(n)],
            "properties": [None if i % 3 else f'[["p", "{i % 4}"]]' for i in range(n)],
            "qos": pa.array([None if i % 5 == 0 else i % 3 for i in range(n)], pa.int32()),
        }
    )
    options = WriteOptions(storage_url, "out")

    first = write_batches(options, "spark/q/1/0", iter([batch.slice(0, 1000), batch.slice(1000)]))
    again = write_batches(options, "spark/q/1/0", iter([batch]))

    assert (first.messages, first.duplicate) == (n, False)
    assert (again.messages, again.duplicate) == (0, True)
    got = {int(m.payload): (stream.partition, m) for stream, m in messages_of(log, "out")}
    assert sorted(got) == list(range(n))
    for i, (partition, m) in got.items():
        key = None if i % 7 == 0 else f"k{i % 11}"
        assert m.key == key
        if key is not None:
            assert partition == route(key_hash(key), 4, 1)
        assert m.mqtt_topic == ("" if i % 2 else f"s/{i % 3}")
        assert tuple(m.properties or ()) == (() if i % 3 else (("p", str(i % 4)),))
        assert m.qos == (0 if i % 5 == 0 else i % 3)
    # Offsets follow the task's row order within each stream.
    for stream in log.storage.list_streams("out"):
        payloads = [int(m.payload) for m in log.storage.read(stream.key, 0, n)]
        assert payloads == sorted(payloads)
        assert stream.next_offset == len(payloads)


def test_streaming_sink_stays_exactly_once_under_a_replayed_batch(
    spark: Any, log: Log, storage_url: str, tmp_path: Path
) -> None:
    log.topics.create("in", partitions=2)
    log.topics.create("out", partitions=3)
    log.produce("in", [Message(str(n).encode(), key=f"k{n % 4}") for n in range(1000)])
    Subscriptions(log.storage).create("sub", "in")
    checkpoint = tmp_path / "checkpoint"

    def run() -> Any:
        query = (
            spark.readStream.format("riverbed")
            .option("db", storage_url)
            .option("subscription", "sub")
            .option("maxMessagesPerTrigger", "400")
            .load()
            .select("key", "payload")
            .writeStream.format("riverbed")
            .option("db", storage_url)
            .option("topic", "out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        assert query.exception() is None
        return query

    run()
    assert len(messages_of(log, "out")) == 1000
    # The driver "died" after the last batch's tasks committed but before Spark
    # recorded the batch: the restart runs that batch again.
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    replay = run()

    assert [p["numInputRows"] for p in replay.recentProgress] == [200]
    payloads = sorted(int(m.payload) for _, m in messages_of(log, "out"))
    assert payloads == list(range(1000))


def test_rows_written_by_spark_wake_readers_in_other_processes(
    spark: Any, log: Log, storage_url: str
) -> None:
    log.topics.create("out", partitions=1)
    storage = log.storage
    woke = threading.Event()
    seen = storage.wakeups.version

    def wait() -> None:
        # Spark's Python workers are other processes: only the storage's
        # cross-process watcher (LISTEN/NOTIFY; SQLite's data_version) wakes us.
        if storage.wakeups.wait(seen, 60) != seen:
            woke.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    spark.createDataFrame([("x",)], "payload string").write.format("riverbed").option(
        "db", storage_url
    ).option("topic", "out").mode("append").save()
    waiter.join(60)

    assert woke.is_set()
    assert [m.payload for _, m in messages_of(log, "out")] == [b"x"]
