"""The broker runs on the core dependencies alone: `make run` installs no extras,
so nothing `riverbed serve` imports may come from the `spark` extra (pyspark,
pyarrow, the ADBC drivers) or from what they bring (pandas, numpy).

The processes here run with those modules made unimportable, as in a venv
without the extra, and a Spark command there says how to install it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.broker import START_TIMEOUT, STOP_TIMEOUT, Client
from harness.net import free_port, wait_listening

EXTRA_MODULES = (
    "pyspark",
    "py4j",
    "pyarrow",
    "adbc_driver_manager",
    "adbc_driver_sqlite",
    "adbc_driver_postgresql",
    "pandas",
    "numpy",
)

WITHOUT_EXTRAS = f"""
import sys

class WithoutSparkExtra:
    # Refuses the extra's modules as if they were not installed.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {EXTRA_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, WithoutSparkExtra())
for name in list(sys.modules):
    if name.partition(".")[0] in {EXTRA_MODULES!r}:
        del sys.modules[name]
from riverbed.cli import main
sys.argv[0] = "riverbed"
main()
"""
"""`python -c WITHOUT_EXTRAS ARGS...` runs `riverbed ARGS...` without the extras."""


def riverbed_without_extras(*args: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_EXTRAS, *args]


def test_the_serve_path_imports_nothing_from_the_spark_extra() -> None:
    code = """
import json, sys
import riverbed.cli
from riverbed.cli.broker import serve
import riverbed.mqtt.broker, riverbed.mqtt.config, riverbed.mqtt.tls, riverbed.log.log
print(json.dumps(sorted(sys.modules)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    imported = {name.partition(".")[0] for name in json.loads(done.stdout)}
    assert "riverbed" in imported
    assert imported.isdisjoint(EXTRA_MODULES), sorted(imported & set(EXTRA_MODULES))


def test_the_broker_serves_without_the_spark_extra(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "serve.log"
    with out.open("wb") as log:
        process = subprocess.Popen(
            riverbed_without_extras(
                "serve",
                "--allow-anonymous",
                "--mqtt",
                f"127.0.0.1:{port}",
                "--db",
                f"sqlite:///{tmp_path}/core.db",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(process, port, START_TIMEOUT, "broker", out.read_text, process.kill)
        client = Client(port, "core-only")
        client.connect()
        try:
            client.subscribe("core/#", qos=1)
            client.publish("core/only", b"no spark here", qos=1)
            client.wait_payloads(b"no spark here")
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(STOP_TIMEOUT) == 0, out.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in out.read_text()


def test_a_spark_command_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/core.db"
    env = os.environ | {"RIVERBED_DB": db}
    done = subprocess.run(
        riverbed_without_extras("subscription", "run", "billing"),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        "error: this command needs pyspark, from Riverbed's `spark` extra, which is not"
        " installed: install it with `make venv`"
    ), done.stderr
    assert "Traceback" not in done.stderr
