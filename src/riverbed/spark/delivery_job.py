"""A delivering subscription's pipeline on Spark Structured Streaming:
what `riverbed subscription run NAME` starts.

The `riverbed-delivery` source reads the subscription the way the `riverbed`
streaming source does (Spark offsets are the main topic's streams' next
offsets, lineage order, admission control by `maxMessagesPerTrigger`), but
plans **one Spark partition per shard** and hands each task its shard's work
rather than the messages: one row `(shard, ranges, tick)` with the shard's
ranges of the batch. The query is DataFrame operations only, so it runs the
same in this process, on a cluster and through Spark Connect:
`mapInArrow(deliver_batches(...))` is every shard's task, which reads its
messages and its due retry-queue rows from the log, delivers them with httpx
(`subscriptions/batch.py`), commits queue rows, GroupState and progress in
one transaction, marked with (run, batch id, shard), and yields its step
stats; `observe` sums them per batch into the query's progress (where the
driver reads the run's totals), and the `noop` sink runs it.

Stopping after the batch in hand: the job writes its run id in the KV entry
`delivery.stop/NAME`; the source's planning finds it there and plans no more
batches, and the job waits until the trigger in hand is over before it stops
the query. A Spark task that fails (a worker lost) runs again: the batch's
marker makes a shard's commit happen once.

The offsets carry one more entry, `~retry`, a counter the driver moves on when
some shard has a retry-queue row due, or when the cursors are behind Spark's
offsets (a rewind, a batch that did not commit): so a batch runs for them
even when the main topic is quiet.

Progress lives in Riverbed (the subscription's cursors and the shards'
state), not in Spark's checkpoint: each run starts a query on a fresh
checkpoint from the cursors, so a restarted job, an offset reset or a new
shard count need nothing from an old checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from riverbed.errors import DeliveryFailed, RiverbedError
from riverbed.spark.options import StreamOptions, check_shared_storage, stream_options
from riverbed.spark.planning import next_offsets
from riverbed.spark.source import SubscriptionStreamReader
from riverbed.subscriptions.step import StepStats

logger = logging.getLogger(__name__)

TICK = "~retry"
WORK_SCHEMA = "shard INT, shards INT, ranges STRING, tick LONG"

STOP_NAMESPACE = "delivery.stop"
"""KV: subscription name -> the run id of the job stopping (no more batches)."""

OBSERVED = "riverbed_delivery"
"""The name of the batch's summed step stats in the query's progress."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark sets on a micro-batch's tasks (MicroBatchExecution)."""


class ShardPartition(InputPartition):
    """One shard's work in one batch."""

    def __init__(self, shard: int, shards: int, ranges_json: str, tick: int) -> None:
        super().__init__((shard, shards, ranges_json, tick))
        self.shard = shard
        self.shards = shards
        """The shard count the batch was planned with."""
        self.ranges_json = ranges_json
        self.tick = tick


class DeliveryDataSource(DataSource):
    """`spark.readStream.format("riverbed-delivery")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "riverbed-delivery"

    def schema(self) -> str:
        return WORK_SCHEMA

    def streamReader(self, schema: StructType) -> DeliveryStreamReader:
        options = {k: v for k, v in self.options.items() if k.lower() != "run"}
        return DeliveryStreamReader(stream_options(options), self.options.get("run", ""))


class DeliveryStreamReader(SubscriptionStreamReader):
    """The work of each shard per batch (see the module docstring)."""

    def __init__(self, options: StreamOptions, run_id: str = "") -> None:
        super().__init__(options)
        self.run_id = run_id

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "run_id": self.run_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"], state.get("run_id", ""))  # type: ignore[misc]

    def _stopping(self) -> bool:
        """Whether the job that started this query is stopping (see the module
        docstring)."""
        entry = self._open().kv_get(STOP_NAMESPACE, self.options.subscription)
        return bool(self.run_id) and entry is not None and entry.value == self.run_id.encode()

    @property
    def _planning(self) -> str:
        """What a warning about an unreachable store names."""
        return f"planning the delivery of {self.options.subscription!r}"

    def _context(self) -> tuple[Any, Any, Any]:
        from riverbed.subscriptions.definition import Definitions
        from riverbed.subscriptions.named import Subscriptions

        storage = self._open()
        subscriptions = Subscriptions(storage)
        record = subscriptions.get(self.options.subscription)
        return subscriptions, record, Definitions(storage).require(record.name)

    def initialOffset(self) -> dict[str, int]:
        from riverbed.storage.outage import ride_out

        return ride_out(
            lambda: self._initial_offset(),
            f"planning the delivery of {self.options.subscription!r}",
        )

    def _initial_offset(self) -> dict[str, int]:
        subscriptions, record, _ = self._context()
        heads = self._open().list_streams(record.topic)
        positions = subscriptions.positions(record, heads)
        return {**{str(h.stream): positions[h.key] for h in heads}, TICK: 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        if self.options.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        from riverbed.storage.outage import ride_out

        return ride_out(
            lambda: self._latest_offset(start, limit),
            f"planning the delivery of {self.options.subscription!r}",
        )

    def _latest_offset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        from riverbed.subscriptions.pipeline import retry_due

        if self._stopping():
            return start  # no new batch
        storage = self._open()
        subscriptions, record, definition = self._context()
        heads = storage.list_streams(record.topic)
        main = {k: v for k, v in start.items() if k != TICK}
        new = [h for h in heads if str(h.stream) not in main]
        initial = subscriptions.positions(record, new) if new else {}
        max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = next_offsets(
            main,
            heads,
            storage.list_storage_topics(record.topic),
            initial,
            self.options.ordering,
            max_messages,
        )
        tick = start.get(TICK, 0)
        cursors = storage.get_cursors(record.name)
        behind = any(
            cursors.get(h.key, main.get(str(h.stream), 0)) < main.get(str(h.stream), 0)
            for h in heads
        )  # a rewind, or a batch that did not commit: the shards read from the cursors
        if behind or retry_due(storage, definition):
            tick += 1
        return {**end, TICK: tick}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ShardPartition]:
        from riverbed.storage.outage import ride_out

        return ride_out(
            lambda: self._partitions(start, end),
            f"planning the delivery of {self.options.subscription!r}",
        )

    def _partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ShardPartition]:
        from riverbed.subscriptions.shards import shard_of

        storage = self._open()
        _, record, definition = self._context()
        heads = storage.list_streams(record.topic)
        sizes = {st.generation: st.partitions for st in storage.list_storage_topics(record.topic)}
        main_start = {k: v for k, v in start.items() if k != TICK}
        main_end = {k: v for k, v in end.items() if k != TICK}
        count = definition.shard_count
        work: list[list[dict[str, int]]] = [[] for _ in range(count)]
        # Every stream the batch knows, even without new messages: a shard reads
        # from its cursor on, so what a batch that did not commit left behind is
        # read again by the next one.
        for head in sorted(heads, key=lambda h: (h.stream.generation, h.stream.partition)):
            s = head.stream
            name = str(s)
            if name not in main_end or name not in main_start:
                continue
            shard = shard_of(s.partition, count, sizes[s.generation])
            work[shard].append(
                {
                    "stream_key": head.key,
                    "generation": s.generation,
                    "partition": s.partition,
                    "start": main_start[name],
                    "end": main_end[name],
                }
            )
        tick = end.get(TICK, 0)
        return [
            ShardPartition(shard, count, json.dumps(items, separators=(",", ":")), tick)
            for shard, items in enumerate(work)
        ]

    def commit(self, end: dict[str, int]) -> None:
        """Nothing: each shard committed its progress with its batch."""

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, str, int]]:
        if isinstance(partition, ShardPartition):
            yield (partition.shard, partition.shards, partition.ranges_json, partition.tick)


@dataclass(slots=True)
class Totals(StepStats):
    """A run's batches and the sum of its shards' step stats."""

    batches: int = 0


STAT_FIELDS = StepStats.__slots__


STATS_SCHEMA = "shard INT, committed INT, " + ", ".join(f"{f} LONG" for f in STAT_FIELDS)
"""What each shard's task yields: its step stats (zeros if it committed nothing)."""


def deliver_batches(url: str, name: str, run_id: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function each task of a batch runs (`mapInArrow`) on its rows, one
    per shard: it runs the shard's batch and yields its stats."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        from riverbed.subscriptions.pipeline import run_shard

        context = TaskContext.get()
        batch = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
        if batch is None:  # pragma: no cover - set on every micro-batch's tasks
            raise RuntimeError("a delivery task found no streaming batch id")
        for rows in batches:
            for row in rows.to_pylist():
                stats = run_shard(
                    url, name, run_id, int(batch), row["shard"], row["shards"], row["ranges"]
                )
                out = {"shard": [row["shard"]], "committed": [int(stats is not None)]}
                for field in STAT_FIELDS:
                    out[field] = [0 if stats is None else getattr(stats, field)]
                yield pa.RecordBatch.from_pydict(out, schema=_stats_arrow_schema())

    return run


def _stats_arrow_schema() -> Any:
    import pyarrow as pa

    fields = [("shard", pa.int32()), ("committed", pa.int32())]
    return pa.schema(fields + [(f, pa.int64()) for f in STAT_FIELDS])


JOB_LEASE = "delivery-job/"
"""The lease (`storage.leases`) a running job holds for its subscription."""


class DeliveryJob:
    """A running `riverbed subscription run`: the streaming query and its totals.

    One job at a time delivers a subscription: a job holds the lease
    `delivery-job/NAME`, renewed every third of `lease_seconds` by a thread of
    its own from the moment it is taken (Spark's start-up and a slow driver
    loop on a busy machine must not let it lapse). A second job
    waits as a standby (`on_wait` is told who holds it) and takes over when
    the first stops, or, if it died, when its lease runs out. A job that
    finds its lease taken (it could not renew it in time) stops with
    `DeliveryFailed`.
    """

    def __init__(
        self,
        spark: Any,
        url: str,
        name: str,
        *,
        trigger_seconds: float = 0.5,
        max_per_trigger: int | None = 20_000,
        on_batch: Callable[[int, Totals], None] | None = None,
        lease_seconds: float = 10.0,
        stop: threading.Event | None = None,
        on_wait: Callable[[str], None] | None = None,
        stop_grace_seconds: float = 60.0,
    ) -> None:
        from riverbed.storage import open_storage
        from riverbed.storage.leases import Leases

        check_shared_storage(url, spark_master(spark))
        self.spark = spark
        self.url = url
        self.name = name
        self.run_id = uuid.uuid4().hex[:12]
        self.totals = Totals()
        self._counted: set[int] = set()
        """Batch ids whose stats are in `totals`."""
        self._grace = stop_grace_seconds
        self._on_batch = on_batch
        self._storage = open_storage(url)
        self._leases = Leases(self._storage)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{self.run_id}"
        self._ttl_us = int(lease_seconds * 1_000_000)
        self._renew_every = lease_seconds / 3
        self._checkpoint: str | None = None
        try:
            self._lease = self._take_lease(stop, on_wait)
        except BaseException:
            self._storage.close()
            raise
        self._lease_lost = threading.Event()
        self._stop_renewing = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew_lease, name=f"riverbed-delivery-lease-{name}", daemon=True
        )
        self._renewer.start()
        try:
            self.query = self._start(spark, trigger_seconds, max_per_trigger)
        except BaseException:
            self.close()
            raise

    def _start(self, spark: Any, trigger_seconds: float, max_per_trigger: int | None) -> Any:
        from pyspark.sql import functions as F

        name, url = self.name, self.url
        spark.dataSource.register(DeliveryDataSource)
        reader = (
            spark.readStream.format("riverbed-delivery")
            .option("db", url)
            .option("subscription", name)
            .option("run", self.run_id)
        )
        if max_per_trigger is not None:
            reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
        stats = reader.load().mapInArrow(deliver_batches(url, name, self.run_id), STATS_SCHEMA)
        observed = stats.observe(OBSERVED, *(F.sum(field).alias(field) for field in STAT_FIELDS))
        writer = (
            observed.writeStream.format("noop")
            .trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")
            .queryName(f"riverbed-delivery-{name}-{self.run_id}")
        )
        if not is_remote(spark):
            # Spark Connect keeps it on the server (a temporary one); here it is
            # a directory of this run, removed at close.
            self._checkpoint = tempfile.mkdtemp(prefix=f"riverbed-delivery-{name}-")
            writer = writer.option("checkpointLocation", self._checkpoint)
        return writer.start()

    def _take_lease(
        self, stop: threading.Event | None, on_wait: Callable[[str], None] | None
    ) -> Any:
        from riverbed.errors import LeaseHeld

        told = False
        while True:
            try:
                return self._leases.acquire(JOB_LEASE + self.name, self.owner, self._ttl_us)
            except LeaseHeld as held:
                if not told and on_wait is not None:
                    on_wait(str(held))
                    told = True
            if stop is not None and stop.wait(0.5):
                raise DeliveryFailed(
                    f"stopped while waiting for the job delivering {self.name!r} to stop"
                )
            if stop is None:
                time.sleep(0.5)

    def _renew_lease(self) -> None:
        """The lease keeper's thread: renew every third of the lease until the
        job closes; a lease another job took is lost for good."""
        from riverbed.errors import PreconditionFailed

        while not self._stop_renewing.wait(self._renew_every):
            try:
                self._lease = self._leases.renew(self._lease, self._ttl_us)
            except PreconditionFailed:
                self._lease_lost.set()
                return
            except RiverbedError as exc:  # unreachable for now: try again, it may not lapse
                logger.warning("renewing the lease of %r failed: %s", self.name, exc)

    def _keep_lease(self) -> None:
        """Raise `DeliveryFailed` once the lease is lost."""
        if self._lease_lost.is_set():
            raise DeliveryFailed(
                f"the job delivering {self.name!r} lost its lease (not renewed in time; another"
                " job may have taken over): stopped"
            )

    def _count_batches(self) -> None:
        """Add the step stats of the batches that ended since the last call
        (the query's progress) to the totals, and tell `on_batch`."""
        for progress in self.query.recentProgress:
            batch_id = progress.batchId
            if batch_id in self._counted:
                continue
            metrics = observed_stats(progress.json)
            if metrics is None:
                continue
            self._counted.add(batch_id)
            t = self.totals
            t.batches += 1
            for field in STAT_FIELDS:
                setattr(t, field, getattr(t, field) + (metrics.get(field) or 0))
            if self._on_batch is not None:
                self._on_batch(batch_id, copy.copy(t))

    def _drain(self) -> bool:
        """Plan no more batches and let the one in hand finish (at most the
        grace period); whether none is left running."""
        self._storage.kv_put(STOP_NAMESPACE, self.name, self.run_id.encode())
        deadline = time.monotonic() + self._grace
        while self.query.isActive and self.query.status["isTriggerActive"]:
            if time.monotonic() >= deadline:
                return False
            self.query.awaitTermination(0.1)
        return True

    def idle(self) -> bool:
        """Nothing left: no main-topic lag, no unread retry-queue row. Not
        idle while the store cannot be reached (it cannot tell; the batches
        wait for it meanwhile)."""
        from riverbed.errors import StorageUnavailable
        from riverbed.subscriptions.pipeline import is_idle

        try:
            return is_idle(self._storage, self.name)
        except StorageUnavailable:
            return False

    def run(self, until_idle: bool = False, stop: threading.Event | None = None) -> Totals:
        """Wait until the query ends, `stop` is set, or (`until_idle`) the
        subscription has nothing left; then stop the query."""
        try:
            while self.query.isActive:
                self._count_batches()
                if stop is not None and stop.is_set():
                    break
                self._keep_lease()
                if until_idle and self.idle():
                    break
                self.query.awaitTermination(0.2)
            exception = self.query.exception()
            if exception is not None:
                first = str(exception).strip().splitlines()[0] if str(exception).strip() else ""
                raise DeliveryFailed(f"the delivery query of {self.name!r} failed: {first}")
        finally:
            self.close()
        return self.totals

    def close(self) -> None:
        """Stop the query after the batch in hand (cut short only past the
        grace period: a batch cut short commits nothing and runs again)."""
        try:
            query = getattr(self, "query", None)
            if query is not None:
                if query.isActive and not self._drain():
                    logger.warning(
                        "the batch in hand did not finish within %.0f s: cut short", self._grace
                    )
                self._count_batches()
                query.stop()
        except Exception as exc:  # the JVM went first (a signal reached it too)
            logger.warning("stopping the delivery query: %s", str(exc).splitlines()[0])
        finally:
            if self._checkpoint is not None:
                shutil.rmtree(self._checkpoint, ignore_errors=True)
            self._stop_renewing.set()
            self._renewer.join()
            with contextlib.suppress(RiverbedError):
                entry = self._storage.kv_get(STOP_NAMESPACE, self.name)
                if entry is not None and entry.value == self.run_id.encode():
                    self._storage.kv_delete_if_version(STOP_NAMESPACE, self.name, entry.version)
            with contextlib.suppress(RiverbedError):
                self._leases.release(self._lease)  # a standby takes over at once
            self._storage.close()


def observed_stats(progress_json: str) -> dict[str, int] | None:
    """A batch's summed step stats from its progress (JSON), None if it has
    none (a trigger that ran no batch). Spark writes an observed row as
    `{"values": [...], "schema": {"fields": [{"name": ...}, ...]}}`, or as an
    object of names (both are read: `StreamingQueryProgress.observedMetrics`
    loses the names on Spark Connect)."""
    raw = json.loads(progress_json).get("observedMetrics", {}).get(OBSERVED)
    if not isinstance(raw, dict):
        return None
    if "values" in raw and "schema" in raw:
        names = [f["name"] for f in raw["schema"]["fields"]]
        return dict(zip(names, raw["values"], strict=True))
    return {str(k): v for k, v in raw.items()}


def is_remote(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_master(spark: Any) -> str | None:
    """Where the session's tasks run: its master (a Connect server's own)."""
    try:
        master: str | None = spark.conf.get("spark.master", None)
    except Exception:  # a Connect server that does not tell: assume another machine
        return "sc://"
    return master
