"""The source, the sink, the example pipeline and the delivery job through
Spark Connect: a Connect server started from pyspark's distribution on
loopback (`harness/spark_cluster.py`, Spark `local[2]` behind it), the
clients in subprocesses (a Connect client changes how PySpark works in its
process, and this one may hold the other tests' local session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.delivery import produce_groups, queued
from harness.delivery_job import check_outcome, setup
from harness.endpoint import Endpoint
from harness.spark_cluster import ConnectServer, serving
from riverbed.log.topics import Topics
from riverbed.storage import open_storage

# A job on the cluster may take minutes on a loaded machine: its subprocess waits
# up to 600 s, so the test may wait longer than the suite's 300 s default.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.xdist_group("spark-cluster"),
    pytest.mark.timeout(900),
]

RIVERBED = str(Path(sys.executable).with_name("riverbed"))
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sensor_pipeline.py"
ROUNDTRIP = ROOT / "tests" / "harness" / "spark_roundtrip.py"


@pytest.fixture(scope="module")
def connect() -> Iterator[ConnectServer]:
    yield from serving(ConnectServer(), "the Spark Connect server")


def client_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path)}


def test_the_source_and_sink_work_through_spark_connect(
    connect: ConnectServer, sqlite_url: str, tmp_path: Path
) -> None:
    storage = open_storage(sqlite_url)
    try:
        Topics(storage).create("orders", 4)
        Topics(storage).create("copies", 2)
        produce_groups(storage, 5, 0, 40)
    finally:
        storage.close()
    done = subprocess.run(
        [sys.executable, str(ROUNDTRIP), sqlite_url, "--remote", connect.remote_url],
        capture_output=True,
        text=True,
        timeout=600,
        env=client_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-4000:] + connect.logs()
    assert json.loads(done.stdout.strip().splitlines()[-1])["read"] == 200
    storage = open_storage(sqlite_url)
    try:
        copies = [
            m.payload
            for head in storage.list_streams("copies")
            for m in storage.read(head.key, head.start_offset, 10_000)
        ]
    finally:
        storage.close()
    assert sorted(copies) == sorted(f"g{g}:{n}:".encode() for g in range(5) for n in range(40))


def test_the_example_pipeline_runs_through_spark_connect(
    connect: ConnectServer, sqlite_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--db", sqlite_url, "--remote", connect.remote_url],
        capture_output=True,
        text=True,
        timeout=600,
        env=client_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-4000:] + connect.logs()
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 21, done.stdout  # 7 complete minutes of 3 devices
    assert all(" 4 readings" in line for line in lines)


def test_the_delivery_job_runs_on_spark_connect(
    connect: ConnectServer, sqlite_url: str, tmp_path: Path
) -> None:
    """`riverbed subscription run --remote`: retries, parks, group order and
    the run's totals (from the query's progress) as on local[*]."""
    with Endpoint() as endpoint:
        setup(sqlite_url, endpoint, groups=6, per_group=30)
        endpoint.fail(b"g1:4:", 503, times=2)  # delivered at attempt 3
        endpoint.fail(b"g3:0:", 400)  # parked at once, g3's rest behind it
        done = subprocess.run(
            [RIVERBED, "subscription", "run", "billing", "--db", sqlite_url, "--remote",
             connect.remote_url, "--until-idle", "--trigger-interval", "0.1"],
            capture_output=True,
            text=True,
            timeout=600,
            env=client_env(tmp_path),
        )  # fmt: skip
        delivered = endpoint.delivered()
        storage = open_storage(sqlite_url)
        try:
            rq, parked = queued(storage, "billing.rq"), queued(storage, "billing.dlq")
            leftover = storage.kv_list("delivery.stop")
        finally:
            storage.close()
    assert done.returncode == 0, done.stderr[-4000:] + connect.logs()
    repeated = check_outcome(delivered, rq, parked, 6, 30, {f"g3:{n}:".encode() for n in range(30)})
    assert repeated == 0
    assert "delivered 150," in done.stdout and "parked 1 " in done.stdout, done.stdout
    assert not leftover  # the job's stop entry is gone with it
