"""Nodes on one SQLite file tell a crashed node from a running one by a lock
the kernel drops with its process (`riverbed/cluster/presence.py`), not by
waiting for its liveness lease: its Wills go and its sessions are free as
soon as a node looks (its start, its next expiry sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.broker import Client
from harness.net import free_port
from harness.nodes import lease_of, named_node
from harness.waiting import eventually
from riverbed.cluster import presence as presence_module
from riverbed.cluster.presence import FilePresence
from riverbed.errors import NodeRunning

LONG_LEASE = 3600.0
"""A liveness lease no test waits out: what happens, happens without its lapse."""

HOLDER = """
import sys, time
from pathlib import Path
from riverbed.cluster.presence import FilePresence
FilePresence(Path(sys.argv[1])).hold(sys.argv[2])
print("held", flush=True)
time.sleep(3600)
"""


def holder(database: Path, node: str) -> subprocess.Popen[str]:
    """Another process holding `node`'s presence (until it is killed)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(database), node], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    with process.stdout:
        assert process.stdout.readline().strip() == "held"
    return process


def test_a_node_is_gone_once_its_process_is_killed(tmp_path: Path) -> None:
    database = tmp_path / "riverbed.db"
    here = FilePresence(database)
    here.hold("here")
    other = holder(database, "node/with odd:name")
    try:
        assert here.reap() == set()  # it runs
        assert sorted(p.name for p in here.folder.iterdir()) == [
            "here.lock",
            "node%2Fwith%20odd%3Aname.lock",
        ]
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
        assert here.reap() == {"node/with odd:name"}
        assert here.reap() == set()  # named once
        assert [p.name for p in here.folder.iterdir()] == ["here.lock"]
    finally:
        other.kill()
        other.wait()
    here.leave()
    assert list(here.folder.iterdir()) == []
    here.leave()  # twice: nothing more


def test_a_second_process_cannot_hold_a_running_nodes_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "riverbed.db"
    other = holder(database, "node-1")
    monkeypatch.setattr(presence_module, "HOLD_WAIT", 0.2)
    try:
        with pytest.raises(NodeRunning, match=r"node 'node-1' runs already: another process holds"):
            FilePresence(database).hold("node-1")
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
        again = FilePresence(database)
        again.hold("node-1")  # its successor under the same name
        assert FilePresence(database).reap() == set()
        again.leave()
    finally:
        other.kill()
        other.wait()


def test_a_database_reached_by_another_path_has_the_same_folder(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    a = FilePresence(tmp_path / "data" / "riverbed.db")
    b = FilePresence(tmp_path / "link" / "riverbed.db")
    assert a.folder == b.folder == tmp_path / "data" / "riverbed.db.nodes"


def test_a_killed_nodes_will_goes_before_its_lease_lapses(sqlite_url: str, tmp_path: Path) -> None:
    """Two nodes on one SQLite file, leases of an hour: B publishes the Will
    of A's client at its first sweep after A is killed, and A's lease shows
    lapsed from then on."""
    with (
        named_node(sqlite_url, tmp_path, "node-a", node_lease_ttl=LONG_LEASE) as a,
        named_node(sqlite_url, tmp_path, "node-b", node_lease_ttl=LONG_LEASE) as b,
    ):
        watcher = Client(b.port, "watcher")
        watcher.connect()
        watcher.subscribe("will/#", qos=1)
        dies = Client(a.port, "dies")
        dies.connect(clean=True, expiry=600, will=("will/dies", b"gone", 1, False))
        a.kill()
        dies.close()
        watcher.wait_payloads(b"gone")
        b.wait_logged(r"node node-a is gone \(its process ended\)")
        assert lease_of(sqlite_url, "node-a") <= lease_of(sqlite_url, "node-b")
        # Its client comes back to B and takes its session at once.
        again = Client(b.port, "dies")
        assert again.connect(clean=False, expiry=600) is True
        assert eventually(lambda: b.session("dies")).node == "node-b"
        assert watcher.payloads() == [b"gone"]
        for client in (again, watcher):
            client.disconnect()


def test_a_second_broker_under_a_running_nodes_name_refuses_to_start(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Before, it took the running node's lease as its own (same owner) and
    both ran as one node."""
    with named_node(sqlite_url, tmp_path, "twin") as first:
        twin = subprocess.run(
            [
                sys.executable,
                "-m",
                "riverbed.cli",
                "--db",
                sqlite_url,
                "serve",
                "--allow-anonymous",
                "--config",
                str(tmp_path / "twin.toml"),
                "--mqtt",
                f"127.0.0.1:{free_port()}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert twin.returncode != 0
        assert "node 'twin' runs already: another process holds" in twin.stderr
        # The first one still serves.
        client = Client(first.port, "still-there")
        client.connect()
        client.disconnect()
