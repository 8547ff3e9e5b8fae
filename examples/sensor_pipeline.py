"""Example pipeline: sensor readings -> Spark per-device, per-minute aggregates -> a topic.

1. Topics `sensors` (binding `sensors/#`) and `sensor-minutes`, a subscription
   `spark-sensors` that the Spark query reads and `dashboard` that a consumer
   reads.
2. Readings are published with `riverbed produce` (JSON lines on stdin), one
   message per reading, keyed by device: `{"device", "ts", "temperature"}`.
3. A Spark Structured Streaming query reads the subscription, averages each
   device's temperature per minute of event time and writes each complete
   minute back to `sensor-minutes` through the riverbed sink (exactly once:
   a replayed micro-batch writes nothing twice). The last minute is still
   open when the readings stop, so it is not written.
4. `riverbed consume dashboard` prints what the consumer receives.

    .venv/bin/python examples/sensor_pipeline.py [--db URL] [--readings N]
        [--master spark://HOST:7077 [--conf NAME=VALUE ...] | --remote sc://HOST:15002]

Without --db it works in a fresh SQLite database in a temporary directory.
With --db it can run again on the same database: it reuses the topics and
subscriptions, publishes the readings again and prints what the consumer
receives this time.
Runs Spark in this process (`local[*]`, a JVM is needed), on a standalone
cluster (`--master`: the database must be PostgreSQL, which every machine of
the cluster reaches; `--conf` passes Spark settings such as
`spark.executor.memory`) or through a Spark Connect server (`--remote`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from riverbed import InvalidInput, Log, Subscriptions
from riverbed.spark import session
from riverbed.spark.options import check_shared_storage

DEVICES = ("boiler", "fridge", "porch")
PARTITIONS = 4
"""Of `sensors`, and of the aggregation's state (Spark's shuffle partitions)."""
START = 1_767_225_600  # 2026-01-01T00:00:00Z, in seconds


def riverbed(db: str, *args: str, stdin: str | None = None) -> str:
    """Run the `riverbed` CLI of this interpreter's environment."""
    command = [str(Path(sys.executable).with_name("riverbed")), "--db", db, *args]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True)
    return done.stdout


def readings(count: int) -> list[dict[str, Any]]:
    """`count` readings spread over the devices, one every 5 s of event time."""
    out = []
    for i in range(count):
        device = DEVICES[i % len(DEVICES)]
        temperature = 20.0 + (i % 7) + DEVICES.index(device) * 10
        out.append({"device": device, "ts": START + 5 * i, "temperature": temperature})
    return out


def setup(db: str) -> None:
    """Create the topics and subscriptions, or reuse them on a second run
    (`exist_ok`: an error only if one exists with other settings)."""
    with Log.open(db) as log:
        log.topics.create("sensors", partitions=PARTITIONS, binding="sensors/#", exist_ok=True)
        log.topics.create("sensor-minutes", partitions=2, exist_ok=True)
        subscriptions = Subscriptions(log.storage)
        subscriptions.create("spark-sensors", "sensors", exist_ok=True)
        subscriptions.create("dashboard", "sensor-minutes", exist_ok=True)


def publish(db: str, count: int) -> None:
    lines = [
        json.dumps(
            {"key": r["device"], "mqtt_topic": f"sensors/{r['device']}", "payload": json.dumps(r)}
        )
        for r in readings(count)
    ]
    riverbed(db, "produce", "sensors", stdin="\n".join(lines) + "\n")


def aggregate(spark: Any, db: str, checkpoint: str) -> None:
    """The Spark query: subscription -> per device and minute -> `sensor-minutes`."""
    from pyspark.sql import functions as F

    reading = "device string, ts long, temperature double"
    frame = (
        spark.readStream.format("riverbed")
        .option("db", db)
        .option("subscription", "spark-sensors")
        .load()
        .select(F.from_json(F.col("payload").cast("string"), reading).alias("r"))
        .select("r.device", F.timestamp_seconds("r.ts").alias("at"), "r.temperature")
        # A minute is written once it is complete: when a reading past its end
        # has been seen (the sink appends, so each result is final).
        .withWatermark("at", "0 seconds")
        .groupBy("device", F.window("at", "1 minute").alias("minute"))
        .agg(
            F.count("*").alias("readings"),
            F.round(F.avg("temperature"), 2).alias("avg_temperature"),
            F.max("temperature").alias("max_temperature"),
        )
        .select(
            F.col("device").alias("key"),
            F.to_json(
                F.struct(
                    "device",
                    F.date_format("minute.start", "yyyy-MM-dd'T'HH:mm'Z'").alias("minute"),
                    "readings",
                    "avg_temperature",
                    "max_temperature",
                )
            ).alias("payload"),
        )
    )
    query = (
        frame.writeStream.format("riverbed")
        .option("db", db)
        .option("topic", "sensor-minutes")
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def run(
    db: str,
    count: int,
    work: Path,
    master: str | None = None,
    remote: str | None = None,
    conf: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The whole pipeline; returns the aggregates the consumer received."""
    check_shared_storage(db, master)  # a SQLite file on a cluster: refused before any write
    setup(db)
    publish(db, count)
    # The aggregation's state is split as `sensors` is, not into the 200 shuffle
    # partitions a cluster or Spark Connect server defaults to: for three devices
    # those are 200 state stores written at every micro-batch (a run on a
    # two-executor cluster took twice as long). --conf spark.sql.shuffle.partitions
    # chooses another count; a checkpoint keeps the count it started with.
    settings = {"spark.sql.shuffle.partitions": str(PARTITIONS), **(conf or {})}
    spark = session(master, remote=remote, config=settings)
    aggregate(spark, db, str(work / "checkpoint"))
    lines = riverbed(db, "consume", "dashboard").splitlines()
    return [json.loads(json.loads(line)["payload"]) for line in lines if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", help="database URL (default: a new SQLite file)")
    parser.add_argument("--readings", type=int, default=90)
    parser.add_argument("--master", help="Spark master URL (default: local[*])")
    parser.add_argument("--remote", help="Spark Connect URL, sc://HOST:PORT")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="NAME=VALUE", help="a Spark setting"
    )
    args = parser.parse_args()
    conf = dict(pair.split("=", 1) for pair in args.conf)
    with tempfile.TemporaryDirectory(prefix="riverbed-example-") as tmp:
        work = Path(tmp)
        db = args.db or f"sqlite:///{work}/example.db"
        try:
            rows = run(db, args.readings, work, args.master, args.remote, conf)
        except InvalidInput as exc:
            sys.exit(f"error: {exc}")
        for row in rows:
            print(
                f"{row['minute']}  {row['device']:<8} {row['readings']:>3} readings"
                f"  avg {row['avg_temperature']:6.2f}  max {row['max_temperature']:6.2f}"
            )


if __name__ == "__main__":
    main()
