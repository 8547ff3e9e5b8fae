"""`riverbed subscription run NAME --metrics`: the delivery job's driver serves
`riverbed_delivery_messages_total{subscription,outcome}` over HTTP, counted from
each batch's result, against a real local HTTP endpoint that fails on command;
scraped and parsed as Prometheus would, and equal to the totals the job prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.delivery import by_group, produce_groups, subscribe
from harness.endpoint import Endpoint
from harness.waiting import eventually
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import ConsumptionPolicy, RetryPolicy

pytestmark = pytest.mark.spark

RIVERBED = str(Path(sys.executable).with_name("riverbed"))


def _outcomes(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "riverbed_delivery_messages"
        for s in family.samples
        if s.labels.get("subscription") == "billing"
    }


def test_the_delivery_job_counts_delivered_retried_parked(sqlite_url: str, tmp_path: Path) -> None:
    with Endpoint() as endpoint:
        storage = open_storage(sqlite_url)
        try:
            subscribe(
                storage,
                endpoint.url,
                retry=RetryPolicy(
                    retry_on_status=(503,),
                    min_delay=0.2,
                    max_delay=1,
                    max_attempts=3,
                    inline_max_delay=0,  # every retry through the retry queue: counted
                ),
                consumption=ConsumptionPolicy(max_in_flight=16, max_parallel_groups=16),
            )
            produce_groups(storage, 3, 0, 10)
        finally:
            storage.close()
        endpoint.fail(b"g1:4:", 503, times=2)  # retried twice, delivered at attempt 3
        endpoint.fail(b"g2:7:", 400)  # parked at once; g2's 8 and 9 follow it to the DLQ
        log = tmp_path / "job.log"
        with log.open("ab") as out:
            job = subprocess.Popen(
                [RIVERBED, "subscription", "run", "billing", "--db", sqlite_url,
                 "--trigger-interval", "0.1", "--metrics", "127.0.0.1:0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the JVM and its Python workers with it
                env={**os.environ, "TMPDIR": str(tmp_path)},
            )  # fmt: skip
        try:
            found = eventually(
                lambda: re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", log.read_text()),
                what="the job to say where its metrics are",
                explain=lambda: log.read_text()[-3000:],
            )
            base = found.group(1)
            # Served from the start, before Spark has run a batch.
            assert set(_outcomes(base)) == {"delivered", "retried", "parked"}
            expected = {"delivered": 27.0, "retried": 2.0, "parked": 1.0}
            eventually(
                lambda: _outcomes(base) == expected,
                180,
                what=f"the counts {expected}",
                explain=lambda: (_outcomes(base), log.read_text()[-3000:]),
            )
            job.send_signal(signal.SIGTERM)
            assert job.wait(timeout=120) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        got = by_group(endpoint.delivered())
    assert {g: sorted(set(seqs)) for g, seqs in got.items()} == {
        "g0": list(range(10)),
        "g1": list(range(10)),
        "g2": list(range(7)),
    }
    assert "delivered 27, retried 2, parked 1" in log.read_text()
