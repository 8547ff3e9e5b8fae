"""Spark benchmark: the `riverbed` source and sink beside Spark's own Parquet.

1,000,000 messages of 100 bytes (8 streams), in one run, on one backend:

- source: a streaming query reading a subscription with Trigger.AvailableNow into
  the `noop` sink, against Spark reading the same rows (the same columns) from a
  Parquet directory, as a streaming query (AvailableNow, noop) and as a batch read;
- sink: a cached DataFrame of (key, payload) written to a topic with
  `df.write.format("riverbed")`, against the same DataFrame written as Parquet;
- latency: a running streaming query (subscription -> riverbed sink, default
  trigger) and a consumer of the sink's topic; one message produced at a time,
  the time until the consumer has it, end to end;
- the ceiling of any Python source here: a Python data source that makes the
  same rows (riverbed's schema) in memory, without a database, read by the same
  streaming query.

Three rounds of each throughput case, alternating; the best round counts.
Prints throughputs and the ratios riverbed / Parquet.

    .venv/bin/python bench/spark.py [--messages N] [--backend sqlite|postgres]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)

from riverbed.log.log import Log  # noqa: E402
from riverbed.log.router import key_hash, route  # noqa: E402
from riverbed.model import Message  # noqa: E402
from riverbed.spark import session  # noqa: E402
from riverbed.spark.options import DEFAULT_PARTITION_MESSAGES  # noqa: E402
from riverbed.spark.planning import Range, split  # noqa: E402
from riverbed.storage.base import StartKind  # noqa: E402
from riverbed.subscriptions import Subscriptions  # noqa: E402

STREAMS = 8
ROUNDS = 3
PAYLOAD = b"x" * 100
COLUMNS = ["topic", "generation", "partition", "offset", "id", "mqtt_topic", "key", "payload"]


def keys_per_partition() -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < STREAMS:
        key = f"key-{i}"
        found.setdefault(route(key_hash(key), STREAMS, 1), key)
        i += 1
    return [found[p] for p in range(STREAMS)]


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def best(results: dict[str, list[float]], name: str, seconds: float) -> None:
    results.setdefault(name, []).append(seconds)


class MemorySource(DataSource):
    """`memory`: riverbed's schema, rows made in memory (the source's ceiling).

    Defined in the script, so Spark pickles it to the workers by value. Its
    streaming reader offers `rows` messages in `parts` Spark partitions, each
    read as Arrow record batches of `reading.CHUNK` rows, as the riverbed source
    does, but nothing is read from a database.
    """

    @classmethod
    def name(cls) -> str:
        return "memory"

    def schema(self) -> str:
        from riverbed.spark.reading import SCHEMA

        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return MemoryReader(int(self.options["rows"]), int(self.options["parts"]))


class MemoryReader(DataSourceStreamReader):
    def __init__(self, rows: int, parts: int) -> None:
        self.rows = rows
        self.parts = parts

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"rows": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        total = end["rows"] - start["rows"]
        each = -(-total // self.parts)
        sizes = [min(each, total - first) for first in range(0, total, each)] if total else []
        return [InputPartition(size) for size in sizes]

    def read(self, partition: InputPartition) -> Any:
        import pyarrow as pa

        from riverbed.spark.reading import CHUNK, spark_arrow_schema

        schema = spark_arrow_schema()
        left = partition.value
        while left > 0:
            n = min(CHUNK, left)
            left -= n
            values = [
                pa.scalar("bench"),
                pa.scalar(0, pa.int32()),
                pa.scalar(1, pa.int32()),
                pa.scalar(left, pa.int64()),
                pa.scalar(bytes(16)),
                pa.scalar(""),
                pa.scalar("key-1"),
                pa.scalar(PAYLOAD),
                pa.scalar(None, pa.string()),
                pa.scalar(0, pa.int32()),
                pa.scalar(0, pa.int64()),
            ]
            columns = [pa.repeat(v, n) for v in values]
            columns[-1] = columns[-1].cast(pa.timestamp("us", tz="UTC"))
            yield from pa.Table.from_arrays(columns, schema=schema).to_batches()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--latency-samples", type=int, default=20)
    args = parser.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="riverbed-bench-spark-"))
    server = None
    try:
        if args.backend == "postgres":
            from harness.postgres import PostgresServer

            server = PostgresServer()
            server.start()
            url = server.new_database("bench")
        else:
            url = f"sqlite:///{work}/bench.db"
        run(url, n, work, args.latency_samples, args.backend)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(url: str, n: int, work: Path, samples: int, backend: str) -> None:
    keys = keys_per_partition()
    with Log.open(url) as log:
        log.topics.create("bench", partitions=STREAMS)
        per = n // STREAMS
        for key in keys:
            for start in range(0, per, 10_000):
                log.produce("bench", [Message(PAYLOAD, key=key)] * min(10_000, per - start))
        subscriptions = Subscriptions(log.storage)
        subscriptions.create("bench-read", "bench")
    total = per * STREAMS

    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    parquet = str(work / "parquet")
    source = spark.read.format("riverbed").option("db", url).option("topic", "bench").load()
    source.select(*COLUMNS).write.parquet(parquet)
    schema = spark.read.parquet(parquet).schema

    def riverbed_stream() -> None:
        with Log.open(url) as log:
            Subscriptions(log.storage).reset("bench-read", StartKind.EARLIEST)
        frame = spark.readStream.format("riverbed").option("db", url)
        frame = frame.option("subscription", "bench-read").load().select(*COLUMNS)
        checkpoint = tempfile.mkdtemp(dir=work)
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        assert rows == total, f"the riverbed stream read {rows} of {total}"

    def parquet_stream() -> None:
        checkpoint = tempfile.mkdtemp(dir=work)
        query = (
            spark.readStream.schema(schema)
            .parquet(parquet)
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    spark.dataSource.register(MemorySource)
    # As many Spark partitions as the riverbed source plans for the same streams.
    streams = [Range(0, "bench", 0, p, 0, per) for p in range(STREAMS)]
    parts = len(split(streams, DEFAULT_PARTITION_MESSAGES, os.cpu_count() or 1))

    def memory_stream() -> None:
        frame = spark.readStream.format("memory").option("rows", total).option("parts", parts)
        checkpoint = tempfile.mkdtemp(dir=work)
        query = (
            frame.load()
            .select(*COLUMNS)
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        assert rows == total, f"the memory stream read {rows} of {total}"

    def parquet_batch() -> None:
        spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

    frame = spark.range(total).selectExpr(
        f"concat('key-', cast(id % {STREAMS} as string)) AS key",
        "cast(repeat('x', 100) AS binary) AS payload",
    )
    frame = frame.repartition(os.cpu_count() or 2).cache()
    frame.count()
    sinks = iter(range(1_000))

    def riverbed_sink() -> None:
        topic = f"sink-{next(sinks)}"
        with Log.open(url) as log:
            log.topics.create(topic, partitions=STREAMS)
        frame.write.format("riverbed").option("db", url).option("topic", topic).mode(
            "append"
        ).save()

    def parquet_sink() -> None:
        frame.write.mode("overwrite").parquet(str(work / "sink-parquet"))

    # Warm-up: JIT, Python workers, ADBC libraries.
    riverbed_stream()
    parquet_stream()
    memory_stream()
    riverbed_sink()
    parquet_sink()
    results: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        best(results, "riverbed stream", timed(riverbed_stream))
        best(results, "parquet stream", timed(parquet_stream))
        best(results, "parquet batch", timed(parquet_batch))
        best(results, "memory stream", timed(memory_stream))
        best(results, "riverbed sink", timed(riverbed_sink))
        best(results, "parquet sink", timed(parquet_sink))
    latencies = latency(spark, url, work, samples)
    report(results, latencies, total, backend)


def latency(spark: Any, url: str, work: Path, samples: int) -> list[float]:
    with Log.open(url) as log:
        log.topics.create("ping", partitions=1)
        log.topics.create("pong", partitions=1)
        subscriptions = Subscriptions(log.storage)
        subscriptions.create("ping-spark", "ping")
        subscriptions.create("pong-reader", "pong")
    query = (
        spark.readStream.format("riverbed")
        .option("db", url)
        .option("subscription", "ping-spark")
        .load()
        .select("key", "payload")
        .writeStream.format("riverbed")
        .option("db", url)
        .option("topic", "pong")
        .option("checkpointLocation", str(work / "latency-checkpoint"))
        .start()
    )
    out: list[float] = []
    try:
        with Log.open(url) as log:
            consumer = Subscriptions(log.storage).consumer("pong-reader")
            for i in range(samples + 2):
                started = time.perf_counter()
                log.produce("ping", [Message(str(i).encode(), key="k")])
                got: list[Any] = []
                while not got:
                    got = consumer.poll(10, timeout=10.0)
                    assert query.isActive, query.exception()
                elapsed = time.perf_counter() - started
                consumer.commit()
                assert got[0].message.payload == str(i).encode()
                if i >= 2:  # the first micro-batches warm up
                    out.append(elapsed)
                time.sleep(0.05)
    finally:
        query.stop()
    return out


def report(
    results: dict[str, list[float]], latencies: list[float], total: int, backend: str
) -> None:
    import pyarrow
    import pyspark

    rate = {name: total / min(times) for name, times in results.items()}
    print(f"# {total:,} messages of {len(PAYLOAD)} bytes, {STREAMS} streams, backend {backend}")
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__}"
    )
    print(f"{'case':<44}{'msg/s':>14}")
    for name in results:
        print(f"{name:<44}{rate[name]:>14,.0f}")
    print()
    print(f"{'ratio':<44}{'value':>14}{'target':>10}")
    ratios = [
        ("source: riverbed stream / parquet stream", "riverbed stream", "parquet stream", 0.8),
        ("source: riverbed stream / parquet batch", "riverbed stream", "parquet batch", 0.8),
        ("sink: riverbed / parquet write", "riverbed sink", "parquet sink", 0.5),
        ("ceiling: memory source / parquet stream", "memory stream", "parquet stream", None),
        ("source: riverbed stream / memory source", "riverbed stream", "memory stream", None),
    ]
    for label, a, b, target in ratios:
        value = rate[a] / rate[b]
        wanted = "(info)" if target is None else f">= {target}"
        print(f"{label:<44}{value:>14.2f}{wanted:>10}")
    ms = sorted(x * 1000 for x in latencies)
    print()
    print(
        f"one-message micro-batch, produce -> Spark -> sink -> consumer ({len(ms)} samples):"
        f" median {statistics.median(ms):.0f} ms, p90 {ms[int(len(ms) * 0.9) - 1]:.0f} ms,"
        f" max {ms[-1]:.0f} ms (target <= 500 ms)"
    )


if __name__ == "__main__":
    main()
