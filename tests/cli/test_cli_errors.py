"""Expected failures end in one `error: ...` line and an exit code, never a
traceback: an unreachable or missing database, a mistyped `--db` (refused by
every command that only reads or changes what exists, and nothing created), a
full database, an address in use, a missing or broken file, Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner, Result

from harness.cli import subcommands
from harness.net import free_port
from harness.waiting import eventually
from riverbed.cli import cli
from riverbed.log.log import Log
from riverbed.model import Message, MessageId
from riverbed.subscriptions import Subscriptions

RIVERBED = str(Path(sys.executable).with_name("riverbed"))
MESSAGE_ID = str(MessageId(0))

COMMANDS: list[tuple[str, ...]] = [
    ("topic", "create", "t", "--partitions", "1"),
    ("topic", "set-limits", "t", "--max-age", "1d"),
    ("topic", "alter", "t", "--max-age", "1d"),
    ("topic", "list"),
    ("topic", "describe", "t"),
    ("topic", "add-storage-topic", "t", "--partitions", "2"),
    ("topic", "switch-produce", "t"),
    ("topic", "delete", "t", "--yes"),
    ("retention", "run"),
    ("subscription", "create", "s", "--topic", "t"),
    ("subscription", "list"),
    ("subscription", "lag", "s"),
    ("subscription", "reset", "s", "--to", "earliest"),
    ("subscription", "delete", "s"),
    ("subscription", "run", "s"),
    ("subscription", "reshard", "s", "--shards", "2"),
    ("dlq", "list", "s"),
    ("dlq", "show", "s", MESSAGE_ID),
    ("dlq", "replay", "s", "--all"),
    ("dlq", "purge", "s", "--all", "--yes"),
    ("produce", "t"),
    ("consume", "s"),
    ("group", "create", "g", "x/#"),
    ("group", "list"),
    ("group", "describe", "g", "x/#"),
    ("group", "delete", "g", "x/#"),
    ("demo",),
    ("worker", "s", "--handler", "json:dumps"),
    ("status",),
    ("cluster", "status"),
    ("cluster", "drain", "n", "--timeout", "5"),
]
"""Every command that opens the database (`serve` is run as a process below)."""

CREATING = {("topic", "create"), ("group", "create"), ("demo",)}
"""The commands that may create a missing database."""

READING = [args for args in COMMANDS if args[:2] not in CREATING and args[:1] not in CREATING]
CREATING_COMMANDS = {args for args in COMMANDS if args not in READING}


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for name, command in subcommands(group).items():
        if isinstance(command, click.Group):
            found |= _leaves(command, (*path, name))
        else:
            found.add((*path, name))
    return found


def test_the_lists_cover_every_command() -> None:
    named = {args[: len(leaf)] for args in COMMANDS for leaf in _leaves(cli)}
    # No database: serve and passwd are tested below, `config example` prints text.
    assert _leaves(cli) - named == {
        ("serve",),
        ("admin",),  # a server, like serve (tests/http)
        ("passwd",),
        ("config", "example"),
        ("token", "add"),  # token files, no database (tests/http/test_tokens.py)
        ("token", "list"),
        ("token", "revoke"),
    }


def invoke(*args: str, stdin: str = "") -> Result:
    """In process; an exception other than an exit is a failure of the test."""
    return CliRunner().invoke(cli, list(args), input=stdin)


def assert_one_error_line(result: Result, code: int = 1) -> None:
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


# --------------------------------------------------------------------- unreachable


@pytest.fixture(params=["postgres-refused", "sqlite-under-a-file"])
def unreachable(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database no command can open: a PostgreSQL port nobody listens on, a
    SQLite path whose directory cannot be made (a file is in the way)."""
    if request.param == "postgres-refused":
        return f"postgresql://riverbed@127.0.0.1:{free_port()}/x"
    (tmp_path / "file").write_text("not a directory")
    return f"sqlite:///{tmp_path}/file/dir/x.db"


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_command_reports_an_unreachable_database_in_one_line(
    unreachable: str, args: tuple[str, ...]
) -> None:
    result = invoke(*args, "--db", unreachable)
    assert_one_error_line(result)
    if unreachable.startswith("postgresql"):
        assert "cannot connect to PostgreSQL at 'postgresql://riverbed@127.0.0.1:" in result.stderr
    elif args[:2] in CREATING or args[:1] in CREATING:
        assert "cannot create the directory of" in result.stderr
    else:
        assert result.stderr.startswith(f"error: no Riverbed database at {unreachable[10:]}")


# --------------------------------------------------------------------- missing databases


@pytest.mark.parametrize("args", READING, ids=" ".join)
def test_reading_commands_refuse_a_missing_sqlite_database_and_create_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    path = tmp_path / "mistyped" / "dir" / "x.db"
    result = invoke(*args, "--db", f"sqlite:///{path}")
    assert_one_error_line(result)
    assert result.stderr == (
        f"error: no Riverbed database at {path} (create one with riverbed serve or riverbed"
        " topic create)\n"
    )
    assert not (tmp_path / "mistyped").exists()


@pytest.mark.parametrize("args", sorted(CREATING_COMMANDS), ids=" ".join)
def test_creating_commands_create_a_missing_sqlite_database(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    url = f"sqlite:///{tmp_path}/new/dir/x.db"
    result = invoke(*args, "--db", url)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"created a new database at {url}\n")
    assert (tmp_path / "new" / "dir" / "x.db").is_file()


def test_a_sqlite_file_without_riverbed_tables_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine (x)")
    conn.close()
    before = path.read_bytes()
    result = invoke("topic", "list", "--db", f"sqlite:///{path}")
    assert_one_error_line(result)
    assert f"no Riverbed database at {path}: the file holds no Riverbed tables" in result.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


@pytest.mark.postgres
def test_a_postgres_database_without_the_schema_is_refused_and_left_empty(
    postgres_url: str,
) -> None:
    result = invoke("subscription", "list", "--db", postgres_url)
    assert_one_error_line(result)
    assert "the database has no Riverbed tables (create one with" in result.stderr
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('meta')").fetchone() == (None,)
    created = invoke("topic", "create", "t", "--partitions", "1", "--db", postgres_url)
    assert created.exit_code == 0, created.output
    assert created.stderr.startswith("created a new database at postgresql://")
    assert invoke("subscription", "list", "--db", postgres_url).exit_code == 0


def test_creating_commands_create_the_database_and_say_so_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new/dir/x.db"
    first = invoke("topic", "create", "t", "--partitions", "1", "--db", url)
    assert first.exit_code == 0, first.output
    assert first.stderr == f"created a new database at {url}\n"
    assert first.stdout == "created topic 't' with 1 partition\n"
    again = invoke("group", "create", "g", "x/#", "--db", url)
    assert again.exit_code == 0 and again.stderr == ""
    listed = invoke("topic", "list", "--db", url)
    assert listed.exit_code == 0 and "t" in listed.stdout


def test_log_open_refuses_without_create_and_creates_with_it(tmp_path: Path) -> None:
    from riverbed.errors import DatabaseNotFound

    url = f"sqlite:///{tmp_path}/x.db"
    with pytest.raises(DatabaseNotFound, match="no Riverbed database at"):
        Log.open(url, create=False)
    assert list(tmp_path.iterdir()) == []
    with Log.open(url) as log:
        assert log.storage.created  # type: ignore[attr-defined]
    with Log.open(url, create=False) as log:
        assert not log.storage.created  # type: ignore[attr-defined]


# --------------------------------------------------------------------- other failures


def test_a_full_database_is_one_error_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert invoke("topic", "create", "t", "--partitions", "1", "--db", url).exit_code == 0
    lines = "".join(f'{{"payload": "{"x" * 1000}{i}"}}\n' for i in range(500))
    result = invoke("produce", "t", "--db", f"{url}?max_size=128KiB", stdin=lines)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "0 of 500 messages were committed\n" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: append on")
    assert result.stderr.endswith("failed: database or disk is full\n")


def test_a_second_create_is_one_error_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert invoke("topic", "create", "t", "--partitions", "1", "--db", url).exit_code == 0
    result = invoke("topic", "create", "t", "--partitions", "1", "--db", url)
    assert_one_error_line(result)
    assert result.stderr == "error: topic 't' exists already\n"


def test_help_lists_the_exit_codes_and_says_what_demo_is() -> None:
    text = invoke("--help").stdout
    for code, meaning in (("0", "done"), ("1", "failed"), ("2", "bad input"), ("130", "Ctrl-C")):
        assert any(line.split()[:1] == [code] and meaning in line for line in text.splitlines())
    assert "make run" not in text
    assert "demo          Try the log out on topic `demo`, without the broker." in text


def test_produced_and_consumed_counts_are_singular_for_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    invoke("topic", "create", "t", "--partitions", "1", "--db", url)
    produced = invoke("produce", "t", "--db", url, stdin='{"payload": "a"}\n')
    assert produced.stderr.startswith("produced 1 message to topic 't'\n")
    invoke("subscription", "create", "s", "--topic", "t", "--db", url)
    consumed = invoke("consume", "s", "--db", url)
    assert consumed.stderr == "consumed 1 message from subscription 's'\n"


# --------------------------------------------------------------------- processes


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RIVERBED, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_serve_on_an_address_in_use_says_so_and_creates_nothing(
    tmp_path: Path, taken_port: int
) -> None:
    db = tmp_path / "new" / "x.db"
    result = run("serve", "--mqtt", f"127.0.0.1:{taken_port}", "--allow-anonymous",
                 "--db", f"sqlite:///{db}")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        f"error: cannot listen on 127.0.0.1:{taken_port}: address already in use (is another"
        " broker running? choose another address with --mqtt HOST:PORT or listeners.mqtt in"
        " the config file)\n"
    )
    assert not db.parent.exists()


@pytest.mark.skipif(subprocess.run(["which", "openssl"]).returncode != 0, reason="no openssl")
def test_serve_with_its_tls_address_in_use_says_so(tmp_path: Path, taken_port: int) -> None:
    key, cert = tmp_path / "server.key", tmp_path / "server.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=x"],
        check=True, capture_output=True,
    )  # fmt: skip
    result = run("serve", "--mqtt", "127.0.0.1:0", "--tls", f"127.0.0.1:{taken_port}",
                 "--certfile", str(cert), "--keyfile", str(key), "--allow-anonymous",
                 "--db", f"sqlite:///{tmp_path}/x.db")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: cannot listen on 127.0.0.1:{taken_port}: address already in use"
    )
    assert "with --tls HOST:PORT or listeners.tls.address" in result.stderr


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ("--config", "missing.toml"), "error: config file 'missing.toml' does not exist"),
        ("[listeners\n", ("--config", "broken.toml"), "error: config file 'broken.toml' is not"),
        (None, ("--tls", "127.0.0.1:0", "--certfile", "none.pem", "--keyfile", "none.key"),
         "error: command line: listeners.tls.certfile = 'none.pem': no such file"),
        ('[log]\nformat = "xml"\n', ("--config", "broken.toml"),
         "error: broken.toml: log.format = 'xml': must be one of text, json"),
    ],
)  # fmt: skip
def test_serve_refuses_missing_and_broken_files_in_one_line(
    tmp_path: Path, setup: str | None, args: tuple[str, ...], message: str
) -> None:
    if setup is not None:
        (tmp_path / "broken.toml").write_text(setup)
    result = subprocess.run(
        [RIVERBED, "serve", "--allow-anonymous", "--mqtt", "127.0.0.1:0", *args,
         "--db", f"sqlite:///{tmp_path}/x.db"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "x.db").exists()


def test_serve_on_an_unreachable_database_is_one_error_line(tmp_path: Path) -> None:
    result = run("serve", "--mqtt", "127.0.0.1:0", "--allow-anonymous",
                 "--db", f"postgresql://riverbed@127.0.0.1:{free_port()}/x")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot connect to PostgreSQL at"), result.stderr
    assert result.stderr.count("\n") == 1


def _reading_stdin(pid: int) -> bool:
    """Whether the process's main thread waits in read(2) on fd 0 (x86-64: syscall 0)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["0", "0x0"]
    return False


def test_ctrl_c_says_interrupted_and_exits_130(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert invoke("topic", "create", "t", "--partitions", "1", "--db", url).exit_code == 0
    with subprocess.Popen(
        [RIVERBED, "produce", "t", "--db", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a shell: a process started with SIGINT ignored keeps ignoring
        # it (Python installs its KeyboardInterrupt handler only over the
        # default), and a test worker may have it ignored (a test before this one
        # on the same worker, e.g. one that started Spark).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as job:
        try:
            # Past its start (the database open, the topic checked): it reads
            # stdin, which stays open, as a user's terminal would.
            eventually(lambda: _reading_stdin(job.pid), 60, "produce to read its stdin")
            job.send_signal(signal.SIGINT)
            # Not communicate() at once: it closes stdin, and produce, reaching
            # the end of its input before the signal is handled, would finish.
            job.wait(timeout=60)
            _, stderr = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    assert job.returncode == 130
    assert stderr == "interrupted\n"


def test_passwd_without_a_terminal_says_to_use_stdin(tmp_path: Path) -> None:
    result = run("passwd", str(tmp_path / "passwd"), "alice")
    assert result.returncode == 2
    assert "no terminal to read a password from: use --stdin" in result.stderr
    assert "Warning" not in result.stderr and "Aborted" not in result.stderr
    assert not (tmp_path / "passwd").exists()


def test_a_worker_that_gives_up_retrying_says_so(tmp_path: Path) -> None:
    (tmp_path / "rb_test_failing.py").write_text("def fail(batch):\n    raise ValueError('bad')\n")
    url = f"sqlite:///{tmp_path}/x.db"
    with Log.open(url) as log:
        log.topics.create("t", 1)
        Subscriptions(log.storage).create("s", "t")
        log.produce("t", [Message(b"x", key="k")])
    result = subprocess.run(
        [RIVERBED, "worker", "s", "--handler", "rb_test_failing:fail", "--on-error", "retry",
         "--max-attempts", "2", "--db", url],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "(2 attempts): ValueError('bad'); the worker stops (on-error retry gave up after" in (
        result.stderr
    )
    assert "(on-error stop)" not in result.stderr
