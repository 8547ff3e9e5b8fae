"""Delivery benchmark (issue 7): Riverbed's Spark delivery pipeline beside a plain loop.

100,000 messages over 1,000 groups (keys), delivered over HTTP to a local
endpoint (`_endpoint.py`, a process of its own that counts what arrives) with
0% and then 10% transient failures (a fixed share of message ids answered 503
once, then 200). Each message's payload is `<key>:<seq>:` padded to 100 bytes
(`seq` its place in the workload), so the endpoint can check order per group.
In one run, per failure rate:

- plain loop (the ceiling): asyncio and one `httpx.AsyncClient` in this
  process, no durability. One coroutine per group sends that group's messages
  one after the other (a group's next message only once its previous was
  answered 200; a 503 retried after `--min-delay` s, the subscription's
  minimum backoff), at most `--in-flight` requests in flight over all groups.
  Same payloads and `X-Riverbed-*` headers as Riverbed's deliveries (message
  ids of its own). Timed from its start to the endpoint's last new delivery.
- Riverbed: the messages are produced once, before any clock runs, to an
  8-partition topic in a SQLite database in a temp dir (`Log.produce_async`,
  key = group). Per failure rate a fresh subscription from the earliest offset,
  `riverbed subscription create NAME --endpoint URL --shards 2 --grouped
  --min-delay 0.1 --max-attempts 5 --max-in-flight N/2 --max-parallel-groups N/2`
  (per shard: the loop's N in all), then the pipeline as a
  subprocess, `riverbed subscription run NAME --db URL --until-idle` (the
  Spark Structured Streaming job; it exits once the main topic has no lag and
  the retry queue is empty). Timed from the subprocess's start to the
  endpoint's last new delivery, so Spark's start-up is in the figure; printed
  apart: the time to the first delivery (mostly that start-up), the rate
  between the first and the last delivery, and when the process exited.

The endpoint's counters are reset before every run. Per run: seconds,
delivered msg/s, 503s answered, deliveries out of order within their group,
duplicates (answered 200 minus distinct ids), the endpoint's CPU share (if it
is near 100% the endpoint is the limit, not the side measured). Then the
ratios, with the targets: Riverbed / plain loop msg/s at 0% failures >= 0.5;
Riverbed's time at 10% / at 0% <= 1.5. `--rounds N` runs everything N times,
alternating; the best time of each counts.

    .venv/bin/python bench/delivery.py [--messages N] [--groups N] [--in-flight 64]
        [--rounds 1] [--peer-only] [--master URL] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _endpoint import Endpoint  # noqa: E402
from riverbed import Log, Message  # noqa: E402
from riverbed.tuning import tune_process  # noqa: E402

MESSAGES = 100_000
GROUPS = 1000
PARTITIONS = 8
PAYLOAD_SIZE = 100
TOPIC = "bench"
SHARDS = 2
MIN_DELAY = 0.1
"""Seconds before a failed message's next attempt, on both sides."""
MAX_ATTEMPTS = 5
IN_FLIGHT = 64
FAIL_PERCENTS = (0, 10)
PUBLISH_BATCH = 1000
PUBLISH_IN_FLIGHT = 8
TARGET_RATIO = 0.5
TARGET_SLOWDOWN = 1.5
POLL = 0.02
"""Seconds between two looks at the endpoint's counters while Riverbed runs."""
RIVERBED = Path(sys.executable).with_name("riverbed")


@dataclass(frozen=True, slots=True)
class Work:
    """One message of the workload."""

    seq: int
    key: str
    payload: bytes


def workload(messages: int, groups: int) -> list[Work]:
    """Message `seq` goes to group `seq mod groups`: every group's messages spread
    over the whole run."""
    width = len(str(groups - 1))
    out = []
    for seq in range(messages):
        key = f"g{seq % groups:0{width}d}"
        payload = f"{key}:{seq}:".encode().ljust(PAYLOAD_SIZE, b".")
        out.append(Work(seq, key, payload))
    return out


@dataclass(frozen=True, slots=True)
class Run:
    """One side's run at one failure rate, as the endpoint counted it."""

    side: str
    fail_percent: int
    messages: int
    seconds: float
    """From the start to the endpoint's last new delivery."""
    stats: dict[str, Any]
    """The endpoint's counters after the run."""
    endpoint_cpu: float
    """The endpoint's CPU seconds over `seconds`."""
    first_delivery: float | None = None
    """Seconds from the start to the first delivery (Riverbed: mostly Spark's start-up)."""
    exited: float | None = None
    """Seconds from the start to the pipeline process's exit (Riverbed)."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def steady_rate(self) -> float | None:
        """msg/s between the first and the last delivery."""
        if self.first_delivery is None or self.seconds <= self.first_delivery:
            return None
        return (self.messages - 1) / (self.seconds - self.first_delivery)


def _check(run: Run) -> None:
    delivered = run.stats["delivered"]
    if delivered != run.messages:
        raise SystemExit(f"{run.side} {run.fail_percent}%: {delivered} of {run.messages} delivered")


# --------------------------------------------------------------------- plain loop


async def _plain_loop(
    url: str, work: Sequence[Work], in_flight: int, min_delay: float, run_id: str
) -> tuple[float, int]:
    """Deliver `work` in order per group; the start time and the messages given up."""
    groups: dict[str, list[Work]] = {}
    for item in work:
        groups.setdefault(item.key, []).append(item)
    slots = asyncio.Semaphore(in_flight)
    given_up = 0
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as client:

        async def deliver_group(items: list[Work]) -> None:
            nonlocal given_up
            for item in items:
                headers = {
                    "X-Riverbed-Key": item.key,
                    "X-Riverbed-Message-Id": f"{run_id}-{item.seq:010d}",
                    "X-Riverbed-Topic": TOPIC,
                }
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    headers["X-Riverbed-Attempt"] = str(attempt)
                    async with slots:
                        try:
                            response = await client.post(url, content=item.payload, headers=headers)
                            status = response.status_code
                        except httpx.TransportError:
                            status = 0
                    if 200 <= status < 300:
                        break
                    if attempt < MAX_ATTEMPTS:
                        await asyncio.sleep(min_delay)  # the slot is free meanwhile
                else:
                    given_up += 1

        start = time.monotonic()
        await asyncio.gather(*(deliver_group(items) for items in groups.values()))
    return start, given_up


def plain_run(
    endpoint: Endpoint, work: Sequence[Work], fail_percent: int, in_flight: int, run_id: str
) -> Run:
    before = endpoint.reset(fail_percent)
    start, given_up = asyncio.run(
        _plain_loop(endpoint.url, work, in_flight, MIN_DELAY, f"{run_id}-{fail_percent}")
    )
    stats = endpoint.stats()
    if given_up:
        raise SystemExit(f"plain loop {fail_percent}%: {given_up} messages given up")
    run = Run(
        "plain loop",
        fail_percent,
        len(work),
        stats["last_delivery"] - start,
        stats,
        stats["cpu_seconds"] - before["cpu_seconds"],
        first_delivery=stats["first_delivery"] - start,
    )
    _check(run)
    return run


# --------------------------------------------------------------------- Riverbed


def riverbed_produce(url: str, work: Sequence[Work]) -> float:
    with Log.open(url) as log:
        log.topics.create(TOPIC, PARTITIONS)
        start = time.perf_counter()
        pending: list[Future[Any]] = []
        for first in range(0, len(work), PUBLISH_BATCH):
            batch = [Message(w.payload, key=w.key) for w in work[first : first + PUBLISH_BATCH]]
            pending.append(log.produce_async(TOPIC, batch))
            if len(pending) >= PUBLISH_IN_FLIGHT:
                pending.pop(0).result()
        for future in pending:
            future.result()
        return time.perf_counter() - start


def riverbed_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RIVERBED), *args], capture_output=True, text=True, timeout=600, check=False
    )


def require_run_command() -> None:
    """Exit early, with the reason, if `riverbed subscription run --until-idle` is missing."""
    help_text = riverbed_cli("subscription", "run", "--help")
    if help_text.returncode != 0 or "--until-idle" not in help_text.stdout:
        raise SystemExit(
            "`riverbed subscription run NAME --db URL --until-idle` is not available"
            f" (exit {help_text.returncode}): {(help_text.stderr or help_text.stdout).strip()}\n"
            "run with --peer-only to measure the plain loop alone"
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, the pipeline's process group (it started its own)."""
    if process.poll() is not None:
        return
    for signum, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def riverbed_run(
    endpoint: Endpoint,
    url: str,
    messages: int,
    fail_percent: int,
    name: str,
    args: argparse.Namespace,
    workdir: Path,
) -> Run:
    created = riverbed_cli(
        "subscription",
        "create",
        name,
        "--db",
        url,
        "--topic",
        TOPIC,
        "--start",
        "earliest",
        "--endpoint",
        endpoint.url,
        "--shards",
        str(args.shards),
        "--grouped",
        "--min-delay",
        str(MIN_DELAY),
        "--max-attempts",
        str(MAX_ATTEMPTS),
        "--max-in-flight",
        str(max(1, args.in_flight // args.shards)),  # per shard: the same total as the loop
        "--max-parallel-groups",
        str(max(1, args.in_flight // args.shards)),
    )
    if created.returncode != 0:
        raise SystemExit(f"subscription create {name} failed:\n{created.stderr}{created.stdout}")
    command = [str(RIVERBED), "subscription", "run", name, "--db", url, "--until-idle"]
    if args.master:
        command += ["--master", args.master]
    log_path = workdir / f"{name}.log"
    before = endpoint.reset(fail_percent)
    with open(log_path, "wb") as log:
        start = time.monotonic()
        # A session of its own: its JVM and Python workers are stopped with it.
        process = subprocess.Popen(
            command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            stats = endpoint.stats()
            progress, progress_at = 0, start
            while stats["delivered"] < messages:
                time.sleep(POLL)
                stats = endpoint.stats()
                now = time.monotonic()
                if stats["delivered"] > progress:
                    progress, progress_at = stats["delivered"], now
                if process.poll() is not None:
                    stats = endpoint.stats()
                    if stats["delivered"] >= messages:
                        break
                    raise SystemExit(
                        f"`{' '.join(command)}` exited ({process.returncode}) with"
                        f" {stats['delivered']} of {messages} delivered:\n{_tail(log_path)}"
                    )
                if now - progress_at > args.stall:
                    raise SystemExit(
                        f"Riverbed {fail_percent}%: nothing new delivered for {args.stall:.0f} s"
                        f" ({progress} of {messages}):\n{_tail(log_path)}"
                    )
            try:
                returncode = process.wait(timeout=args.exit_timeout)
            except subprocess.TimeoutExpired:
                raise SystemExit(
                    f"`{' '.join(command)}` delivered everything but did not exit within"
                    f" {args.exit_timeout:.0f} s:\n{_tail(log_path)}"
                ) from None
            exited = time.monotonic() - start
            if returncode != 0:
                raise SystemExit(f"`{' '.join(command)}` exited {returncode}:\n{_tail(log_path)}")
        finally:
            _stop(process)
    stats = endpoint.stats()  # after the exit: late duplicates counted too
    run = Run(
        "Riverbed",
        fail_percent,
        messages,
        stats["last_delivery"] - start,
        stats,
        stats["cpu_seconds"] - before["cpu_seconds"],
        first_delivery=stats["first_delivery"] - start,
        exited=exited,
    )
    _check(run)
    return run


# --------------------------------------------------------------------- report


def _row(run: Run) -> str:
    s = run.stats
    first = "" if run.first_delivery is None else f"{run.first_delivery:8.2f}"
    steady = "" if run.steady_rate is None else f"{run.steady_rate:10,.0f}"
    exited = "" if run.exited is None else f"{run.exited:7.1f}"
    return (
        f"{run.side:<11}{run.fail_percent:>4}%{run.messages:>10,}{run.seconds:>9.2f}"
        f"{run.rate:>10,.0f}{s['failures']:>8,}{s['out_of_order']:>6,}{s['duplicates']:>6,}"
        f"{100 * run.endpoint_cpu / run.seconds:>6.0f}%{first:>9}{steady:>11}{exited:>8}"
    )


HEADER = (
    f"{'side':<11}{'fail':>5}{'messages':>10}{'seconds':>9}{'msg/s':>10}{'503s':>8}"
    f"{'ooo':>6}{'dups':>6}{'ep cpu':>7}{'first s':>9}{'steady/s':>11}{'exit s':>8}"
)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def report(best: dict[tuple[str, int], Run], rounds: int) -> None:
    print()
    print(f"best of {rounds} round(s) each:" if rounds > 1 else "results:")
    print(HEADER)
    for run in sorted(best.values(), key=lambda r: (r.fail_percent, r.side != "plain loop")):
        print(_row(run))
    print(
        "(503s: injected failures answered; ooo: delivered out of order within the group;"
        " dups: 200s minus distinct ids; ep cpu: the endpoint's CPU over the run;"
        " first s: to the first delivery; steady/s: first to last delivery)"
    )
    print()
    plain0, plain10 = best.get(("plain loop", 0)), best.get(("plain loop", 10))
    rb0, rb10 = best.get(("Riverbed", 0)), best.get(("Riverbed", 10))
    if plain0 and plain10:
        print(f"plain loop time 10% / 0%: {plain10.seconds / plain0.seconds:.2f}x (reference)")
    if not (rb0 and plain0 and rb10):
        print("Riverbed not run: no ratios against targets")
        return
    ratio = rb0.rate / plain0.rate
    print(
        f"Riverbed / plain loop at 0% failures: {ratio:.2f}x"
        f" ({rb0.rate:,.0f} vs {plain0.rate:,.0f} msg/s); target >= {TARGET_RATIO}x"
        f" {verdict(ratio >= TARGET_RATIO)}"
    )
    if rb0.steady_rate is not None and plain0.steady_rate is not None:
        print(
            f"  without Spark's start-up (first to last delivery):"
            f" {rb0.steady_rate / plain0.steady_rate:.2f}x (reference)"
        )
    slowdown = rb10.seconds / rb0.seconds
    print(
        f"Riverbed time at 10% / at 0% failures: {slowdown:.2f}x"
        f" ({rb10.seconds:.2f} vs {rb0.seconds:.2f} s); target <= {TARGET_SLOWDOWN}x"
        f" {verdict(slowdown <= TARGET_SLOWDOWN)}"
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--groups", type=int, default=GROUPS)
    parser.add_argument(
        "--in-flight",
        type=int,
        default=IN_FLIGHT,
        help="requests in flight: the plain loop's limit and the subscription's --max-in-flight",
    )
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--rounds", type=int, default=1, help="the best time of each counts")
    parser.add_argument("--peer-only", action="store_true", help="the plain loop alone")
    parser.add_argument("--master", help="Spark master for `subscription run` (its default)")
    parser.add_argument(
        "--stall", type=float, default=300.0, help="give up after this long with no new delivery"
    )
    parser.add_argument(
        "--exit-timeout",
        type=float,
        default=120.0,
        help="seconds the pipeline may take to exit once everything is delivered",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (database, logs)")
    args = parser.parse_args()
    if args.messages < 1 or args.groups < 1 or args.in_flight < 1 or args.rounds < 1:
        parser.error("--messages, --groups, --in-flight and --rounds must be positive")
    tune_process()
    if not args.peer_only:
        require_run_command()

    work = workload(args.messages, args.groups)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.messages:,} messages of {PAYLOAD_SIZE} B, {args.groups:,} groups,"
        f" {PARTITIONS} partitions, {args.shards} shards, {args.in_flight} in flight,"
        f" retry after {MIN_DELAY} s; {platform.machine()}, {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}, httpx {_version('httpx')},"
        f" pyspark {_version('pyspark')}; load average {load}",
        flush=True,
    )
    endpoint = Endpoint.start()
    workdir = Path(tempfile.mkdtemp(prefix="riverbed-delivery-"))
    url = f"sqlite:///{workdir / 'riverbed.db'}"
    best: dict[tuple[str, int], Run] = {}

    def keep(run: Run) -> None:
        print(_row(run), flush=True)
        key = (run.side, run.fail_percent)
        if key not in best or run.seconds < best[key].seconds:
            best[key] = run

    try:
        print(f"endpoint {endpoint.url} (pid {endpoint.process.pid})", flush=True)
        if not args.peer_only:
            seconds = riverbed_produce(url, work)
            print(
                f"produced {args.messages:,} messages to {url} in {seconds:.2f} s"
                f" ({args.messages / seconds:,.0f} msg/s; not part of any figure)",
                flush=True,
            )
        print(HEADER, flush=True)
        for round_ in range(args.rounds):
            for fail_percent in FAIL_PERCENTS:
                keep(plain_run(endpoint, work, fail_percent, args.in_flight, f"r{round_}"))
                if not args.peer_only:
                    name = f"deliver-r{round_}-f{fail_percent}"
                    keep(
                        riverbed_run(
                            endpoint, url, args.messages, fail_percent, name, args, workdir
                        )
                    )
    finally:
        endpoint.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(best, args.rounds)


if __name__ == "__main__":
    main()
