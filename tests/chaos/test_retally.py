"""`bench/chaos.py --retally DIR` counts a kept run (`--keep DIR`) again from its
files, on made-up directories: the shared group's repeat just after a fence its
broker logged is in window (the node log's wall clock put on the run's
monotonic clock by the pair of clocks events.json recorded, or for a directory
kept before that, by the publishers' connections); a directory that is not a
kept run is refused with a message naming it, and nothing is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WALL = time.mktime(time.strptime("2026-11-26 20:18:00", "%Y-%m-%d %H:%M:%S"))
"""20:18:00 local time (the broker logs' asctime), on the made-up run's clock 1000.0."""

NODE0_LOG = """\
--- start 1
2026-11-26 20:18:01,500 DEBUG riverbed.mqtt.connection: client chaos-p0 (('127.0.0.1', 1)) \
connected: MQTT 5, session 40, expiry 3600s
2026-11-26 20:18:05,000 INFO riverbed.sharedsub.host: group $share/g/chaos/#: leading as v1/leader/a
2026-11-26 20:18:20,000 INFO riverbed.sharedsub.agent: group $share/g/chaos/#: borrower s/n/1 \
replaced by s/n/2: the Leader may have dropped this Borrower (fence)
"""

PUBLISHER_LOG = """\
1001.000000 Sending CONNECT (u0, p0, wr0, wq0, wf0, c0, k30) client_id=b'chaos-p0'
1001.600000 Received CONNACK (0, Success)
1001.600100 on_connect Success
1002.000000 publish p0.k0.0 mid 1
1002.100000 publish p0.k0.1 mid 2
"""
"""Publisher p0 connected between 1001.0 and 1001.6 on the run's clock and its
broker logged it at 20:18:01,500 (so 20:18:00 is 999.8 +- 0.3 there)."""

DELIVERIES = [
    # The fence is at 1020.0: acknowledged 1 s before it, delivered again after.
    ["share-a", "p0.k0.0", 1019.0, 0, False, None],
    ["share-b", "p0.k0.0", 1021.0, 0, False, None],
    # The same on a session: no kill on its path, stale.
    ["sess-q1", "p0.k0.0", 1019.0, 0, False, None],
    ["sess-q1", "p0.k0.0", 1021.0, 0, True, None],
    ["sess-q1", "p0.k0.1", 1019.5, 0, False, None],
    # p0.k0.1 is twice in the log (a QoS 1 publisher's resend): the shared
    # group's repeat, acknowledged long before the fence, is that copy.
    ["share-a", "p0.k0.1", 1005.0, 0, False, None],
    ["share-b", "p0.k0.1", 1030.0, 0, False, None],
    ["workers", "p0.k0.0", 1003.0, 0, None, "s@0"],
    ["workers", "p0.k0.1", 1003.0, 1, None, "s@1"],
    ["workers", "p0.k0.1", 1003.0, 2, None, "s@2"],
]
EVENTS = [{"at": 999.0, "target": "run", "what": "started", "detail": ""}]


def kept_run(directory: Path, *, clock: bool) -> Path:
    """A made-up kept run: with the recorded clocks and acknowledged.json, or
    as kept before those were recorded."""
    directory.mkdir()
    (directory / "node0.log").write_text(NODE0_LOG)
    (directory / "deliveries.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DELIVERIES))
    if clock:
        recorded = {"clock": {"wall": WALL, "monotonic": 1000.0}, "events": EVENTS}
        (directory / "events.json").write_text(json.dumps(recorded))
        (directory / "acknowledged.json").write_text(
            json.dumps(
                {
                    "acknowledged": ["p0.k0.0", "p0.k0.1"],
                    "log_copies_beyond_one": {"p0.k0.1": 2},
                    "refused": [],
                }
            )
        )
    else:
        (directory / "events.json").write_text(json.dumps(EVENTS))
        (directory / "publisher-p0.log").write_text(PUBLISHER_LOG)
    return directory


def retally(tmp_path: Path, directory: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "counts.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--retally", str(directory),
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    return result, out


def check_counts(counts: dict[str, Any]) -> None:
    shared, session = counts["consumers"]["shared"], counts["consumers"]["sess-q1"]
    assert (shared["in_window"], shared["stale"], shared["lost"]) == (1, 0, 0), counts
    assert shared["republished_copies"] == 1, counts
    assert (session["in_window"], session["stale"], session["lost"]) == (0, 1, 0), counts
    assert counts["consumers"]["workers"]["expected"] == 2
    assert counts["shared_group_disruptions"] == {"node0": {"fences": 1, "leader_changes": 0}}


def test_a_kept_run_is_counted_again_with_the_shared_groups_fence(tmp_path: Path) -> None:
    result, out = retally(tmp_path, kept_run(tmp_path / "run", clock=True))
    assert result.returncode == 1, result.stderr  # the session's repeat is stale
    counts = json.loads(out.read_text())
    check_counts(counts)
    assert counts["notes"] == []
    assert "node0 1 fence(s), 0 Leader change(s)" in result.stdout


def test_a_run_kept_without_its_clocks_is_matched_by_the_publishers_connections(
    tmp_path: Path,
) -> None:
    result, out = retally(tmp_path, kept_run(tmp_path / "run", clock=False))
    assert result.returncode == 1, result.stderr
    counts = json.loads(out.read_text())
    check_counts(counts)
    # Logged at 20:18:01,5 between CONNECT (1001.0) and CONNACK (1001.6): 20:18:00
    # is 999.8 +- 0.3 on the run's clock (the fence 1019.8).
    assert abs(counts["clock"]["wall"] - counts["clock"]["monotonic"] - (WALL - 999.8)) < 0.001
    assert "clocks matched by the publishers' connections (within 0.301 s)" in result.stdout


def test_a_directory_that_is_not_a_kept_run_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result, out = retally(tmp_path, empty)
    assert result.returncode == 2
    assert f"--retally {empty}: no events.json there (not a directory a chaos run kept)" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not out.exists() and list(empty.iterdir()) == []
