"""Wills across a takeover between live nodes (docs/cluster.md, "Takeover across
nodes"): the taken connection's Will without delay is published once, at the
takeover; one with a delay is not, since the session was resumed (on the other
node) within it [MQTT-3.1.3-9].
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.nodes import named_node
from harness.waiting import SLOW, eventually

DELAY = 4
"""The Will Delay (s) of the connection taken over: waited out by the test."""


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with (
        named_node(postgres_url, tmp_path, "node-a", node_lease_ttl=30) as a,
        named_node(postgres_url, tmp_path, "node-b", node_lease_ttl=30) as b,
    ):
        yield a, b


def taken_over(a: BrokerProcess, b: BrokerProcess, client_id: str, delay: int) -> Client:
    """`client_id` connected to A with a Will (delay `delay`), then taken by a
    connection to B; returns the new connection."""
    old = Client(a.port, client_id)
    old.connect(
        clean=True, expiry=600, will=(f"will/{client_id}", b"gone", 1, False), will_delay=delay
    )
    assert old.paho is not None
    old.paho._reconnect_on_failure = False  # no public setter
    new = Client(b.port, client_id)
    assert new.connect(clean=False, expiry=600, timeout=60 * SLOW) is True
    assert old.wait_disconnected(30)
    assert old.disconnects[:1] == [0x8E]
    old.close()
    return new


def test_a_will_across_a_takeover_between_live_nodes(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = nodes
    watcher = Client(b.port, "watcher")
    watcher.connect()
    watcher.subscribe("will/#", qos=1)
    at_once = taken_over(a, b, "at-once", 0)
    watcher.wait_payloads(b"gone", timeout=30 * SLOW)
    later = taken_over(a, b, "resumed", DELAY)
    resumed = time.monotonic()
    # Past its delay (A's timer fired, and found the session resumed on B).
    eventually(lambda: time.monotonic() > resumed + DELAY + 2, 30 * SLOW, "the delay passed")
    a.wait_logged("client resumed: will no longer pending", timeout=30 * SLOW)
    marker = Client(b.port, "marker")
    marker.connect()
    marker.publish("will/marker", b"marker", qos=1).wait_for_publish(30)
    watcher.wait_payloads(b"marker", timeout=30 * SLOW)
    assert [(r.topic, r.payload) for r in watcher.received] == [
        ("will/at-once", b"gone"),
        ("will/marker", b"marker"),
    ]
    for client in (at_once, later, marker, watcher):
        client.disconnect()
