"""Retention benchmark: what a large deletion does to concurrent commits.

A topic holds a backlog (default 1,000,000 messages of 100 bytes, one stream)
that retention may delete; meanwhile a producer thread appends one message at a
time to the same stream (on PostgreSQL a deleting transaction holds the
stream's head row, which appends lock too; SQLite has one write lock anyway),
on a fixed schedule (`--every-ms`, default one commit per millisecond;
PostgreSQL with fsync on needs more than that per commit here, so give it 20),
as a broker under steady load commits. Measured per mode: the producer's commit
latency while the deletion runs, counted from when each commit was due, not
from when it could start (a commit stuck behind the deletion delays the ones
due after it, as it would a broker's PUBLISHes: no coordinated omission), p50,
p99 and max; and how long the deletion takes.

- `idle`: no deletion, the producer alone (the reference).
- `one transaction`: the whole prefix in one `delete_before`, what
  `run_retention` did before issue 14.
- `batches of N`: `apply_retention(batch=N)`, a transaction per N messages (the
  broker's default is 10,000).

    .venv/bin/python bench/retention.py [--messages N] [--backend sqlite|postgres]
        [--batches 10000,1000] [--every-ms 1]

SQLite is a file in a temporary directory (WAL, synchronous=NORMAL, the
defaults); PostgreSQL a throwaway server started here from Debian's binaries
with its default durability (fsync and synchronous_commit on).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from riverbed import Log, Message, RetentionPolicy, open_storage  # noqa: E402
from riverbed.log.retention import apply_retention  # noqa: E402
from riverbed.tuning import tune_process  # noqa: E402

PAYLOAD = b"x" * 100
FILL_BATCH = 10_000


def fill(log: Log, messages: int) -> None:
    log.topics.create("backlog", 1, retention_policy=RetentionPolicy.CONSUMED)
    batch = [Message(PAYLOAD, key="k")] * FILL_BATCH
    for _ in range(messages // FILL_BATCH):
        log.produce("backlog", batch)


def measure(
    log: Log, delete: Callable[[], object] | None, idle_seconds: float, every: float
) -> dict[str, float]:
    """Commit latencies (ms) of a producer while `delete` runs (or for
    `idle_seconds` without it), and the deletion's duration (s)."""
    latencies: list[float] = []
    stop = threading.Event()
    message = [Message(PAYLOAD, key="k")]  # the backlog's stream

    def produce() -> None:
        due = time.perf_counter()
        while not stop.is_set():
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            log.produce("backlog", message)
            latencies.append((time.perf_counter() - due) * 1000)
            due += every

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.2)  # the producer runs before the deletion begins
    latencies.clear()  # (a commit or two late already stay late: an upper bound)
    began = time.perf_counter()
    if delete is None:
        time.sleep(idle_seconds)
    else:
        delete()
    took = time.perf_counter() - began
    stop.set()
    producer.join()
    ordered = sorted(latencies)
    return {
        "commits": len(ordered),
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
        "seconds": took,
    }


@contextlib.contextmanager
def database(backend: str) -> Iterator[Callable[[str], str]]:
    """Yields `url(name)`: a new empty database for each mode."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="riverbed-bench-") as directory:
            yield lambda name: f"sqlite:///{directory}/{name}.db"
        return
    from harness.postgres import PostgresServer

    with PostgresServer(
        settings={"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
        on_disk=True,
    ) as server:
        yield server.new_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--batches", default="10000,1000")
    parser.add_argument("--every-ms", type=float, default=1.0)
    args = parser.parse_args()
    tune_process()
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"retention benchmark: {args.messages:,} messages of {len(PAYLOAD)} B, {args.backend},"
        f" a commit due every {args.every_ms:g} ms,"
        f" {platform.machine()} x{os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    modes: list[tuple[str, int | None]] = [("idle", None), ("one transaction", args.messages)]
    modes += [(f"batches of {b:,}", b) for b in batches]
    rows = []
    with database(args.backend) as new_url:
        for number, (name, batch) in enumerate(modes):
            with Log(open_storage(new_url(f"mode{number}"))) as log:
                fill(log, args.messages)
                if batch is None:
                    result = measure(log, None, 3.0, args.every_ms / 1000)
                else:

                    def delete(log: Log = log, batch: int = batch) -> None:
                        run = apply_retention(log.storage, "backlog", batch=batch)
                        assert sum(r.deleted for r in run.results) >= args.messages

                    result = measure(log, delete, 0, args.every_ms / 1000)
            rows.append((name, result))
            print(
                f"  {name:18} commits {result['commits']:7.0f}  p50 {result['p50']:7.2f} ms"
                f"  p99 {result['p99']:8.2f} ms  max {result['max']:8.1f} ms"
                f"  deletion {result['seconds']:6.2f} s",
                flush=True,
            )
    idle = rows[0][1]
    for name, result in rows[1:]:
        print(f"  {name}: p99 {result['p99'] / idle['p99']:.1f}x idle")


if __name__ == "__main__":
    main()
