"""The `riverbed` PySpark data source: batch and streaming reads, and the sink.

Shaped like PySpark's own data sources (STYLE.md): one factory with one method
per capability, options checked once (`options.py`), readers that workers get
pickled and that keep no state there, imports inside methods.

Streaming reads follow a named subscription. Spark's offsets are the streams'
next offsets (`planning.py`); the driver-side reader asks the database only for
the heads table (`latestOffset`, no scan) and the generations when streams
appear; the tasks read their ranges themselves (`reading.py`). `commit(end)`
moves the subscription's cursors so lag and retention see Spark's progress, but
nothing depends on it: Spark's checkpoint is the authority on where the query
is, and `commit` arrives one batch late or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from riverbed.spark.options import (
    ReadOptions,
    StreamOptions,
    read_options,
    stream_options,
    write_options,
)
from riverbed.spark.planning import Range, next_offsets, ranges, split
from riverbed.spark.reading import SCHEMA, read_ranges


class RangesPartition(InputPartition):
    """One Spark task's share of a read: ranges of streams."""

    def __init__(self, items: Sequence[Range]) -> None:
        super().__init__(tuple(items))
        self.items = tuple(items)


def _cores() -> int:
    return os.cpu_count() or 1


class RiverbedDataSource(DataSource):
    """`spark.read.format("riverbed")`, `readStream`, `write` and `writeStream`."""

    @classmethod
    def name(cls) -> str:
        return "riverbed"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> StreamReader:
        return StreamReader(stream_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from riverbed.spark.sink import BatchWriter, check_columns

        check_columns(schema)
        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from riverbed.spark.sink import StreamWriter, check_columns

        check_columns(schema)
        return StreamWriter(write_options(self.options), schema)


class BatchReader(DataSourceReader):
    """A batch read of one topic: every stream, optionally narrowed."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[RangesPartition]:
        from riverbed.storage import open_storage

        o = self.options
        storage = open_storage(o.db)
        try:
            heads = storage.list_streams(o.topic)
            if not heads:
                storage.get_topic(o.topic)  # raises TopicNotFound
            start: dict[str, int] = {}
            end: dict[str, int] = {}
            for head in heads:
                name = str(head.stream)
                first = max(o.starting.get(name, head.start_offset), head.start_offset)
                if o.since_us is not None:
                    # Everything before the first message at or after `since` is older.
                    first = max(first, storage.first_offset_at(head.key, o.since_us))
                start[name] = first
                end[name] = min(o.ending.get(name, head.next_offset), head.next_offset)
        finally:
            storage.close()
        groups = split(ranges(start, end, heads), o.partition_messages, _cores())
        return [RangesPartition(g) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        o = self.options
        # With no partitions planned, Spark still runs one task on a bare
        # InputPartition: it has nothing to read.
        items = getattr(partition, "items", ())
        return read_ranges(o.db, items, o.topic_filter, o.key, o.since_us, o.until_us)


class SubscriptionStreamReader(DataSourceStreamReader):
    """What the streaming readers of a subscription share: the options, and
    on the driver a storage connection of its own (workers get the options
    only: no connection, no driver-side state)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._storage: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def _open(self) -> Any:
        if self._storage is None:
            from riverbed.storage import open_storage

            self._storage = open_storage(self.options.db)
        return self._storage

    def stop(self) -> None:
        if self._storage is not None:
            self._storage.close()
            self._storage = None


class StreamReader(SubscriptionStreamReader, SupportsTriggerAvailableNow):
    """A streaming read of a named subscription (see the module docstring)."""

    def __init__(self, options: StreamOptions) -> None:
        super().__init__(options)
        self._target: dict[str, int] | None = None

    # --- driver side ------------------------------------------------------

    def _subscription(self) -> Any:
        from riverbed.subscriptions.named import Subscriptions

        subscriptions = Subscriptions(self._open())
        return subscriptions, subscriptions.get(self.options.subscription)

    def initialOffset(self) -> dict[str, int]:
        """Where the subscription's cursors are: a new query continues from there."""
        subscriptions, record = self._subscription()
        heads = self._open().list_streams(record.topic)
        positions = subscriptions.positions(record, heads)
        return {str(h.stream): positions[h.key] for h in heads}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the heads as they are now, no further."""
        _, record = self._subscription()
        self._target = {
            str(h.stream): h.next_offset for h in self._open().list_streams(record.topic)
        }

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        storage = self._open()
        subscriptions, record = self._subscription()
        heads = storage.list_streams(record.topic)
        new = [h for h in heads if str(h.stream) not in start]
        initial = subscriptions.positions(record, new) if new else {}
        max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return next_offsets(
            start,
            heads,
            storage.list_storage_topics(record.topic),
            initial,
            self.options.ordering,
            max_messages,
            self._target,
        )

    def reportLatestOffset(self) -> dict[str, int] | None:
        _, record = self._subscription()
        return {str(h.stream): h.next_offset for h in self._open().list_streams(record.topic)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[RangesPartition]:
        # Straight from the offset log on a replayed batch: the same ranges again.
        _, record = self._subscription()
        heads = self._open().list_streams(record.topic)
        groups = split(ranges(start, end, heads), self.options.partition_messages, _cores())
        return [FilteredPartition(g, record.filter) for g in groups]

    def commit(self, end: dict[str, int]) -> None:
        """Spark has processed everything below `end`: move the subscription's
        cursors there (forward only), so that lag and retention see it."""
        storage = self._open()
        _, record = self._subscription()
        keys = {str(h.stream): h.key for h in storage.list_streams(record.topic)}
        storage.commit_cursors(
            record.name, {keys[name]: offset for name, offset in end.items() if name in keys}
        )

    # --- worker side ------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        items = getattr(partition, "items", ())
        return read_ranges(self.options.db, items, getattr(partition, "topic_filter", None))


class FilteredPartition(RangesPartition):
    """A streaming task's ranges with the subscription's MQTT filter."""

    def __init__(self, items: Sequence[Range], topic_filter: str | None) -> None:
        super().__init__(items)
        self.topic_filter = topic_filter
