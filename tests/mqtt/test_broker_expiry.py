"""Message Expiry Interval end to end: a message whose interval passed before it
could be delivered (queued for an offline session) is not delivered; the
subscriber is sent what is left of the interval."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness.broker import BrokerProcess, Client


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url) as running:
        yield running


def test_expired_messages_are_not_delivered_to_a_returning_session(
    broker: BrokerProcess,
) -> None:
    sub = Client(broker.port, "away")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("e/#")
    sub.disconnect()
    pub = Client(broker.port, "e-pub")
    pub.connect()
    pub.publish("e/1", b"short", expiry=1).wait_for_publish(5)
    pub.publish("e/1", b"long", expiry=100).wait_for_publish(5)
    pub.publish("e/1", b"never").wait_for_publish(5)
    pub.disconnect()
    time.sleep(2.5)

    again = Client(broker.port, "away")
    assert again.connect(clean=False, expiry=300) is True
    got = again.wait_for(2)
    time.sleep(0.3)
    got = again.wait_for(0)
    assert [m.payload for m in got] == [b"long", b"never"]
    long, never = got
    assert long.expiry is not None and 95 <= long.expiry <= 98  # what is left of 100
    assert never.expiry is None
    again.disconnect()


def test_live_delivery_carries_the_interval_and_retained_messages_expire(
    broker: BrokerProcess,
) -> None:
    sub = Client(broker.port, "live")
    sub.connect()
    sub.subscribe("x/#")
    pub = Client(broker.port, "x-pub")
    pub.connect()
    pub.publish("x/1", b"live", expiry=30).wait_for_publish(5)
    pub.publish("x/kept", b"brief", retain=True, expiry=1).wait_for_publish(5)
    got = sub.wait_for(2)
    assert (got[0].payload, got[0].expiry) in ((b"live", 30), (b"live", 29))
    time.sleep(2.0)
    late = Client(broker.port, "late")
    late.connect()
    late.subscribe("x/#")
    time.sleep(0.5)
    assert late.payloads() == []  # the retained message expired
    for client in (sub, pub, late):
        client.disconnect()
