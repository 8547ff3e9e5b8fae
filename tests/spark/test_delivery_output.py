"""What `riverbed subscription run --until-idle` prints on a normal run: its own
lines, not Spark's and py4j's logging (a stopped query's InterruptedException,
"Failed to cancel job group" warnings); `--verbose` shows those."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.delivery import produce_groups, subscribe
from harness.endpoint import Endpoint
from riverbed.storage import open_storage

pytestmark = pytest.mark.spark

RIVERBED = str(Path(sys.executable).with_name("riverbed"))


def test_a_normal_run_prints_no_exception_and_no_spark_warnings(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Endpoint() as endpoint:
        storage = open_storage(sqlite_url)
        try:
            subscribe(storage, endpoint.url, shards=2)
            produce_groups(storage, 4, 0, 25)
        finally:
            storage.close()
        job = subprocess.run(
            [RIVERBED, "subscription", "run", "billing", "--db", sqlite_url, "--until-idle",
             "--trigger-interval", "0.1"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )  # fmt: skip
        delivered = len(endpoint.delivered())
    assert job.returncode == 0, job.stderr[-3000:]
    assert delivered == 100
    assert "delivered 100," in job.stdout
    assert "Exception" not in job.stderr and "Traceback" not in job.stderr, job.stderr[-3000:]
    # log4j's WARN and ERROR lines (not the JVM's own "WARNING: Using incubator modules").
    assert not re.search(r"\b(WARN|ERROR)\b", job.stderr), job.stderr[-3000:]
    assert job.stderr.startswith("subscription billing: 2 shards, delivering to")
