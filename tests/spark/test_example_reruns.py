"""examples/sensor_pipeline.py runs twice in a row on the same database, as
a user would run it: in a process of its own, with its own Spark."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ci import in_ci

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sensor_pipeline.py"
LINE = re.compile(r"^(\S+Z)\s+(\w+)\s+(\d+) readings", re.MULTILINE)


def test_the_example_runs_twice_on_one_database(tmp_path: Path) -> None:
    if shutil.which("java") is None and not in_ci():
        pytest.skip("Spark needs a JVM")
    url = f"sqlite:///{tmp_path}/example.db"
    # 30 readings, one per 5 s over 3 devices: minutes 0 and 1 are complete.
    expected = {
        (f"2026-01-01T00:0{m}Z", d) for m in range(2) for d in ("boiler", "fridge", "porch")
    }
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--db", url, "--readings", "30"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env=os.environ,
        )
        assert done.returncode == 0, (run, done.stderr[-3000:])
        rows = LINE.findall(done.stdout)
        assert {(minute, device) for minute, device, _ in rows} == expected, (run, done.stdout)
        assert len(rows) == len(expected) and all(n == "4" for _, _, n in rows)
