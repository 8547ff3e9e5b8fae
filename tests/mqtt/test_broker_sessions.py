"""Persistent sessions end to end: resume, clean start, expiry, restarts, crashes.

Real paho-mqtt 2.x clients over TCP against `riverbed serve` in a subprocess, on
both storage backends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.waiting import eventually
from riverbed.clock import now_us

PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url) as running:
        yield running


def _publish(port: int, topic: str, payloads: list[bytes], client_id: str = "pub") -> None:
    pub = Client(port, client_id)
    pub.connect()
    infos = [pub.publish(topic, p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(30)
    pub.disconnect()


def _numbered(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


def _wait_expired(broker: BrokerProcess, client_id: str) -> None:
    """Wait until the broker has recorded `client_id`'s disconnect and the
    session's expiry interval has passed since, by the broker's own record:
    time passing is the scenario, but counted from when the broker saw it."""
    eventually(
        lambda: (
            (r := broker.session(client_id)) is None or (not r.connected and r.expired(now_us()))
        ),
        what=f"the session of {client_id!r} to expire",
        interval=0.1,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_resume_delivers_what_was_published_while_offline(
    broker: BrokerProcess, protocol: int
) -> None:
    sub = Client(broker.port, "sub", protocol=protocol)
    # MQTT 3.1.1 has no expiry: clean session 0 is what makes a session persistent.
    assert sub.connect(clean=protocol == paho.MQTTv5, expiry=300) is False
    sub.subscribe("s/#")
    _publish(broker.port, "s/1", _numbered("online", 5))
    sub.wait_payloads(*_numbered("online", 5))
    assert sub.payloads() == _numbered("online", 5)
    sub.disconnect()

    _publish(broker.port, "s/1", _numbered("offline", 50))

    again = Client(broker.port, "sub", protocol=protocol)
    assert again.connect(clean=False, expiry=300) is True  # [MQTT-3.1.2-5]
    again.wait_payloads(*_numbered("offline", 50))
    # The subscription survived: live messages still arrive. From the same
    # publisher (one key, one stream), so "live" also comes after anything
    # of the backlog that would come twice.
    _publish(broker.port, "s/2", [b"live"])
    got = again.wait_payloads(b"live")
    # In order, none twice, no old ones.
    assert again.payloads() == [*_numbered("offline", 50), b"live"]
    assert not any(m.dup for m in got)
    again.disconnect()


def test_clean_start_discards_the_session(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "sub")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("c/#")
    sub.disconnect()
    _publish(broker.port, "c/1", [b"missed"])
    fresh = Client(broker.port, "sub")
    assert fresh.connect(clean=True, expiry=300) is False  # [MQTT-3.1.2-4]
    _publish(broker.port, "c/1", [b"after"])
    # A marker from the same publisher (one key, one stream), after "after":
    # once it is here, "after" would have been too.
    fresh.subscribe("marker/#")
    _publish(broker.port, "marker/1", [b"marker 1"])
    fresh.wait_payloads(b"marker 1")
    assert fresh.payloads() == [b"marker 1"]  # no c/# subscription any more
    fresh.disconnect()
    again = Client(broker.port, "sub")
    assert again.connect(clean=False, expiry=300) is True
    _publish(broker.port, "marker/1", [b"marker 2"])
    again.wait_payloads(b"marker 2")
    assert again.payloads() == [b"marker 2"]  # neither "missed" nor "after"
    again.disconnect()


def test_mqtt311_clean_session_0_persists(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "old", protocol=paho.MQTTv311)
    assert sub.connect(clean=False) is False
    sub.subscribe("v3/#")
    sub.disconnect()
    _publish(broker.port, "v3/x", _numbered("m", 10))
    again = Client(broker.port, "old", protocol=paho.MQTTv311)
    assert again.connect(clean=False) is True
    again.wait_payloads(*_numbered("m", 10))
    assert again.payloads() == _numbered("m", 10)
    again.disconnect()


def test_session_expiry(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "brief")
    sub.connect(clean=True, expiry=1)
    sub.subscribe("e/#")
    sub.disconnect()
    _wait_expired(broker, "brief")
    again = Client(broker.port, "brief")
    assert again.connect(clean=False, expiry=1) is False  # [MQTT-4.1.0-2]
    again.disconnect()


def test_expiry_changed_at_disconnect(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "changer")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("d/#")
    sub.disconnect(expiry=1)
    _wait_expired(broker, "changer")
    again = Client(broker.port, "changer")
    assert again.connect(clean=False, expiry=300) is False
    again.disconnect()


def test_expiry_zero_ends_with_the_connection(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "zero")
    sub.connect(clean=True, expiry=0)
    sub.subscribe("z/#")
    sub.disconnect()
    again = Client(broker.port, "zero")
    assert again.connect(clean=False, expiry=0) is False
    again.disconnect()


@pytest.mark.slow
def test_session_and_expiry_survive_a_restart(broker: BrokerProcess) -> None:
    keeper = Client(broker.port, "keeper")
    keeper.connect(clean=True, expiry=300)
    keeper.subscribe("r/#")
    keeper.disconnect()
    brief = Client(broker.port, "brief")
    brief.connect(clean=True, expiry=2)
    brief.subscribe("r/#")
    brief.disconnect()
    _publish(broker.port, "r/1", _numbered("before", 5))
    broker.restart()
    _publish(broker.port, "r/1", _numbered("after", 5))
    _wait_expired(broker, "brief")
    again = Client(broker.port, "keeper")
    assert again.connect(clean=False, expiry=300) is True
    # The marker comes after every message of the same publisher.
    _publish(broker.port, "r/1", [b"marker"])
    again.wait_payloads(b"marker")
    assert again.payloads() == [*_numbered("before", 5), *_numbered("after", 5), b"marker"]
    again.disconnect()
    expired = Client(broker.port, "brief")
    assert expired.connect(clean=False, expiry=2) is False  # expired while the broker was down
    expired.disconnect()


@pytest.mark.slow
@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_crash_loses_nothing_acknowledged(broker: BrokerProcess, online: bool) -> None:
    """SIGKILL the broker while a QoS 1 publisher is sending: every message the
    publisher got a PUBACK for reaches the persistent subscriber, in order; a
    message delivered (and acknowledged) before comes again only with DUP=1."""
    sub = Client(broker.port, "durable")
    sub.connect(clean=True, expiry=600)
    sub.subscribe("k/#")
    _publish(broker.port, "k/1", _numbered("early", 20), client_id="warmup")
    sub.wait_payloads(*_numbered("early", 20))
    if not online:
        sub.disconnect()

    total = 3000
    payloads = _numbered("m", total)
    pub = Client(broker.port, "crash-pub")
    pub.connect()
    sent: dict[int, bytes] = {}

    def produce() -> None:
        for payload in payloads:
            info = pub.publish("k/1", payload, qos=1)
            sent[info.mid] = payload
            if info.rc != paho.MQTT_ERR_SUCCESS and info.rc != paho.MQTT_ERR_QUEUE_SIZE:
                return

    producer = threading.Thread(target=produce)
    producer.start()
    eventually(lambda: len(pub.acked) >= total // 3, what=f"{total // 3} PUBACKs", interval=0.005)
    broker.kill()
    producer.join(60)
    pub.close()
    sub.close()
    acked = {sent[mid] for mid in list(pub.acked) if mid in sent}
    assert len(acked) >= total // 3

    before = sub.received if online else []
    had = {m.payload for m in before}
    broker.start()
    again = Client(broker.port, "durable")
    assert again.connect(clean=False, expiry=600) is True
    # A marker from the crashed publisher's client id (its key: its stream),
    # after everything it got into the log: once here, all of that came.
    _publish(broker.port, "k/1", [b"end"], client_id="crash-pub")
    again.wait_payloads(b"end", timeout=120)
    received = [m for m in again.received_now() if m.payload != b"end"]
    again.disconnect()

    missing = acked - had - {m.payload for m in received}
    assert not missing, f"{len(missing)} acknowledged messages lost"
    # Duplicates only with DUP=1: whatever this subscriber had already been
    # given (before the crash, or earlier on this connection) comes again marked.
    seen = {m.payload for m in before} | {b"early%d" % i for i in range(20)}
    for message in received:
        if message.payload in seen:
            assert message.dup, f"{message.payload!r} delivered again without DUP"
        seen.add(message.payload)
    # Per-key (per-publisher) order: the first deliveries of m<i> go up.
    order = [int(m.payload[1:]) for m in [*before, *received] if m.payload.startswith(b"m")]
    firsts: list[int] = []
    known: set[int] = set()
    for n in order:
        if n not in known:
            known.add(n)
            firsts.append(n)
    assert firsts == sorted(firsts)
