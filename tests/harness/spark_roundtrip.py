"""A Spark driver for tests of the `riverbed` source and sink beyond this
process, run as a script (a process holds one SparkContext, and the test
session's local one is taken):

    python tests/harness/spark_roundtrip.py DB (--master URL | --remote URL) [--conf N=V ...]

It batch-reads topic `orders`, writes every row's key and payload to topic
`copies` through the sink, and prints one JSON line: rows read, and where the
tasks imported Riverbed from (`riverbed.__file__` in each task).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any


def where_riverbed(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    import riverbed

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"path": [riverbed.__file__] * batch.num_rows})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--master")
    parser.add_argument("--remote")
    parser.add_argument("--conf", action="append", default=[])
    args = parser.parse_args()
    from riverbed.spark import session

    # Its `distinct` shuffles 8 rows: 4 partitions, not a cluster's default 200.
    conf = {"spark.sql.shuffle.partitions": "4", **dict(p.split("=", 1) for p in args.conf)}
    spark = session(args.master, remote=args.remote, config=conf)
    frame = spark.read.format("riverbed").option("db", args.db).option("topic", "orders").load()
    read = frame.count()
    frame.select("key", "payload").repartition(3).write.format("riverbed").option(
        "db", args.db
    ).option("topic", "copies").mode("append").save()
    paths = spark.range(0, 8, 1, 4).mapInArrow(where_riverbed, "path string").distinct()
    print(json.dumps({"read": read, "paths": sorted(r["path"] for r in paths.collect())}))
    spark.stop()


if __name__ == "__main__":
    main()
