"""`riverbed subscription run`: a delivering subscription's pipeline on Spark
(issue 7), against a real local HTTP server that fails on command, on both
backends; and the job killed (SIGKILL, the JVM and its Python workers with
it) mid-stream and started again: nothing lost, no retry- or dead-letter
queue entry written twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.delivery import by_group, produce_groups, queued
from harness.delivery_job import check_outcome, setup
from harness.endpoint import Endpoint
from harness.postgres import PostgresServer
from harness.waiting import SLOW, eventually
from riverbed.storage import open_storage
from riverbed.subscriptions.dlq import parked as parked_in
from riverbed.subscriptions.queues import QueuedMessage

pytestmark = pytest.mark.spark

RIVERBED = str(Path(sys.executable).with_name("riverbed"))
JOB_STALL = 300 * SLOW
"""Seconds a `riverbed subscription run` job may go without a delivery or a log line."""


def test_the_job_delivers_retries_and_parks_in_group_order(spark: Any, storage_url: str) -> None:
    from riverbed.spark.delivery_job import DeliveryJob

    with Endpoint() as endpoint:
        setup(storage_url, endpoint, groups=6, per_group=30)
        endpoint.fail(b"g1:4:", 503, times=2)  # delivered at attempt 3
        endpoint.fail(b"g2:7:", 503)  # parked after 3 attempts, g2's rest behind it
        endpoint.fail(b"g3:0:", 400)  # parked at once, g3's rest behind it
        job = DeliveryJob(spark, storage_url, "billing", trigger_seconds=0.1)
        stop = threading.Event()
        timer = threading.Timer(120, stop.set)
        timer.start()
        try:
            totals = job.run(until_idle=True, stop=stop)
        finally:
            timer.cancel()
        assert not stop.is_set(), "not idle after 120 s"
        delivered = endpoint.delivered()
        got = by_group(delivered)
        assert got == {
            **{f"g{g}": list(range(30)) for g in (0, 1, 4, 5)},
            "g2": list(range(7)),
        }
        assert [r.attempt for r in endpoint.requests if r.payload == b"g1:4:"] == [1, 2, 3]
        storage = open_storage(storage_url)
        try:
            parked = queued(storage, "billing.dlq")
        finally:
            storage.close()
    assert sorted(q.payload for q in parked) == sorted(
        [f"g2:{n}:".encode() for n in range(7, 30)] + [f"g3:{n}:".encode() for n in range(30)]
    )
    assert totals.delivered == 4 * 30 + 7 and totals.parked == 2


def _run_job(url: str, log: Path, lease_seconds: int = 10) -> subprocess.Popen[bytes]:
    """`riverbed subscription run` in a process group of its own (the JVM and
    Python workers with it). A killed job's lease keeps the next one waiting
    `lease_seconds`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                RIVERBED,
                "subscription",
                "run",
                "billing",
                "--db",
                url,
                "--until-idle",
                "--trigger-interval",
                "0.1",
                "--max-per-trigger",
                "200",
                "--lease-seconds",
                str(lease_seconds),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A killed job cannot remove its Spark checkpoint: keep it in the test's dir.
            env={**os.environ, "TMPDIR": str(log.parent)},
        )


def _wait_for(job: subprocess.Popen[bytes], endpoint: Endpoint, log: Path, count: int) -> None:
    """Until the endpoint has `count` deliveries, the job still running. The job
    starts a JVM before its first delivery: on a loaded CI machine that alone
    took over 120 s, so the wait is bounded per stall (no delivery and no line
    of the job's log for `JOB_STALL` seconds), not in total."""

    def done() -> bool:
        assert job.poll() is None, log.read_text()[-3000:]
        return len(endpoint.delivered()) >= count

    eventually(
        done,
        JOB_STALL,
        f"{count} deliveries by the job",
        explain=lambda: (len(endpoint.delivered()), log.read_text()[-3000:]),
        progress=lambda: (len(endpoint.delivered()), log.stat().st_size),
    )


def _run_to_the_end(url: str, log: Path) -> None:
    """A job started again, until idle."""
    job = _run_job(url, log)
    try:
        assert job.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def _queues(url: str) -> tuple[list[QueuedMessage], list[QueuedMessage]]:
    """Every retry- and dead-letter-queue row."""
    storage = open_storage(url)
    try:
        return queued(storage, "billing.rq"), queued(storage, "billing.dlq")
    finally:
        storage.close()


def test_a_job_killed_mid_stream_loses_nothing_and_writes_no_queue_entry_twice(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Endpoint(delay=0.002) as endpoint:
        setup(sqlite_url, endpoint, groups=20, per_group=100, inline=0)
        for g in range(0, 20, 3):
            endpoint.fail(f"g{g}:1".encode(), 503, times=1)  # g0:1:, g0:10:..19:, ...
        endpoint.fail(b"g4:5", 400)
        log = tmp_path / "job.log"
        job = _run_job(sqlite_url, log)
        try:
            _wait_for(job, endpoint, log, 600)
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        killed_at = len(endpoint.delivered())
        assert killed_at < 2000  # mid-stream
        _run_to_the_end(sqlite_url, log)
        delivered = endpoint.delivered()
        rq, parked = _queues(sqlite_url)
    assert rq, "the retry queue was used"
    repeated = check_outcome(
        delivered, rq, parked, 20, 100, {f"g4:{n}:".encode() for n in range(5, 100)}
    )
    assert repeated <= 200 + 20  # only from the batch the kill cut short (at least once)


@pytest.mark.postgres
def test_the_job_rides_out_a_postgresql_restart(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    """The server stops mid-stream and comes back: the job waits for it (its
    planning, batches and commits try again) instead of failing, and delivers
    everything; a batch cut short by the outage is delivered again at most."""
    url = own_postgres.new_database("outage")
    with Endpoint(delay=0.005) as endpoint:
        setup(url, endpoint, groups=20, per_group=100)
        log = tmp_path / "job.log"
        job = _run_job(url, log, lease_seconds=120)  # the outage must not cost the lease
        try:
            _wait_for(job, endpoint, log, 300)
            own_postgres.halt()
            try:
                eventually(
                    lambda: "the store cannot be reached" in log.read_text(),
                    timeout=120,
                    what="the job waiting for the store",
                    explain=lambda: log.read_text()[-3000:],
                )
                assert job.poll() is None, log.read_text()[-3000:]
            finally:
                own_postgres.resume()
            assert job.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        assert "the store is back" in log.read_text()
        delivered = endpoint.delivered()
        rq, parked = _queues(url)
    repeated = check_outcome(delivered, rq, parked, 20, 100, set())
    assert repeated <= 200 + 20  # only a batch the outage cut short


def test_sigterm_stops_the_job_after_the_batch_in_hand(sqlite_url: str, tmp_path: Path) -> None:
    """SIGTERM mid-stream: the job finishes and commits the batch it holds,
    then exits 0; the next job delivers the rest and nothing twice."""
    with Endpoint(delay=0.01) as endpoint:
        setup(sqlite_url, endpoint, groups=20, per_group=100, inline=0)
        endpoint.fail(b"g3:2", 503, times=1)
        log = tmp_path / "job.log"
        job = _run_job(sqlite_url, log)
        try:
            _wait_for(job, endpoint, log, 300)
            job.send_signal(signal.SIGTERM)  # the CLI's process only, as `kill PID` does
            assert job.wait(timeout=120) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        stopped_at = len(endpoint.delivered())
        assert stopped_at < 2000, "stopped mid-stream"
        assert f"delivered {stopped_at}," in log.read_text()  # its totals: the batch counted
        _run_to_the_end(sqlite_url, log)
        delivered = endpoint.delivered()
        rq, parked = _queues(sqlite_url)
    assert check_outcome(delivered, rq, parked, 20, 100, set()) == 0


def test_the_shard_count_changes_while_the_job_runs(spark: Any, sqlite_url: str) -> None:
    """2 -> 4 -> 1 shards under a running job, with traffic and retries in
    flight: the job takes the new shards at its next batch (its batch in
    flight loses its commit and runs again); nothing lost, order kept."""
    from riverbed.spark.delivery_job import DeliveryJob
    from riverbed.subscriptions.pipeline import is_idle
    from riverbed.subscriptions.reshard import change_shard_count

    with Endpoint(delay=0.002) as endpoint:
        setup(sqlite_url, endpoint, groups=20, per_group=60, inline=0)
        for g in range(0, 20, 4):
            endpoint.fail(f"g{g}:1".encode(), 503, times=1)
        endpoint.fail(b"g7:3:", 400)
        job = DeliveryJob(spark, sqlite_url, "billing", trigger_seconds=0.1, max_per_trigger=200)
        stop = threading.Event()
        runner = threading.Thread(target=job.run, kwargs={"stop": stop})
        runner.start()
        storage = open_storage(sqlite_url)
        try:
            endpoint.wait_for(300, timeout=120)
            assert change_shard_count(storage, "billing", 4).new_count == 4
            produce_groups(storage, 20, 60, 20)
            endpoint.wait_for(800, timeout=120)
            assert change_shard_count(storage, "billing", 1).new_count == 1
            deadline = time.monotonic() + 120
            while not is_idle(storage, "billing") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert is_idle(storage, "billing")
            rq = queued(storage, "billing.rq")
            parked = [p.message for p in parked_in(storage, "billing", limit=10_000)]
        finally:
            stop.set()
            runner.join(timeout=60)
            storage.close()
        delivered = endpoint.delivered()
    assert not runner.is_alive()
    repeated = check_outcome(
        delivered, rq, parked, 20, 80, {f"g7:{n}:".encode() for n in range(3, 80)}, copies=3
    )
    assert repeated <= 2 * 200  # at most a batch per change


def test_a_second_job_waits_and_takes_over(spark: Any, sqlite_url: str) -> None:
    """One job delivers a subscription at a time: a second one waits as a
    standby and takes over when the first stops; nothing lost, order kept."""
    from riverbed.spark.delivery_job import DeliveryJob

    with Endpoint(delay=0.002) as endpoint:
        setup(sqlite_url, endpoint, groups=10, per_group=100)
        first = DeliveryJob(
            spark, sqlite_url, "billing", trigger_seconds=0.1, max_per_trigger=100, lease_seconds=10
        )
        stop_first, stop_second = threading.Event(), threading.Event()
        one = threading.Thread(target=first.run, kwargs={"stop": stop_first})
        one.start()
        told: list[str] = []
        started: list[DeliveryJob] = []

        def standby() -> None:
            job = DeliveryJob(
                spark,
                sqlite_url,
                "billing",
                trigger_seconds=0.1,
                lease_seconds=10,
                stop=stop_second,
                on_wait=told.append,
            )
            started.append(job)
            job.run(until_idle=True, stop=stop_second)

        two = threading.Thread(target=standby)
        two.start()
        try:
            endpoint.wait_for(200, timeout=120)
            deadline = time.monotonic() + 30
            while not told and time.monotonic() < deadline:
                time.sleep(0.05)
            assert told and first.owner in told[0]
            assert not started  # still waiting while the first one runs
            stop_first.set()
            one.join(timeout=60)
            two.join(timeout=120)
            assert started and not two.is_alive()
        finally:
            stop_first.set()
            stop_second.set()
            one.join(timeout=60)
            two.join(timeout=60)
        delivered = endpoint.delivered()
    check_outcome(delivered, [], [], 10, 100, set())


def test_the_lease_is_kept_while_spark_starts_slowly(
    spark: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's start-up took 30-80 s on a loaded machine, longer than the lease,
    and nothing renewed it meanwhile: the job stopped itself ("lost its
    lease") with no other job around. A thread renews it from the moment it is
    taken."""
    from riverbed.spark.delivery_job import DeliveryJob

    started = DeliveryJob._start

    def slow_start(job: DeliveryJob, *args: Any) -> Any:
        # Spark starting slowly: the start waits until the lease (3 s) was
        # renewed well past the time it was taken for.
        first = job._lease.expires_us
        eventually(
            lambda: job._lease.expires_us > first + 4_500_000, 60, "renewals during the start"
        )
        return started(job, *args)

    monkeypatch.setattr(DeliveryJob, "_start", slow_start)
    with Endpoint(delay=0.0) as endpoint:
        setup(sqlite_url, endpoint, groups=2, per_group=10)
        # 3 s, renewed every second: room for a renewal late by two seconds on
        # a busy machine (with 1 s, one late by 0.7 s lost it during a full run).
        job = DeliveryJob(spark, sqlite_url, "billing", trigger_seconds=0.1, lease_seconds=3)
        totals = job.run(until_idle=True)
        delivered = endpoint.delivered()
    assert totals.delivered == 20
    check_outcome(delivered, [], [], 2, 10, set())
