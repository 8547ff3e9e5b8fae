"""Spark benchmark: the `riverbed` source and sink beside Spark's own Parquet.

1,000,000 messages of 100 bytes (8 streams), in one run, on one backend:

- source: a streaming query reading a subscription with Trigger.AvailableNow into
  the `noop` sink, against Spark reading the same rows (the same columns) from a
  Parquet directory, as a streaming query (AvailableNow, noop) and as a batch read;
- sink: a cached DataFrame of (key, payload) written to a topic with
  `df.write.format("riverbed")`, as it comes (every task writes every stream)
  and planned by stream (`riverbed.spark.by_stream`: one stream, one task; and
  one task per core, each writing streams no other task writes),
  against a raw bulk load of the same rows with the same driver outside Spark
  (PostgreSQL: one ADBC transaction, `adbc_ingest` into `messages`; SQLite: the
  storage's own bulk load, ADBC staging and one copy) and, for context, the same
  DataFrame written as Parquet;
- latency: a running streaming query (subscription -> riverbed sink, default
  trigger) and a consumer of the sink's topic; one message produced at a time,
  the time until the consumer has it, end to end;
- the ceiling of any Python source here: a Python data source that makes the
  same rows (riverbed's schema) in memory, without a database, read by the same
  streaming query.

Three rounds of each throughput case, alternating; the best round counts.
Prints throughputs, the ratios against the ceiling and the raw load (the
targets) and against Parquet (context).

`--master local` (default) runs `local[*]`; `--master cluster` starts a
standalone cluster from pyspark's distribution on loopback (a master and
`--workers` workers of one core each, `tests/harness/spark_cluster.py`) and,
with two workers, measures the source and the sink again with one executor
(`spark.cores.max=1`) and prints the two against each other; `--master
spark://HOST:PORT` uses a running cluster.

    .venv/bin/python bench/spark.py [--messages N] [--backend sqlite|postgres]
        [--master local|cluster|spark://HOST:PORT] [--workers N]
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

from riverbed import Log, Message, Subscriptions  # noqa: E402
from riverbed.log.partitioning import key_hash, route  # noqa: E402
from riverbed.spark import by_stream, session  # noqa: E402
from riverbed.spark.options import DEFAULT_PARTITION_MESSAGES  # noqa: E402
from riverbed.spark.planning import Range, split  # noqa: E402
from riverbed.storage.base import StartKind  # noqa: E402

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
    parser.add_argument("--master", default="local", help="local, cluster or spark://HOST:PORT")
    parser.add_argument("--workers", type=int, default=2, help="workers of --master cluster")
    parser.add_argument("--latency-samples", type=int, default=20)
    args = parser.parse_args()
    if args.master != "local" and args.backend == "sqlite":
        parser.error("a cluster needs --backend postgres (a SQLite file cannot be shared)")
    work = Path(tempfile.mkdtemp(prefix="riverbed-bench-spark-"))
    server = None
    cluster = None
    try:
        if args.backend == "postgres":
            from harness.postgres import PostgresServer

            server = PostgresServer()
            server.start()
            url = server.new_database("bench")
        else:
            url = f"sqlite:///{work}/bench.db"
        master = None
        if args.master == "cluster":
            from harness.spark_cluster import SparkCluster

            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            cluster = SparkCluster(workers=args.workers, memory=EXECUTOR_MEMORY).start()
            master = cluster.master_url
        elif args.master != "local":
            master = args.master
        run(url, args.messages, work, args.latency_samples, args.backend, master, args.workers)
    finally:
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


EXECUTOR_MEMORY = "1g"
"""Per worker of `--master cluster`: room for the cached DataFrames."""


def start_spark(master: str | None, cores_max: int | None = None) -> Any:
    if master is None:
        spark = session()
    else:
        config = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
            "spark.sql.shuffle.partitions": "4",
        }
        if cores_max is not None:
            config["spark.cores.max"] = str(cores_max)
        spark = session(master, config=config)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemorySource)
    return spark


def sink_rows(n: int) -> Any:
    """The rows the sink's tasks hand the appender (`sink.message_columns`)."""
    import pyarrow as pa

    keys = pa.array([f"key-{i}" for i in range(STREAMS)] * (n // STREAMS), pa.string())
    m = len(keys)
    return pa.table(
        {
            "mqtt_topic": pa.repeat(pa.scalar("", pa.string()), m),
            "key": keys,
            "payload": pa.repeat(pa.scalar(PAYLOAD, pa.binary()), m),
            "properties": pa.nulls(m, pa.binary()),
            "qos": pa.repeat(pa.scalar(0, pa.int16()), m),
            "retain": pa.repeat(pa.scalar(0, pa.int16()), m),
        }
    )


def raw_loader(url: str, backend: str, n: int) -> Callable[[], None]:
    """A raw bulk load of the sink's rows into a new topic, outside Spark.

    The rows are routed, stamped and grouped by stream once, beforehand (what
    the appender hands the storage); the timed part is the database's work:
    PostgreSQL, one ADBC transaction moving the heads and `adbc_ingest`ing the
    rows into `messages` (binary COPY); SQLite, `append_arrow_once` (ADBC
    staging file, then one `INSERT ... SELECT` per stream under the write lock).
    """
    from riverbed.storage import bulk

    loads = iter(range(1_000))
    table = sink_rows(n)

    def load() -> None:
        topic = f"raw-{next(loads)}"
        captured: dict[str, Any] = {}
        with Log.open(url) as log:
            log.topics.create(topic, partitions=STREAMS)
            real = log.storage.append_arrow_once

            def capture(marker: str, streams: Any, rows: Any) -> dict[int, int]:
                captured.update(streams=streams, rows=rows)
                return {}

            log.storage.append_arrow_once = capture  # type: ignore[method-assign]
            log.appender.append_arrow_once(topic, table, "capture")
            streams, rows = captured["streams"], captured["rows"]
            if backend == "sqlite":
                started = time.perf_counter()
                real(f"raw/{topic}", streams, rows)
                spent.append(time.perf_counter() - started)
                return
        import adbc_driver_postgresql.dbapi

        conn = adbc_driver_postgresql.dbapi.connect(url, autocommit=False)
        try:
            started = time.perf_counter()
            with conn.cursor() as cur:
                for key, count in sorted(streams):
                    cur.execute(
                        "UPDATE streams SET next_offset = next_offset + $1 WHERE id = $2",
                        (count, key),
                    )
                firsts = {key: 0 for key, _ in streams}
                cur.adbc_ingest("messages", bulk.message_table(streams, firsts, rows), "append")
            conn.commit()
            spent.append(time.perf_counter() - started)
        finally:
            conn.close()

    spent: list[float] = []
    load.spent = spent  # type: ignore[attr-defined]
    return load


def run(
    url: str,
    n: int,
    work: Path,
    samples: int,
    backend: str,
    master: str | None,
    workers: int,
) -> None:
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

    spark = start_spark(master)
    parquet = str(work / "parquet")
    source = spark.read.format("riverbed").option("db", url).option("topic", "bench").load()
    source.select(*COLUMNS).write.parquet(parquet)
    results = measure(spark, url, work, total, backend, parquet, with_parquet=True)
    latencies = latency(spark, url, work, samples)
    raw = raw_loader(url, backend, total)
    raw()  # warm-up
    for _ in range(ROUNDS):
        raw()
    results["raw bulk load"] = raw.spent[1:]  # type: ignore[attr-defined]
    one_worker: dict[str, list[float]] | None = None
    if master is not None and workers == 2:
        spark.stop()
        spark = start_spark(master, cores_max=1)
        one_worker = measure(spark, url, work, total, backend, parquet, with_parquet=False)
    spark.stop()
    report(results, latencies, total, backend, master, one_worker)


def measure(
    spark: Any,
    url: str,
    work: Path,
    total: int,
    backend: str,
    parquet: str,
    *,
    with_parquet: bool,
) -> dict[str, list[float]]:
    """Best-of-ROUNDS timings of every Spark case, after a warm-up round."""
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

    # As many Spark partitions as the riverbed source plans for the same streams.
    streams = [Range(0, "bench", 0, p, 0, total // STREAMS) for p in range(STREAMS)]
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
    with Log.open(url) as log:
        log.topics.create(f"sink-plan-{id(frame)}", partitions=STREAMS)
    planned = by_stream(frame, f"sink-plan-{id(frame)}", url).cache()
    planned.count()
    # The same plan in one partition per core: each task writes several
    # streams, still disjoint from the other tasks', with fewer tasks to start.
    per_core = by_stream(frame, f"sink-plan-{id(frame)}", url, os.cpu_count() or 2).cache()
    per_core.count()

    def sink(data: Any) -> Callable[[], None]:
        def write() -> None:
            topic = f"sink-{id(data)}-{next(sinks)}"
            with Log.open(url) as log:
                log.topics.create(topic, partitions=STREAMS)
            data.write.format("riverbed").option("db", url).option("topic", topic).mode(
                "append"
            ).save()

        return write

    def parquet_sink() -> None:
        frame.write.mode("overwrite").parquet(str(work / "sink-parquet"))

    cases: list[tuple[str, Callable[[], None]]] = [
        ("riverbed stream", riverbed_stream),
        ("memory stream", memory_stream),
        ("riverbed sink", sink(frame)),
        ("riverbed sink by stream", sink(planned)),
        ("riverbed sink by stream, per core", sink(per_core)),
    ]
    if with_parquet:
        cases += [
            ("parquet stream", parquet_stream),
            ("parquet batch", parquet_batch),
            ("parquet sink", parquet_sink),
        ]
    for _, case in cases:  # warm-up: JIT, Python workers, ADBC libraries
        case()
    results: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, case in cases:
            best(results, name, timed(case))
    frame.unpersist()
    planned.unpersist()
    per_core.unpersist()
    return results


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
    results: dict[str, list[float]],
    latencies: list[float],
    total: int,
    backend: str,
    master: str | None,
    one_worker: dict[str, list[float]] | None,
) -> None:
    import pyarrow
    import pyspark

    rate = {name: total / min(times) for name, times in results.items()}
    print(
        f"# {total:,} messages of {len(PAYLOAD)} bytes, {STREAMS} streams, backend {backend},"
        f" master {master or 'local[*]'}"
    )
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__},"
        f" load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"{'case':<44}{'msg/s':>14}")
    for name in results:
        print(f"{name:<44}{rate[name]:>14,.0f}")
    print()
    print(f"{'ratio':<44}{'value':>14}{'target':>10}")
    ratios = [
        ("source: riverbed stream / memory source", "riverbed stream", "memory stream", 0.9),
        ("sink by stream / raw bulk load", "riverbed sink by stream", "raw bulk load", 0.8),
        (
            "sink by stream, per core / raw bulk load",
            "riverbed sink by stream, per core",
            "raw bulk load",
            0.8,
        ),
        ("sink as it comes / raw bulk load", "riverbed sink", "raw bulk load", None),
        ("source: riverbed stream / parquet stream", "riverbed stream", "parquet stream", None),
        ("source: riverbed stream / parquet batch", "riverbed stream", "parquet batch", None),
        ("ceiling: memory source / parquet stream", "memory stream", "parquet stream", None),
        ("sink by stream / parquet write", "riverbed sink by stream", "parquet sink", None),
    ]
    for label, a, b, target in ratios:
        value = rate[a] / rate[b]
        wanted = "(info)" if target is None else f">= {target}"
        print(f"{label:<44}{value:>14.2f}{wanted:>10}")
    if one_worker is not None:
        print()
        print(f"{'two workers against one':<44}{'2 workers':>14}{'1 worker':>14}{'2 / 1':>8}")
        for name, times in one_worker.items():
            one = total / min(times)
            print(f"{name:<44}{rate[name]:>14,.0f}{one:>14,.0f}{rate[name] / one:>8.2f}")
    ms = sorted(x * 1000 for x in latencies)
    print()
    print(
        f"one-message micro-batch, produce -> Spark -> sink -> consumer ({len(ms)} samples):"
        f" median {statistics.median(ms):.0f} ms, p90 {ms[int(len(ms) * 0.9) - 1]:.0f} ms,"
        f" max {ms[-1]:.0f} ms (target <= 500 ms)"
    )


if __name__ == "__main__":
    main()
