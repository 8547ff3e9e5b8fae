"""Outbound Topic Aliases (issue 3; MQTT 5.0 §3.3.2.3.4), end to end.

The broker uses aliases towards a client only up to the Topic Alias Maximum the
client sent in its CONNECT: a topic's first PUBLISH on a connection names it and
sets the alias, later ones carry the alias and an empty topic; topics beyond the
maximum go out by name. Aliases belong to one network connection.

A raw client built on our codec checks the packets: paho-mqtt 2.2 sends a Topic
Alias Maximum if asked to but does not resolve the aliases it then receives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from riverbed.mqtt.codec import Publish, Suback, Subscribe, SubscribeTopic


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(f"sqlite:///{tmp_path}/riverbed.db") as running:
        yield running


def _publish_all(port: int, topics: list[str]) -> None:
    pub = Client(port, "alias-pub")
    pub.connect()
    for i, topic in enumerate(topics):
        pub.publish(topic, f"m{i}".encode(), qos=1).wait_for_publish(5)
    pub.disconnect()


def _received(sub: RawClient, count: int) -> list[tuple[str, int | None, bytes]]:
    got = []
    for _ in range(count):
        packet = sub.expect(Publish)
        got.append((packet.topic, packet.properties.topic_alias, packet.payload))
    return got


def test_aliases_up_to_the_clients_maximum(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as sub:
        sub.connect("alias-sub", clean=True, alias_maximum=2)
        sub.send(Subscribe(1, (SubscribeTopic("t/#", 0),)))
        sub.expect(Suback)
        _publish_all(broker.port, ["t/a", "t/a", "t/b", "t/c", "t/b", "t/c", "t/a"])
        assert _received(sub, 7) == [
            ("t/a", 1, b"m0"),  # named, alias 1 set
            ("", 1, b"m1"),
            ("t/b", 2, b"m2"),
            ("t/c", None, b"m3"),  # the client takes 2 aliases: by name
            ("", 2, b"m4"),
            ("t/c", None, b"m5"),
            ("", 1, b"m6"),
        ]


def test_no_aliases_unless_the_client_accepts_them(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as sub:
        sub.connect("plain-sub", clean=True)
        sub.send(Subscribe(1, (SubscribeTopic("t/#", 0),)))
        sub.expect(Suback)
        _publish_all(broker.port, ["t/a", "t/a"])
        assert _received(sub, 2) == [("t/a", None, b"m0"), ("t/a", None, b"m1")]


def test_aliases_start_afresh_on_a_new_connection(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as sub:
        sub.connect("alias-sub", clean=False, expiry=60, alias_maximum=5)
        sub.send(Subscribe(1, (SubscribeTopic("t/#", 1),)))
        sub.expect(Suback)
        _publish_all(broker.port, ["t/a"])
        assert _received(sub, 1) == [("t/a", 1, b"m0")]
    with RawClient(broker.port) as sub:
        sub.connect("alias-sub", clean=False, expiry=60, alias_maximum=5)
        _publish_all(broker.port, ["t/a"])
        # The session resumed; the alias did not: the topic is named again.
        assert _received(sub, 1) == [("t/a", 1, b"m0")]
