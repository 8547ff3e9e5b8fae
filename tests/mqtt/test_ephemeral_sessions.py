"""A session that ends with its connection (Session Expiry Interval 0, no Will)
is written to the store only once it needs to be (`Broker.defers_ephemeral`):
on SQLite its CONNECT commits nothing; its first SUBSCRIBE, QoS 2 PUBLISH or
QoS 2 window creates the record, and whatever it stored goes with it, also
after a crash. On PostgreSQL the record is written at CONNECT as before (a
CONNECT on another node finds the connection it takes over by it).
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
