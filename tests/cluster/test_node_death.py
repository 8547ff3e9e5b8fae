"""A node that dies (SIGKILL) leaves its duties to the others (docs/cluster.md,
"When a node dies"): once its liveness lease lapsed, a surviving node publishes
the Wills of its clients, each once and when due (the Will Delay counted from
when the record was last seen), and its sessions expire on schedule.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client, Received
from harness.nodes import SHORT_LEASE, SWEEP, lease_of, named_node
from harness.waiting import SLOW, eventually
from riverbed.sessions.store import SessionRecord, SessionStore
from riverbed.storage import open_storage

DELAY = 12
"""A Will Delay (s) longer than the lease and a few sweeps: due after the lapse."""
LONG_DELAY = 40
"""A Will Delay (s) its client comes back within."""


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with (
        named_node(postgres_url, tmp_path, "node-a") as a,
        named_node(postgres_url, tmp_path, "node-b") as b,
    ):
        yield a, b


def wall(received: Received) -> float:
    """When a message arrived, in seconds since the epoch."""
    return time.time() - (time.monotonic() - received.at)


def test_a_dead_nodes_wills_are_published_once_by_another_node_when_due(
    postgres_url: str, nodes: tuple[BrokerProcess, BrokerProcess]
) -> None:
    a, b = nodes
    watcher = Client(b.port, "watcher")
    watcher.connect()
    watcher.subscribe("will/#", qos=1)
    now = Client(a.port, "dies-now")
    now.connect(clean=True, expiry=600, will=("will/now", b"now", 1, False), will_delay=0)
    later = Client(a.port, "dies-later")
    later.connect(clean=True, expiry=600, will=("will/later", b"later", 1, False), will_delay=DELAY)
    back = Client(a.port, "comes-back")
    back.connect(
        clean=True, expiry=600, will=("will/back", b"back", 1, False), will_delay=LONG_DELAY
    )
    records = {cid: a.session(cid) for cid in ("dies-now", "dies-later", "comes-back")}
    assert all(r is not None and r.node == "node-a" and r.will for r in records.values())
    a.kill()
    killed = time.time()
    for client in (now, later, back):
        client.close()
    # "comes-back" reconnects to B (taking its session from the dead node)
    # long before its Will is due: it is never published.
    again = Client(b.port, "comes-back")
    assert again.connect(clean=False, expiry=600, timeout=60 * SLOW) is True

    got = watcher.wait_payloads(b"now", b"later", timeout=(SHORT_LEASE + DELAY + 60) * SLOW)
    lapsed = lease_of(postgres_url, "node-a") / 1e6
    by_payload = {r.payload: r for r in got}
    assert wall(by_payload[b"now"]) >= lapsed - 0.5  # not before the lease lapsed
    later_record = records["dies-later"]
    assert later_record is not None
    due = later_record.seen_us / 1e6 + DELAY
    assert wall(by_payload[b"later"]) >= max(due, lapsed) - 0.5
    assert killed < lapsed

    # A crash between publishing a Will and clearing it, simulated: the Will is
    # put back into its record. A coming back (same name), or B at its next
    # sweep if it comes first, finds it, and its marker: nobody publishes it again.
    eventually(lambda: a_record(postgres_url, "dies-now").will is None, 30 * SLOW, "will cleared")
    put_back(postgres_url, "dies-now", records["dies-now"])
    a.start()
    eventually(
        lambda: a_record(postgres_url, "dies-now").will is None,
        30 * SLOW,
        "the will put back cleared by the node that came back",
    )
    found = "dies-now: will published already"
    eventually(lambda: a.logged(found) + b.logged(found), 30 * SLOW, "the marker found")
    marker = Client(b.port, "marker")
    marker.connect()
    marker.publish("will/marker", b"marker", qos=1).wait_for_publish(30)
    watcher.wait_payloads(b"marker", timeout=30 * SLOW)
    assert sorted(watcher.payloads()) == [b"later", b"marker", b"now"]
    assert again.received == []
    for client in (marker, again, watcher):
        client.disconnect()


def test_a_dead_nodes_sessions_expire_counting_from_when_they_were_last_seen(
    postgres_url: str, nodes: tuple[BrokerProcess, BrokerProcess]
) -> None:
    a, b = nodes
    expiry = 12
    client = Client(a.port, "short-lived")
    client.connect(clean=True, expiry=expiry)
    client.subscribe("s/#", qos=1)
    record = a.session("short-lived")
    assert record is not None and record.connected
    a.kill()
    client.close()
    lease = lease_of(postgres_url, "node-a") / 1e6
    expires = record.seen_us / 1e6 + expiry
    # Held while its node's lease ran, then offline but not expired yet.
    eventually(lambda: time.time() > lease + 2 * SWEEP, 30 * SLOW, "the lease lapsed")
    if time.time() < expires - 1:
        assert b.session("short-lived") is not None
    eventually(
        lambda: b.session("short-lived") is None, (expiry + 30) * SLOW, "the session expired"
    )
    assert time.time() >= expires
    b.wait_logged("session of client short-lived expired")


def a_record(url: str, client_id: str) -> SessionRecord:
    storage = open_storage(url)
    try:
        stored = SessionStore(storage).load(client_id)
    finally:
        storage.close()
    assert stored is not None
    return stored.record


def put_back(url: str, client_id: str, old: SessionRecord | None) -> None:
    """Write the Will `old` held back into the client's record."""
    assert old is not None
    storage = open_storage(url)
    try:
        store = SessionStore(storage)
        stored = store.load(client_id)
        assert stored is not None and stored.record.will is None
        store.write(replace(stored.record, will=old.will), stored.version)
    finally:
        storage.close()
