"""Will Messages end to end: sent when the connection is lost or DISCONNECT 0x04
asks for it, not after DISCONNECT 0x00; delayed by the Will Delay Interval and
cancelled by a reconnect within it; QoS and retain honoured."""

from __future__ import annotations

import time
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from harness.broker import BrokerProcess, Client

PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url) as running:
        yield running


def _watcher(port: int) -> Client:
    watcher = Client(port, "watcher")
    watcher.connect()
    watcher.subscribe("will/#", qos=2)
    return watcher


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_lost_connection_sends_the_will(broker: BrokerProcess, protocol: int) -> None:
    watcher = _watcher(broker.port)
    client = Client(broker.port, "dies", protocol=protocol)
    client.connect(will=("will/dies", b"gone", 2, False))
    client.drop()
    got = watcher.wait_for(1)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("will/dies", b"gone", 2)]
    watcher.disconnect()


def test_normal_disconnect_sends_no_will_and_0x04_does(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    polite = Client(broker.port, "polite")
    polite.connect(will=("will/polite", b"no", 1, False))
    polite.disconnect()
    asks = Client(broker.port, "asks")
    asks.connect(will=("will/asks", b"yes", 1, False))
    assert asks.paho is not None
    asks.paho.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    asks.wait_disconnected(5)
    asks.close()
    time.sleep(0.5)
    assert watcher.payloads() == [b"yes"]
    watcher.disconnect()


def test_will_delay_and_a_reconnect_within_it(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    back = Client(broker.port, "back")
    back.connect(clean=True, expiry=60, will=("will/back", b"back", 1, False), will_delay=2)
    back.drop()
    time.sleep(0.5)
    again = Client(broker.port, "back")
    assert again.connect(clean=False, expiry=60) is True  # within the delay: no will
    late = Client(broker.port, "late")
    late.connect(clean=True, expiry=60, will=("will/late", b"late", 1, False), will_delay=2)
    started = time.monotonic()
    late.drop()
    got = watcher.wait_for(1, timeout=10)
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    assert watcher.payloads() == [b"late"]
    assert [m.payload for m in got] == [b"late"] and 1.5 < elapsed < 5
    again.disconnect()
    watcher.disconnect()


def test_delay_is_cut_short_by_the_session_ending(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    short = Client(broker.port, "short")
    # Session expiry 0: the session ends with the connection, so the will goes now.
    short.connect(clean=True, expiry=0, will=("will/short", b"now", 1, False), will_delay=30)
    started = time.monotonic()
    short.drop()
    assert [m.payload for m in watcher.wait_for(1, timeout=5)] == [b"now"]
    assert time.monotonic() - started < 3
    watcher.disconnect()


def test_a_retained_will(broker: BrokerProcess) -> None:
    client = Client(broker.port, "kept")
    client.connect(will=("will/kept", b"kept", 1, True))
    client.drop()
    time.sleep(0.5)
    late = Client(broker.port, "late-sub")
    late.connect()
    late.subscribe("will/#")
    got = late.wait_for(1)
    assert [(m.payload, m.retain) for m in got] == [(b"kept", True)]
    late.disconnect()


def _persistent_watcher(port: int, clean: bool) -> Client:
    watcher = Client(port, "p-watcher")
    watcher.connect(clean=clean, expiry=300)
    if clean:
        watcher.subscribe("will/#", qos=1)
    return watcher


def test_a_pending_will_survives_a_broker_restart(broker: BrokerProcess) -> None:
    _persistent_watcher(broker.port, clean=True).disconnect()
    client = Client(broker.port, "pending")
    client.connect(clean=True, expiry=60, will=("will/pending", b"late", 1, False), will_delay=3)
    client.drop()
    time.sleep(0.5)
    broker.kill()  # before the delay is over
    broker.start()
    watcher = _persistent_watcher(broker.port, clean=False)
    assert [m.payload for m in watcher.wait_for(1, timeout=10)] == [b"late"]
    watcher.disconnect()
    broker.stop()
    broker.start()  # published and cleared: not again
    watcher = _persistent_watcher(broker.port, clean=False)
    time.sleep(1.0)
    assert watcher.payloads() == []
    watcher.disconnect()


def test_a_crash_publishes_the_wills_of_connected_clients(broker: BrokerProcess) -> None:
    _persistent_watcher(broker.port, clean=True).disconnect()
    polite = Client(broker.port, "polite2")
    polite.connect(clean=True, expiry=60, will=("will/polite2", b"no", 1, False))
    polite.disconnect()  # DISCONNECT 0x00: its will is gone for good
    connected = Client(broker.port, "connected")
    connected.connect(clean=True, expiry=60, will=("will/connected", b"crash", 1, False))
    broker.kill()
    connected.close()
    broker.start()
    watcher = _persistent_watcher(broker.port, clean=False)
    watcher.wait_for(1, timeout=10)
    time.sleep(0.5)
    assert watcher.payloads() == [b"crash"]
    watcher.disconnect()
