"""`riverbed status`: read from the database, with the broker running and
stopped, and creating nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from harness.broker import BrokerProcess, Client
from harness.cli import rb
from harness.waiting import eventually
from riverbed.clock import now_us
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.sessions.store import SessionRecord, SessionStore, node_lease
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases
from riverbed.subscriptions.named import Subscriptions

SECOND = 1_000_000


def status(url: str) -> dict[str, Any]:
    result = rb(url, "status", "--json")
    assert result.exit_code == 0, result.output
    info: dict[str, Any] = json.loads(result.output)
    return info


def test_with_a_broker_running_it_is_up_and_after_it_stops_it_is_down(sqlite_url: str) -> None:
    with BrokerProcess(sqlite_url) as broker:
        client = Client(broker.port, "reader")
        client.connect(clean=False, expiry=3600)
        try:
            client.subscribe("sensors/#")
            info = status(sqlite_url)
            assert info["broker"] == {"up": True, "nodes_up": 1, "nodes": 1}
            (node,) = info["nodes"]
            assert node["up"] and node["lease_seconds_left"] > 0
            assert node["sessions"] == 1
            assert info["sessions"] == {"total": 1, "online": 1, "offline": 0}
            text = rb(sqlite_url, "status").output
            assert "broker: up (1 of 1 nodes with a fresh lease)" in text
            assert "sessions: 1 (1 online, 0 offline)" in text
            client.disconnect()
            eventually(
                lambda: status(sqlite_url)["sessions"]["online"] == 0,
                what="the session offline",
            )
        finally:
            client.close()
        assert broker.stop() == 0

    info = status(sqlite_url)
    assert info["broker"]["up"] is False
    assert info["nodes"] == []  # a node that stops gives its lease up
    assert info["sessions"] == {"total": 1, "online": 0, "offline": 1}
    assert "broker: down (no broker node holds a lease)" in rb(sqlite_url, "status").output


def test_a_node_whose_lease_ran_out_is_down(storage_url: str) -> None:
    """What a crashed broker leaves: its lease, unrenewed, and session records
    still marked connected on it."""
    storage = open_storage(storage_url)
    try:
        leases = Leases(storage)
        then = now_us() - 60 * SECOND
        leases.acquire(node_lease("crashed"), "crashed", 30 * SECOND, now_us=then)
        leases.acquire(node_lease("alive"), "alive", 3600 * SECOND)
        record = SessionRecord("c1", "s1", 5, 3600, connected=True, seen_us=then, node="crashed")
        SessionStore(storage).write(record, None)
    finally:
        storage.close()

    info = status(storage_url)

    assert info["broker"] == {"up": True, "nodes_up": 1, "nodes": 2}
    nodes = {n["node"]: n for n in info["nodes"]}
    assert nodes["alive"]["up"] is True
    assert nodes["crashed"]["up"] is False and nodes["crashed"]["lease_seconds_left"] < 0
    assert (nodes["crashed"]["sessions"], nodes["alive"]["sessions"]) == (1, 0)
    assert info["sessions"] == {"total": 1, "online": 0, "offline": 1}
    text = rb(storage_url, "status").output
    assert "expired" in text and "fresh, expires in" in text


def test_topics_subscriptions_and_lag(storage_url: str) -> None:
    with Log.open(storage_url) as log:
        log.topics.create("orders", 2)
        Subscriptions(log.storage).create("billing", "orders")
        log.produce("orders", [Message(b"m%d" % i, key=f"k{i}") for i in range(7)])
        consumer = Subscriptions(log.storage).consumer("billing")
        assert len(consumer.poll(3)) == 3
        consumer.commit()

    assert rb(storage_url, "group", "create", "audit", "sensors/#").exit_code == 0

    info = status(storage_url)

    assert info["groups"] == [{"group": "audit", "filter": "sensors/#", "leader": None, "lag": 0}]
    topics = {t["name"]: t for t in info["topics"]}
    assert topics["orders"] == {"name": "orders", "partitions": 2, "messages": 7, "appended": 7}
    assert info["subscriptions"] == [{"name": "billing", "topic": "orders", "lag": 4}]
    assert info["queues"] == {"retry": 0, "dead_letter": 0}
    text = rb(storage_url, "status").output
    assert "billing" in text and "orders" in text


def test_it_creates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/data/riverbed.db"

    result = rb(url, "status")

    assert result.exit_code == 1
    assert result.output == (
        f"error: no Riverbed database at {tmp_path}/data/riverbed.db (create one with"
        " riverbed serve or riverbed topic create)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_it_leaves_an_empty_database_without_topics(storage_url: str) -> None:
    open_storage(storage_url).close()  # the tables, no topic yet

    assert status(storage_url)["topics"] == []

    storage = open_storage(storage_url)
    try:
        assert storage.list_topics() == []  # not even the built-in `mqtt`
    finally:
        storage.close()


def test_postgres_database_without_riverbed_tables(postgres_url: str) -> None:
    result = rb(postgres_url, "status")

    assert result.exit_code == 1
    assert "no Riverbed database at" in result.output

    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('meta')").fetchone() == (None,)
