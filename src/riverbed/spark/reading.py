"""What a Spark task does to read: ranges of streams -> Arrow record batches.

Runs in Spark's Python workers. It opens its own storage (a worker keeps no
state between tasks), reads each range through ADBC where installed (on
PostgreSQL one streamed query per range, `read_arrow_batches`; on SQLite chunks
of `Storage.read_arrow`) and turns the columns into the source's schema without
a Python object per row. Deterministic for a range: a retried task or a
replayed batch yields the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from riverbed.spark.planning import Range, filter_regex

SCHEMA = (
    "topic string, generation int, partition int, offset long, id binary, mqtt_topic string,"
    " key string, payload binary, properties string, qos int, timestamp timestamp"
)
"""The DataFrame a read gives: one row per message. `id` is the 16 bytes of the
message id (`lower(hex(id))` is the form the CLI prints); `properties` is the
stored JSON `[[name, value], ...]` (a bytes value as `[name, "b", base64]`), null
when there are none; `timestamp` is when the log accepted the message."""

CHUNK = 65_536
"""Offsets per query where the storage reads a range in chunks (SQLite): bounds
a task's memory whatever its range (PostgreSQL streams, `postgres.BATCH_BYTES`)."""


def spark_arrow_schema() -> Any:
    """`SCHEMA` as the Arrow schema Spark checks record batches against."""
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("generation", pa.int32()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("id", pa.binary()),
            ("mqtt_topic", pa.string()),
            ("key", pa.string()),
            ("payload", pa.binary()),
            ("properties", pa.string()),
            ("qos", pa.int32()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


def read_ranges(
    db: str,
    items: Sequence[Range],
    topic_filter: str | None = None,
    key: str | None = None,
    since_us: int | None = None,
    until_us: int | None = None,
) -> Iterator[Any]:
    """Yield the messages of `items` as Arrow record batches of `SCHEMA`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from riverbed.storage import open_storage

    schema = spark_arrow_schema()
    pattern = None if topic_filter is None else filter_regex(topic_filter)
    no_dollar = topic_filter is not None and topic_filter[:1] in ("+", "#")
    storage = open_storage(db)
    try:
        for r in items:
            topic = pa.scalar(r.topic, pa.string())
            generation = pa.scalar(r.generation, pa.int32())
            partition = pa.scalar(r.partition, pa.int32())
            for batch in _stream_batches(storage, r, key, since_us, until_us):
                if pattern is not None and batch.num_rows:
                    names = batch.column("mqtt_topic")
                    mask = pc.match_substring_regex(names, pattern)
                    if no_dollar:  # [MQTT-4.7.2-1]
                        mask = pc.and_(mask, pc.invert(pc.starts_with(names, "$")))
                    batch = batch.filter(mask)
                n = batch.num_rows
                if n == 0:
                    continue
                columns = [
                    pa.repeat(topic, n),
                    pa.repeat(generation, n),
                    pa.repeat(partition, n),
                    batch.column("offset"),
                    batch.column("id"),
                    batch.column("mqtt_topic"),
                    batch.column("key"),
                    batch.column("payload"),
                    batch.column("properties").cast(pa.string()),
                    batch.column("qos"),
                    batch.column("timestamp_us").cast(pa.timestamp("us", tz="UTC")),
                ]
                yield pa.RecordBatch.from_arrays(columns, schema=schema)
    finally:
        storage.close()


def _stream_batches(
    storage: Any, r: Range, key: str | None, since_us: int | None, until_us: int | None
) -> Iterator[Any]:
    """One range's messages as record batches of `Storage.read_arrow`'s columns:
    streamed from one query where the storage can (PostgreSQL), else in chunks of
    `CHUNK` offsets."""
    from riverbed.storage.arrow import ArrowStreams

    if isinstance(storage, ArrowStreams):
        yield from storage.read_arrow_batches(
            r.stream_key, r.start, r.end, key=key, since_us=since_us, until_us=until_us
        )
        return
    for first in range(r.start, r.end, CHUNK):
        table = storage.read_arrow(
            r.stream_key,
            first,
            min(first + CHUNK, r.end),
            key=key,
            since_us=since_us,
            until_us=until_us,
        )
        yield from table.to_batches()
