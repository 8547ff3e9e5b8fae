"""The installed `riverbed` script in real processes: stdin and stdout pipes,
exit codes, a reader that goes away (`| head`), and SIGINT/SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.subscriptions import Subscriptions

RIVERBED = str(Path(sys.executable).with_name("riverbed"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `riverbed` process whose database is in `tmp_path`."""
    return os.environ | {"RIVERBED_DB": f"sqlite:///{tmp_path}/x.db"}


def run(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RIVERBED, *args], input=stdin, env=env, capture_output=True, text=True, timeout=60
    )


def committed(env: dict[str, str], name: str) -> int:
    with Log.open(env["RIVERBED_DB"]) as log:
        return sum(s.committed for s in Subscriptions(log.storage).lag(name))


def produce(env: dict[str, str], count: int, payload: str = "x", start: int = 0) -> None:
    with Log.open(env["RIVERBED_DB"]) as log:
        log.produce(
            "orders",
            [Message(f"{start + i}:{payload}".encode(), key=f"k{i % 3}") for i in range(count)],
        )


def test_pipes_and_exit_codes(env: dict[str, str]) -> None:
    assert run(env, "topic", "create", "orders", "--partitions", "2").returncode == 0
    good = "".join(json.dumps({"key": "a", "payload": f"m{i}"}) + "\n" for i in range(3))
    produced = run(env, "produce", "orders", "--print-positions", stdin=good)
    assert produced.returncode == 0, produced.stderr
    assert len(produced.stdout.splitlines()) == 3
    assert "produced 3 messages" in produced.stderr

    bad = run(env, "produce", "orders", stdin=good + '{"payload": "x", "qos": 5}\n')
    assert bad.returncode == 2
    assert bad.stderr == "error: line 4: qos 5 is not 0, 1 or 2\n"

    assert run(env, "subscription", "create", "s", "--topic", "orders").returncode == 0
    consumed = run(env, "consume", "s")
    assert consumed.returncode == 0
    assert [json.loads(line)["payload"] for line in consumed.stdout.splitlines()] == [
        "m0",
        "m1",
        "m2",
    ]
    assert run(env, "consume", "s").stdout == ""

    missing = run(env, "consume", "nope")
    assert (missing.returncode, missing.stderr) == (
        1,
        "error: subscription 'nope' does not exist\n",
    )
    usage = run(env, "topic", "create", "x")
    assert usage.returncode == 2 and "Missing option '--partitions'" in usage.stderr
    for result in (bad, missing, usage):
        assert "Traceback" not in result.stderr


def test_a_reader_that_goes_away_gets_no_traceback_and_no_unprinted_commit(
    env: dict[str, str],
) -> None:
    """`riverbed consume s | head -1`: output far beyond a pipe's buffer."""
    assert run(env, "topic", "create", "orders", "--partitions", "4").returncode == 0
    total = 3000
    produce(env, total, payload="y" * 300)
    assert run(env, "subscription", "create", "s", "--topic", "orders").returncode == 0
    process = subprocess.Popen(
        [RIVERBED, "consume", "s", "--batch", "100"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    assert json.loads(process.stdout.readline())["stream"].startswith("orders/0/")
    process.stdout.close()
    assert process.wait(timeout=60) == 0
    stderr = process.stderr.read()
    process.stderr.close()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    done = committed(env, "s")
    # Only whole batches that were written out before the pipe broke.
    assert 0 < done < total and done % 100 == 0
    assert f"consumed {done} messages" in stderr


class _Lines:
    """Lines of a process's output, read by a thread (so the test can time out)."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    def get(self) -> dict[str, object]:
        message: dict[str, object] = json.loads(self._queue.get(timeout=20))
        return message

    def join(self) -> None:
        self._thread.join(timeout=20)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_follow_stops_cleanly_on_a_signal(env: dict[str, str], signum: int) -> None:
    assert run(env, "topic", "create", "orders", "--partitions", "2").returncode == 0
    assert run(env, "subscription", "create", "s", "--topic", "orders").returncode == 0
    produce(env, 5)
    with subprocess.Popen(
        [RIVERBED, "consume", "s", "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        lines = _Lines(process.stdout)
        try:
            got = [lines.get() for _ in range(5)]
            produce(env, 3, start=5)  # written while it waits: it must pick them up
            got += [lines.get() for _ in range(3)]
            process.send_signal(signum)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            lines.join()
        stderr = process.stderr.read()
    assert sorted(int(str(m["payload"]).split(":")[0]) for m in got) == list(range(8))
    assert "Traceback" not in stderr and "consumed 8 messages" in stderr
    assert committed(env, "s") == 8
