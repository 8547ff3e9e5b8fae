"""Competing consumers benchmark: Riverbed's workers beside depeche-db 0.13.1.

100,000 messages of 100 bytes over 1,000 keys and 8 partitions, on one throwaway
PostgreSQL server (started here from Debian's binaries, default durability:
fsync and synchronous_commit on; Riverbed and depeche-db each in a database of
their own), in one run:

- publish. Riverbed: `Log.produce_async` in batches of 1,000, 8 batches in
  flight (what `riverbed produce` does). depeche-db: `MessageStore.write` per
  message (one origin stream per key), 1,000 writes per transaction, then its
  projector copies them into the 8-partition aggregated stream. The projection
  is printed apart; the ratio uses depeche-db's writes alone (the reading that
  favours it).
- consume, with 1 and then 2 worker processes, each run on a fresh subscription
  from the first message, in `--rounds` alternating rounds (the best of each
  counts): Riverbed `Worker` (seed 004 loop, default transaction-level advisory
  locks, at-least-once, batch 100); depeche-db subscription, batch 100,
  `AckStrategy.BATCHED`. Handlers only count. The processes start, connect and
  say ready first; the clock runs from a start signal until every message has
  been counted.

Prints each throughput and the ratios Riverbed / depeche-db; targets: consume
>= 10x, publish >= 20x. depeche-db runs in a venv of its own (never in ours):

    python3 -m venv /tmp/depeche-venv
    /tmp/depeche-venv/bin/pip install depeche-db==0.13.1 'sqlalchemy<2.1' sniffio psycopg2-binary
    .venv/bin/python bench/competing.py [--messages N] [--depeche-python PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))

from riverbed import Batch, Log, Message, Subscriptions, Worker, open_storage  # noqa: E402
from riverbed.tuning import tune_process  # noqa: E402

KEYS = 1000
PARTITIONS = 8
PAYLOAD = b"x" * 100
PUBLISH_BATCH = 1000
IN_FLIGHT = 8
CONSUME_BATCH = 100
TOPIC = "bench"
DEPECHE_PYTHON = "/tmp/depeche-venv/bin/python"
TARGET_CONSUME = 10.0
TARGET_PUBLISH = 20.0


# --------------------------------------------------------------------- Riverbed


def riverbed_publish(url: str, messages: int) -> float:
    with Log.open(url) as log:
        log.topics.create(TOPIC, PARTITIONS)
        keys = [f"key-{i}" for i in range(KEYS)]
        start = time.perf_counter()
        pending: list[Future[Any]] = []
        for first in range(0, messages, PUBLISH_BATCH):
            batch = [
                Message(PAYLOAD, key=keys[i % KEYS])
                for i in range(first, min(first + PUBLISH_BATCH, messages))
            ]
            pending.append(log.produce_async(TOPIC, batch))
            if len(pending) >= IN_FLIGHT:
                pending.pop(0).result()
        for future in pending:
            future.result()
        return time.perf_counter() - start


def _riverbed_consumer(url: str, name: str, done: Any, ready: Any, go: Any) -> None:
    tune_process()
    storage = open_storage(url)

    def handle(batch: Batch) -> None:
        with done.get_lock():
            done.value += len(batch.messages)

    worker = Worker(storage, name, handle, batch_size=CONSUME_BATCH, poll_interval=0.05)
    storage.list_streams(TOPIC)  # connect before the clock starts
    ready.release()
    go.wait()
    thread = threading.Thread(target=worker.run)
    thread.start()
    while done.value >= 0:
        time.sleep(0.01)
    worker.stop()
    thread.join()
    storage.close()


def riverbed_consume(url: str, messages: int, processes: int, run: int) -> float:
    name = f"bench-{processes}-{run}"
    storage = open_storage(url)
    Subscriptions(storage).create(name, TOPIC)
    storage.close()
    context = multiprocessing.get_context("spawn")
    done = context.Value("q", 0)
    ready = context.Semaphore(0)
    go = context.Event()
    children = [
        context.Process(target=_riverbed_consumer, args=(url, name, done, ready, go))
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
        if any(c.exitcode is not None for c in children) or time.perf_counter() - start > 600:
            for child in children:
                child.terminate()
            raise SystemExit(f"Riverbed consumers failed: {done.value} of {messages} counted")
    elapsed = time.perf_counter() - start
    with done.get_lock():
        done.value = -(1 << 40)
    for child in children:
        child.join(timeout=60)
    return elapsed


# --------------------------------------------------------------------- depeche-db


def depeche(python: str, *args: object) -> dict[str, float]:
    out = subprocess.run(
        [python, str(ROOT / "_depeche_peer.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        raise SystemExit(f"depeche-db {args[0]} failed:\n{out.stderr}\n{out.stdout}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------- main


def rate(messages: int, seconds: float) -> str:
    return f"{messages / seconds:>10,.0f} msg/s  ({seconds:6.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--depeche-python", default=DEPECHE_PYTHON)
    parser.add_argument("--riverbed-only", action="store_true", help="skip depeche-db")
    parser.add_argument("--rounds", type=int, default=3, help="consume rounds (best counts)")
    args = parser.parse_args()
    messages: int = args.messages
    if not os.path.exists(args.depeche_python):
        raise SystemExit(f"no depeche-db venv at {args.depeche_python}: see this file's docstring")
    tune_process()

    from harness.postgres import PostgresServer

    server = PostgresServer(
        settings={"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
        on_disk=True,
    )
    server.start()
    try:
        rb_url = server.new_database("riverbed_bench")
        dd_url = server.new_database("depeche_bench")
        print(
            f"{messages:,} messages of {len(PAYLOAD)} B, {KEYS:,} keys, {PARTITIONS} partitions;"
            f" {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            flush=True,
        )
        results: dict[str, float] = {}
        results["rb_publish"] = riverbed_publish(rb_url, messages)
        print(
            f"publish   Riverbed              {rate(messages, results['rb_publish'])}", flush=True
        )
        if args.riverbed_only:
            for processes in (1, 2):
                for run in range(args.rounds):
                    rb = riverbed_consume(rb_url, messages, processes, run)
                    print(f"consume   Riverbed    x{processes}        {rate(messages, rb)}")
            return
        published = depeche(args.depeche_python, "publish", dd_url, messages, KEYS, PARTITIONS)
        results["dd_publish"] = published["publish_s"]
        results["dd_project"] = published["project_s"]
        print(
            f"publish   depeche-db (write)    {rate(messages, results['dd_publish'])}", flush=True
        )
        print(
            f"          depeche-db (project)  {rate(messages, results['dd_project'])}", flush=True
        )
        # Alternating rounds, each on fresh subscriptions; the best of each counts
        # (the machine is shared: a round can lose its CPU to something else).
        for processes in (1, 2):
            for run in range(args.rounds):
                rb = riverbed_consume(rb_url, messages, processes, run)
                print(f"consume   Riverbed    x{processes}        {rate(messages, rb)}", flush=True)
                dd = depeche(
                    args.depeche_python, "consume", dd_url, messages, processes, CONSUME_BATCH, run
                )["consume_s"]
                print(f"consume   depeche-db  x{processes}        {rate(messages, dd)}", flush=True)
                for key, seconds in (
                    (f"rb_consume_{processes}", rb),
                    (f"dd_consume_{processes}", dd),
                ):
                    results[key] = min(results.get(key, seconds), seconds)
    finally:
        server.stop()

    print()
    publish_ratio = results["dd_publish"] / results["rb_publish"]
    with_projection = (results["dd_publish"] + results["dd_project"]) / results["rb_publish"]
    verdict = "met" if publish_ratio >= TARGET_PUBLISH else "NOT met"
    print(
        f"publish ratio Riverbed / depeche-db: {publish_ratio:5.1f}x"
        f" (with its projection {with_projection:.1f}x); target {TARGET_PUBLISH:.0f}x {verdict}"
    )
    for processes in (1, 2):
        rb, dd = results[f"rb_consume_{processes}"], results[f"dd_consume_{processes}"]
        ratio = dd / rb
        verdict = "met" if ratio >= TARGET_CONSUME else "NOT met"
        print(
            f"consume x{processes} best of {args.rounds}: Riverbed {messages / rb:,.0f} msg/s,"
            f" depeche-db {messages / dd:,.0f} msg/s; ratio {ratio:5.1f}x;"
            f" target {TARGET_CONSUME:.0f}x {verdict}"
        )


if __name__ == "__main__":
    main()
