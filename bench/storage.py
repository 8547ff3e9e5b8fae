"""Storage benchmark: Riverbed's append and read beside the raw driver.

1,000,000 messages of 100 bytes over 8 streams in batches of 1,000, on each
backend, in one run:

- append, raw: the driver alone on Riverbed's schema, one transaction per batch
  (sqlite3 `executemany`; psycopg binary `COPY`), moving the stream head too.
- append, Riverbed: `Log.produce` (ids, routing, group commit) of the same
  payloads, each batch's key routed to one stream as in the raw run.
- read, raw: the driver's `SELECT ... ORDER BY off LIMIT 1000` per stream.
- read, Riverbed: a subscription `Consumer` polling 1,000 at a time in lineage
  order and committing after each batch; and `Storage.read` alone. Reads run
  three rounds, alternating, and the best round of each counts.

The process first applies `riverbed.tuning.tune_process()`, as every `riverbed`
command does (`--default-gc` measures without it); the raw runs share it.

Prints each throughput and the ratio Riverbed / raw. PostgreSQL is a throwaway
server started here from Debian's binaries with its default durability
(fsync and synchronous_commit on).

    .venv/bin/python bench/storage.py [--messages N] [--backend sqlite|postgres] [--default-gc]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from riverbed import Log, Message, Subscriptions, open_storage  # noqa: E402
from riverbed.log.partitioning import key_hash, route  # noqa: E402
from riverbed.model import MessageIdGenerator  # noqa: E402
from riverbed.storage.base import StartKind  # noqa: E402
from riverbed.tuning import tune_process  # noqa: E402

STREAMS = 8
ROUNDS = 3
BATCH = 1000
PAYLOAD = b"x" * 100
TOPIC = "bench"


def keys_per_partition() -> list[str]:
    """One key that routes to each partition of an 8-partition topic."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < STREAMS:
        key = f"key-{i}"
        found.setdefault(route(key_hash(key), STREAMS, 1), key)
        i += 1
    return [found[p] for p in range(STREAMS)]


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    count = fn()
    return time.perf_counter() - start, count


# --- raw drivers -------------------------------------------------------------


def raw_append_sqlite(url: str, stream_keys: list[int], total: int) -> int:
    import sqlite3

    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    ids = MessageIdGenerator()
    heads = dict.fromkeys(stream_keys, 0)
    sql = (
        "INSERT INTO messages (stream, off, id, ts, mqtt_topic, key, payload, properties,"
        " qos, retain) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    for b in range(total // BATCH):
        stream = stream_keys[b % STREAMS]
        first = heads[stream]
        rows = [
            (stream, first + i, id_bytes, ts, TOPIC, "k", PAYLOAD, None, 1, 0)
            for i, (id_bytes, ts) in enumerate(ids.reserve(BATCH))
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows)
        conn.execute("UPDATE streams SET next_offset = ? WHERE id = ?", (first + BATCH, stream))
        conn.execute("COMMIT")
        heads[stream] = first + BATCH
    conn.close()
    return total


def raw_read_sqlite(url: str, stream_keys: list[int]) -> int:
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    sql = (
        "SELECT off, id, ts, mqtt_topic, key, payload, properties, qos, retain FROM messages"
        " WHERE stream = ? AND off >= ? ORDER BY off LIMIT ?"
    )
    count = 0
    for stream in stream_keys:
        offset = 0
        while rows := conn.execute(sql, (stream, offset, BATCH)).fetchall():
            count += len(rows)
            offset = rows[-1][0] + 1
    conn.close()
    return count


def raw_append_postgres(url: str, stream_keys: list[int], total: int) -> int:
    import psycopg

    types = ["int8", "int8", "bytea", "int8", "text", "text", "bytea", "bytea", "int2", "int2"]
    ids = MessageIdGenerator()
    heads = dict.fromkeys(stream_keys, 0)
    with psycopg.connect(url, autocommit=True) as conn:
        for b in range(total // BATCH):
            stream = stream_keys[b % STREAMS]
            first = heads[stream]
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(
                    "COPY messages (stream, off, id, ts, mqtt_topic, key, payload, properties,"
                    " qos, retain) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(types)
                    for i, (id_bytes, ts) in enumerate(ids.reserve(BATCH)):
                        copy.write_row(
                            (stream, first + i, id_bytes, ts, TOPIC, "k", PAYLOAD, None, 1, 0)
                        )
                cur.execute(
                    "UPDATE streams SET next_offset = %s WHERE id = %s", (first + BATCH, stream)
                )
            heads[stream] = first + BATCH
    return total


def raw_read_postgres(url: str, stream_keys: list[int]) -> int:
    import psycopg

    sql = (
        "SELECT off, id, ts, mqtt_topic, key, payload, properties, qos, retain FROM messages"
        " WHERE stream = %s AND off >= %s ORDER BY off LIMIT %s"
    )
    count = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for stream in stream_keys:
            offset = 0
            while rows := conn.execute(sql, (stream, offset, BATCH)).fetchall():
                count += len(rows)
                offset = rows[-1][0] + 1
    return count


# --- Riverbed ----------------------------------------------------------------


def riverbed_append(log: Log, keys: list[str], total: int) -> int:
    for b in range(total // BATCH):
        key = keys[b % STREAMS]
        log.produce(TOPIC, [Message(PAYLOAD, key=key, mqtt_topic=TOPIC, qos=1)] * BATCH)
    return total


def riverbed_consume(log: Log) -> int:
    consumer = Subscriptions(log.storage).consumer("bench-reader")
    count = 0
    while batch := consumer.poll(BATCH):
        count += len(batch)
        consumer.commit()
    return count


def riverbed_storage_read(log: Log) -> int:
    count = 0
    for head in log.storage.list_streams(TOPIC):
        offset = 0
        while rows := log.storage.read(head.key, offset, BATCH):
            count += len(rows)
            offset = rows[-1].offset + 1
    return count


# --- driver ------------------------------------------------------------------


def checkpoint(url: str) -> None:
    if url.startswith("sqlite"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")


def fresh(url_for: Callable[[str], str], name: str) -> tuple[str, list[int]]:
    url = url_for(name)
    storage = open_storage(url)
    log = Log(storage)
    log.topics.create(TOPIC, STREAMS, binding=None)
    keys = [h.key for h in storage.list_streams(TOPIC)]
    log.close()
    return url, keys


def run_backend(
    name: str,
    url_for: Callable[[str], str],
    total: int,
    raw_append: Callable[[str, list[int], int], int],
    raw_read: Callable[[str, list[int]], int],
) -> list[tuple[str, float, float]]:
    keys = keys_per_partition()
    raw_url, raw_streams = fresh(url_for, "raw")
    rb_url, _ = fresh(url_for, "riverbed")

    # Each append starts from a clean slate: a checkpoint first, so neither pays
    # for flushing what the other wrote.
    checkpoint(raw_url)
    raw_append_s, _ = timed(lambda: raw_append(raw_url, raw_streams, total))
    checkpoint(raw_url)
    log = Log(open_storage(rb_url))
    checkpoint(rb_url)
    rb_append_s, _ = timed(lambda: riverbed_append(log, keys, total))
    checkpoint(rb_url)
    Subscriptions(log.storage).create("bench-reader", TOPIC)

    # Reads are cheap to repeat: alternate the three, best of ROUNDS each, so a
    # warmer page cache favours no one.
    raw_read_s = rb_consume_s = rb_read_s = float("inf")
    for _ in range(ROUNDS):
        seconds, n_raw = timed(lambda: raw_read(raw_url, raw_streams))
        raw_read_s = min(raw_read_s, seconds)
        Subscriptions(log.storage).reset("bench-reader", StartKind.EARLIEST)
        seconds, n_rb = timed(lambda: riverbed_consume(log))
        rb_consume_s = min(rb_consume_s, seconds)
        seconds, n_read = timed(lambda: riverbed_storage_read(log))
        rb_read_s = min(rb_read_s, seconds)
        assert n_raw == n_rb == n_read == total, (n_raw, n_rb, n_read, total)
    log.close()

    def rate(seconds: float) -> float:
        return total / seconds

    return [
        (f"{name} append", rate(rb_append_s), rate(raw_append_s)),
        (f"{name} read (Consumer, commit per batch)", rate(rb_consume_s), rate(raw_read_s)),
        (f"{name} read (Storage.read)", rate(rb_read_s), rate(raw_read_s)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's default gc thresholds instead of Riverbed's process tuning",
    )
    args = parser.parse_args()
    if not args.default_gc:
        # What every `riverbed` process does at start; raw and Riverbed runs share it.
        tune_process()
    total = args.messages - args.messages % (BATCH * STREAMS)
    results: list[tuple[str, float, float]] = []
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            results += run_backend(
                "sqlite",
                lambda n: f"sqlite:///{tmp}/{n}.db",
                total,
                raw_append_sqlite,
                raw_read_sqlite,
            )
    if args.backend in ("postgres", "both"):
        from harness.postgres import PostgresServer

        server = PostgresServer(
            settings={"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
            on_disk=True,
        )
        server.start()
        try:
            results += run_backend(
                "postgres",
                lambda n: server.new_database(f"bench_{n}"),
                total,
                raw_append_postgres,
                raw_read_postgres,
            )
        finally:
            server.stop()
    print(f"# {total:,} messages of {len(PAYLOAD)} bytes, {STREAMS} streams, batches of {BATCH}")
    print(f"# gc thresholds {gc.get_threshold()}")
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}"
    )
    print(f"{'case':45} {'riverbed msg/s':>15} {'raw msg/s':>12} {'ratio':>6}")
    for case, ours, raw in results:
        print(f"{case:45} {ours:15,.0f} {raw:12,.0f} {ours / raw:6.2f}")


if __name__ == "__main__":
    main()
