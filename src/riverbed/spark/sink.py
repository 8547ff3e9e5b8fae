"""The `riverbed` sink: DataFrame rows become messages of a topic, exactly once.

Each Spark task routes its rows through the topic's router (seed 003 Produce,
by key) and appends them in one transaction that also records a marker naming
the write and the task's partition (`Appender.append_arrow_once`). A retried
task, a speculative copy or a replayed micro-batch finds the marker and writes
nothing (DESIGN.md, Spark). The rows stay Arrow columns all the way: ids,
hashes and routes are computed column-wise and the storage loads the columns in
bulk (ADBC; `storage/bulk.py`), about 2.3x the tuple-per-row path on SQLite
(docs/benchmarks.md, Spark). Markers:

- streaming: `spark/<query id>/<batch id>/<partition>`: Spark keeps the query id
  in the checkpoint, so a restarted query replaying a batch uses the same one;
- batch: `spark-write/<random id of this write>/<partition>` (task retries).

Input columns: `payload` (binary or string, required), `key` (string; null
spreads), `mqtt_topic` (string; must match the topic's binding), `properties`
(string: the JSON the source reads, `[[name, value], ...]`), `qos` (int 0-2).
Other columns are refused, so a misspelt one is not silently dropped. The
writer's commit wakes the broker's subscribers like any append (the storage's
cross-process wake-up).

A task holds the heads of the streams it writes from its reservation to its
commit (offsets stay dense and committed in order). Two tasks that write the
same stream therefore commit one after the other; on PostgreSQL, where tasks
load in parallel otherwise, `by_stream` plans the DataFrame's partitions so that
no two tasks share a stream (`distribution.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from riverbed.errors import InvalidInput
from riverbed.spark.options import WriteOptions

COLUMNS = {
    "payload": (BinaryType, StringType),
    "key": (StringType,),
    "mqtt_topic": (StringType,),
    "properties": (StringType,),
    "qos": (IntegerType,),
}

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Local properties Spark sets on a micro-batch's tasks (StreamExecution,
MicroBatchExecution): what makes a streaming marker."""


def check_columns(schema: StructType) -> None:
    """Refuse a DataFrame the sink cannot write, before any task runs."""
    names = [f.name for f in schema.fields]
    if "payload" not in names:
        raise InvalidInput(f"the riverbed sink needs a 'payload' column; got {names}")
    for field in schema.fields:
        allowed = COLUMNS.get(field.name)
        if allowed is None:
            raise InvalidInput(
                f"the riverbed sink does not know column {field.name!r}; it writes"
                f" {sorted(COLUMNS)} (select or rename columns first)"
            )
        if not isinstance(field.dataType, allowed):
            kinds = " or ".join(t.typeName() for t in allowed)
            raise InvalidInput(
                f"column {field.name!r} is {field.dataType.typeName()}; the riverbed sink"
                f" wants {kinds}"
            )


@dataclass(frozen=True, slots=True)
class Written(WriterCommitMessage):
    """What one task wrote: its marker and how many messages (0 if it found its
    marker: written before)."""

    marker: str
    messages: int
    duplicate: bool


def _task() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - Spark always runs writers in a task
        raise RuntimeError("the riverbed sink runs inside a Spark task")
    return context


def write_batches(options: WriteOptions, marker: str, batches: Iterator[Any]) -> Written:
    """Append one task's record batches to the topic under `marker`."""
    from riverbed.log.log import Log
    from riverbed.storage import open_storage

    log = Log(open_storage(options.db))
    try:
        table = message_columns(log, options.topic, batches)
        firsts = log.appender.append_arrow_once(options.topic, table, marker)
        return Written(marker, table.num_rows if firsts is not None else 0, firsts is None)
    finally:
        log.close()


def message_columns(log: Any, topic: str, batches: Iterator[Any]) -> Any:
    """A task's record batches -> the columns `Appender.append_arrow_once` takes,
    checked, without a Python object per row (a conversion per distinct
    `mqtt_topic` and `properties` value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from riverbed.model import Message

    fields = [("mqtt_topic", pa.string()), ("key", pa.string()), ("payload", pa.binary())]
    fields += [("properties", pa.binary()), ("qos", pa.int16()), ("retain", pa.int16())]
    schema = pa.schema(fields)
    received = [b for b in batches if b.num_rows]
    if not received:
        return schema.empty_table()
    given = pa.Table.from_batches(received)
    n = given.num_rows
    names = given.schema.names

    def column(name: str) -> Any:
        return given.column(name).combine_chunks()

    payload = column("payload")
    if payload.null_count:
        raise InvalidInput("the riverbed sink cannot write a null payload")
    key = column("key") if "key" in names else pa.nulls(n, pa.string())
    if "mqtt_topic" in names:
        topics = column("mqtt_topic")
        fresh = [t for t in pc.unique(topics).to_pylist() if t]
        log.check(topic, *(Message(b"", mqtt_topic=t) for t in fresh))
        topics = topics.fill_null("")
    else:
        topics = pa.repeat(pa.scalar("", pa.string()), n)
    if "properties" in names:
        properties = _encoded_properties(column("properties"))
    else:
        properties = pa.nulls(n, pa.binary())
    if "qos" in names:
        qos = column("qos").fill_null(0)
        low, high = pc.min_max(qos).values()
        if low.as_py() < 0 or high.as_py() > 2:
            raise InvalidInput("the riverbed sink's qos column holds values outside 0-2")
    else:
        qos = pa.repeat(pa.scalar(0, pa.int16()), n)
    retain = pa.repeat(pa.scalar(0, pa.int16()), n)
    columns = [topics, key, payload, properties, qos, retain]
    return pa.Table.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def _encoded_properties(texts: Any) -> Any:
    """The `properties` column (JSON text) as stored: `encode_properties` of each
    distinct text once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from riverbed.model import decode_properties, encode_properties

    encoded = pc.dictionary_encode(texts)
    blobs: list[bytes | None] = []
    for text in encoded.dictionary.to_pylist():
        try:
            blobs.append(encode_properties(decode_properties(text.encode())))
        except (ValueError, TypeError, IndexError) as exc:
            raise InvalidInput(f"properties {text!r} are not [[name, value], ...]: {exc}") from None
    return pc.take(pa.array(blobs, pa.binary()), encoded.indices)


class BatchWriter(DataSourceArrowWriter):
    """`df.write.format("riverbed")`: one transaction per task."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex
        """Made on the driver once per write; every task and retry shares it."""

    def write(self, iterator: Iterator[Any]) -> Written:
        marker = f"spark-write/{self.write_id}/{_task().partitionId()}"
        return write_batches(self.options, marker, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("riverbed")`: one transaction per task, idempotent
    per (query, micro-batch, partition)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        context = _task()
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:  # pragma: no cover - set by every micro-batch
            raise RuntimeError("the riverbed sink found no streaming query or batch id")
        marker = f"spark/{query}/{batch}/{context.partitionId()}"
        return write_batches(self.options, marker, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task committed its own transaction: nothing is left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A failed task's transaction rolled back; a finished one stays, and a
        replay of the batch skips it by its marker."""
