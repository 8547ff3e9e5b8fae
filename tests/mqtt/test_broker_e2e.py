"""End to end: paho-mqtt 2.x clients over TCP against `riverbed serve` in a subprocess."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from riverbed.mqtt.protocol import CONNECT_TIMEOUT

PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("qos", [0, 1])
def test_publish_subscribe(broker: BrokerProcess, protocol: int, qos: int) -> None:
    sub = Client(broker.port, "sub", protocol=protocol)
    assert sub.connect() is False
    assert sub.subscribe("a/#", qos=qos) == [qos]
    pub = Client(broker.port, "pub", protocol=protocol)
    pub.connect()
    infos = [pub.publish(f"a/{i % 3}", f"m{i}".encode(), qos=qos) for i in range(20)]
    for info in infos:
        info.wait_for_publish(30)
    got = sub.wait_for(20)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
    assert {m.qos for m in got} == {qos}
    assert not any(m.dup for m in got)
    pub.disconnect()
    sub.disconnect()


def test_qos_is_the_lower_of_message_and_subscription(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "sub")
    sub.connect()
    assert sub.subscribe("low/#", qos=0) == [0]
    assert sub.subscribe("high/#", qos=2) == [2]
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("low/x", b"a", qos=1).wait_for_publish(30)
    pub.publish("high/x", b"b", qos=0).wait_for_publish(30)
    pub.publish("high/x", b"c", qos=1).wait_for_publish(30)
    pub.publish("high/x", b"d", qos=2).wait_for_publish(30)
    got = sub.wait_for(4)
    assert [(m.payload, m.qos) for m in got] == [(b"a", 0), (b"b", 0), (b"c", 1), (b"d", 2)]
    pub.disconnect()
    sub.disconnect()


def test_overlapping_subscriptions_deliver_one_copy(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "sub")
    sub.connect()
    sub.subscribe("o/#", qos=0)
    sub.subscribe("o/+", qos=1)
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("o/x", b"one", qos=1).wait_for_publish(30)
    # A marker from the same publisher (key, stream): a second copy of "one"
    # would come before it.
    pub.publish("o/x", b"end", qos=1).wait_for_publish(30)
    sub.wait_payloads(b"one", b"end")
    assert [(m.payload, m.qos) for m in sub.received_now()] == [(b"one", 1), (b"end", 1)]
    pub.disconnect()
    sub.disconnect()


def test_dollar_topics_not_matched_by_leading_wildcards(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "sub")
    sub.connect()
    sub.subscribe("#", qos=1)
    sub.subscribe("$app/+", qos=1)
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("$app/x", b"dollar", qos=1).wait_for_publish(30)
    pub.publish("plain", b"plain", qos=1).wait_for_publish(30)
    # A marker from the same publisher (key, stream): a second copy of
    # "dollar" (were "#" to match it) would come before it.
    pub.publish("end", b"end", qos=1).wait_for_publish(30)
    sub.wait_payloads(b"dollar", b"plain", b"end")
    assert sub.payloads() == [b"dollar", b"plain", b"end"]
    pub.disconnect()
    sub.disconnect()


def test_unsubscribe_stops_delivery(broker: BrokerProcess) -> None:
    sub = Client(broker.port, "sub")
    sub.connect()
    sub.subscribe("u/#", qos=1)
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("u/1", b"before", qos=1).wait_for_publish(30)
    sub.wait_payloads(b"before")
    sub.unsubscribe("u/#")  # waits for the UNSUBACK
    sub.subscribe("marker/#")
    pub.publish("u/1", b"after", qos=1).wait_for_publish(30)
    # A marker from the same publisher (key, stream), after "after".
    pub.publish("marker/1", b"end", qos=1).wait_for_publish(30)
    sub.wait_payloads(b"end")
    assert sub.payloads() == [b"before", b"end"]
    pub.disconnect()
    sub.disconnect()


def test_empty_client_id_gets_one_assigned(broker: BrokerProcess) -> None:
    client = Client(broker.port, "")
    client.connect()
    assigned = client.connack_properties.AssignedClientIdentifier
    assert assigned.startswith("auto-")
    client.disconnect()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_takeover(broker: BrokerProcess, protocol: int) -> None:
    first = Client(broker.port, "same", protocol=protocol)
    first.connect(clean=False, expiry=300)
    first.subscribe("t/#")
    second = Client(broker.port, "same", protocol=protocol)
    assert second.connect(clean=False, expiry=300) is True
    assert first.wait_disconnected(30)
    if protocol == paho.MQTTv5:
        assert 0x8E in first.disconnects  # Session taken over
    first.close()
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("t/x", b"to-second", qos=1).wait_for_publish(30)
    assert [m.payload for m in second.wait_for(1)] == [b"to-second"]
    second.disconnect()
    pub.disconnect()


def test_keep_alive_timeout(broker: BrokerProcess) -> None:
    # A raw client that says keep alive 1 s and then stays silent: closed after
    # 1.5 s [MQTT-3.1.2-22]. Time passing is the scenario; the upper bound only
    # tells "closed for keep alive" from "never", with room for a loaded machine.
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(_connect_v5("silent", keep_alive=1))
        assert sock.recv(100)[:1] == b"\x20"  # CONNACK
        started = time.monotonic()
        data = sock.recv(100)
        elapsed = time.monotonic() - started
        assert data[:1] == b"\xe0"  # DISCONNECT
        assert data[2] == 0x8D  # Keep Alive timeout
        assert sock.recv(100) == b""
        assert 1.2 < elapsed < 20


def test_a_connection_without_a_connect_is_closed_after_the_connect_timeout(
    broker: BrokerProcess,
) -> None:
    # Two hostile sockets: one silent, one that sends half a CONNECT and
    # stops. Both are closed, without a word, once CONNECT_TIMEOUT has passed
    # (MQTT 5.0 §3.1: a Server SHOULD close a connection whose CONNECT does
    # not come in reasonable time), while a client that connects meanwhile is
    # served. Time passing is the scenario; the upper bound only tells
    # "closed" from "never", with room for a loaded machine.
    half = _connect_v5("slow", keep_alive=60)[:5]
    with (
        socket.create_connection(("127.0.0.1", broker.port), timeout=60) as silent,
        socket.create_connection(("127.0.0.1", broker.port), timeout=60) as slow,
    ):
        started = time.monotonic()
        slow.sendall(half)
        ok = Client(broker.port, "meanwhile")
        ok.connect()
        ok.disconnect()
        assert silent.recv(100) == b""
        assert slow.recv(100) == b""
        elapsed = time.monotonic() - started
        assert CONNECT_TIMEOUT - 0.5 < elapsed < 60


def test_the_connect_timeout_is_a_setting(tmp_path: Path) -> None:
    # [limits] connect_timeout = 1: a silent socket is closed after a second,
    # well before the default 10 s (the upper bound tells the two apart, with
    # room for a loaded machine).
    config = tmp_path / "riverbed.toml"
    config.write_text("[limits]\nconnect_timeout = 1\n")
    with (
        BrokerProcess(
            f"sqlite:///{tmp_path}/riverbed.db", extra_args=("--config", str(config))
        ) as broker,
        socket.create_connection(("127.0.0.1", broker.port), timeout=60) as silent,
    ):
        started = time.monotonic()
        assert silent.recv(100) == b""
        elapsed = time.monotonic() - started
        assert 0.5 < elapsed < CONNECT_TIMEOUT - 1
        broker.wait_logged("no CONNECT within 1s")


def test_malformed_bytes_close_only_that_connection(broker: BrokerProcess) -> None:
    healthy = Client(broker.port, "healthy")
    healthy.connect()
    healthy.subscribe("h/#")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(_connect_v5("bad", keep_alive=60))
        assert sock.recv(100)[:1] == b"\x20"
        sock.sendall(b"\x36\x00")  # PUBLISH with QoS 3: malformed [MQTT-3.3.1-4]
        data = sock.recv(100)
        assert data[:1] == b"\xe0" and data[2] == 0x81  # DISCONNECT Malformed Packet
        assert sock.recv(100) == b""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(b"\x10\x05garbage")  # not even a CONNECT
        assert sock.recv(100) in (b"", b"\x20\x03\x00\x81\x00", b"\x20\x03\x00\x82\x00")
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("h/1", b"still-here", qos=1).wait_for_publish(30)
    assert [m.payload for m in healthy.wait_for(1)] == [b"still-here"]
    pub.disconnect()
    healthy.disconnect()


def _connect_v5(client_id: str, keep_alive: int) -> bytes:
    cid = client_id.encode()
    body = (
        b"\x00\x04MQTT\x05\x02"
        + keep_alive.to_bytes(2, "big")
        + b"\x00"  # no properties
        + len(cid).to_bytes(2, "big")
        + cid
    )
    return bytes([0x10, len(body)]) + body
