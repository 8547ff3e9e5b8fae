"""Spark beyond one process, for tests: a standalone cluster and a Spark Connect
server, started from pyspark's own distribution on loopback.

`SparkCluster().start()` runs a master (`spark-class ...deploy.master.Master`)
and two workers (`...deploy.worker.Worker`, one core and 512 MB each) on free
127.0.0.1 ports and waits until the master lists both workers alive;
`master_url` is what `riverbed.spark.session(master)` and `riverbed
subscription run --master` take. `kill_worker(i)` SIGKILLs a worker with its
executor and Python workers (a machine lost). `ConnectServer().start()` runs the
Spark Connect server (`sbin/start-connect-server.sh --wait`, on `local[2]`
unless given a master) and exposes `remote_url` (`sc://127.0.0.1:PORT`).

Every process runs in a process group of its own, started here, and is stopped
by that group's id. Every address is 127.0.0.1 (`SPARK_LOCAL_IP`): Spark binds
to the machine's first non-loopback address otherwise. Python workers run this
interpreter; the environment (`PYTHONPATH` included) is passed down, so
executors import the Riverbed under test unless a test ships its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar

from harness.ci import in_ci
from harness.net import free_port, wait_listening
from harness.waiting import SLOW, eventually

LOOPBACK = "127.0.0.1"

START_TIMEOUT = 180.0 * SLOW
"""Seconds a JVM may take to start on a machine whose cores are busy."""

DRIVER_SETTINGS = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
}
"""What a driver talking to the test cluster needs so that it stays on loopback."""


class SparkUnavailable(RuntimeError):
    """The cluster or server could not start (no pyspark or no JVM)."""


def spark_home() -> Path:
    """pyspark's distribution: `bin/spark-class`, `sbin/`, `jars/`."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkUnavailable(f"pyspark is not installed: {exc}") from None
    return Path(pyspark.__file__).parent


def spark_env(work: Path) -> dict[str, str]:
    """The environment every Spark process gets: loopback, this interpreter,
    logs and scratch space in `work`."""
    home = spark_home()
    return {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work),
        "SPARK_WORKER_DIR": str(work / "workers"),
        "SPARK_LOCAL_DIRS": str(work / "scratch"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The master's and workers' JVMs as the drivers' (tests/conftest.py).
        "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", ""),
    }


class _Process:
    """One JVM in its own process group, its output in a log file."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process group this harness started (the JVM, its
        executors and Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=20)
        self.kill(signal.SIGKILL)  # whatever of the group is left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=20)


class SparkCluster:
    """A standalone master and `workers` workers on loopback."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "512m") -> None:
        self.worker_count = workers
        self.cores = cores
        self.memory = memory
        self.work = Path(tempfile.mkdtemp(prefix="riverbed-spark-cluster-"))
        self.port = 0
        self.ui_port = 0
        self.master: _Process | None = None
        self.workers: list[_Process] = []

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def _class(self, main: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main, *args]

    def start(self) -> SparkCluster:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise SparkUnavailable("no JVM: java is not on PATH and JAVA_HOME is not set")
        env = spark_env(self.work)
        for sub in ("logs", "workers", "scratch"):
            (self.work / sub).mkdir(exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self.master = _Process(
            "the Spark master",
            self._class(
                "org.apache.spark.deploy.master.Master",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ),
            env,
            self.work / "master.log",
        )
        try:
            master = self.master
            wait_listening(
                master.popen, self.port, START_TIMEOUT, master.name, master.tail, master.stop
            )
            for i in range(self.worker_count):
                self.workers.append(self._worker(i, env))
            eventually(
                lambda: self.alive_workers() >= self.worker_count,
                START_TIMEOUT,
                f"{self.worker_count} Spark workers registered with the master",
                interval=0.5,
                explain=lambda: "\n".join(w.tail(1500) for w in self.workers),
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _worker(self, i: int, env: dict[str, str]) -> _Process:
        return _Process(
            f"Spark worker {i}",
            self._class(
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                LOOPBACK,
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.work / "workers" / str(i)),
                self.master_url,
            ),
            env,
            self.work / f"worker-{i}.log",
        )

    def status(self) -> dict[str, object]:
        """The master's own account (its web UI's JSON): workers, apps.
        `OSError` while the UI is not up, or answers with an empty or
        partial body (seen while the master starts on a busy machine)."""
        url = f"http://{LOOPBACK}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
        try:
            status: dict[str, object] = json.loads(body)
        except ValueError as exc:
            raise OSError(f"the Spark master's UI answered {body[:200]!r}: {exc}") from exc
        return status

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except OSError:
            return 0
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def running_executors(self) -> int:
        """Executors of running applications, as the master counts them."""
        try:
            apps = self.status().get("activeapps", [])
        except OSError:
            return 0
        assert isinstance(apps, list)
        return sum(int(a.get("cores", 0)) for a in apps)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker `i`'s process group: the worker, its executor and
        the executor's Python workers, as if its machine went away."""
        worker = self.workers[i]
        worker.kill()
        worker.popen.wait(timeout=30)

    def logs(self) -> str:
        parts = [self.master.tail()] if self.master else []
        parts += [w.tail() for w in self.workers]
        return "\n".join(parts)

    def stop(self) -> None:
        for process in [*self.workers, *([self.master] if self.master else [])]:
            process.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ConnectServer:
    """A Spark Connect server (pyspark's `sbin/start-connect-server.sh --wait`)."""

    def __init__(self, master: str = "local[2]") -> None:
        self.master = master
        self.work = Path(tempfile.mkdtemp(prefix="riverbed-spark-connect-"))
        self.port = 0
        self.process: _Process | None = None

    @property
    def remote_url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self) -> ConnectServer:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise SparkUnavailable("no JVM: java is not on PATH and JAVA_HOME is not set")
        env = spark_env(self.work)
        for sub in ("logs", "scratch"):
            (self.work / sub).mkdir(exist_ok=True)
        self.port = free_port()
        settings = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            **DRIVER_SETTINGS,
        }
        command = [
            str(spark_home() / "sbin" / "start-connect-server.sh"),
            "--wait",
            "--master",
            self.master,
        ]
        for name, value in settings.items():
            command += ["--conf", f"{name}={value}"]
        self.process = _Process("the Spark Connect server", command, env, self.work / "connect.log")
        p = self.process
        try:
            wait_listening(p.popen, self.port, START_TIMEOUT, p.name, p.tail, p.stop)
        except BaseException:
            self.stop()
            raise
        return self

    def logs(self) -> str:
        return self.process.tail() if self.process else ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Server(Protocol):
    def start(self) -> Self: ...
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)


def serving(server: S, what: str) -> Iterator[S]:
    """A module fixture's body: start `server`, yield it, stop it. If it cannot
    start, its tests fail in CI (never skip there) and are skipped elsewhere."""
    import pytest

    try:
        started = server.start()
    except Exception as exc:
        message = f"{what} could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield started
    finally:
        started.stop()
