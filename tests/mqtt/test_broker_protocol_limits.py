"""Receive Maximum, acknowledgement order, when a subscription takes effect,
Server Keep Alive and client Subscription Identifiers (issue 14, items 1-6),
end to end: raw clients on our codec and paho-mqtt against `riverbed serve`.

Raw clients, because these rules are about exact packet sequences that a
well-behaved client library produces only by accident: many PUBLISHes in one
write, PUBRELs never sent, a SUBSCRIBE and a PUBLISH half a millisecond apart.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.mqtt.codec import (
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    DisconnectReason,
    Packet,
    Puback,
    PubackReason,
    Pubcomp,
    Publish,
    PublishProperties,
    Pubrec,
    PubrecReason,
    Pubrel,
    Suback,
    Subscribe,
    SubscribeTopic,
    Will,
    encode,
)

RECEIVE_MAXIMUM = 100
"""The broker's default `limits.receive_maximum`."""


def _broker(tmp_path: Path, url: str, config: str = "") -> BrokerProcess:
    path = tmp_path / "riverbed.toml"
    path.write_text(config)
    return BrokerProcess(url, extra_args=("--config", str(path)))


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url) as running:
        yield running


def _send_all(client: RawClient, packets: list[Packet]) -> None:
    """All `packets` in one write (one read at the broker)."""
    client.sock.sendall(b"".join(encode(p, MQTT_5) for p in packets))


def _closed(client: RawClient) -> bool:
    try:
        client.next()
    except ConnectionError:
        return True
    return False


# --------------------------------------------------------------------- 1: QoS 0


def test_qos0_publishes_do_not_count_toward_receive_maximum(broker: BrokerProcess) -> None:
    # Three windows' worth of QoS 0, then two QoS 1, in one write: only the
    # QoS 1 ones wait for an acknowledgement, so the client is within its
    # Receive Maximum and both are acknowledged [MQTT-3.3.4-7].
    with RawClient(broker.port) as client:
        client.connect("mixed", clean=True)
        qos0 = [Publish("mixed/0", b"%d" % i) for i in range(3 * RECEIVE_MAXIMUM)]
        qos1 = [Publish("mixed/1", b"q1-%d" % i, qos=1, packet_id=i) for i in (1, 2)]
        _send_all(client, [*qos0, *qos1])
        assert [client.expect(Puback) for _ in qos1] == [Puback(1), Puback(2)]


def test_more_than_receive_maximum_qos1_unacknowledged_is_refused(
    broker: BrokerProcess,
) -> None:
    # The limit itself still holds for QoS 1: one more than Receive Maximum in
    # one write (none acknowledged yet) gets DISCONNECT 0x93.
    with RawClient(broker.port) as client:
        connack = client.connect("greedy", clean=True)
        assert connack.properties.receive_maximum == RECEIVE_MAXIMUM
        _send_all(
            client,
            [Publish("greedy/t", b"x", qos=1, packet_id=i) for i in range(1, RECEIVE_MAXIMUM + 2)],
        )
        disconnect = client.expect(Disconnect)
        assert disconnect.reason_code == DisconnectReason.RECEIVE_MAXIMUM_EXCEEDED
        assert _closed(client)


# --------------------------------------------------------------------- 2: QoS 2


def test_qos2_publishes_count_toward_receive_maximum_until_pubcomp(
    broker: BrokerProcess,
) -> None:
    # A QoS 2 PUBLISH counts until its PUBCOMP is sent [MQTT-3.3.4-7]: with
    # Receive Maximum PUBRECs answered and no PUBREL, one more is refused.
    with RawClient(broker.port) as client:
        client.connect("unreleased", clean=True)
        for i in range(1, RECEIVE_MAXIMUM + 1):
            client.send(Publish("q2/t", b"%d" % i, qos=2, packet_id=i))
            assert client.expect(Pubrec) == Pubrec(i)
        # The same PUBLISH again (its PUBREC lost) is not a new one: answered,
        # not counted twice.
        client.send(Publish("q2/t", b"5", qos=2, dup=True, packet_id=5))
        assert client.expect(Pubrec) == Pubrec(5)
        # A PUBCOMP frees its slot.
        client.send(Pubrel(1))
        assert client.expect(Pubcomp) == Pubcomp(1)
        client.send(Publish("q2/t", b"101", qos=2, packet_id=RECEIVE_MAXIMUM + 1))
        assert client.expect(Pubrec) == Pubrec(RECEIVE_MAXIMUM + 1)
        client.send(Publish("q2/t", b"102", qos=2, packet_id=RECEIVE_MAXIMUM + 2))
        disconnect = client.expect(Disconnect)
        assert disconnect.reason_code == DisconnectReason.RECEIVE_MAXIMUM_EXCEEDED
        assert _closed(client)


# --------------------------------------------------------------------- 3: order


def test_acknowledgements_go_out_in_arrival_order_refusals_included(
    tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "acl").write_text("deny publish anyone denied/#\ndefault allow\n")
    config = '[auth]\nallow_anonymous = true\nacl_file = "acl"\n'
    with _broker(tmp_path, sqlite_url, config) as broker, RawClient(broker.port) as client:
        client.connect("ordered", clean=True)
        # [MQTT-4.6.0-2]: PUBACKs in the order the PUBLISHes came, refusals too.
        _send_all(
            client,
            [
                Publish("allowed/a", b"1", qos=1, packet_id=1),
                Publish("denied/a", b"2", qos=1, packet_id=2),
                Publish("denied/b", b"3", qos=1, packet_id=3),
                Publish("allowed/b", b"4", qos=1, packet_id=4),
                Publish("denied/c", b"5", qos=1, packet_id=5),
            ],
        )
        refused = PubackReason.NOT_AUTHORIZED
        assert [client.expect(Puback) for _ in range(5)] == [
            Puback(1),
            Puback(2, refused),
            Puback(3, refused),
            Puback(4),
            Puback(5, refused),
        ]
        # A refused QoS 2 PUBLISH behind a QoS 1 one still committing.
        _send_all(
            client,
            [
                Publish("allowed/c", b"6", qos=1, packet_id=6),
                Publish("denied/d", b"7", qos=2, packet_id=7),
                Publish("allowed/d", b"8", qos=2, packet_id=8),
            ],
        )
        assert client.expect(Puback) == Puback(6)
        assert client.expect(Pubrec) == Pubrec(7, PubrecReason.NOT_AUTHORIZED)
        assert client.expect(Pubrec) == Pubrec(8)


# --------------------------------------------------------------------- 4: SUBSCRIBE

GAP = 0.0005
"""Seconds between the SUBSCRIBE's bytes and the PUBLISH's (the issue: 0.5 ms)."""
TRIALS = 200


def _spin(seconds: float) -> None:
    """Wait `seconds` on the CPU (a sleep this short overshoots by far)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _no_delay(client: RawClient) -> RawClient:
    """Each packet on the wire when sent: with Nagle's algorithm the SUBSCRIBE
    after a PUBACK would wait for the broker's (delayed) ACK of it, 40 ms."""
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def _race(subscriber: RawClient, publisher: RawClient, trial: int, packet_id: int) -> bool:
    """SUBSCRIBE, and GAP later a matching PUBLISH on the other connection;
    then a marker after the SUBACK. True if the subscriber got the first."""
    topic = f"race/{trial}"
    subscriber.send(Subscribe(packet_id, (SubscribeTopic(topic, 1),)))
    _spin(GAP)
    publisher.send(Publish(topic, b"raced", qos=1, packet_id=packet_id))
    assert publisher.expect(Puback) == Puback(packet_id)
    got: list[bytes] = []
    subacked = False
    while b"marker" not in got:
        packet = subscriber.next()
        if isinstance(packet, Suback):
            assert packet.reason_codes == (1,), packet
            subacked = True
            # Same publisher, same stream: the marker comes after the raced one.
            publisher.send(Publish(topic, b"marker", qos=1, packet_id=packet_id))
            assert publisher.expect(Puback) == Puback(packet_id)
        elif isinstance(packet, Publish):
            got.append(packet.payload)
            if packet.packet_id is not None:
                subscriber.send(Puback(packet.packet_id))
    assert subacked
    return got == [b"raced", b"marker"]


def test_a_subscription_takes_effect_when_its_subscribe_is_read(broker: BrokerProcess) -> None:
    # A message committed after the SUBSCRIBE was read is delivered, even when
    # its publisher did not wait for the SUBACK. One session for all trials:
    # after the first, the session already follows the topic's streams.
    missed: list[int] = []
    with (
        _no_delay(RawClient(broker.port)) as publisher,
        _no_delay(RawClient(broker.port)) as subscriber,
    ):
        publisher.connect("racer-pub", clean=True)
        subscriber.connect("racer-sub", clean=True)
        for trial in range(TRIALS):
            if not _race(subscriber, publisher, trial, trial % 60000 + 1):
                missed.append(trial)
    assert not missed, f"missed {len(missed)} of {TRIALS}: trials {missed[:20]}"


def test_a_new_sessions_first_subscription_takes_effect_when_read(
    broker: BrokerProcess,
) -> None:
    # A fresh session per trial: its first SUBSCRIBE creates its cursors, which
    # start where the log was when the SUBSCRIBE was read, not when they are
    # written.
    missed: list[int] = []
    with _no_delay(RawClient(broker.port)) as publisher:
        publisher.connect("fresh-pub", clean=True)
        for trial in range(TRIALS):
            with _no_delay(RawClient(broker.port)) as subscriber:
                subscriber.connect(f"fresh-sub-{trial}", clean=True)
                if not _race(subscriber, publisher, trial, trial + 1):
                    missed.append(trial)
    assert not missed, f"missed {len(missed)} of {TRIALS}: trials {missed[:20]}"


# --------------------------------------------------------------------- 5: keep alive


def test_server_keep_alive_is_not_applied_to_mqtt311_clients(
    tmp_path: Path, sqlite_url: str
) -> None:
    # MQTT 3.1.1 has no Server Keep Alive: a silent 3.1.1 client is dropped after
    # 1.5 times its own keep alive (2 s here, not the configured 60 s)
    # [MQTT-3.1.2-24], and its Will is published.
    config = "[limits]\nserver_keep_alive = 60\n"
    with _broker(tmp_path, sqlite_url, config) as broker:
        watcher = Client(broker.port, "watcher")
        watcher.connect()
        watcher.subscribe("will/#")
        with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
            connect = Connect("silent-311", True, 2, will=Will("will/silent", b"gone", 1))
            sock.sendall(encode(connect, 4))
            decoder = Decoder(4)
            assert decoder.feed(sock.recv(100)) == [Connack()]
            started = time.monotonic()
            assert sock.recv(100) == b""  # closed, without a DISCONNECT (3.1.1 has none)
            assert time.monotonic() - started < 30
        assert eventually(watcher.payloads, what="the Will") == [b"gone"]
        # MQTT 5 clients are told the Server Keep Alive and held to it.
        with RawClient(broker.port) as v5:
            assert v5.connect("v5", clean=True).properties.server_keep_alive == 60
        watcher.disconnect()


# --------------------------------------------------------------------- 6: identifiers


def test_a_publish_with_a_subscription_identifier_is_a_protocol_error(
    broker: BrokerProcess,
) -> None:
    watcher = Client(broker.port, "watcher")
    watcher.connect()
    watcher.subscribe("ids/#")
    with RawClient(broker.port) as client:
        client.connect("identified", clean=True)
        properties = PublishProperties(subscription_identifiers=(7,))
        client.send(Publish("ids/x", b"with-id", qos=1, packet_id=1, properties=properties))
        # [MQTT-3.3.4-6]: a client's PUBLISH carries no Subscription Identifier.
        assert client.expect(Disconnect).reason_code == DisconnectReason.PROTOCOL_ERROR
        assert _closed(client)
    # Nothing was committed: the watcher gets the marker sent after, only.
    pub = Client(broker.port, "pub", protocol=paho.MQTTv311)
    pub.connect()
    pub.publish("ids/x", b"marker", qos=1).wait_for_publish(10)
    eventually(lambda: b"marker" in watcher.payloads(), what="the marker")
    assert watcher.payloads() == [b"marker"]
    pub.disconnect()
    watcher.disconnect()
