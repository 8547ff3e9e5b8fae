"""contrib/riverbed.service: a unit systemd accepts, that stops the broker the
way the broker wants to be stopped, and whose command line starts a working
broker (run here with its paths moved into `tmp_path`)."""

from __future__ import annotations

import configparser
import queue
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from harness.broker import START_TIMEOUT
from harness.ci import in_ci
from harness.net import free_port, wait_listening
from harness.waiting import DEFAULT_TIMEOUT
from riverbed.mqtt.broker import EXIT_MARGIN
from riverbed.mqtt.config import Limits

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "riverbed.service"
INSTALLED = "/opt/riverbed/bin/riverbed"
"""Where the unit expects the `riverbed` script (a venv in /opt/riverbed)."""
RIVERBED = str(Path(sys.executable).with_name("riverbed"))


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        message = "systemd-analyze is not installed (Debian: the systemd package)"
        if in_ci():
            pytest.fail(f"{message}; .ci/run installs it", pytrace=False)
        pytest.skip(message)
    # verify checks that ExecStart's program exists: point it at this one.
    copy = tmp_path / "riverbed.service"
    copy.write_text(UNIT.read_text().replace(INSTALLED, RIVERBED))
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=120
    )
    # verify exits 0 after warnings about unknown keys or bad values: none may show.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_unit_restarts_on_failure_and_stops_within_the_broker_s_grace() -> None:
    service = unit()["Service"]
    assert service["Type"] in ("simple", "notify")
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    # The broker exits at most stop_grace + EXIT_MARGIN after SIGTERM; systemd
    # must not SIGKILL it before that.
    assert int(service["TimeoutStopSec"]) > Limits().stop_grace + EXIT_MARGIN
    assert service["User"] == "riverbed"
    assert service["StateDirectory"] == "riverbed"


def test_the_unit_s_command_runs_a_broker(tmp_path: Path) -> None:
    """ExecStart with /etc/riverbed and /var/lib/riverbed moved into tmp_path,
    configured as docs/deploy.md says; stopped with the unit's KillSignal
    within its TimeoutStopSec."""
    service = unit()["Service"]
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    state.mkdir()
    port = free_port()
    (etc / "riverbed.toml").write_text(
        f'[listeners]\nmqtt = "127.0.0.1:{port}"\n\n[auth]\npassword_file = "passwd"\n'
    )
    added = subprocess.run(
        [RIVERBED, "passwd", str(etc / "passwd"), "alice", "--stdin"],
        input="wonderland\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    out = tmp_path / "serve.log"
    with out.open("wb") as log:
        process = subprocess.Popen(
            exec_start(etc, state), stdout=log, stderr=subprocess.STDOUT, cwd=state
        )
    try:
        wait_listening(process, port, START_TIMEOUT, "broker", out.read_text, process.kill)
        assert connack(port, None, None) == "Not authorized"  # the config file applies
        assert connack(port, "alice", "wonderland") == "Success"
        process.send_signal(signal.Signals[service["KillSignal"]])
        assert process.wait(float(service["TimeoutStopSec"])) == 0, out.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (state / "riverbed.db").exists()


def connack(port: int, username: str | None, password: str | None) -> str:
    """The reason of the CONNACK the broker on `port` answers a CONNECT with."""
    answered: queue.Queue[str] = queue.Queue()
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.on_connect = lambda _client, _data, _flags, reason, _props: answered.put(str(reason))
    if username is not None:
        client.username_pw_set(username, password)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        return answered.get(timeout=DEFAULT_TIMEOUT)
    finally:
        client.disconnect()
        client.loop_stop()


def exec_start(etc: Path, state: Path, *extra: str) -> list[str]:
    """The unit's ExecStart with its paths moved to `etc` and `state`."""
    command = (
        unit()["Service"]["ExecStart"]
        .replace(INSTALLED, RIVERBED)
        .replace("/etc/riverbed", str(etc))
        .replace("/var/lib/riverbed", str(state))
    )
    return [*shlex.split(command), *extra]


def test_a_bad_configuration_is_not_restarted_an_unreachable_database_is(
    tmp_path: Path,
) -> None:
    """Restart=on-failure with RestartPreventExitStatus: a bad value (exit 2)
    would fail again the same way; a database that is down may come back."""
    service = unit()["Service"]
    not_restarted = {int(status) for status in service["RestartPreventExitStatus"].split()}
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    state.mkdir()
    config = etc / "riverbed.toml"
    config.write_text("[limits]\nreceive_maximum = 0\n\n[auth]\nallow_anonymous = true\n")
    bad = subprocess.run(exec_start(etc, state), capture_output=True, text=True, timeout=120)
    assert bad.stderr.startswith(f"error: {config}: limits.receive_maximum = 0: must be")
    assert bad.returncode in not_restarted

    config.write_text(
        f'[listeners]\nmqtt = "127.0.0.1:{free_port()}"\n\n[auth]\nallow_anonymous = true\n'
    )
    down = subprocess.run(
        exec_start(etc, state, "--db", f"postgresql://nobody@127.0.0.1:{free_port()}/none"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.stderr.startswith("error: cannot connect to PostgreSQL"), down.stderr
    assert down.returncode != 0
    assert down.returncode not in not_restarted
