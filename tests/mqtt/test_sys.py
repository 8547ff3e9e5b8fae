"""The `$SYS/broker/...` topics (mqtt/sys.py): what they say, who may publish
there, and that they never grow the log without bound."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.errors import InvalidConfig
from riverbed.log.log import Log
from riverbed.mqtt.codec import Puback, PubackReason, Publish, Pubrec, PubrecReason
from riverbed.mqtt.config import load_config
from riverbed.mqtt.retained import RetainedStore
from riverbed.mqtt.sys import (
    SYS_BINDING,
    SYS_TOPIC,
    Counters,
    Load,
    SysState,
    is_sys_topic,
)
from riverbed.storage.base import RetentionPolicy

UPTIME = "$SYS/broker/uptime"
CONNECTED = "$SYS/broker/clients/connected"
TOTAL = "$SYS/broker/clients/total"


# --------------------------------------------------------------------- sans-I/O


def _counters(now: float, **changes: int) -> Counters:
    values = dict.fromkeys(
        (
            "connected",
            "sessions",
            "disconnected",
            "subscriptions",
            "retained",
            "messages_received",
            "messages_sent",
            "bytes_received",
            "bytes_sent",
            "connections",
            "dropped",
        ),
        0,
    )
    values.update(changes)
    return Counters(now, **values)


def test_the_first_update_says_everything_later_ones_what_changed() -> None:
    state = SysState(started=100.0, version="riverbed 9")
    first = state.update(_counters(100.0, connected=2, sessions=5, disconnected=3))
    assert first["$SYS/broker/version"] == "riverbed 9"
    assert first[UPTIME] == "0 seconds"
    assert first[CONNECTED] == "2"
    assert first[TOTAL] == "5"
    assert first["$SYS/broker/clients/disconnected"] == "3"
    assert first["$SYS/broker/load/messages/received/15min"] == "0.00"
    assert all(is_sys_topic(name) for name in first)
    # 10 s later, one client more and nothing else: its count, the maximum and
    # the uptime changed (the loads stay 0.00).
    second = state.update(_counters(110.0, connected=3, sessions=5, disconnected=3))
    assert second == {
        UPTIME: "10 seconds",
        CONNECTED: "3",
        "$SYS/broker/clients/maximum": "3",
    }


def test_a_steady_rate_raises_the_load_towards_it_by_its_time_constant() -> None:
    load = Load(window=60.0)
    # 10 messages a second for one time constant, in 10 s steps: 1 - 1/e of the way.
    for _ in range(6):
        load.update(100, 10.0)
    assert load.value == pytest.approx(600 * (1 - math.exp(-1)))
    for _ in range(200):
        load.update(100, 10.0)
    assert load.value == pytest.approx(600.0)
    assert load.update(0, 0.0) == pytest.approx(600.0)  # no time passed: unchanged


def test_sys_names_are_the_broker_tree_only() -> None:
    assert is_sys_topic("$SYS")
    assert is_sys_topic("$SYS/broker/uptime")
    assert not is_sys_topic("$SYSTEM/x")
    assert not is_sys_topic("$app/x")
    assert not is_sys_topic("SYS/x")


def test_the_interval_key_is_validated() -> None:
    def interval(value: object) -> int:
        overrides = {"auth.allow_anonymous": True, "sys.interval": value}
        return load_config(overrides=overrides).sys.interval

    assert interval(None) == 10
    assert interval("2m") == 120
    assert interval(0) == 0
    for bad in ("-1", "soon", 86_401):
        with pytest.raises(InvalidConfig, match=r"sys\.interval"):
            interval(bad)


# --------------------------------------------------------------------- a broker


def _broker(tmp_path: Path, config: str) -> BrokerProcess:
    path = tmp_path / "riverbed.toml"
    path.write_text(config)
    return BrokerProcess(f"sqlite:///{tmp_path}/riverbed.db", extra_args=("--config", str(path)))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with _broker(tmp_path, "[sys]\ninterval = 1\n") as running:
        yield running


def _latest(client: Client, topic: str) -> str | None:
    values = [m.payload.decode() for m in client.received_now() if m.topic == topic]
    return values[-1] if values else None


def _next_update(client: Client) -> None:
    """Wait until the broker published its uptime twice more (an update
    finished after this call, whatever was in progress then)."""
    seen = sum(1 for m in client.received_now() if m.topic == UPTIME)
    eventually(
        lambda: sum(1 for m in client.received_now() if m.topic == UPTIME) >= seen + 2,
        what="two more $SYS updates",
    )


def test_a_sys_subscriber_sees_the_counts_change(broker: BrokerProcess) -> None:
    watcher = Client(broker.port, "watcher")
    watcher.connect()
    watcher.subscribe("$SYS/#", qos=0)
    # Retained: the current values come at once, the version with them.
    eventually(lambda: _latest(watcher, "$SYS/broker/version"), what="the version")
    assert _latest(watcher, "$SYS/broker/version").startswith("riverbed ")  # type: ignore[union-attr]
    eventually(lambda: _latest(watcher, CONNECTED) == "1", what="one client connected")
    first_uptime = _latest(watcher, UPTIME)
    assert first_uptime is not None and first_uptime.endswith(" seconds")

    other = Client(broker.port, "other")
    other.connect()
    eventually(lambda: _latest(watcher, CONNECTED) == "2", what="two clients connected")
    # Both sessions count, the one not stored yet too (it ends with its
    # connection and has not subscribed: docs/broker.md).
    eventually(lambda: _latest(watcher, TOTAL) == "2", what="two sessions counted")
    other.publish("plain/x", b"hello", qos=1).wait_for_publish(30)
    eventually(
        lambda: int(_latest(watcher, "$SYS/broker/messages/received") or 0) >= 1,
        what="the message counted",
    )
    eventually(
        lambda: float(_latest(watcher, "$SYS/broker/load/messages/received/1min") or 0) > 0,
        what="a load",
    )
    eventually(lambda: _latest(watcher, UPTIME) != first_uptime, what="the uptime move")
    assert int(_latest(watcher, "$SYS/broker/subscriptions/count") or 0) >= 1
    assert int(_latest(watcher, "$SYS/broker/bytes/received") or 0) > 0
    other.disconnect()
    eventually(lambda: _latest(watcher, CONNECTED) == "1", what="one client again")
    watcher.disconnect()


def test_leading_wildcards_do_not_match_sys(broker: BrokerProcess) -> None:
    everything = Client(broker.port, "everything")
    everything.connect()
    everything.subscribe("#", "+/broker/uptime", qos=1)
    watcher = Client(broker.port, "watcher")
    watcher.connect()
    watcher.subscribe("$SYS/broker/uptime", qos=0)
    _next_update(watcher)  # updates were published while `everything` was subscribed
    everything.publish("end", b"end", qos=1).wait_for_publish(30)
    everything.wait_payloads(b"end")
    assert [m.topic for m in everything.received_now()] == ["end"]
    everything.disconnect()
    watcher.disconnect()


def _stored_sys_names(db_url: str) -> tuple[list[str], list[str]]:
    """(MQTT topic names in the log's `sys` and `mqtt` topics, retained names)
    under `$SYS`."""
    with Log.open(db_url, create=False) as log:
        logged = []
        for head in log.storage.list_streams():
            for message in log.storage.read(head.key, head.start_offset, 100_000):
                if is_sys_topic(message.mqtt_topic):
                    logged.append(message.mqtt_topic)
        retained = [m.mqtt_topic for m in RetainedStore(log.storage).matching("$SYS/#")]
        return logged, retained


def test_clients_may_not_publish_to_sys(broker: BrokerProcess) -> None:
    watcher = Client(broker.port, "watcher")
    watcher.connect()
    watcher.subscribe("$SYS/#", qos=1)
    with RawClient(broker.port) as raw:
        raw.connect("raw", clean=True)
        raw.send(Publish("$SYS/x", b"forged", qos=1, retain=True, packet_id=1))
        assert raw.expect(Puback) == Puback(1, PubackReason.NOT_AUTHORIZED)
        raw.send(Publish("$SYS/broker/uptime", b"forged", qos=2, packet_id=2))
        assert raw.expect(Pubrec) == Pubrec(2, PubrecReason.NOT_AUTHORIZED)
        raw.send(Publish("after", b"after", qos=1, packet_id=3))
        assert raw.expect(Puback) == Puback(3)  # refused, not disconnected
    v311 = Client(broker.port, "v311", protocol=paho.MQTTv311)
    v311.connect()
    v311.publish("$SYS/y", b"forged", qos=1).wait_for_publish(30)  # 3.1.1: acknowledged...
    _next_update(watcher)
    # ... and, like the MQTT 5 ones, never delivered nor stored.
    assert not [m for m in watcher.received_now() if m.payload == b"forged"]
    logged, retained = _stored_sys_names(broker.db_url)
    assert logged and "$SYS/x" not in logged and "$SYS/y" not in logged
    assert "$SYS/broker/uptime" in retained and "$SYS/x" not in retained
    assert {m.payload for m in watcher.received_now() if m.topic == UPTIME} != {b"forged"}
    v311.disconnect()
    watcher.disconnect()


def test_interval_zero_publishes_nothing(tmp_path: Path) -> None:
    with _broker(tmp_path, "[sys]\ninterval = 0\n") as broker:
        watcher = Client(broker.port, "watcher")
        watcher.connect()
        watcher.subscribe("$SYS/#", "marker", qos=1)
        watcher.publish("marker", b"marker", qos=1).wait_for_publish(30)
        watcher.wait_payloads(b"marker")
        # With an interval the first values are stored before the broker
        # listens (`SysPublisher.start`): none here, and no `sys` topic.
        assert _stored_sys_names(broker.db_url) == ([], [])
        with Log.open(broker.db_url, create=False) as log:
            assert SYS_TOPIC not in [t.name for t in log.topics.list()]
        assert broker.logged(r"\$SYS topics are off") == 1
        assert watcher.payloads() == [b"marker"]
        watcher.disconnect()


def test_the_sys_topic_keeps_its_limit(tmp_path: Path) -> None:
    """Many updates later, the log holds at most the `sys` topic's limit (plus
    an update's worth not yet trimmed), here with the broker's retention off:
    the $SYS task trims its topic itself."""
    db_url = f"sqlite:///{tmp_path}/riverbed.db"
    with Log.open(db_url) as log:
        # What the broker would make, with a small limit (it keeps an existing one).
        log.topics.create(
            SYS_TOPIC,
            1,
            binding=SYS_BINDING,
            retention_policy=RetentionPolicy.EXPIRED,
            max_messages=10,
        )
    config = "[sys]\ninterval = 1\n[retention]\ninterval = 0\n"
    with _broker(tmp_path, config) as broker:
        watcher = Client(broker.port, "watcher")
        watcher.connect()
        watcher.subscribe("$SYS/#", qos=0)  # its deliveries change counters each update
        eventually(lambda: len(watcher.received_now()) >= 100, 120, "100 $SYS messages")
        with Log.open(db_url, create=False) as log:
            (head,) = log.storage.list_streams(SYS_TOPIC)
            assert head.next_offset >= 100
            updates = len(SysState(0.0, "").update(_counters(0.0)))  # every name
            assert head.next_offset - head.start_offset <= 10 + updates
        watcher.disconnect()


def test_reading_sys_needs_an_acl_rule_that_names_it(tmp_path: Path) -> None:
    # "#" covers no "$" topic [MQTT-4.7.2-1]: only the monitor may read $SYS.
    (tmp_path / "acl").write_text("allow all anyone #\nallow subscribe client monitor $SYS/#\n")
    config = '[sys]\ninterval = 1\n[auth]\nacl_file = "acl"\n'
    with _broker(tmp_path, config) as broker:
        nosy = Client(broker.port, "nosy")
        nosy.connect()
        assert nosy.subscribe("$SYS/#", qos=0) == [0x87]
        monitor = Client(broker.port, "monitor")
        monitor.connect()
        assert monitor.subscribe("$SYS/#", qos=0) == [0]
        eventually(lambda: _latest(monitor, CONNECTED) == "2", what="two clients connected")
        nosy.disconnect()
        monitor.disconnect()
