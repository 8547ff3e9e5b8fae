"""Paced commits, end to end (issue 3; mqtt/pacer.py): a PUBLISH arriving soon
after a commit waits for the commit interval, and what arrives meanwhile, from
every connection, is committed with it.

While a PUBACK waits, the broker acknowledges the TCP bytes at once
(TCP_QUICKACK): a client with Nagle's algorithm on (paho-mqtt, and this raw
client: neither sets TCP_NODELAY) sends a small packet only once the previous
one is acknowledged, so without it every PUBLISH after the first would wait for
the previous one's PUBACK, and each would pay the interval again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess
from harness.raw_mqtt import RawClient
from riverbed.mqtt.codec import (
    MQTT_5,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscribeTopic,
    encode,
)

INTERVAL_MS = 30
"""Shorter than Linux's delayed ACK (40 ms at least): else the delayed ACK
itself would release a Nagle client's next segment within the interval."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    config = tmp_path / "riverbed.toml"
    config.write_text(f"[storage]\ncommit_interval_ms = {INTERVAL_MS}\n")
    with BrokerProcess(
        f"sqlite:///{tmp_path}/riverbed.db", extra_args=("--config", str(config))
    ) as running:
        yield running


def _publish(client: RawClient, packet_id: int) -> None:
    client.send(Publish("paced/t", b"m%d" % packet_id, qos=1, packet_id=packet_id))


def _one_read(client: RawClient) -> list[Packet]:
    """The packets of the next read from the socket (one TCP segment here)."""
    assert not client.pending
    data = client.sock.recv(65536)
    assert data, "the broker closed the connection"
    return client.decoder.feed(data)


def test_publishes_within_the_interval_share_its_commit(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as client:
        client.connect("paced-pub", clean=True)
        # Request and response for a while: the kernel acknowledges a new
        # connection's first segments at once, later ones with the response.
        for packet_id in range(1, 21):
            _publish(client, packet_id)
            assert client.expect(Puback).packet_id == packet_id
        # Just after a commit: these wait for the next, and Nagle holds 22-24
        # until 21 is acknowledged.
        for packet_id in range(21, 25):
            _publish(client, packet_id)
        acks = _one_read(client)
    # One commit for all four, so one write of their PUBACKs.
    assert [(type(p), p.packet_id) for p in acks] == [  # type: ignore[attr-defined]
        (Puback, packet_id) for packet_id in range(21, 25)
    ]


def test_one_publishers_order_holds_across_qos_and_retain(broker: BrokerProcess) -> None:
    # QoS 0/1 wait for the pacer; a QoS 2 or retained PUBLISH commits what waits
    # first; and towards the subscriber a QoS 1 or 0 message is not sent before a
    # QoS 2 one held for its persist: the wire order is the publisher's. (A raw
    # subscriber: paho hands a QoS 2 message to the application only at PUBREL.)
    kinds = [(1, False), (0, False), (2, False), (1, True), (1, False), (2, False), (0, False)]
    with RawClient(broker.port) as sub, RawClient(broker.port) as pub:
        sub.connect("order-sub", clean=True)
        sub.send(Subscribe(1, (SubscribeTopic("mix/t", 2),)))
        sub.expect(Suback)
        pub.connect("order-pub", clean=True)
        pub.sock.sendall(  # all in one segment: one read
            b"".join(
                encode(
                    Publish("mix/t", b"m%d" % i, qos, retain, packet_id=i + 1 if qos else None),
                    MQTT_5,
                )
                for i, (qos, retain) in enumerate(kinds)
            )
        )
        answered, got = 0, []
        while answered < sum(1 for qos, _ in kinds if qos) or len(got) < len(kinds):
            for client in (pub, sub):
                client.sock.settimeout(0.05)
                try:
                    packet = client.next()
                except TimeoutError:
                    continue
                finally:
                    client.sock.settimeout(10.0)
                if isinstance(packet, Publish):
                    got.append(packet.payload)
                    if packet.qos == 1:
                        sub.send(Puback(packet.packet_id or 0))
                    elif packet.qos == 2:
                        sub.send(Pubrec(packet.packet_id or 0))
                elif isinstance(packet, Pubrec):
                    client.send(Pubrel(packet.packet_id))
                elif isinstance(packet, Pubrel):
                    client.send(Pubcomp(packet.packet_id))
                elif isinstance(packet, Puback | Pubcomp):
                    answered += 1
    assert got == [b"m%d" % i for i in range(len(kinds))]
