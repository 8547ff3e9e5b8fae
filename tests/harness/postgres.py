"""A throwaway PostgreSQL server for tests.

`PostgresServer().start()` runs `initdb` in a fresh temporary directory, starts
the server on a free loopback port (TCP on 127.0.0.1 only, its unix socket in
that directory), creates the database `riverbed` and exposes its URL;
`new_database(name)` makes another empty database, so each test can have a clean
one in a few milliseconds. `stop()` shuts the server down and deletes the
directory; `halt()` and `resume()` stop it and start it again on the same port
and data (a server restart, or an outage, as clients see it).

Debian keeps the server binaries under `/usr/lib/postgresql/<version>/bin`
(DESIGN.md, "Facts about this machine"); set `RIVERBED_PG_BIN` to use others.
`initdb` refuses to run as root, so as root every server command runs as the
`postgres` OS user (`runuser -u postgres --`) in a directory that user owns.

A server outlives a test process that dies without its teardown (SIGTERM from
`timeout`, SIGKILL), its postmaster reparented to init and its directory left
in `/dev/shm`. So each server has a reaper: a small process in a session of its
own, which reads a pipe from the test process and, once the pipe closes without
a word (the test process is gone), stops the server and deletes its directory.
`stop()` tells it first that there is nothing left to do. Neither signals the
pid in `postmaster.pid` unless that process is the directory's server (its
command line names the directory): a server that died without removing the
file leaves a pid the kernel may since have given to any other process.

Durability settings are for speed: `fsync=off` and `synchronous_commit=off` are
fine because tests that kill a process with SIGKILL kill a *client*, never this
server.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psycopg

from harness.net import free_port

BIN_ENV = "RIVERBED_PG_BIN"
"""Directory of `initdb`, `pg_ctl` and `postgres`, if not Debian's newest."""

OS_USER = "postgres"
"""The OS user that runs the server when the tests run as root."""

TMPFS_MINIMUM = 1 << 30
"""Free bytes /dev/shm needs for the server to live there."""

_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Small shared memory: Docker's /dev/shm is 64 MB.
    "shared_buffers": "32MB",
    "dynamic_shared_memory_type": "mmap",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %d '",
}


class PostgresUnavailable(RuntimeError):
    """The server could not be started; the message says why."""


def find_bindir() -> Path:
    """`RIVERBED_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin`, else PATH."""
    configured = os.environ.get(BIN_ENV)
    if configured:
        if not (Path(configured) / "initdb").exists():
            raise PostgresUnavailable(f"{BIN_ENV}={configured!r} has no initdb")
        return Path(configured)
    candidates = []
    for initdb in Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        version = initdb.parent.parent.name
        if version.isdigit():
            candidates.append((int(version), initdb.parent))
    if candidates:
        return max(candidates)[1]
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise PostgresUnavailable(
        "no PostgreSQL server binaries: none under /usr/lib/postgresql/*/bin, no initdb on"
        f" PATH and {BIN_ENV} unset (apt-get install postgresql)"
    )


def _world_traversable(path: str) -> bool:
    """Can every user enter this directory (the `postgres` user must)?"""
    current = Path(path).resolve()
    return all(directory.stat().st_mode & 0o001 for directory in (current, *current.parents))


class PostgresServer:
    """One PostgreSQL server in a temporary directory; see the module docstring."""

    def __init__(
        self,
        bindir: Path | None = None,
        database: str = "riverbed",
        settings: dict[str, str] | None = None,
        on_disk: bool = False,
    ) -> None:
        """`settings` override the test defaults and `on_disk` keeps the cluster off
        tmpfs: what a benchmark with durability on needs."""
        self._settings = {**_SETTINGS, **(settings or {})}
        self._on_disk = on_disk
        self._bindir = bindir
        self._database = database
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self._admin: psycopg.Connection[tuple[object, ...]] | None = None
        self._as_postgres = os.geteuid() == 0
        self._discarded: list[str] = []
        self._reaper: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""
        """URL of the database `riverbed` (empty until started)."""

    # --- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """initdb, start, create the database; raises `PostgresUnavailable`."""
        if self._dir is not None:
            raise RuntimeError("the server is started already")
        bindir = self._bindir or find_bindir()
        self._bindir = bindir
        self._dir = Path(tempfile.mkdtemp(prefix="riverbed-pg-", dir=self._base_directory()))
        atexit.register(self.stop)
        try:
            if self._as_postgres:
                try:
                    user = pwd.getpwnam(OS_USER)
                except KeyError:
                    raise PostgresUnavailable(
                        f"running as root needs the OS user {OS_USER!r} to run initdb"
                    ) from None
                os.chown(self._dir, user.pw_uid, user.pw_gid)
            self._reaper = _start_reaper(self._dir)
            self._initdb(bindir)
            self._start_server(bindir)
            self._admin = psycopg.connect(self._url("postgres"), autocommit=True)
            self._admin.execute(f"CREATE DATABASE {self._database}")
            self.url = self._url(self._database)
        except BaseException:
            self.stop()
            raise

    def _base_directory(self) -> str:
        # Creating a database creates some 300 files: on tmpfs that takes 10 ms,
        # on this machine's disk 100-300 ms. Docker's default /dev/shm (64 MB) is
        # too small for a cluster, hence the size check.
        shm = "/dev/shm"
        try:
            if self._on_disk:
                raise OSError("asked for a cluster on disk")
            stats = os.statvfs(shm)
            if stats.f_bavail * stats.f_frsize >= TMPFS_MINIMUM and _world_traversable(shm):
                return shm
        except OSError:
            pass
        base = tempfile.gettempdir()
        if self._as_postgres and not _world_traversable(base):
            base = "/tmp"
        return base

    def _initdb(self, bindir: Path) -> None:
        initdb = [
            str(bindir / "initdb"),
            "--pgdata",
            str(self._data),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
            "--no-instructions",
        ]
        try:
            # A natural-language collation, as production servers usually have: the
            # storage must not depend on the database's default collation for order.
            self._run([*initdb, "--locale-provider", "icu", "--icu-locale", "en-US"], 120)
        except PostgresUnavailable:
            # A server built without ICU (or older than 15): plain C collation.
            shutil.rmtree(self._data, ignore_errors=True)
            self._run(initdb, timeout=120)

    def _start_server(self, bindir: Path) -> None:
        # The port is free when we look but may be taken before the server binds
        # it: try a few.
        failure = ""
        for _ in range(3):
            self.port = free_port()
            settings = {
                **self._settings,
                "port": str(self.port),
                "unix_socket_directories": f"'{self._dir}'",
            }
            with (self._data / "postgresql.auto.conf").open("a") as conf:
                for name, value in settings.items():
                    conf.write(f"{name} = {value}\n")
            try:
                self._run(
                    [
                        str(bindir / "pg_ctl"),
                        "start",
                        "--pgdata",
                        str(self._data),
                        "--log",
                        str(self._log),
                        "--wait",
                        "--timeout",
                        "60",
                    ],
                    timeout=90,
                )
                return
            except PostgresUnavailable as exc:
                failure = str(exc)
                if "could not bind" not in self._log_tail():
                    break
        raise PostgresUnavailable(failure)

    def stop(self) -> None:
        """Stop the server (immediately: nothing in it is worth keeping) and
        delete its directory. Safe to call twice."""
        with self._lock:
            directory, self._dir = self._dir, None
            admin, self._admin = self._admin, None
        if directory is None:
            return
        atexit.unregister(self.stop)
        if admin is not None:
            with contextlib.suppress(psycopg.Error):
                admin.close()
        data = directory / "data"
        if our_postmaster(data) is None:
            # Not running (or the file is stale): nothing to stop, and pg_ctl
            # would signal whatever process has that pid now.
            with contextlib.suppress(OSError):
                (data / "postmaster.pid").unlink()
        elif self._bindir is not None:
            try:
                pg_ctl = str(self._bindir / "pg_ctl")
                stop = [pg_ctl, "stop", "--pgdata", str(data), "--mode", "immediate", "--wait"]
                self._run(stop, timeout=60, cwd=directory)
            except PostgresUnavailable:
                self._kill_postmaster(data)
        shutil.rmtree(directory, ignore_errors=True)
        self.url = ""
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            _dismiss(reaper)

    def halt(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected), keeping its
        data and port for `resume`."""
        assert self._dir is not None and self._bindir is not None, "not started"
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(psycopg.Error):
                admin.close()
        pg_ctl = str(self._bindir / "pg_ctl")
        self._run([pg_ctl, "stop", "--pgdata", str(self._data), "--mode", "fast", "--wait"], 60)

    def resume(self) -> None:
        """Start a server that `halt` stopped, on the same port and data."""
        assert self._dir is not None and self._bindir is not None, "not started"
        pg_ctl = str(self._bindir / "pg_ctl")
        start = [pg_ctl, "start", "--pgdata", str(self._data), "--log", str(self._log)]
        self._run([*start, "--wait", "--timeout", "60"], timeout=90)
        admin = psycopg.connect(self._url("postgres"), autocommit=True)
        with self._lock:
            self._admin = admin

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- databases ------------------------------------------------------------
    def new_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        self._check_name(name)
        self._drop_discarded()
        self._admin_execute(f"CREATE DATABASE {name}")
        return self._url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database now, disconnecting whoever is still connected."""
        self._check_name(name)
        self._admin_execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def discard_database(self, name: str) -> None:
        """Drop a database soon: before the next `new_database` (or never, if the
        server stops first).

        Dropping right after the last client disconnected costs 100 ms, because
        PostgreSQL polls every 100 ms for the database's backends to exit; a
        moment later they are gone and the drop takes a few milliseconds.
        """
        self._check_name(name)
        with self._lock:
            self._discarded.append(name)

    def _drop_discarded(self) -> None:
        with self._lock:
            names, self._discarded = self._discarded, []
        for name in names:
            self.drop_database(name)

    def _check_name(self, name: str) -> None:
        if not _DATABASE_NAME.fullmatch(name):
            raise ValueError(f"database name {name!r} is not [a-z_][a-z0-9_]*, at most 63")

    def _admin_execute(self, sql: str) -> None:
        with self._lock:
            if self._admin is None:
                raise RuntimeError("the server is not running")
            self._admin.execute(sql.encode())

    # --- plumbing -------------------------------------------------------------
    @property
    def _data(self) -> Path:
        assert self._dir is not None
        return self._dir / "data"

    @property
    def _log(self) -> Path:
        assert self._dir is not None
        return self._dir / "server.log"

    def _url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _run(self, argv: Sequence[str], timeout: float, cwd: Path | None = None) -> None:
        command = list(argv)
        if self._as_postgres:
            command = ["runuser", "-u", OS_USER, "--", *command]
        try:
            result = subprocess.run(
                command,
                cwd=cwd or self._dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresUnavailable(f"{Path(argv[0]).name} failed: {exc}") from exc
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise PostgresUnavailable(
                f"{Path(argv[0]).name} exited with {result.returncode}: {output}\n"
                f"server log:\n{self._log_tail()}"
            )

    def pids(self) -> list[int]:
        """The server's processes: the postmaster and its children (to SIGSTOP a
        server that then neither answers nor refuses, like a hung host)."""
        postmaster = our_postmaster(self._data)
        assert postmaster is not None, "the server is not running"
        out = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
                if int(stat.read_text().rpartition(")")[2].split()[1]) == postmaster:
                    out.append(int(stat.parent.name))
        return out

    def _kill_postmaster(self, data: Path) -> None:
        pid = our_postmaster(data)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def our_postmaster(data: Path) -> int | None:
    """The pid in `data`'s `postmaster.pid` if that process is the server of
    `data` (its command line names the directory); None otherwise. A server
    that died without removing the file leaves a pid the kernel may have given
    to some other process since: that one is never signalled."""
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    return pid if os.fsencode(str(data)) in argv else None


# --------------------------------------------------------------------- the reaper

_REAPER = """
import os, shutil, signal, sys, time
directory = sys.argv[1]
word = sys.stdin.buffer.read()  # until the test process closes the pipe, or dies
if word != b"done":
    data = os.path.join(directory, "data")
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            pid = int(f.readline())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if os.fsencode(data) not in f.read().split(b"\\0"):
                raise ValueError("a stale pid: not this directory's server")
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
"""
"""Stops the server in `directory` and deletes it unless told `done` first."""


def _start_reaper(directory: Path) -> subprocess.Popen[bytes]:
    """The reaper of the server in `directory` (see the module docstring): in a
    session of its own, so a signal to the test's process group spares it."""
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _dismiss(reaper: subprocess.Popen[bytes]) -> None:
    """Tell a reaper its server is stopped and gone: it exits doing nothing."""
    assert reaper.stdin is not None
    with contextlib.suppress(OSError):
        reaper.stdin.write(b"done")
        reaper.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        reaper.wait(timeout=30)


# --------------------------------------------------------------------- clients of a database

_OTHER_CLIENTS = (
    "FROM pg_stat_activity WHERE datname = current_database()"
    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


def terminate_connections(url: str) -> int:
    """Terminate every client connection to `url`'s database, as an administrator's
    `pg_terminate_backend` or a server restart would; return how many.

    Waits (up to 5 s each) until they are gone, so the clients' next statement
    fails for certain."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(f"SELECT pg_terminate_backend(pid, 5000) {_OTHER_CLIENTS}").fetchall()
    return len(rows)


def count_connections(url: str) -> int:
    """Client connections to `url`'s database right now, this one's not counted."""
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(f"SELECT count(*) {_OTHER_CLIENTS}").fetchone()
    assert row is not None
    return int(row[0])


def with_password(url: str, password: str) -> str:
    """`postgresql://user@host/db` -> `postgresql://user:password@host/db`."""
    scheme, _, rest = url.partition("://")
    user, at, host = rest.partition("@")
    assert at and ":" not in user, f"{url} has no user or has a password already"
    return f"{scheme}://{user}:{password}@{host}"
