"""`riverbed cluster status` and `riverbed cluster drain` on SQLite, where
there is one node: the view, the drain request found at the node's sweep, and
bad input (an unknown node, one not alive, a bad --timeout) refused with
nothing changed. Two nodes on PostgreSQL: tests/cluster/test_drain.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.broker import BrokerProcess, Client
from harness.waiting import SLOW
from riverbed.cli import cli
from riverbed.clock import now_us
from riverbed.cluster.directory import DRAINS
from riverbed.sessions.store import node_lease
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases


@pytest.fixture
def empty_db(db: str) -> str:
    """A database that exists, with no broker node."""
    open_storage(db, create=True).close()
    return db


def drain_requests(url: str) -> list[str]:
    storage = open_storage(url)
    try:
        return [e.key for e in storage.kv_list(DRAINS)]
    finally:
        storage.close()


def test_status_without_nodes(empty_db: str) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["cluster", "status", "--db", empty_db])
    assert result.exit_code == 0
    assert "no broker node on this database" in result.output
    result = runner.invoke(cli, ["cluster", "status", "--json", "--db", empty_db])
    assert (result.exit_code, json.loads(result.output)) == (0, [])


def test_draining_an_unknown_node_is_refused(empty_db: str) -> None:
    result = CliRunner().invoke(cli, ["cluster", "drain", "ghost", "--db", empty_db])
    assert result.exit_code == 1
    assert "error: no broker node 'ghost' holds a lease on this database (alive: none" in (
        result.output
    )
    assert drain_requests(empty_db) == []


def test_draining_a_node_whose_lease_lapsed_is_refused(empty_db: str) -> None:
    storage = open_storage(empty_db)
    try:
        long_ago = now_us() - 60_000_000
        Leases(storage).acquire(node_lease("dead"), "dead", 1_000_000, now_us=long_ago)
    finally:
        storage.close()
    result = CliRunner().invoke(cli, ["cluster", "drain", "dead", "--db", empty_db])
    assert result.exit_code == 1
    assert "error: broker node 'dead' is not alive: its lease lapsed 59 s ago" in result.output
    assert drain_requests(empty_db) == []
    status = CliRunner().invoke(cli, ["cluster", "status", "--db", empty_db])
    assert "lapsed" in status.output


@pytest.mark.parametrize("timeout", ["0", "-1", "3601", "soon"])
def test_a_bad_timeout_is_refused(empty_db: str, timeout: str) -> None:
    result = CliRunner().invoke(
        cli, ["cluster", "drain", "ghost", "--timeout", timeout, "--db", empty_db]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--timeout'" in result.output
    assert timeout in result.output
    assert drain_requests(empty_db) == []


def test_the_one_node_on_sqlite_drains_at_its_sweep(sqlite_url: str) -> None:
    broker = BrokerProcess(sqlite_url)
    broker.start()
    try:
        client = Client(broker.port, "lonely")
        client.connect(clean=True, expiry=600)
        client.subscribe("l/#", qos=1)
        status = CliRunner().invoke(cli, ["cluster", "status", "--json", "--db", sqlite_url])
        (node,) = json.loads(status.output)
        assert node["alive"] and node["sessions"] == 1
        assert node["addresses"] == [f"mqtt://127.0.0.1:{broker.port}"]
        result = CliRunner().invoke(
            cli,
            ["cluster", "drain", node["node"], "--timeout", str(60 * SLOW), "--db", sqlite_url],
        )
        assert result.exit_code == 0, result.output
        assert "looks at its next expiry sweep" in result.output
        assert f"node {node['node']} drained: 1 client connection asked to move" in result.output
        assert broker.process is not None and broker.process.wait(60 * SLOW) == 0
        assert client.wait_disconnected(30)
        assert client.disconnects[:1] == [0x9C]
        record = broker.session("lonely")
        assert record is not None and not record.connected  # saved
        assert drain_requests(sqlite_url) == []
        client.close()
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ('node_name = ""', "must be 1 to 63 letters, digits"),
        ('node_name = "node a"', "must be 1 to 63 letters, digits"),
        ('node_name = "-node"', "starting with a letter or digit"),
        ("node_name = 7", "must be 1 to 63 letters, digits"),
        ('server_reference = ""', "must be a non-empty string"),
        ('server_reference = "a\\nb"', "must be a non-empty string"),
    ],
)
def test_a_bad_cluster_setting_stops_serve_before_it_starts(
    tmp_path: Path, sqlite_url: str, text: str, rule: str
) -> None:
    config = tmp_path / "riverbed.toml"
    config.write_text(f"[cluster]\n{text}\n")
    key = text.partition(" =")[0]
    result = CliRunner().invoke(
        cli, ["serve", "--config", str(config), "--db", sqlite_url, "--mqtt", "127.0.0.1:0"]
    )
    assert result.exit_code == 2, result.output
    assert f"cluster.{key}" in result.output and rule in result.output
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing created
