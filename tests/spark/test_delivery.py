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
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.delivery import by_group, produce_groups, queued, subscribe
from harness.endpoint import Endpoint
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import ConsumptionPolicy, RetryPolicy

pytestmark = pytest.mark.spark

RIVERBED = str(Path(sys.executable).with_name("riverbed"))


def setup(url: str, endpoint: Endpoint, groups: int, per_group: int, shards: int = 2) -> None:
    storage = open_storage(url)
    try:
        subscribe(
            storage,
            endpoint.url,
            shards=shards,
            retry=RetryPolicy(retry_on_status=(503,), min_delay=0.2, max_delay=1, max_attempts=3),
            consumption=ConsumptionPolicy(max_in_flight=16, max_parallel_groups=16),
        )
        produce_groups(storage, groups, 0, per_group)
    finally:
        storage.close()


def test_the_job_delivers_retries_and_parks_in_group_order(spark: Any, storage_url: str) -> None:
    from riverbed.spark.delivery import DeliveryJob

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


def _run_job(url: str, log: Path) -> subprocess.Popen[bytes]:
    """`riverbed subscription run` in a process group of its own (the JVM and
    Python workers with it)."""
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
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_a_job_killed_mid_stream_loses_nothing_and_writes_no_queue_entry_twice(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Endpoint(delay=0.002) as endpoint:
        setup(sqlite_url, endpoint, groups=20, per_group=100)
        for g in range(0, 20, 3):
            endpoint.fail(f"g{g}:1".encode(), 503, times=1)  # g0:1:, g0:10:..19:, ...
        endpoint.fail(b"g4:5", 400)
        log = tmp_path / "job.log"
        job = _run_job(sqlite_url, log)
        try:
            deadline = time.monotonic() + 120
            while len(endpoint.delivered()) < 600 and time.monotonic() < deadline:
                assert job.poll() is None, log.read_text()[-3000:]
                time.sleep(0.05)
            assert len(endpoint.delivered()) >= 600, log.read_text()[-3000:]
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        killed_at = len(endpoint.delivered())
        assert killed_at < 2000  # mid-stream
        job = _run_job(sqlite_url, log)
        try:
            assert job.wait(timeout=180) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        delivered = endpoint.delivered()
        storage = open_storage(sqlite_url)
        try:
            rq = queued(storage, "billing.rq")
            parked = queued(storage, "billing.dlq")
        finally:
            storage.close()
    payloads = Counter(r.payload for r in delivered)
    parked_payloads = Counter(q.payload for q in parked)
    # Nothing lost: everything delivered or parked.
    everything = {f"g{g}:{n}:".encode() for g in range(20) for n in range(100)}
    assert set(payloads) | set(parked_payloads) == everything
    assert set(parked_payloads) == {f"g4:{n}:".encode() for n in range(5, 100)}
    # No queue entry twice: one per (message, attempt) in the RQ, one per message in the DLQ.
    assert max(Counter((q.message_id, q.attempt) for q in rq).values(), default=1) == 1
    assert max(parked_payloads.values()) == 1
    # Repeats only from the batch the kill cut short (at least once).
    repeated = sum(count - 1 for count in payloads.values())
    assert repeated <= 200 + 20
    # Order per group: the first deliveries of each group in main order.
    first: dict[str, list[int]] = {}
    seen: set[bytes] = set()
    for r in delivered:
        if r.payload not in seen:
            seen.add(r.payload)
            group, seq, _ = r.payload.split(b":")
            first.setdefault(group.decode(), []).append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in first.values())
