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
    pub.publish("e/1", b"short", expiry=1).wait_for_publish(30)
    before_long = time.monotonic()
    pub.publish("e/1", b"long", expiry=100).wait_for_publish(30)
    pub.publish("e/1", b"never").wait_for_publish(30)
    # The scenario is time passing: "short" (stamped before its PUBACK) has
    # expired 1 s after it; the sleep is well past that.
    time.sleep(2.5)

    again = Client(broker.port, "away")
    assert again.connect(clean=False, expiry=300) is True
    # A marker from the same publisher (key, stream) after the three.
    pub.publish("e/1", b"end").wait_for_publish(30)
    pub.disconnect()
    got = [m for m in again.wait_payloads(b"end") if m.payload != b"end"]
    assert [m.payload for m in got] == [b"long", b"never"]
    long, never = got
    # What is left of 100: at least 2 s went (the sleep), at most the time
    # from before its PUBLISH to its arrival (rounded up).
    assert long.expiry is not None
    assert 100 - (long.at - before_long) - 1 <= long.expiry <= 98
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
    before_live = time.monotonic()
    pub.publish("x/1", b"live", expiry=30).wait_for_publish(30)
    pub.publish("x/kept", b"brief", retain=True, expiry=1).wait_for_publish(30)
    got = sub.wait_payloads(b"live", b"brief")
    assert got[0].payload == b"live" and got[0].expiry is not None
    # What is left of 30 (whole seconds): no more than it took to get here.
    assert 30 - (got[0].at - before_live) - 1 <= got[0].expiry <= 30
    # Retained messages go out in topic name order, so this one after "x/kept".
    pub.publish("x/zz-marker", b"marker", retain=True).wait_for_publish(30)
    # The scenario is time passing: "brief" (stamped before its PUBACK) has
    # expired 1 s after it; the sleep is well past that.
    time.sleep(2.0)
    late = Client(broker.port, "late")
    late.connect()
    late.subscribe("x/#")
    late.wait_payloads(b"marker")
    assert late.payloads() == [b"marker"]  # the retained message expired
    for client in (sub, pub, late):
        client.disconnect()
