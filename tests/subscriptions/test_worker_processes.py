"""Competing consumers as processes (`riverbed worker`), on both backends: the
work is shared, no stream is handled by two processes at once, a SIGKILLed
worker's streams move to the others with nothing lost, and an exactly-once
handler killed at random points leaves each message's effect exactly once.

The handlers live in a module written to the test's directory; each call
appends "enter" and "exit" lines (stream, pid, monotonic ns, offsets, payloads)
to one file with single O_APPEND writes, which is what the observer reads.
CLOCK_MONOTONIC is one clock for every process on the machine.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.waiting import SLOW, eventually
from riverbed.cli import cli
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import Storage
from riverbed.storage.transactions import transaction
from riverbed.subscriptions import Subscriptions

HANDLERS = """
import os, time

OUT = os.environ.get("RB_TEST_OUT", "calls.txt")
PAUSE = float(os.environ.get("RB_TEST_PAUSE", "0"))


def _line(kind, batch, enter):
    offsets = ",".join(str(m.offset) for m in batch.messages)
    payloads = ",".join(m.payload.decode() for m in batch.messages)
    now = time.monotonic_ns()
    text = f"{kind} {batch.stream} {os.getpid()} {enter} {now} {offsets} {payloads}\\n"
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def record(batch):
    enter = time.monotonic_ns()
    _line("enter", batch, enter)
    time.sleep(PAUSE)  # the scenario: a handler's work takes time
    _line("exit", batch, enter)


def effect(batch):
    enter = time.monotonic_ns()
    _line("enter", batch, enter)
    batch.tx.executemany(
        "INSERT INTO effects (stream, off, payload) VALUES (?, ?, ?)",
        [(str(batch.stream), m.offset, m.payload.decode()) for m in batch.messages],
    )
    time.sleep(PAUSE)  # the scenario: a handler's work takes time
    _line("exit", batch, enter)
"""


@dataclass(frozen=True)
class Call:
    kind: str
    stream: str
    pid: int
    enter: int
    exit: int
    offsets: list[int]
    payloads: list[str]


def read_calls(path: Path) -> list[Call]:
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        kind, stream, pid, enter, leave, offsets, payloads = line.split(" ")
        calls.append(
            Call(
                kind,
                stream,
                int(pid),
                int(enter),
                int(leave),
                [int(o) for o in offsets.split(",")],
                payloads.split(","),
            )
        )
    return calls


def check_no_overlap(calls: list[Call]) -> None:
    """Completed calls of one stream never overlap in time."""
    by_stream: dict[str, list[Call]] = {}
    for call in calls:
        if call.kind == "exit":
            by_stream.setdefault(call.stream, []).append(call)
    for stream, done in by_stream.items():
        done.sort(key=lambda c: c.enter)
        for before, after in itertools.pairwise(done):
            assert after.enter >= before.exit, (
                f"{stream} handled by {before.pid} and {after.pid} at once"
            )


def check_order(calls: list[Call]) -> None:
    """Per stream, in time order, a batch starts at or before where the batches
    before it ended (a redelivery), never past it (a gap), and is consecutive."""
    by_stream: dict[str, list[Call]] = {}
    for call in calls:
        if call.kind == "exit":
            by_stream.setdefault(call.stream, []).append(call)
    for stream, done in by_stream.items():
        done.sort(key=lambda c: c.enter)
        reached = done[0].offsets[0]
        for call in done:
            assert call.offsets == list(range(call.offsets[0], call.offsets[-1] + 1)), stream
            assert call.offsets[0] <= reached, f"{stream}: a gap before offset {call.offsets[0]}"
            reached = max(reached, call.offsets[-1] + 1)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "rb_test_handlers.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def log(storage: Storage) -> Iterator[Log]:
    opened = Log(storage)
    try:
        yield opened
    finally:
        opened.appender.close()


def setup(log: Log, messages: int, partitions: int = 8, keys: int = 100) -> None:
    log.topics.create("t", partitions)
    Subscriptions(log.storage).create("s", "t")
    log.produce("t", [Message(b"%d" % i, key=f"k{i % keys}") for i in range(messages)])


def start_worker(
    url: str, project: Path, handler: str, *args: str, pause: float = 0.0
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RB_TEST_OUT=str(project / "calls.txt"), RB_TEST_PAUSE=str(pause))
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack (`stop`)
    with open(project / "workers.err", "ab") as err:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli", "worker", "s", "--handler",
             f"rb_test_handlers:{handler}", "--db", url, "--poll-interval", "0.1", *args],
            cwd=project,
            env=env,
            stderr=err,
        )  # fmt: skip
    _errors[proc.pid] = project / "workers.err"
    return proc


_errors: dict[int, Path] = {}
"""Where each worker started here writes its stderr, by pid."""


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, and the exit code; a worker still running 30 s later is a
    hang: its stacks (and its children's) go into the failure."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30 * SLOW)
    except subprocess.TimeoutExpired:
        for pid in [*_children(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        errors = _errors.get(proc.pid)
        told = errors.read_text(errors="replace")[-20_000:] if errors else "(no stderr file)"
        raise AssertionError(
            f"worker {proc.pid} still running 30 s after SIGTERM; its stderr:\n{told}"
        ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def all_seen(project: Path, total: int) -> bool:
    seen = {p for c in read_calls(project / "calls.txt") if c.kind == "exit" for p in c.payloads}
    return len(seen) >= total


def caught_up(storage: Storage) -> bool:
    return all(s.lag == 0 for s in Subscriptions(storage).lag("s"))


# --------------------------------------------------------------------- tests


def test_worker_processes_share_the_streams_one_at_a_time(
    storage: Storage, storage_url: str, log: Log, project: Path
) -> None:
    total = 1500
    setup(log, total)
    parent = start_worker(storage_url, project, "record", "--processes", "3",
                          "--batch-size", "10", pause=0.003)  # fmt: skip
    try:
        eventually(
            lambda: all_seen(project, total) and caught_up(storage),
            120,
            "all messages",
            interval=0.05,
        )
    finally:
        code = stop(parent)
    assert code == 0, (project / "workers.err").read_text()
    calls = read_calls(project / "calls.txt")
    done = [c for c in calls if c.kind == "exit"]
    payloads = [p for c in done for p in c.payloads]
    assert sorted(payloads, key=int) == [str(i) for i in range(total)]  # once each
    check_no_overlap(calls)
    check_order(calls)
    assert len({c.pid for c in done}) >= 2, "one process did all the work"


def test_sigkill_of_a_worker_mid_batch_loses_nothing(
    storage: Storage, storage_url: str, log: Log, project: Path
) -> None:
    total = 800
    setup(log, total)
    # The victim's handler is slow (2 s a batch): once it has entered a batch it
    # is still in it when the SIGKILL comes, however busy the machine.
    workers = [
        start_worker(storage_url, project, "record", "--batch-size", "10", pause=pause)
        for pause in (2.0, 0.05, 0.05)
    ]
    victim = workers[0]
    try:

        def victim_mid_batch() -> bool:
            mine = [c for c in read_calls(project / "calls.txt") if c.pid == victim.pid]
            return bool(mine) and mine[-1].kind == "enter"

        eventually(victim_mid_batch, 60, "the victim to start a batch", interval=0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        # The victim's locks lapse first (their lease, 15 s, on SQLite).
        eventually(
            lambda: all_seen(project, total) and caught_up(storage),
            120,
            "the survivors",
            interval=0.05,
        )
    finally:
        codes = [stop(w) for w in workers[1:]]
        stop(victim)
    assert codes == [0, 0], (project / "workers.err").read_text()
    calls = read_calls(project / "calls.txt")
    unfinished = [c for c in calls if c.pid == victim.pid][-1]
    assert unfinished.kind == "enter"
    finished_by_others = {
        p for c in calls if c.kind == "exit" and c.pid != victim.pid for p in c.payloads
    }
    assert set(unfinished.payloads) <= finished_by_others  # its batch was taken over
    seen = {p for c in calls if c.kind == "exit" for p in c.payloads}
    assert seen == {str(i) for i in range(total)}
    check_no_overlap(calls)
    check_order(calls)


def test_exactly_once_handler_killed_at_random_points(
    storage: Storage, storage_url: str, log: Log, project: Path
) -> None:
    total = 1000
    setup(log, total)
    with transaction(storage) as tx:
        tx.execute("CREATE TABLE effects (stream TEXT, off INTEGER, payload TEXT)")
    rng = random.Random(6)
    args = ("--exactly-once", "--batch-size", "10")
    workers = [start_worker(storage_url, project, "effect", *args, pause=0.02) for _ in range(2)]

    def effects() -> int:
        with transaction(storage) as tx:
            return int(tx.execute("SELECT COUNT(*) FROM effects").fetchone()[0])

    # Five kills, each once the effects pass another sixth of the messages, a
    # random moment later, of a random worker; it is restarted at once.
    kills = 0
    try:
        for threshold in range(1, 6):
            eventually(
                lambda: effects() >= threshold * total // 6,  # noqa: B023 (called at once)
                120,
                f"the workers to get past {threshold}/6 of the messages",
                interval=0.01,
            )
            time.sleep(rng.uniform(0, 0.05))  # the scenario: a random moment
            index = rng.randrange(len(workers))
            workers[index].send_signal(signal.SIGKILL)
            workers[index].wait(timeout=30)
            kills += 1
            workers[index] = start_worker(storage_url, project, "effect", *args, pause=0.02)
        eventually(lambda: caught_up(storage), 120, "the workers to finish", interval=0.05)
    finally:
        for w in workers:
            stop(w)
    assert kills == 5
    with transaction(storage) as tx:
        rows = tx.execute("SELECT stream, off, payload FROM effects").fetchall()
    payloads = sorted((str(p) for _, _, p in rows), key=int)
    assert payloads == [str(i) for i in range(total)], "an effect is missing or doubled"
    assert len({(s, o) for s, o, _ in rows}) == total
    calls = read_calls(project / "calls.txt")
    check_no_overlap(calls)


# --------------------------------------------------------------------- the command line


def test_worker_command_refuses_bad_input_with_exit_code_2(
    sqlite_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Log.open(sqlite_url) as log:
        log.topics.create("t", 1)
        Subscriptions(log.storage).create("s", "t")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the cwd on it

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["worker", *args, "--db", sqlite_url])
        return result.exit_code, result.stderr

    code, err = run("nope", "--handler", "rb_test_handlers:record")
    assert code == 2 and "subscription 'nope' does not exist" in err
    code, err = run("s", "--handler", "rb_test_handlers")
    assert code == 2 and "'rb_test_handlers' is not MODULE:FUNCTION" in err
    code, err = run("s", "--handler", "rb_test_handlers:nothing")
    assert code == 2 and "has no attribute 'nothing'" in err
    code, err = run("s", "--handler", "rb_test_handlers:record", "--batch-size", "0")
    assert code == 2 and "0 is not in the range x>=1" in err
    code, err = run("s", "--handler", "rb_test_handlers:record", "--processes", "0")
    assert code == 2 and "--processes" in err
    code, err = run("s", "--handler", "rb_test_handlers:record", "--on-error", "ignore")
    assert code == 2 and "'ignore' is not one of 'stop', 'retry', 'skip'" in err
    code, err = run("s", "--handler", "rb_test_handlers:record", "--max-attempts", "3")
    assert code == 2 and "applies to --on-error retry only" in err


def test_worker_command_exits_1_when_the_handler_fails_with_on_error_stop(
    sqlite_url: str, project: Path
) -> None:
    (project / "rb_test_failing.py").write_text("def fail(batch):\n    raise ValueError('bad')\n")
    with Log.open(sqlite_url) as log:
        log.topics.create("t", 1)
        Subscriptions(log.storage).create("s", "t")
        log.produce("t", [Message(b"x", key="k")])
    proc = subprocess.run(
        [sys.executable, "-m", "riverbed.cli", "worker", "s", "--handler", "rb_test_failing:fail",
         "--db", sqlite_url],
        cwd=project, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "ValueError('bad')" in proc.stderr and "t/0/0 offsets 0-0" in proc.stderr
