"""A new session with no Will is written to the store only once it needs to be
(`Broker.defers_ephemeral`): on SQLite its CONNECT commits nothing; its first
SUBSCRIBE, QoS 2 PUBLISH or QoS 2 window creates the record, and whatever it
stored goes with it, also after a crash. One that outlives its connection
(Session Expiry Interval above 0) is written at the latest when the
connection ends, or the broker stops; a crash before that loses a session
with nothing in it, and the client is told (Session Present 0). On
PostgreSQL the record is written at CONNECT as before (a CONNECT on another
node finds the connection it takes over by it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.mqtt.codec import Publish, Pubrec, Suback, Subscribe, SubscribeTopic
from riverbed.storage.urls import StorageUrl


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url) as running:
        yield running


def _qos2_markers(sqlite_url: str) -> int:
    """QoS 2 markers in the file, read without changing anything."""
    path = StorageUrl.parse(sqlite_url).path
    assert path is not None
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        (count,) = db.execute(
            "SELECT count(*) FROM markers WHERE marker LIKE 'mqtt.qos2/%'"
        ).fetchone()
    return int(count)


def test_a_clean_session_is_stored_once_it_subscribes_and_gone_when_it_leaves(
    broker: BrokerProcess, storage_url: str
) -> None:
    sqlite = storage_url.startswith("sqlite")
    with RawClient(broker.port) as client:
        assert not client.connect("eph-1", clean=True, expiry=0).session_present
        # On SQLite nothing is written for it yet; PostgreSQL writes at CONNECT.
        assert (broker.session("eph-1") is None) is sqlite
        client.send(Subscribe(1, (SubscribeTopic("eph/#", 1),)))
        assert client.expect(Suback).packet_id == 1
        record = broker.session("eph-1")
        assert record is not None and record.connected
        assert [s.topic_filter for s in record.subscriptions] == ["eph/#"]
    broker.wait_logged(r"client eph-1 \(.*\) disconnected")
    eventually(lambda: broker.session("eph-1") is None, what="the session gone with its connection")


def test_a_clean_session_with_a_will_is_stored_at_connect(broker: BrokerProcess) -> None:
    client = Client(broker.port, "eph-will")
    client.connect(clean=True, expiry=0, will=("eph/will", b"gone", 1, False))
    record = broker.session("eph-will")
    assert record is not None and record.will is not None  # a crash must not lose the Will
    client.disconnect()


def test_a_clean_session_that_publishes_qos_1_is_never_stored(sqlite_url: str) -> None:
    with BrokerProcess(sqlite_url) as broker:
        sub = Client(broker.port, "eph-sub")
        sub.connect(clean=True, expiry=300)
        sub.subscribe("eph/p", qos=1)
        with RawClient(broker.port) as pub:
            pub.connect("eph-pub", clean=True, expiry=0)
            assert pub.publish_many([("eph/p", b"m%d" % i) for i in range(20)]) == 20
            assert broker.session("eph-pub") is None
        sub.wait_payloads(*[b"m%d" % i for i in range(20)])
        sub.disconnect()


def test_a_qos2_marker_of_a_clean_session_goes_after_a_crash(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Its first QoS 2 PUBLISH writes the record before the marker: killed
    before the PUBREL, the broker restarted finds the record (expired: it ended
    with the connection) and drops the marker with it. A marker with no record
    would stay for good. The restarted broker takes a new node name; the
    killed node's liveness lease (30 s, longer than the wait below) ends when
    the new one finds its process gone (riverbed/cluster/presence.py)."""
    with BrokerProcess(sqlite_url) as broker:
        with RawClient(broker.port) as pub:
            pub.connect("eph-q2", clean=True, expiry=0)
            pub.send(Publish("eph/q2", b"x", qos=2, packet_id=1))
            assert pub.expect(Pubrec).packet_id == 1
            record = broker.session("eph-q2")
            assert record is not None and record.connected
            assert _qos2_markers(sqlite_url) == 1
            broker.kill()
        broker.start()
        eventually(lambda: broker.session("eph-q2") is None, what="the expired record swept")
        eventually(lambda: _qos2_markers(sqlite_url) == 0, what="its QoS 2 marker dropped")


def test_a_new_persistent_session_is_stored_when_it_leaves(
    broker: BrokerProcess, storage_url: str
) -> None:
    sqlite = storage_url.startswith("sqlite")
    with RawClient(broker.port) as client:
        assert not client.connect("per-1", clean=False, expiry=300).session_present
        assert (broker.session("per-1") is None) is sqlite
    broker.wait_logged(r"client per-1 \(.*\) disconnected")
    eventually(lambda: broker.session("per-1") is not None, what="the session stored")
    record = broker.session("per-1")
    assert record is not None and not record.connected and record.expiry_interval == 300
    with RawClient(broker.port) as client:
        assert client.connect("per-1", clean=False, expiry=300).session_present


def test_a_new_persistent_session_with_a_will_is_stored_at_connect(broker: BrokerProcess) -> None:
    client = Client(broker.port, "per-will")
    client.connect(clean=False, expiry=300, will=("per/will", b"gone", 1, False))
    record = broker.session("per-will")
    assert record is not None and record.will is not None  # a crash must not lose the Will
    client.disconnect()


def test_a_persistent_session_kept_in_memory_is_stored_when_the_broker_stops(
    sqlite_url: str,
) -> None:
    with BrokerProcess(sqlite_url) as broker, RawClient(broker.port) as client:
        assert not client.connect("per-stop", clean=False, expiry=300).session_present
        assert broker.session("per-stop") is None
        broker.restart()
        record = broker.session("per-stop")
        assert record is not None and record.expiry_interval == 300
        with RawClient(broker.port) as again:
            assert again.connect("per-stop", clean=False, expiry=300).session_present


def test_a_crash_loses_a_new_persistent_session_only_while_it_holds_nothing(
    sqlite_url: str,
) -> None:
    """Killed before the session stored anything, the broker comes back without
    it, and says so (Session Present 0); once it subscribed, it is stored and
    resumes after the crash with its subscription (the restarted broker takes
    a new node name, so the resume is immediate)."""
    with BrokerProcess(sqlite_url) as broker:
        with RawClient(broker.port) as empty, RawClient(broker.port) as subscribed:
            assert not empty.connect("per-empty", clean=False, expiry=300).session_present
            assert not subscribed.connect("per-sub", clean=False, expiry=300).session_present
            subscribed.send(Subscribe(1, (SubscribeTopic("per/sub", 1),)))
            assert subscribed.expect(Suback).packet_id == 1
            assert broker.session("per-empty") is None
            assert broker.session("per-sub") is not None
            broker.kill()
        broker.start()
        with RawClient(broker.port) as empty:
            assert not empty.connect("per-empty", clean=False, expiry=300).session_present
        sub = Client(broker.port, "per-sub")
        assert sub.connect(clean=False, expiry=300)
        with RawClient(broker.port) as pub:
            pub.connect("per-pub", clean=True, expiry=0)
            assert pub.publish_many([("per/sub", b"after")]) == 1
        sub.wait_payloads(b"after")
        sub.disconnect()
