"""Planning a DataFrame's partitions for the `riverbed` sink: one stream, one task.

A sink task holds the heads of the streams it writes from its reservation to its
commit (`sink.py`), so two tasks that write one stream commit one after the
other. On PostgreSQL, tasks that write disjoint streams load their rows side by
side; `by_stream` repartitions a DataFrame so that they do, with the router's
formula written as a Spark expression (no Python per row, Spark Connect too).
"""

from __future__ import annotations

from typing import Any

from riverbed.errors import InvalidInput


def stream_index(partitions: int, k: int) -> Any:
    """A Spark column: the index (0 to `partitions` - 1) of the stream that the
    sink appends a row to in a storage topic of `partitions` streams refining K =
    `k`, computed as the router does (seed 003 Produce: `route` of the CRC-32 of
    the UTF-8 key); null for a row without a key (the sink spreads those)."""
    from pyspark.sql import functions as F

    h = "crc32(cast(key AS binary))"
    return F.expr(f"pmod({k} * {h}, {partitions}) + pmod({h} div {partitions}, {k})")


def by_stream(frame: Any, topic: str, db: str | None = None, partitions: int | None = None) -> Any:
    """`frame` (a DataFrame for the `riverbed` sink) with its partitions planned
    by stream: the rows that go to one stream of `topic` are all in one Spark
    partition, so no two sink tasks contend for a stream's head and their bulk
    loads run side by side (PostgreSQL; SQLite has one writer anyway).

    A range repartitioning on `stream_index` into `partitions` Spark partitions
    (default: the streams of the topic's produce generation). Which partition a
    row lands in depends on its key only, so a recomputed partition holds the
    same rows and the sink's markers stay exact. Rows without a key all land in
    the first partition, and the sink spreads them over every stream as usual:
    only keyed rows are kept apart. DataFrame operations only (Spark Connect
    too). The layout is read now: plan again after a scale-up.
    """
    from riverbed.storage import open_storage

    if partitions is not None and partitions < 1:
        raise InvalidInput(f"by_stream needs at least 1 partition; got {partitions}")
    storage = open_storage(db)  # None: the default database
    try:
        record = storage.get_topic(topic)
        generation = storage.list_storage_topics(topic)[record.produce_pointer]
    finally:
        storage.close()
    column = stream_index(generation.partitions, generation.k)
    return frame.repartitionByRange(partitions or generation.partitions, column)
