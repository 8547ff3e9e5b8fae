"""The chaos run's short mode (bench/chaos.py --short, issue 14): publishers,
persistent sessions, a shared group, competing workers and a delivering
subscription's Spark job on one store while broker nodes, workers and the job
are SIGKILLed and started again. Nothing acknowledged may be lost, no message
may come again after its acknowledgement had time to be committed (stale), per
key no message may overtake an earlier one, and every acknowledged message
must be in the log.

Every kind of kill comes at least once, each into live traffic: a broker
node or a worker while the publishers publish, the Spark job once it has
delivered (mid-stream: it is killed once, and the node and worker kills come
while it starts, so one Spark start, not one per kill, follows the first). The
two backends are two tests, which pytest-xdist runs side by side.

The run is a process of its own (the script as a user runs it); its counts
come back as JSON. The counting itself is tested on made-up records in
test_tally.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 480
"""Seconds a short run may take before it counts as hung: it takes about two
minutes with both cores busy, 3-4 on a busier machine (docs/testing.md), most
of it Spark's two start-ups."""

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(TIMEOUT + 180)]

ROOT = Path(__file__).resolve().parents[2]


def chaos(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run bench/chaos.py --short with `args`; its JSON counts."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (the delivery job)")
    out = tmp_path / "counts.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    log = tmp_path / "chaos.out"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "chaos.py"), "--short", "--json", str(out),
             "--keep", str(tmp_path / "run"), *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        try:
            code = process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            process.terminate()  # chaos.py stops what it started, then exits
            code = process.wait(120)
    report = log.read_text(errors="replace")[-8000:]
    assert out.exists(), f"no counts (exit {code}):\n{report}"
    counts: dict[str, Any] = json.loads(out.read_text())
    counts["report"] = report
    # Counted again from the kept files (--retally): the same counts.
    again = tmp_path / "again.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--retally", str(tmp_path / "run"),
         "--json", str(again)],
        env=env, capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert again.exists(), f"--retally wrote no counts:\n{report}"
    counts["counted_again"] = json.loads(again.read_text())["consumers"]
    return counts


def check(counts: dict[str, Any]) -> None:
    report = counts["report"]
    assert counts["kills"] >= 6, report
    assert {t.rstrip("0123456789") for t in counts["kills_by_target"]} == {
        "node",
        "worker",
        "job",
    }, report
    for kill in counts["kill_events"]:
        if kill["target"] == "job":
            assert kill["job_requests"] > 0, (kill, report)  # mid-stream
        else:
            assert kill["while_publishing"], (kill, report)
    assert counts["false_acknowledgements"] == [], report
    assert counts["log_order_violations"] == [], report
    assert counts["unacknowledged"] == 0, report
    assert not any(counts["qos2_repeats"].values()), report
    for name, c in counts["consumers"].items():
        assert c["expected"] > 1000, (name, report)
        assert c["lost_ids"] == [], (name, report)
        assert c["stale_ids"] == [], (name, report)
        assert c["order_violation_ids"] == [], (name, report)
    assert counts["target_met"], report
    for name, c in counts["consumers"].items():
        assert counts["counted_again"][name] == {
            k: v for k, v in c.items() if not k.endswith("_ids")
        }, (name, report)


def test_chaos_on_sqlite(tmp_path: Path) -> None:
    check(chaos(tmp_path, "--backend", "sqlite", "--seed", "11"))


@pytest.mark.postgres
def test_chaos_on_postgres_with_two_nodes(tmp_path: Path) -> None:
    from harness.postgres import PostgresUnavailable, find_bindir

    try:
        find_bindir()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL could not start: {exc}")
    check(chaos(tmp_path, "--backend", "postgres", "--nodes", "2", "--seed", "12"))
