"""depeche-db's side of `bench/competing.py`; runs in depeche-db's own venv.

Not part of Riverbed and never imported by it: `bench/competing.py` runs this
file with the interpreter of a venv holding depeche-db 0.13.1 (see
docs/benchmarks.md) and reads one JSON line of results from its stdout.

    publish URL MESSAGES KEYS PARTITIONS   write MESSAGES messages of ~100 bytes, one
                                           origin stream per key, 1,000 per transaction;
                                           then project them into the aggregated stream
    consume URL MESSAGES PROCESSES BATCH RUN
                                           consume the aggregated stream with a new batched-ack
                                           subscription (named after PROCESSES and RUN) in
                                           PROCESSES processes
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import multiprocessing
import sys
import time
import uuid
import zlib
from typing import Any

import depeche_db as dd
import sqlalchemy as sa

WRITE_BATCH = 1000
FLUSH = 100
"""Messages a consumer counts before it adds them to the shared total."""
TIMEOUT = 600.0
"""Seconds a consume run may take before it is called failed."""
STREAM_NAME = "bench_stream"


@dataclasses.dataclass
class Event:
    event_id: uuid.UUID
    occurred_at: dt.datetime
    key: str
    payload: str

    def get_message_id(self) -> uuid.UUID:
        return self.event_id

    def get_message_time(self) -> dt.datetime:
        return self.occurred_at


class Serializer:
    def serialize(self, message: Event) -> dict:
        return {
            "event_id": str(message.event_id),
            "occurred_at": message.occurred_at.isoformat(),
            "key": message.key,
            "payload": message.payload,
        }

    def deserialize(self, message: dict) -> Event:
        return Event(
            uuid.UUID(message["event_id"]),
            dt.datetime.fromisoformat(message["occurred_at"]),
            message["key"],
            message["payload"],
        )


class KeyPartitioner:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def get_partition(self, message: dd.StoredMessage) -> int:
        return zlib.crc32(message.message.key.encode()) % self.partitions


def engine(url: str) -> sa.engine.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))


def objects(url: str, partitions: int) -> tuple[dd.MessageStore, dd.AggregatedStream]:
    store = dd.MessageStore(name="bench", engine=engine(url), serializer=Serializer())
    stream = store.aggregated_stream(
        name=STREAM_NAME,
        partitioner=KeyPartitioner(partitions),
        stream_wildcards=["key-%"],
        update_batch_size=1000,
    )
    return store, stream


def publish(url: str, messages: int, keys: int, partitions: int) -> dict[str, float]:
    store, stream = objects(url, partitions)
    payload = "x" * 100
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    start = time.perf_counter()
    written = 0
    while written < messages:
        with store.engine.connect() as conn:
            for i in range(written, min(written + WRITE_BATCH, messages)):
                key = f"key-{i % keys}"
                store.write(key, Event(uuid.uuid4(), now, key, payload), conn=conn)
            conn.commit()
        written = min(written + WRITE_BATCH, messages)
    publish_s = time.perf_counter() - start
    start = time.perf_counter()
    while stream.projector.update_full().more_messages_available:
        pass
    project_s = time.perf_counter() - start
    return {"publish_s": publish_s, "project_s": project_s}


def _consumer(url: str, name: str, batch: int, done: Any, ready: Any, go: Any) -> None:
    _, stream = objects(url, 8)
    handlers = dd.MessageHandlerRegister()
    local = [0]

    def handle(message: dd.SubscriptionMessage[Event]) -> None:
        local[0] += 1
        if local[0] == FLUSH:  # counted as we go: a crash loses no more than this
            with done.get_lock():
                done.value += local[0]
            local[0] = 0

    handlers.register_manual(handle, dd.SubscriptionMessage[Event])
    subscription = stream.subscription(
        name=name,
        handlers=handlers,
        batch_size=batch,
        ack_strategy=dd.AckStrategy.BATCHED,
    )
    ready.release()
    go.wait()
    while True:
        subscription.runner.run_once()
        if local[0]:
            with done.get_lock():
                done.value += local[0]
            local[0] = 0
        elif done.value < 0:
            return
        else:
            time.sleep(0.005)


def consume(url: str, messages: int, processes: int, batch: int, run: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    done = context.Value("q", 0)
    ready = context.Semaphore(0)
    go = context.Event()
    children = [
        context.Process(
            target=_consumer, args=(url, f"bench_sub_{processes}_{run}", batch, done, ready, go)
        )
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    for _ in children:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    while done.value < messages:
        time.sleep(0.002)
        failed = [c.exitcode for c in children if c.exitcode is not None]
        if failed or time.perf_counter() - start > TIMEOUT:
            for child in children:
                child.terminate()
            raise SystemExit(
                f"depeche-db consumers failed (exit codes {failed}) or timed out after"
                f" {time.perf_counter() - start:.0f}s with {done.value} of {messages} counted"
            )
    elapsed = time.perf_counter() - start
    handled = done.value
    with done.get_lock():
        done.value = -1 << 40
    for child in children:
        child.join(timeout=60)
        if child.is_alive():
            child.terminate()
    return {"consume_s": elapsed, "handled": handled}


def main() -> None:
    command, url, *args = sys.argv[1:]
    if command == "publish":
        result = publish(url, *(int(a) for a in args))
    elif command == "consume":
        result = consume(url, *(int(a) for a in args))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
