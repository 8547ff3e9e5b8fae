"""A test process that dies without its teardown leaves no PostgreSQL server
behind (harness/postgres.py, the reaper)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ci import in_ci
from harness.postgres import PostgresServer, _start_reaper
from harness.waiting import eventually

TESTS_DIR = Path(__file__).parents[1]

SERVER = """
import sys
from harness.postgres import PostgresServer, PostgresUnavailable
server = PostgresServer()
try:
    server.start()
except PostgresUnavailable as exc:
    print("unavailable", exc, flush=True)
    sys.exit(0)
print(server._dir, server.pids()[0], flush=True)
sys.stdin.read()
"""
"""A test process with a server: prints its directory and postmaster's pid,
then waits to be killed."""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.postgres
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_server_outliving_its_test_process_is_stopped_and_removed(how: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    with subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    ) as child:
        assert child.stdout is not None
        words = child.stdout.readline().decode().split()
        if not words or words[0] == "unavailable":
            message = f"PostgreSQL could not start: {' '.join(words[1:])}"
            child.kill()
            if in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        directory, postmaster = Path(words[0]), int(words[1])
        assert directory.is_dir() and _alive(postmaster)
        child.send_signal(how)  # no teardown, no atexit
        child.wait(timeout=60)
    eventually(lambda: not _alive(postmaster), what=f"the postmaster {postmaster} to stop")
    eventually(lambda: not directory.exists(), what=f"{directory} to be removed")


@pytest.mark.postgres
def test_a_server_stopped_by_its_test_is_left_to_it(postgres_server: PostgresServer) -> None:
    # The session's server runs; a second one stopped as a test stops it: its
    # reaper has nothing left to do and exits.
    server = PostgresServer()
    server.start()
    reaper = server._reaper
    assert reaper is not None and reaper.poll() is None
    directory = server._dir
    server.stop()
    assert reaper.poll() == 0
    assert directory is not None and not directory.exists()
    assert postgres_server.url  # untouched


def _stale_pid_file(data: Path, pid: int) -> None:
    """A `postmaster.pid` left by a server that died, its pid since given to `pid`."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "postmaster.pid").write_text(f"{pid}\n{data}\n")


def test_a_reaper_never_signals_a_process_that_took_a_stale_pid(tmp_path: Path) -> None:
    directory = tmp_path / "server"
    with subprocess.Popen(["sleep", "600"]) as bystander:
        try:
            _stale_pid_file(directory / "data", bystander.pid)
            reaper = _start_reaper(directory)
            assert reaper.stdin is not None
            reaper.stdin.close()  # the test process is gone, as far as it knows
            assert reaper.wait(timeout=60) == 0
            assert not directory.exists()
            assert bystander.poll() is None, "the reaper signalled a process not its server's"
        finally:
            bystander.kill()


@pytest.mark.postgres
def test_stopping_a_server_never_signals_a_process_that_took_a_stale_pid() -> None:
    server = PostgresServer()
    server.start()
    server.halt()  # the postmaster is gone; its pid file is written again below
    data = server._data
    with subprocess.Popen(["sleep", "600"]) as bystander:
        try:
            _stale_pid_file(data, bystander.pid)
            server.stop()
            assert not data.exists()
            assert bystander.poll() is None, "stop() signalled a process not its server's"
        finally:
            bystander.kill()
