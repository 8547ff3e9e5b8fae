"""The source, the sink, the example pipeline and `riverbed subscription run
--master` on a Spark standalone cluster (a master and two workers on loopback,
`harness/spark_cluster.py`) with PostgreSQL storage; Riverbed shipped to the
executors from the driver; a worker and then the driver SIGKILLed under the
delivery job. A SQLite file is refused for a cluster.

Drivers run as subprocesses: this process may hold the local SparkContext of
the other Spark tests. One cluster serves the module; the module's tests stay
on one pytest-xdist worker (`xdist_group`), beside the Connect tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.delivery import produce_groups, queued
from harness.delivery_job import check_outcome, setup
from harness.endpoint import Endpoint
from harness.postgres import PostgresServer
from harness.spark_cluster import DRIVER_SETTINGS, LOOPBACK, SparkCluster, serving
from harness.waiting import eventually
from riverbed.errors import InvalidInput
from riverbed.spark.options import MASTER_ENV, read_options, write_options
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

SETTINGS = {**DRIVER_SETTINGS, "spark.executor.memory": "512m", "spark.executor.cores": "1"}
CONF = [arg for name, value in SETTINGS.items() for arg in ("--conf", f"{name}={value}")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    yield from serving(SparkCluster(), "the Spark cluster")


def driver_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_LOCAL_IP": LOOPBACK,
        "PYSPARK_PYTHON": sys.executable,
        "TMPDIR": str(tmp_path),
    }


def test_a_sqlite_database_is_refused_for_a_cluster_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "riverbed.db"
    url = f"sqlite:///{db}"
    run = subprocess.run(
        [
            RIVERBED,
            "subscription",
            "run",
            "billing",
            "--db",
            url,
            "--master",
            "spark://127.0.0.1:7",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "SQLite file" in run.stderr and "spark://127.0.0.1:7" in run.stderr
    assert "Traceback" not in run.stderr
    example = subprocess.run(
        [sys.executable, str(EXAMPLE), "--db", url, "--master", "spark://127.0.0.1:7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert example.returncode != 0 and "use PostgreSQL" in example.stderr, example.stderr
    assert "Traceback" not in example.stderr
    assert not db.exists()  # nothing created
    # What the source and sink check where Spark plans them (under a cluster's JVM).
    monkeypatch.setenv(MASTER_ENV, "spark://127.0.0.1:7")
    with pytest.raises(InvalidInput, match="SQLite file"):
        read_options({"db": url, "topic": "orders"})
    with pytest.raises(InvalidInput, match="SQLite file"):
        write_options({"db": url, "topic": "orders"})
    assert write_options({"db": "postgresql://u@127.0.0.1/x", "topic": "t"}).topic == "t"
    monkeypatch.setenv(MASTER_ENV, "local[2]")
    assert read_options({"db": url, "topic": "orders"}).db == url


def test_the_source_and_sink_run_on_a_cluster_with_riverbed_shipped_from_the_driver(
    cluster: SparkCluster, postgres_url: str, tmp_path: Path
) -> None:
    storage = open_storage(postgres_url)
    try:
        from riverbed.log.topics import Topics

        Topics(storage).create("orders", 4)
        Topics(storage).create("copies", 2)
        produce_groups(storage, 5, 0, 40)
    finally:
        storage.close()
    done = subprocess.run(
        [sys.executable, str(ROUNDTRIP), postgres_url, "--master", cluster.master_url, *CONF],
        capture_output=True,
        text=True,
        timeout=600,
        env=driver_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-4000:] + cluster.logs()
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["read"] == 200
    # Every task imported the Riverbed the driver shipped (addPyFile), not another copy.
    assert result["paths"] and all("riverbed.zip" in p for p in result["paths"]), result
    storage = open_storage(postgres_url)
    try:
        copies = [
            m.payload
            for head in storage.list_streams("copies")
            for m in storage.read(head.key, head.start_offset, 10_000)
        ]
    finally:
        storage.close()
    assert sorted(copies) == sorted(f"g{g}:{n}:".encode() for g in range(5) for n in range(40))


def test_the_example_pipeline_runs_on_a_cluster(
    cluster: SparkCluster, postgres_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--db", postgres_url, "--master", cluster.master_url, *CONF],
        capture_output=True,
        text=True,
        timeout=600,
        env=driver_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    # 90 readings over 3 devices, one per 5 s: 7 complete minutes each.
    assert len(lines) == 21, done.stdout
    assert all(" 4 readings" in line for line in lines)


def test_the_delivery_job_survives_a_worker_killed_and_resumes_after_its_driver_is_killed(
    cluster: SparkCluster, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Last in the module: it leaves the cluster one worker short."""
    url = postgres_server.new_database("cluster_faults")
    log = tmp_path / "job.log"

    def start_job() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [RIVERBED, "subscription", "run", "billing", "--db", url, "--master",
                 cluster.master_url, *CONF, "--until-idle", "--trigger-interval", "0.1",
                 "--max-per-trigger", "200", "--lease-seconds", "5"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=driver_env(tmp_path),
            )  # fmt: skip

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:]

    with Endpoint(delay=0.005) as endpoint:
        setup(url, endpoint, groups=20, per_group=100, inline=0)
        for g in range(0, 20, 3):
            endpoint.fail(f"g{g}:1".encode(), 503, times=1)
        endpoint.fail(b"g4:5", 400)
        job = start_job()
        try:
            eventually(
                lambda: job.poll() is None and len(endpoint.delivered()) >= 300,
                300,
                "the job on the cluster delivering 300 messages",
                explain=tail,
            )
            cluster.kill_worker(0)  # its executor and Python workers with it
            before = len(endpoint.delivered())
            eventually(
                lambda: job.poll() is None and len(endpoint.delivered()) >= before + 400,
                300,
                "the job going on after a worker was killed",
                explain=lambda: tail() + cluster.logs(),
            )
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver, mid-stream
            job.wait()
        killed_at = len(endpoint.delivered())
        assert killed_at < 2000, "killed mid-stream"
        job = start_job()
        try:
            assert job.wait(timeout=600) == 0, tail()
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        delivered = endpoint.delivered()
        storage = open_storage(url)
        try:
            rq, parked = queued(storage, "billing.rq"), queued(storage, "billing.dlq")
        finally:
            storage.close()
    assert rq, "the retry queue was used"
    repeated = check_outcome(
        delivered, rq, parked, 20, 100, {f"g4:{n}:".encode() for n in range(5, 100)}
    )
    assert repeated <= 2 * (200 + 20)  # the batches the two kills cut short, at most
