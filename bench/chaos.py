"""Chaos run (issue 14): every consumer kind at once on one store, with things
SIGKILLed at random moments; counts what was lost, duplicated, reordered.

Against one store (SQLite, or PostgreSQL with `--nodes` broker nodes):

- publishers `p0..p3` (QoS 1 and QoS 2 alternately, 4 keys each, `--rate`
  msg/s each) publish `pP.kK.S` to `chaos/pP` with the user property `key`
  `pPkK`; persistent sessions, paho reconnects and sends again what was not
  acknowledged (bench/_chaos_clients.py);
- consumers of topic `chaos` (binding `chaos/#`, 4 partitions, kept forever):
  two persistent MQTT sessions (`sess-q1` subscribed with QoS 1, `sess-q2`
  with QoS 2), a shared group `$share/g/chaos/#` of two members, two
  competing-consumer workers (`riverbed worker work`, bench/_chaos_handler.py)
  and the named subscription `deliver` delivering to a local HTTP endpoint
  through its Spark job (`riverbed subscription run deliver`);
  with two nodes, clients are spread over both;
- a chaos loop SIGKILLs a broker node, a worker process or the Spark job's
  whole process group (its JVM and Python workers with it) every
  `0.8 * --duration / --kills` seconds on average after the previous one is
  back (the first kills take each kind once, the job first), and starts it
  again at once, until `--kills` kills; with `--pg-restart N` (PostgreSQL) it also
  restarts the PostgreSQL server N times (`pg_ctl restart -m fast`: every
  connection dropped, a second or two without a server). Something that exits
  by itself is logged as an unexpected exit and started again.

At the end the publishers stop, every message sent waits for its
acknowledgement, every consumer waits (per message, with a deadline) for every
acknowledged message, the log is read (how many copies of each message it
holds), and per consumer kind the run prints lost, order violations, duplicates
(republished copies / within a kill's window / stale) and the DUP flag, as
defined in bench/_chaos_tally.py, with a verdict against the target: the kills
asked for, 0 lost, 0 stale, 0 order violations, 0 false acknowledgements (an
acknowledged message that is not in the log).

    .venv/bin/python bench/chaos.py [--kills 100] [--duration 600]
        [--backend sqlite|postgres] [--nodes 1|2] [--pg-restart N] [--seed S]
        [--short] [--no-spark] [--json FILE] [--keep DIR]
    .venv/bin/python bench/chaos.py --retally DIR [--window 10] [--json FILE]

`--short` (what tests/chaos runs): 6 kills, each kind at least once, the job
once (as soon as it delivers: one Spark start after the first) and the node
and worker kills while it starts, 30 s of publishing; the job's lease is 10 s
instead of 30 (its successor waits less). Exit status 0 when the target is
met, 1 when not. Process logs (brokers, workers, the job,
PostgreSQL) and the run's events are kept in `--keep DIR` (default: a temporary
directory, named at the end), with what the counts are made of (the
deliveries, what was acknowledged, the clocks read at the start: the broker
logs' wall-clock times on the run's monotonic clock); `--retally DIR` counts
that again (exit status 1 when something was lost, stale or out of order).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH))

from _chaos_clients import Publisher, Subscriber  # noqa: E402
from _chaos_tally import (  # noqa: E402
    Clock,
    Counts,
    Delivery,
    Disruption,
    group_disruptions,
    local_time,
    message_id,
    parse_group_log,
    parse_id,
    tally,
)
from harness.broker import BrokerProcess  # noqa: E402
from harness.endpoint import Endpoint  # noqa: E402
from harness.postgres import PostgresServer  # noqa: E402
from harness.sharedsub import short_timers_config  # noqa: E402

TOPIC = "chaos"
GROUP = f"$share/g/{TOPIC}/#"
PARTITIONS = 4
PUBLISHERS = 4
KEYS = 4
SHARDS = 2
WORKERS = 2
SHORT_JVM = (
    {}
    if "PYSPARK_SUBMIT_ARGS" in os.environ
    else {
        "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false"
        " --driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
    }
)
"""The short mode's job: no Spark UI, and only the JVM's quick (C1) compiler,
whose start-up takes less CPU (a job lives a minute there; 25 s instead of 43
to the first delivery, median of 4 on a busy machine). Not when the
environment sets Spark's submit arguments itself."""

JOB_START = 300.0
"""Seconds a delivery job may take to start delivering (Spark's start-up) before
the final drain counts it as stuck."""

KIND_TARGETS = {
    "session": ("node", "postgres"),
    "shared": ("node", "postgres"),
    "workers": ("worker", "postgres"),
    "delivery": ("job", "postgres"),
}
"""Which disruptions are on each consumer kind's path (by target name prefix).
The shared group's path also has the fences and Leader changes the broker
nodes log about it (`_chaos_tally.group_disruptions`)."""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def riverbed(*args: str, db: str) -> None:
    """Run a `riverbed` command to completion (setup)."""
    command = [sys.executable, "-m", "riverbed.cli", *args, "--db", db]
    result = subprocess.run(command, env=_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")


# --------------------------------------------------------------------- components


class Process:
    """A `riverbed` command in a process group of its own, logging to a file."""

    def __init__(
        self, name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"--- start at {time.monotonic():.3f}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**_env(), **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group (a JVM and Python workers too)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM to the command's own process (docs/delivery.md: not the group,
        which would reach Spark's JVM), then SIGKILL the group after `timeout`."""
        if not self.alive():
            return self.exit_code()
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ChaosPostgres(PostgresServer):
    """The harness's throwaway server, with a restart (`pg_ctl restart -m fast`)."""

    def restart(self) -> None:
        assert self._bindir is not None
        self._run(
            [
                str(self._bindir / "pg_ctl"),
                "restart",
                "--pgdata",
                str(self._data),
                "--log",
                str(self._log),
                "--mode",
                "fast",
                "--wait",
                "--timeout",
                "60",
            ],
            timeout=90,
        )

    def log_text(self) -> str:
        try:
            return self._log.read_text(errors="replace")
        except OSError:
            return ""


# --------------------------------------------------------------------- the run


@dataclass
class Options:
    backend: str = "sqlite"
    nodes: int = 1
    kills: int = 100
    duration: float = 600.0
    pg_restarts: int = 0
    seed: int = 1
    spark: bool = True
    rate: float = 25.0
    window: float = 10.0
    drain: float = 180.0
    keep: Path | None = None
    short: bool = False
    """The short mode's kill schedule (`Run._chaos_short`)."""
    lease: float = 30.0
    """The delivery job's `--lease-seconds`: how long a killed job's successor
    may have to wait for its lease."""


@dataclass
class Event:
    at: float
    target: str
    what: str
    detail: str = ""
    publishing: bool = True
    """Were the publishers still publishing?"""
    requests: int | None = None
    """A job's kill: the requests it sent the endpoint since it started."""


@dataclass
class Run:
    options: Options
    directory: Path
    url: str = ""
    postgres: ChaosPostgres | None = None
    brokers: list[BrokerProcess] = field(default_factory=list)
    workers: list[Process] = field(default_factory=list)
    job: Process | None = None
    endpoint: Endpoint | None = None
    publishers: list[Publisher] = field(default_factory=list)
    subscribers: dict[str, list[Subscriber]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    unexpected: list[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    t0: float = field(default_factory=time.monotonic)
    clock: Clock = field(default_factory=Clock.now)
    """Both clocks read at the run's start: the broker logs' wall-clock times
    (fences, Leader changes) on the run's monotonic clock."""
    job_requests_at_start: int = 0
    publishing_stopped: bool = False

    def note(
        self,
        target: str,
        what: str,
        detail: str = "",
        requests: int | None = None,
        at: float | None = None,
    ) -> None:
        """Record an event; `at`: when it happened if not now (a kill is when its
        signal went out, not when the killed process group was reaped)."""
        when = time.monotonic() if at is None else at
        event = Event(when, target, what, detail, not self.publishing_stopped, requests)
        with self.lock:
            self.events.append(event)
            if what == "exit":
                self.unexpected.append(event)
        print(f"  [{event.at - self.t0:7.1f} s] {target}: {what} {detail}".rstrip(), flush=True)

    # --- start -------------------------------------------------------------------
    def start(self) -> None:
        o = self.options
        if o.backend == "postgres":
            # Commits wait for the WAL (synchronous_commit on): a server restart
            # must not take back what the broker acknowledged.
            self.postgres = ChaosPostgres(settings={"synchronous_commit": "on"})
            self.postgres.start()
            self.url = self.postgres.url
        else:
            self.url = f"sqlite:///{self.directory}/riverbed.db"
        riverbed(
            "topic", "create", TOPIC, "--partitions", str(PARTITIONS),
            "--binding", f"{TOPIC}/#", "--retention", "none", db=self.url,
        )  # fmt: skip
        self.endpoint = Endpoint()
        if o.spark:
            riverbed(
                "subscription", "create", "deliver", "--topic", TOPIC,
                "--endpoint", self.endpoint.url, "--shards", str(SHARDS), "--grouped",
                db=self.url,
            )  # fmt: skip
            # A killed job cannot remove its Spark checkpoint: keep it in the
            # run's directory. The driver binds to loopback, not to whatever
            # address the host name resolves to.
            job_env = {"TMPDIR": str(self.directory), "SPARK_LOCAL_IP": "127.0.0.1"}
            if o.short:
                job_env.update(SHORT_JVM)
            self.job = Process(
                "job",
                [sys.executable, "-m", "riverbed.cli", "subscription", "run", "deliver",
                 "--db", self.url, "--master", "local[2]", "--trigger-interval", "0.2",
                 "--max-per-trigger", "500", "--lease-seconds", str(o.lease),
                 "--stop-grace", "30"],
                self.directory / "job.log",
                job_env,
            )  # fmt: skip
            # First: Spark takes longest to start (10-40 s, more on a busy
            # machine); the rest starts meanwhile.
            self._start_job()
        # Shortened shared-subscription timers: a killed member's streams move
        # within seconds.
        config = short_timers_config(self.directory)
        self.brokers = [
            BrokerProcess(self.url, extra_args=("--config", str(config))) for _ in range(o.nodes)
        ]
        # The workers' subscription (for the workers, started next) while the brokers start.
        at_once(
            [functools.partial(b.start, timeout=60) for b in self.brokers]
            + [functools.partial(
                riverbed, "subscription", "create", "work", "--topic", TOPIC, db=self.url
            )]
        )  # fmt: skip
        for n in range(WORKERS):
            worker = Process(
                f"worker{n}",
                [sys.executable, "-m", "riverbed.cli", "worker", "work",
                 "--handler", "_chaos_handler:record", "--db", self.url,
                 "--poll-interval", "0.2", "--batch-size", "20"],
                self.directory / f"worker{n}.log",
                {"CHAOS_WORKER_OUT": str(self.directory / "worker-calls.txt")},
                cwd=BENCH,  # the handler module's directory
            )  # fmt: skip
            worker.start()
            self.workers.append(worker)
        ports = [b.port for b in self.brokers]

        def port(i: int) -> int:
            return ports[i % len(ports)]

        self.subscribers = {
            "session": [
                Subscriber("sess-q1", port(0), f"{TOPIC}/#", 1),
                Subscriber("sess-q2", port(1), f"{TOPIC}/#", 2),
            ],
            "shared": [
                Subscriber("share-a", port(0), f"$share/g/{TOPIC}/#", 1),
                Subscriber("share-b", port(1), f"$share/g/{TOPIC}/#", 1),
            ],
        }
        # Connected at once; every subscription is in place before the first publish.
        at_once([s.start for group in self.subscribers.values() for s in group])
        self.publishers = [
            Publisher(n, port(n), qos_of(f"p{n}."), KEYS, o.rate) for n in range(PUBLISHERS)
        ]
        at_once([p.start for p in self.publishers])
        self.note("run", "started", f"store {o.backend}, {o.nodes} node(s), {self.url}")

    def _start_job(self) -> None:
        assert self.job is not None and self.endpoint is not None
        self.job.start()
        self.job_requests_at_start = len(self.endpoint.requests)

    # --- chaos -------------------------------------------------------------------
    def chaos(self) -> int:
        """Kill and restart until `kills` kills; returns the kills."""
        return self._chaos_short() if self.options.short else self._chaos_paced()

    def _chaos_paced(self) -> int:
        """Once the job delivers, kill (each kind once first, the job first of
        all, then at random) every `0.8 * duration / kills` seconds on average,
        until `kills` kills (or 3x `duration`)."""
        o = self.options
        rng = random.Random(o.seed)
        # Kills spread over 80% of the duration: the last one has time to heal.
        gap = 0.8 * o.duration / max(o.kills, 1)
        kinds = ["node", "worker"] + (["job"] if o.spark else [])
        # Each kind once first, the job (slowest to come back) first of all.
        first = (["job"] if o.spark else []) + rng.sample(kinds[:2], 2)
        if o.spark:
            # The clock starts once the job delivers (Spark takes 10-40 s to start).
            deadline = time.monotonic() + 300
            while not self.job_delivering() and time.monotonic() < deadline:
                self.supervise()
                time.sleep(0.2)
            self.note("job", "delivering")
        # Kills are paced to spread over `duration`; restarts take time too, so
        # the run goes on past it until the kills are done (at most 3x).
        end = time.monotonic() + 3 * o.duration
        pg_times = sorted(
            time.monotonic() + o.duration * (i + rng.uniform(0.2, 0.8)) / o.pg_restarts
            for i in range(o.pg_restarts)
        )
        kills = 0
        next_kill = time.monotonic() + gap * rng.uniform(0.5, 1.5)
        while kills < o.kills and time.monotonic() < end:
            self.supervise()
            now = time.monotonic()
            if pg_times and now >= pg_times[0]:
                pg_times.pop(0)
                self.restart_postgres()
                continue
            if now < next_kill:
                time.sleep(0.1)
                continue
            kind = first[0] if first else rng.choices(kinds, [5, 3, 2][: len(kinds)])[0]
            if self.kill(kind, rng):
                if first:
                    first.pop(0)
                kills += 1
                next_kill = time.monotonic() + gap * rng.uniform(0.5, 1.5)
            else:
                time.sleep(0.1)
        return kills

    def _chaos_short(self) -> int:
        """The short mode (CI): every kind killed, with one Spark start on the
        critical path after the first.

        Spark's start (25-115 s on a busy machine) is most of the run, and a
        killed job starts again from scratch: the job is killed once, as soon
        as it delivers (after 20-200 requests, or 2 s after the first: within
        its first batch), and not again. The node and worker kills (`kills -
        1`, each kind at least once) do not wait for Spark: they are spread
        over the first 80% of `duration` from the start, while the job starts.
        Publishing stops after `duration` seconds once those kills are done,
        so a job killed later than that is killed catching up (still
        mid-stream) and the backlog its successor delivers stays small.
        PostgreSQL restarts (`--pg-restart`) are spread over `duration`.
        """
        o = self.options
        rng = random.Random(o.seed)
        begin = time.monotonic()
        others = o.kills - 1 if o.spark else o.kills
        gap = 0.8 * o.duration / max(others, 1)
        first = rng.sample(["node", "worker"], 2)
        pg_times = sorted(
            begin + o.duration * (i + rng.uniform(0.2, 0.8)) / o.pg_restarts
            for i in range(o.pg_restarts)
        )
        # Killing a job that has not delivered yet would cost a Spark start and
        # prove nothing: the job is waited for (one that never delivers leaves
        # the kills short of the target).
        end = begin + max(3 * o.duration, 300)
        job_kills = 0
        job_kill_at: float | None = None
        # Within its first batch (up to 500 messages, sent in a second or so):
        # the batch never commits and its successor delivers it again.
        job_kill_after = rng.randint(20, 200)
        other_kills = 0
        next_kill = begin + gap * rng.uniform(0.5, 1.5)
        while time.monotonic() < end:
            self.supervise()
            now = time.monotonic()
            if other_kills >= others and now >= begin + o.duration and not pg_times:
                self.stop_publishing()
                if job_kills or not o.spark:
                    break
            if pg_times and now >= pg_times[0]:
                pg_times.pop(0)
                self.restart_postgres()
                continue
            if o.spark and not job_kills:
                assert self.job is not None
                if job_kill_at is None and self.job_delivering():
                    self.note("job", "delivering")
                    job_kill_at = now + 2.0
                if job_kill_at is not None and (
                    now >= job_kill_at or self.job_requests() >= job_kill_after
                ):
                    job_kills += int(self.kill("job", rng))
                    continue
            if other_kills < others and now >= next_kill:
                kind = first[0] if first else rng.choices(["node", "worker"], [5, 3])[0]
                if self.kill(kind, rng):
                    if first:
                        first.pop(0)
                    other_kills += 1
                    next_kill = time.monotonic() + gap * rng.uniform(0.5, 1.5)
                    continue
            time.sleep(0.1)
        return job_kills + other_kills

    def kill(self, kind: str, rng: random.Random) -> bool:
        """SIGKILL one `kind` that is up and start it again; False if none was up."""
        if kind == "node":
            up = [i for i, b in enumerate(self.brokers) if b.process and b.process.poll() is None]
            if not up:
                return False
            i = rng.choice(up)
            at = time.monotonic()
            self.brokers[i].kill()
            self.note(f"node{i}", "kill", at=at)
            self._start_broker(i)
            return True
        if kind == "worker":
            up = [w for w in self.workers if w.alive()]
            if not up:
                return False
            worker = rng.choice(up)
            at = time.monotonic()
            worker.kill()
            self.note(worker.name, "kill", at=at)
            worker.start()
            self.note(worker.name, "restart")
            return True
        assert self.job is not None and self.endpoint is not None
        # Mid-stream: once the job has delivered since it started (Spark takes
        # 10-20 s to start), or after two minutes whatever it did.
        if not self.job.alive() or not (
            self.job_delivering() or time.monotonic() - self.job.started_at > 120
        ):
            return False
        at = time.monotonic()
        self.job.kill()
        # What the killed job had sent is recorded before the new one is
        # counted from: a request read after the restart would pass for the
        # new job delivering (`job_starting`), while it still starts Spark.
        self.endpoint.quiet()
        requests = self.job_requests()
        self.note(
            "job",
            "kill",
            f"after {at - self.job.started_at:.1f} s, {requests} requests",
            requests=requests,
            at=at,
        )
        self._start_job()
        self.note("job", "restart")
        return True

    def job_starting(self) -> bool:
        """Is the job up, not delivering yet, and started less than JOB_START s ago?"""
        return (
            self.job is not None
            and self.job.alive()
            and not self.job_delivering()
            and time.monotonic() - self.job.started_at < JOB_START
        )

    def job_delivering(self) -> bool:
        """Has the job delivered something since it (last) started?"""
        return self.job_requests() > 0

    def job_requests(self) -> int:
        """The requests the endpoint got since the job (last) started."""
        assert self.endpoint is not None
        return len(self.endpoint.requests) - self.job_requests_at_start

    def _start_broker(self, i: int) -> None:
        try:
            self.brokers[i].start(timeout=60)
            self.note(f"node{i}", "restart")
        except RuntimeError as exc:
            self.note(f"node{i}", "exit", f"failed to start: {str(exc)[-2000:]}")

    def restart_postgres(self) -> None:
        assert self.postgres is not None
        self.note("postgres", "pg-restart", "begin")
        self.postgres.restart()
        self.note("postgres", "restart", "server up again")

    def supervise(self) -> None:
        """Start again whatever exited by itself (logged as unexpected)."""
        for i, broker in enumerate(self.brokers):
            process = broker.process
            if process is not None and process.poll() is not None:
                self.note(f"node{i}", "exit", f"code {process.returncode}:\n{broker.tail(40)}")
                self._start_broker(i)
        for worker in self.workers:
            if not worker.alive():
                self.note(worker.name, "exit", f"code {worker.exit_code()}:\n{worker.tail(40)}")
                worker.start()
        if self.job is not None and not self.job.alive():
            self.note("job", "exit", f"code {self.job.exit_code()}:\n{self.job.tail(40)}")
            self._start_job()

    # --- the end -----------------------------------------------------------------
    def stop_publishing(self) -> None:
        """Stop the publishers (once); what is in flight still gets acknowledged."""
        if self.publishing_stopped:
            return
        self.publishing_stopped = True
        for publisher in self.publishers:
            publisher.stop()
        self.note("run", "publishers stopped")

    def drain(self) -> dict[str, Any]:
        """Stop publishing, wait for acknowledgements and deliveries (per message,
        each consumer until nothing more arrives for `drain` seconds); returns
        what did not arrive."""
        o = self.options
        self.stop_publishing()
        deadline = time.monotonic() + o.drain
        while time.monotonic() < deadline and any(p.outstanding() for p in self.publishers):
            self.supervise()
            time.sleep(0.2)
        unacknowledged = sum(p.outstanding() for p in self.publishers)
        acked = self.acknowledged()
        pending: dict[str, int] = {}
        for kind, received in self.receivers().items():
            # Until nothing is missing, or nothing more arrived for `drain`
            # seconds: a consumer still catching up (the delivery job on a busy
            # machine) is given the time it needs, a stuck one is not. A job
            # (re)started that has not delivered yet is still starting Spark:
            # its `drain` seconds start when it delivers, or at most
            # JOB_START seconds after it started.
            missing = len(acked - received())
            stalled_at = time.monotonic() + o.drain
            while missing and time.monotonic() < stalled_at:
                self.supervise()
                time.sleep(0.2)
                now_missing = len(acked - received())
                if now_missing < missing or (kind == "delivery" and self.job_starting()):
                    stalled_at = time.monotonic() + o.drain
                missing = now_missing
            pending[kind] = missing
        self.note("run", "drained", f"unacknowledged {unacknowledged}, missing {pending}")
        return {"unacknowledged": unacknowledged, "missing_at_deadline": pending}

    def acknowledged(self) -> set[str]:
        out: set[str] = set()
        for publisher in self.publishers:
            with publisher.lock:
                out.update(publisher.acknowledged)
        return out

    def receivers(self) -> dict[str, Callable[[], set[str]]]:
        def union(subs: list[Subscriber]) -> Callable[[], set[str]]:
            return lambda: set().union(*(s.received() for s in subs))

        out: dict[str, Callable[[], set[str]]] = {
            s.name: (lambda s=s: s.received()) for s in self.subscribers["session"]
        }
        out["shared"] = union(self.subscribers["shared"])
        out["workers"] = lambda: {d.message for d in self.worker_deliveries()}
        if self.options.spark:
            out["delivery"] = lambda: {d.message for d in self.endpoint_deliveries()}
        return out

    def worker_deliveries(self) -> list[Delivery]:
        path = self.directory / "worker-calls.txt"
        out: list[Delivery] = []
        if not path.exists():
            return out
        for line in path.read_text().splitlines():
            at, _pid, stream, offsets, payloads = line.split(" ")
            for n, (offset, message) in enumerate(
                zip(offsets.split(","), payloads.split(","), strict=True)
            ):
                out.append(Delivery("workers", message, float(at), n, copy=f"{stream}@{offset}"))
        return out

    def endpoint_deliveries(self) -> list[Delivery]:
        assert self.endpoint is not None
        return [
            Delivery("delivery", r.payload.decode(), r.at, copy=r.message_id)
            for r in self.endpoint.delivered()
        ]

    def log_copies(self) -> tuple[Counter[str], list[tuple[str, int, int]]]:
        """How many times the log holds each message, and per-key order in the log
        (first copies)."""
        from riverbed.storage import open_storage

        storage = open_storage(self.url)
        copies: Counter[str] = Counter()
        disorder: list[tuple[str, int, int]] = []
        try:
            for head in storage.list_streams(TOPIC):
                offset = head.start_offset
                highest: dict[str, int] = {}
                while offset < head.next_offset:
                    batch = storage.read(head.key, offset, 10_000)
                    if not batch:
                        break
                    for m in batch:
                        message = m.payload.decode()
                        copies[message] += 1
                        if copies[message] == 1:
                            key, seq = parse_id(message)
                            if seq < highest.get(key, -1):
                                disorder.append((key, seq, highest[key]))
                            highest[key] = max(seq, highest.get(key, -1))
                    offset = batch[-1].offset + 1
        finally:
            storage.close()
        return copies, disorder

    def stop(self) -> None:
        for group in self.subscribers.values():
            for subscriber in group:
                subscriber.close()
        for publisher in self.publishers:
            publisher.close()
            wire = self.directory / f"publisher-{publisher.name}.log"
            wire.write_text("\n".join(publisher.wire) + "\n")

        def stop_broker(i: int) -> None:
            broker = self.brokers[i]
            try:
                broker.stop(30)
            except RuntimeError as exc:
                self.note(f"node{i}", "stop failed", str(exc)[-2000:])
            broker.kill()
            shutil.copy(broker.log_path, self.directory / f"node{i}.log")

        # All at once: nothing left depends on another (the counts are taken),
        # and the job's Spark takes a while to stop.
        calls: list[Callable[[], object]] = [functools.partial(w.stop, 30) for w in self.workers]
        calls += [functools.partial(stop_broker, i) for i in range(len(self.brokers))]
        if self.job is not None:
            calls.append(self.job.stop)
        at_once(calls)
        if self.endpoint is not None:
            self.endpoint.close()
        if self.postgres is not None:
            (self.directory / "postgres.log").write_text(self.postgres.log_text())
            self.postgres.stop()


def at_once(calls: Sequence[Callable[[], object]]) -> None:
    """Run `calls` in threads of their own and wait for all; the first error is raised."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,), daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def qos_of(message: str) -> int:
    """The QoS publisher `pP` publishes at (odd P: 2)."""
    return 1 + int(message.split(".", 1)[0][1:]) % 2


def disruptions(events: Sequence[Event], kind: str) -> list[Disruption]:
    """The run's kills and restarts on `kind`'s path (KIND_TARGETS)."""
    prefixes = KIND_TARGETS[kind]
    return [
        Disruption(e.at, e.target, e.what)
        for e in events
        if e.target.startswith(prefixes) and e.what in ("kill", "restart", "exit", "pg-restart")
    ]


def tally_kinds(
    consumers: Sequence[str],
    deliveries: Sequence[Delivery],
    acked: set[str],
    copies: Counter[str],
    events: Sequence[Event],
    group: Sequence[Disruption],
    window: float,
) -> dict[str, Counts]:
    """`tally` per consumer kind: each session (`sess-...`) on its own, the shared
    group's members (`share-...`) as one `shared`, `workers`, `delivery`.
    `group`: the shared group's disruptions the brokers logged, on its path only."""
    by_consumer: dict[str, list[Delivery]] = {name: [] for name in consumers}
    for d in deliveries:
        by_consumer["shared" if d.consumer.startswith("share-") else d.consumer].append(d)
    out: dict[str, Counts] = {}
    for name in consumers:
        kind = "session" if name.startswith("sess-") else name
        path = disruptions(events, kind) + (list(group) if kind == "shared" else [])
        out[name] = tally(name, by_consumer[name], acked, copies, path, window)
    return out


def group_counts(group: Sequence[Disruption]) -> dict[str, dict[str, int]]:
    """Per node, the shared group's fences and Leader changes the brokers logged
    (a Leader change: a Leader starting, but the group's first, or stopping)."""
    out: dict[str, dict[str, int]] = {}
    for d in group:
        counts = out.setdefault(d.target, {"fences": 0, "leader_changes": 0})
        counts["fences" if d.what == "fence" else "leader_changes"] += 1
    return dict(sorted(out.items()))


def print_counts(per_kind: dict[str, Counts], group: Sequence[Disruption]) -> None:
    header = (
        f"  {'consumer':10} {'expected':>8} {'lost':>5} {'order':>5} {'dups':>6}"
        f" {'repub':>6} {'window':>6} {'w/DUP':>6} {'stale':>5} {'1st DUP':>7} {'max w':>6}"
    )
    print(header)
    for c in per_kind.values():
        print(
            f"  {c.consumer:10} {c.expected:8} {len(c.lost):5} {len(c.order_violations):5}"
            f" {c.duplicates:6} {c.republished:6} {c.in_window:6} {c.in_window_dup_flag:6}"
            f" {len(c.stale):5} {c.first_with_dup_flag:7} {c.largest_window:6.1f}"
        )
    per_node = group_counts(group)
    print(
        "  on the shared group's path, as the brokers logged (fences, Leader changes): "
        + (
            "; ".join(
                f"{node} {n['fences']} fence(s), {n['leader_changes']} Leader change(s)"
                for node, n in per_node.items()
            )
            or "none"
        )
    )


def print_failures(per_kind: dict[str, Counts]) -> None:
    for c in per_kind.values():
        if c.lost:
            print(f"  {c.consumer} lost (first 20): {c.lost[:20]}")
        if c.stale:
            print(f"  {c.consumer} stale (first 10): {c.stale[:10]}")
        if c.order_violations:
            print(f"  {c.consumer} order violations (first 10): {c.order_violations[:10]}")


def report(run: Run, kills: int, drained: dict[str, Any]) -> dict[str, Any]:
    o = run.options
    acked = run.acknowledged()
    copies, log_disorder = run.log_copies()
    false_acks = sorted(acked - copies.keys())
    shared: list[Delivery] = []
    for sub in run.subscribers["shared"]:
        with sub.lock:
            shared.extend(sub.deliveries)
    deliveries = list(shared)
    for sub in run.subscribers["session"]:
        with sub.lock:
            deliveries.extend(sub.deliveries)
    deliveries += run.worker_deliveries() + (run.endpoint_deliveries() if o.spark else [])
    group = group_disruptions(
        (
            e
            for i, broker in enumerate(run.brokers)
            for e in parse_group_log(broker.log_path.read_text(errors="replace"), f"node{i}", GROUP)
        ),
        run.clock,
    )
    consumers = [s.name for s in run.subscribers["session"]] + ["shared", "workers"]
    consumers += ["delivery"] if o.spark else []
    per_kind = tally_kinds(consumers, deliveries, acked, copies, run.events, group, o.window)
    # QoS 2 end to end (a QoS 2 publisher, the QoS 2 subscription): exactly once
    # (DESIGN.md, guarantee 3): any repeat beyond the log's copies breaks it.
    qos2_repeats: dict[str, int] = {}
    for sub in run.subscribers["session"]:
        if sub.qos == 2:
            with sub.lock:
                got = Counter(d.message for d in sub.deliveries if qos_of(d.message) == 2)
            qos2_repeats[sub.name] = sum(max(0, n - copies.get(m, 1)) for m, n in got.items())
    # A publisher republishes a refused message; a later one of its key already in
    # flight may have been accepted first: order violations after a refusal are
    # the publisher's (counted apart, in the report and not in the target).
    refused = {m for p in run.publishers for m, _ in p.refused}
    after_refusal = 0
    for c in per_kind.values():
        kept = [v for v in c.order_violations if message_id(v[0], v[1]) not in refused]
        after_refusal += len(c.order_violations) - len(kept)
        c.order_violations = kept
    log_refused = [v for v in log_disorder if message_id(v[0], v[1]) in refused]
    log_disorder = [v for v in log_disorder if v not in log_refused]
    # To count again later (--retally).
    with (run.directory / "deliveries.jsonl").open("w") as raw:
        for d in deliveries:
            raw.write(json.dumps([d.consumer, d.message, d.at, d.order, d.dup, d.copy]) + "\n")
    (run.directory / "acknowledged.json").write_text(
        json.dumps(
            {
                "acknowledged": sorted(acked),
                "log_copies_beyond_one": {m: n for m, n in sorted(copies.items()) if n > 1},
                "refused": sorted(refused),
            }
        )
    )
    kills_by_target = Counter(e.target for e in run.events if e.what == "kill")
    sent = sum(len(p.sent) for p in run.publishers)
    lost = sum(len(c.lost) for c in per_kind.values())
    stale = sum(len(c.stale) for c in per_kind.values())
    disorder = sum(len(c.order_violations) for c in per_kind.values())
    met = (
        kills >= o.kills
        and lost == 0
        and stale == 0
        and disorder == 0
        and not false_acks
        and not log_disorder
        and not any(qos2_repeats.values())
    )
    print()
    print(
        f"chaos run: {o.backend}, {o.nodes} node(s), seed {o.seed}, {kills} kills"
        f" ({dict(sorted(kills_by_target.items()))}), {o.pg_restarts} PostgreSQL restart(s),"
        f" {time.monotonic() - run.t0:.0f} s"
    )
    print(
        f"  published {sent}, acknowledged {len(acked)}, unacknowledged at the end"
        f" {drained['unacknowledged']}; refused {sum(len(p.refused) for p in run.publishers)};"
        f" the log holds {sum(copies.values())} ({sum(1 for c in copies.values() if c > 1)}"
        f" messages twice or more)"
    )
    print(f"  false acknowledgements (acknowledged, not in the log): {len(false_acks)}")
    print(
        f"  per-key order violations in the log: {len(log_disorder)}"
        f" (and {len(log_refused)} after a refusal: a refused message republished"
        " after a later one of its key was accepted)"
    )
    print(f"  unexpected exits: {len(run.unexpected)}")
    print(f"  QoS 2 messages delivered twice to a QoS 2 subscription: {qos2_repeats}")
    print_counts(per_kind, group)
    sessions_lost = {s.name: s.sessions_lost for g in run.subscribers.values() for s in g}
    if any(sessions_lost.values()):
        print(f"  sessions found gone at a reconnect: {sessions_lost}")
    print(
        f"  target ({o.kills} kills, 0 lost, 0 stale, 0 order violations, 0 false"
        f" acknowledgements, QoS 2 exactly once): {'met' if met else 'NOT met'}"
    )
    print_failures(per_kind)
    if false_acks:
        print(f"  false acknowledgements (first 20): {false_acks[:20]}")
    return {
        "backend": o.backend,
        "nodes": o.nodes,
        "seed": o.seed,
        "kills": kills,
        "kills_by_target": dict(kills_by_target),
        "kill_events": [
            {
                "at": round(e.at - run.t0, 1),
                "target": e.target,
                "while_publishing": e.publishing,
                "job_requests": e.requests,
            }
            for e in run.events
            if e.what == "kill"
        ],
        "pg_restarts": o.pg_restarts,
        "clock": {"wall": run.clock.wall, "monotonic": run.clock.monotonic},
        "shared_group_disruptions": group_counts(group),
        "published": sent,
        "acknowledged": len(acked),
        "refused": sum(len(p.refused) for p in run.publishers),
        **drained,
        "false_acknowledgements": false_acks,
        "log_order_violations": log_disorder,
        "log_order_violations_after_refusal": log_refused,
        "order_violations_after_refusal": after_refusal,
        "unexpected_exits": [
            {"at": round(e.at - run.t0, 1), "target": e.target, "detail": e.detail}
            for e in run.unexpected
        ],
        "sessions_lost": sessions_lost,
        "qos2_repeats": qos2_repeats,
        "consumers": {
            name: {
                **c.summary(),
                "lost_ids": c.lost[:200],
                "stale_ids": [
                    (m, round(a - run.t0, 2), round(b - run.t0, 2)) for m, a, b in c.stale[:200]
                ],
                "order_violation_ids": c.order_violations[:200],
            }
            for name, c in per_kind.items()
        },
        "target_met": met,
        "directory": str(run.directory),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
    }


# --------------------------------------------------------------------- counting again


class KeptRunError(ValueError):
    """A `--retally` directory that is not what a chaos run keeps."""


CONNECTED = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) \w+ riverbed\.mqtt\.connection:"
    r" client (?P<client>chaos-p\d+) \(.*\) connected: "
)


def retally(directory: Path, window: float) -> dict[str, Any]:
    """Count the run kept in `directory` (`--keep`) again, from its files: the
    deliveries (deliveries.jsonl), the run's events and clocks (events.json),
    the broker logs (node*.log), what was acknowledged and refused and the
    log's copies (acknowledged.json). A directory kept before those were
    recorded is counted as well as its files allow: the clocks from the
    publishers' connections (`clock_from_connects`), the acknowledged messages
    from what the publishers sent (right when the run ended with none
    unacknowledged) and the refused from what they sent twice (their wire logs),
    the log's copies from the workers' (each names the log record it got)."""
    for name in ("events.json", "deliveries.jsonl"):
        if not (directory / name).is_file():
            raise KeptRunError(
                f"--retally {directory}: no {name} there (not a directory a chaos run kept)"
            )
    recorded = json.loads((directory / "events.json").read_text())
    notes: list[str] = []
    if isinstance(recorded, dict):
        clock = Clock(**recorded["clock"])
        events = [Event(**e) for e in recorded["events"]]
    else:
        clock, error = clock_from_connects(directory)
        events = [Event(**e) for e in recorded]
        notes.append(f"clocks matched by the publishers' connections (within {error:.3f} s)")
    deliveries = []
    with (directory / "deliveries.jsonl").open() as raw:
        for line in raw:
            consumer, message, at, order, dup, copy = json.loads(line)
            deliveries.append(Delivery(consumer, message, at, order, dup, copy))
    kept = directory / "acknowledged.json"
    if kept.is_file():
        inputs = json.loads(kept.read_text())
        acked = set(inputs["acknowledged"])
        copies = Counter(inputs["log_copies_beyond_one"])  # the rest: once (tally's default)
        refused = set(inputs["refused"])
    else:
        published: Counter[str] = Counter()
        for log in sorted(directory.glob("publisher-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                fields = line.split(" ")
                if len(fields) >= 3 and fields[1] == "publish":
                    published[fields[2]] += 1
        acked = set(published)
        # A publisher publishes a message again (not a QoS resend) only once refused.
        refused = {m for m, n in published.items() if n > 1}
        records: dict[str, set[str | None]] = {}
        for d in deliveries:
            if d.consumer == "workers":
                records.setdefault(d.message, set()).add(d.copy)
        copies = Counter({m: len(r) for m, r in records.items()})
        notes.append(
            "acknowledged: every message a publisher sent; refused: those it published"
            " again; the log's copies: the workers' (no acknowledged.json)"
        )
    group = group_disruptions(
        (
            e
            for log in sorted(directory.glob("node*.log"))
            for e in parse_group_log(log.read_text(errors="replace"), log.stem, GROUP)
        ),
        clock,
    )
    names = {d.consumer for d in deliveries}
    consumers = [*sorted(n for n in names if n.startswith("sess-")), "shared", "workers"]
    consumers += ["delivery"] if "delivery" in names else []
    per_kind = tally_kinds(consumers, deliveries, acked, copies, events, group, window)
    for c in per_kind.values():
        c.order_violations = [
            v for v in c.order_violations if message_id(v[0], v[1]) not in refused
        ]
    print(f"chaos run counted again: {directory}, window {window} s")
    for note in notes:
        print(f"  {note}")
    print_counts(per_kind, group)
    print_failures(per_kind)
    return {
        "directory": str(directory),
        "window": window,
        "notes": notes,
        "clock": {"wall": clock.wall, "monotonic": clock.monotonic},
        "shared_group_disruptions": group_counts(group),
        "consumers": {name: c.summary() for name, c in per_kind.items()},
        "target_met": not any(c.lost or c.stale or c.order_violations for c in per_kind.values()),
    }


def clock_from_connects(directory: Path) -> tuple[Clock, float]:
    """The clocks of a kept run that did not record them, matched by the
    publishers' connections: a broker logs a publisher `connected` (wall clock)
    after the publisher sent CONNECT and before it got CONNACK (both in its
    wire log, monotonic). Each connection bounds the difference of the clocks;
    returns the middle of the bounds of all, and how far from it the truth can be."""
    low, high = -float("inf"), float("inf")
    for log in sorted(directory.glob("publisher-*.log")):
        client = f"chaos-{log.stem.removeprefix('publisher-')}"
        connects: list[tuple[float, float]] = []  # (CONNECT sent, CONNACK in)
        sent = None
        for line in log.read_text(errors="replace").splitlines():
            at, _, text = line.partition(" ")
            if text.startswith("Sending CONNECT"):
                sent = float(at)
            elif text == "on_connect Success" and sent is not None:
                connects.append((sent, float(at)))
        walls = sorted(
            local_time(m["stamp"], int(m["ms"]))
            for node in directory.glob("node*.log")
            for m in map(CONNECTED.match, node.read_text(errors="replace").splitlines())
            if m is not None and m["client"] == client
        )
        if len(walls) != len(connects):
            raise KeptRunError(
                f"--retally {directory}: {client} connected {len(connects)} time(s) by its"
                f" log and {len(walls)} by the broker logs: the clocks cannot be matched"
            )
        for (sent_at, connack_at), wall in zip(connects, walls, strict=True):
            low = max(low, wall - connack_at)
            high = min(high, wall + 0.001 - sent_at)  # asctime drops the rest of the ms
    if not low <= high:
        raise KeptRunError(f"--retally {directory}: the publishers' connections do not match")
    # wall - monotonic, the same for every moment: Clock(that, 0).
    return Clock((low + high) / 2, 0.0), (high - low) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument(
        "--duration", type=float, default=600.0, help="seconds the kills are spread over"
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=None)
    parser.add_argument(
        "--pg-restart",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="N",
        help="restart the PostgreSQL server N times (default with the flag: 3)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--short", action="store_true", help="6 kills, 30 s of publishing, one job kill (CI)"
    )
    parser.add_argument("--no-spark", action="store_true", help="without the delivery job")
    parser.add_argument("--rate", type=float, default=25.0, help="msg/s per publisher")
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds of a kill's in-flight window"
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=None,
        help="seconds without a delivery after which a consumer counts as done",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the counts here")
    parser.add_argument("--keep", type=Path, default=None, help="directory for logs")
    parser.add_argument(
        "--retally",
        type=Path,
        default=None,
        metavar="DIR",
        help="count again the run kept in DIR (--keep), with --window; runs nothing",
    )
    args = parser.parse_args(argv)
    if args.retally is not None:
        try:
            counted = retally(args.retally, args.window)
        except KeptRunError as exc:
            parser.error(str(exc))
        if args.json is not None:
            args.json.write_text(json.dumps(counted, indent=1))
        return 0 if counted["target_met"] else 1
    nodes = args.nodes or (2 if args.backend == "postgres" else 1)
    if nodes > 1 and args.backend == "sqlite":
        parser.error(f"--nodes {nodes} needs --backend postgres (one SQLite file, one node)")
    if args.pg_restart and args.backend != "postgres":
        parser.error("--pg-restart needs --backend postgres")
    if args.pg_restart < 0:
        parser.error(f"--pg-restart {args.pg_restart}: must be 0 or more")
    options = Options(
        backend=args.backend,
        nodes=nodes,
        kills=6 if args.short else args.kills,
        duration=30.0 if args.short else args.duration,
        pg_restarts=args.pg_restart,
        seed=args.seed,
        spark=not args.no_spark,
        rate=20.0 if args.short else args.rate,
        window=args.window,
        drain=args.drain if args.drain is not None else (90.0 if args.short else 180.0),
        keep=args.keep,
        short=args.short,
        # Short: the killed job's successor waits at most 10 s (its Spark
        # start covers most of that), not 30.
        lease=10.0 if args.short else 30.0,
    )
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        directory = args.keep
    else:
        directory = Path(tempfile.mkdtemp(prefix="riverbed-chaos-"))
    run = Run(options, directory)

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")  # runs `finally`: stop everything

    signal.signal(signal.SIGTERM, terminate)
    kills = 0
    try:
        run.start()
        kills = run.chaos()
        run.note("run", "chaos over", f"{kills} kills")
        drained = run.drain()
        result = report(run, kills, drained)
    finally:
        run.stop()
        (directory / "events.json").write_text(
            json.dumps(
                {
                    "clock": {"wall": run.clock.wall, "monotonic": run.clock.monotonic},
                    "events": [e.__dict__ for e in run.events],
                },
                indent=1,
            )
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"  logs and events: {directory}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
