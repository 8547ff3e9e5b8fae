"""The Makefile's set-up: `make run` installs the core only (the broker's own
dependencies), `make test` adds the dev and spark extras, and either order
installs only what the venv lacks (one stamp per set of extras).

`make -n` prints what a target would run without running it, against a venv
directory in `tmp_path`; one test runs `make run` for real, with a venv made of
links to this interpreter, and talks MQTT to what it starts."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import START_TIMEOUT, STOP_TIMEOUT, Client
from harness.net import free_port, wait_listening
from harness.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


MAKEFILE_VARIABLES = ("PYTHON", "VENV", "EXTRAS", "PYTEST_ARGS", "TEST_WORKERS", "PORT", "ARGS")
"""The Makefile's settings: `make test TEST_WORKERS=0` exports them to the tests."""


def make_env(**extra: str) -> dict[str, str]:
    """This environment without what a `make test` around the tests passes down,
    so the make run here sees the Makefile's defaults."""
    inherited = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", *MAKEFILE_VARIABLES)
    return {k: v for k, v in os.environ.items() if k not in inherited} | extra


def make_n(venv: Path, *args: str) -> list[str]:
    """The commands `make -n ARGS VENV=venv` prints, one per line."""
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "--no-print-directory", f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=make_env(),
    )
    return done.stdout.splitlines()


def pip_installs(commands: list[str]) -> list[str]:
    """What each `pip install -e` among `commands` installs (`.` or `.[extras]`)."""
    return [
        shlex.split(command)[-1]
        for command in commands
        if "pip install" in command and " -e " in command
    ]


def serve_command(commands: list[str]) -> list[str]:
    (serve,) = [command for command in commands if "riverbed serve" in command]
    return shlex.split(serve)[2:]  # after `VENV/bin/riverbed serve`


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return tmp_path / "venv"


def stamp(venv: Path, *names: str) -> None:
    """Pretend the venv exists with these sets of extras installed."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").touch()
    for name in names:
        (venv / f".installed-{name}").touch()


def test_run_on_a_fresh_machine_installs_the_core_only(venv: Path) -> None:
    commands = make_n(venv, "run")
    assert commands[0] == f"python3 -m venv {venv}"
    assert pip_installs(commands) == ["."]
    assert serve_command(commands) == ["--allow-anonymous", "--http", "127.0.0.1:8080"]
    shown = " ".join(commands)
    assert "dashboard: http://127.0.0.1:8080/ " in shown
    assert "admin API: http://127.0.0.1:8080/api/v1" in shown


def test_test_on_a_fresh_machine_installs_dev_and_spark(venv: Path) -> None:
    commands = make_n(venv, "test")
    assert commands[0] == f"python3 -m venv {venv}"
    assert pip_installs(commands) == [".[dev,spark]"]
    assert any(command.startswith(f"{venv}/bin/pytest -n 3 ") for command in commands)


def test_test_after_run_adds_the_extras(venv: Path) -> None:
    stamp(venv, "core")
    commands = make_n(venv, "test")
    assert not any("-m venv" in command for command in commands)
    assert pip_installs(commands) == [".[dev,spark]"]


def test_run_after_test_installs_nothing(venv: Path) -> None:
    stamp(venv, "core")  # installing the extras stamps the core too
    stamp(venv, "dev,spark")
    commands = make_n(venv, "run")
    assert pip_installs(commands) == []
    assert not any("-m venv" in command for command in commands)
    assert pip_installs(make_n(venv, "test")) == []


def test_extras_install_stamps_the_core_as_well(venv: Path) -> None:
    (touch,) = [command for command in make_n(venv, "venv") if command.startswith("touch ")]
    assert shlex.split(touch)[1:] == [f"{venv}/.installed-dev,spark", f"{venv}/.installed-core"]


def test_a_changed_pyproject_reinstalls(venv: Path) -> None:
    stamp(venv, "core", "dev,spark")
    old = 1_000_000_000  # 2001: older than any checkout's pyproject.toml
    for name in ("core", "dev,spark"):
        os.utime(venv / f".installed-{name}", (old, old))
    assert pip_installs(make_n(venv, "run")) == ["."]
    assert pip_installs(make_n(venv, "test")) == [".[dev,spark]"]


def test_port_and_args_change_what_run_starts(venv: Path) -> None:
    stamp(venv, "core")
    assert serve_command(make_n(venv, "run", "PORT=1884", "HTTP_PORT=")) == [
        "--allow-anonymous",
        "--mqtt",
        "127.0.0.1:1884",
    ]
    assert serve_command(make_n(venv, "run", "ARGS=--mqtt 127.0.0.1:1885", "HTTP_PORT=8081")) == [
        "--allow-anonymous",
        "--http",
        "127.0.0.1:8081",
        "--mqtt",
        "127.0.0.1:1885",
    ]
    assert serve_command(make_n(venv, "run", "ARGS=--http 127.0.0.1:9090")) == [
        "--allow-anonymous",
        "--http",
        "127.0.0.1:9090",
    ]
    # A config file decides who may connect: no --allow-anonymous over it.
    assert serve_command(make_n(venv, "run", "ARGS=--config riverbed.toml")) == [
        "--config",
        "riverbed.toml",
    ]


@pytest.fixture
def linked_venv(tmp_path: Path) -> Path:
    """A venv directory whose python and riverbed are this test run's, stamped as
    installed: `make run` then runs the broker of this checkout."""
    venv = tmp_path / "venv"
    stamp(venv, "core")
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "bin" / "riverbed").symlink_to(Path(sys.executable).with_name("riverbed"))
    return venv


@pytest.fixture
def make_run(linked_venv: Path, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`make run PORT=...` started for real, in a session of its own (so the
    broker under it gets the SIGTERM too, as Ctrl-C reaches both); yields the
    port and the output's path."""
    port, http_port = free_port(), free_port()
    out = tmp_path / "make-run.log"
    with out.open("wb") as log:
        process = subprocess.Popen(
            [
                *("make", "-C", str(ROOT), f"VENV={linked_venv}", "run"),
                *(f"PORT={port}", f"HTTP_PORT={http_port}"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=make_env(RIVERBED_DB=f"sqlite:///{tmp_path}/run.db"),
            start_new_session=True,
        )

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def group_gone() -> bool:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_listening(process, port, START_TIMEOUT, "make run", out.read_text, kill)
        yield port, out
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_TIMEOUT)  # make itself dies of the signal
        eventually(group_gone, STOP_TIMEOUT, "the broker under make to exit")
        assert "riverbed.mqtt.broker: stopped;" in out.read_text(), out.read_text()
    finally:
        kill()
        process.wait()


def test_make_run_serves_mqtt_on_the_port_asked_for(make_run: tuple[int, Path]) -> None:
    port, out = make_run
    client = Client(port, "make-run")
    client.connect()
    try:
        client.subscribe("hello/#", qos=1)
        client.publish("hello/world", b"from make run", qos=1)
        client.wait_payloads(b"from make run")
    finally:
        client.close()
    assert f"listening for MQTT on 127.0.0.1:{port}" in out.read_text()
