"""`riverbed cluster drain NODE` (docs/cluster.md, "Draining a node"): the node
sends its clients to the others and exits 0, and nothing of their sessions is
lost; `riverbed cluster status` shows the nodes before and after.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from click.testing import CliRunner

from harness.broker import BrokerProcess, Client
from harness.nodes import named_node
from harness.waiting import SLOW, eventually
from riverbed.cli import cli

REFERENCE = "lb.example.com:1883"


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    config = f'server_reference = "{REFERENCE}"\n'
    with (
        named_node(postgres_url, tmp_path, "node-a", config=config) as a,
        named_node(postgres_url, tmp_path, "node-b", config=config) as b,
    ):
        yield a, b


class Stream:
    """QoS 1 messages `0`, `1`, ... published to `d/s` on one node until stopped."""

    def __init__(self, port: int) -> None:
        self.client = Client(port, "stream")
        self.client.connect()
        self.published = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            info = self.client.publish("d/s", str(self.published).encode(), qos=1)
            info.wait_for_publish(60)
            assert info.is_published()
            self.published += 1
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        self.client.disconnect()
        return self.published


def mover(port: int, client_id: str, protocol: int) -> tuple[Client, list[Any]]:
    """A client with a persistent session subscribed to the stream, that stays
    disconnected when the broker closes its connection; the DISCONNECT
    properties it gets are recorded."""
    client = Client(port, client_id, protocol=protocol)
    client.connect(clean=protocol != paho.MQTTv5, expiry=600)
    if protocol != paho.MQTTv5:
        client.close()
        client.connect(clean=False)  # MQTT 3.1.1: clean session 0 from here on
    client.subscribe("d/#", qos=1)
    assert client.paho is not None
    client.paho._reconnect_on_failure = False  # no public setter
    properties: list[Any] = []
    recorded = client.paho.on_disconnect

    def on_disconnect(c: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        properties.append(props)
        recorded(c, userdata, flags, reason, props)

    client.paho.on_disconnect = on_disconnect
    return client, properties


def cluster_status(url: str) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["cluster", "status", "--json", "--db", url])
    assert result.exit_code == 0, result.output
    return {n["node"]: n for n in json.loads(result.output)}


def test_a_drained_node_sends_its_clients_away_and_exits_with_nothing_lost(
    postgres_url: str, nodes: tuple[BrokerProcess, BrokerProcess]
) -> None:
    a, b = nodes
    v5, v5_disconnect = mover(a.port, "mover-5", paho.MQTTv5)
    v3, _ = mover(a.port, "mover-3", paho.MQTTv311)
    # A shared subscription whose Leader runs on A (its first member is there).
    member_a = Client(a.port, "member-a")
    member_a.connect()
    member_a.subscribe("$share/g/sh/#", qos=1)
    stream = Stream(b.port)
    v5.wait_for(3, timeout=30 * SLOW)
    v3.wait_for(3, timeout=30 * SLOW)

    def before() -> dict[str, dict[str, Any]] | None:
        view = cluster_status(postgres_url)
        a_view = view["node-a"]
        ok = (a_view["connections"], a_view["sessions"], a_view["leaders"]) == (3, 3, 1)
        return view if ok else None

    view = eventually(before, 30 * SLOW, "node-a's connections, sessions and Leader")
    assert view["node-a"]["alive"] and view["node-b"]["alive"]
    assert view["node-a"]["addresses"] == [f"mqtt://127.0.0.1:{a.port}"]
    assert a.process is not None and view["node-a"]["pid"] == a.process.pid
    assert (view["node-b"]["sessions"], view["node-b"]["leaders"]) == (1, 0)  # the publisher
    member_b = Client(b.port, "member-b")
    member_b.connect()
    member_b.subscribe("$share/g/sh/#", qos=1)

    result = CliRunner().invoke(
        cli, ["cluster", "drain", "node-a", "--timeout", str(60 * SLOW), "--db", postgres_url]
    )
    assert result.exit_code == 0, result.output
    assert "node node-a drained: 3 client connections asked to move" in result.output
    assert "1 shared-subscription Leader handed over" in result.output
    assert a.process.wait(60 * SLOW) == 0
    assert v5.wait_disconnected(30) and v3.wait_disconnected(30)
    assert v5.disconnects[:1] == [0x9C]  # Use another server
    assert v5_disconnect[0].ServerReference == REFERENCE

    # They reconnect to B and resume their sessions: nothing lost.
    before_drain = {c.client_id: c.payloads() for c in (v5, v3)}
    again5 = Client(b.port, "mover-5")
    assert again5.connect(clean=False, expiry=600) is True
    again3 = Client(b.port, "mover-3", protocol=paho.MQTTv311)
    assert again3.connect(clean=False) is True
    again5.wait_for(3, timeout=30 * SLOW)
    published = stream.stop()
    for old, new in ((v5, again5), (v3, again3)):

        def missing(old: Client = old, new: Client = new) -> list[int]:
            got = {int(p) for p in before_drain[old.client_id] + new.payloads()}
            return [seq for seq in range(published) if seq not in got]

        eventually(lambda: not missing(), 60 * SLOW, f"{old.client_id} got every message")

    # The group found a new Leader (on B): its member there gets what comes.
    sender = Client(b.port, "sender")
    sender.connect()
    sender.publish("sh/1", b"after-drain", qos=1).wait_for_publish(30)
    member_b.wait_payloads(b"after-drain", timeout=60 * SLOW)

    def after() -> dict[str, dict[str, Any]] | None:
        view = cluster_status(postgres_url)
        b_view = view["node-b"]
        # The movers, the group's member and the sender (the stream left).
        return view if (b_view["sessions"], b_view["leaders"]) == (4, 1) else None

    view = eventually(after, 30 * SLOW, "node-b's sessions and Leader")
    assert "node-a" not in view  # lease released, entry gone
    assert view["node-b"]["alive"]
    for client in (again5, again3, v5, v3, member_a, member_b, sender):
        client.close()


def test_draining_a_node_that_is_not_alive_changes_nothing(
    postgres_url: str, nodes: tuple[BrokerProcess, BrokerProcess]
) -> None:
    a, _b = nodes
    a.kill()
    runner = CliRunner()

    def lapsed() -> dict[str, dict[str, Any]] | None:
        view = cluster_status(postgres_url)
        return None if view["node-a"]["alive"] else view

    view = eventually(lapsed, 60 * SLOW, "node-a's lease lapsed")
    assert view["node-a"]["connections"] is None
    result = runner.invoke(cli, ["cluster", "drain", "node-a", "--db", postgres_url])
    assert result.exit_code == 1
    assert "broker node 'node-a' is not alive: its lease lapsed" in result.output
    a.start()  # with the same name: no drain request waits for it
    eventually(lambda: cluster_status(postgres_url)["node-a"]["alive"], 60 * SLOW, "node-a up")
    client = Client(a.port, "still-here")
    client.connect()
    client.disconnect()
