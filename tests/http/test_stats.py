"""One set of counters, three readers: after a known workload of real paho
clients against `riverbed serve --http` in a subprocess, `/metrics` (parsed
with prometheus_client's parser), the `$SYS/broker/...` topics and
`/api/v1/stats` say the same numbers; the in-flight gauge follows a subscriber
that withholds its PUBACKs; the shared-group counters move when a member joins;
`/api/v1/stats` under `riverbed admin` reads the storage itself."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import paho.mqtt.client as paho
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.admin_api import AdminApi
from harness.broker import BrokerProcess, Client
from harness.cli import rb
from harness.waiting import eventually
from riverbed.mqtt.retained import RetainedStore
from riverbed.storage import open_storage

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

CONFIG = """
[sys]
interval = 1
[metrics]
refresh_interval = 1
[shared_subscriptions]
find_leader_retry = 0.3
leader_periodic = 0.5
leader_resend = 0.5
"""
N_QOS1 = 30
M_QOS0 = 20


@pytest.fixture
def broker(tmp_path: Path, sqlite_url: str) -> Iterator[BrokerProcess]:
    config = tmp_path / "riverbed.toml"
    config.write_text(CONFIG)
    with BrokerProcess(sqlite_url, http=True, extra_args=("--config", str(config))) as running:
        yield running


def _samples(api: httpx.Client) -> Samples:
    answer = api.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _sys(url: str) -> dict[str, str]:
    """The `$SYS/broker/...` values as a new subscriber gets them (their retained
    copies), read from the database: no subscriber of `$SYS` adds to what is sent."""
    storage = open_storage(url)
    try:
        return {
            m.mqtt_topic: m.payload.decode()
            for m in RetainedStore(storage).matching("$SYS/broker/#")
        }
    finally:
        storage.close()


def test_metrics_sys_and_stats_count_the_same_workload(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    subscriber = Client(broker.port, "sub")
    subscriber.connect()
    subscriber.subscribe("w/#", qos=1)
    publisher = Client(broker.port, "pub")
    publisher.connect()
    payloads = [b"one-%d" % i for i in range(N_QOS1)]
    for payload in payloads:
        publisher.publish("w/one", payload, qos=1)
    for i in range(M_QOS0):
        payloads.append(b"zero-%d" % i)
        publisher.publish("w/zero", payloads[-1], qos=0)
    subscriber.wait_payloads(*payloads)
    assert len(subscriber.received_now()) == N_QOS1 + M_QOS0

    total = N_QOS1 + M_QOS0
    # Nothing moves any more (no $SYS subscriber, keep-alives a minute away):
    # wait for a $SYS update that shows all of it, then read all three.
    sent_bytes = eventually(
        lambda: (
            int(_sys(broker.db_url).get("$SYS/broker/messages/sent", -1)) == total
            and _value(_samples(api), "riverbed_sent_bytes_total")
        ),
        what="$SYS to show every message sent",
        explain=lambda: _sys(broker.db_url),
    )

    def settled() -> tuple[Samples, dict[str, str], dict[str, object]] | None:
        sys_values = _sys(broker.db_url)
        samples = _samples(api)
        stats = api.get("/api/v1/stats").json()
        same = (
            int(sys_values["$SYS/broker/bytes/sent"])
            == _value(samples, "riverbed_sent_bytes_total")
            == stats["bytes_out"]
            == sent_bytes
            # The subscriber's PUBACKs may come after the $SYS update that
            # showed every message sent: wait for one that has them too.
            and int(sys_values["$SYS/broker/bytes/received"])
            == _value(samples, "riverbed_received_bytes_total")
            == stats["bytes_in"]
        )
        return (samples, sys_values, stats) if same else None

    samples, sys_values, stats = eventually(settled, what="the three readers to agree")
    assert _value(samples, "riverbed_publish_received_total", qos="1") == N_QOS1
    assert _value(samples, "riverbed_publish_received_total", qos="0") == M_QOS0
    assert _value(samples, "riverbed_publish_sent_total", qos="1") == N_QOS1
    assert _value(samples, "riverbed_publish_sent_total", qos="0") == M_QOS0
    assert int(sys_values["$SYS/broker/messages/received"]) == total
    assert int(sys_values["$SYS/broker/messages/sent"]) == total
    assert stats["publish_in"] == total
    assert stats["publish_out"] == total
    received = _value(samples, "riverbed_received_bytes_total")
    assert int(sys_values["$SYS/broker/bytes/received"]) == received == stats["bytes_in"]
    assert received > sum(len(p) for p in payloads)
    assert _value(samples, "riverbed_messages_in_flight") == 0 == stats["in_flight"]
    assert stats["connections"] == stats["sessions_online"] == 2
    assert stats["node"] and stats["uptime_seconds"] > 0 and stats["at"] > 0
    commit = stats["commit"]
    assert commit["count"] == _value(samples, "riverbed_commit_seconds_count") >= 1
    assert 0 < commit["p50_seconds"] <= commit["p99_seconds"] <= 5.0
    for client in (subscriber, publisher):
        client.close()


def test_stats_shows_subscription_lag_from_the_last_reading(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    publisher = Client(broker.port, "pub")
    publisher.connect()
    for i in range(4):
        publisher.publish("lag/x", b"%d" % i, qos=1)
    eventually(lambda: len(publisher.acked) == 4, what="4 PUBACKs")
    created = rb(broker.db_url, "subscription", "create", "behind", "--topic", "mqtt")
    assert created.exit_code == 0, created.output
    publisher.publish("lag/x", b"late", qos=1)
    eventually(lambda: len(publisher.acked) == 5, what="5 PUBACKs")

    def reading() -> dict[str, object] | None:
        stats = api.get("/api/v1/stats").json()
        listed = {s["name"]: s for s in stats["subscriptions"]}
        behind = listed.get("behind")
        return stats if behind is not None and behind["lag"] == 5 else None

    stats = eventually(reading, what="the lag of 'behind' in /api/v1/stats")
    assert stats["subscriptions"] == [
        {"name": "behind", "lag": 5, "retry_queue": None, "dead_letter_queue": None}
    ]
    assert stats["readings_at"] > 0
    publisher.close()


def test_in_flight_counts_messages_a_subscriber_has_not_acknowledged(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    got: list[paho.MQTTMessage] = []
    arrived = threading.Lock()
    holder = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="holder", protocol=paho.MQTTv5)
    holder.manual_ack_set(True)  # PUBACK only when the test says so

    def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with arrived:
            got.append(message)

    subacked = threading.Event()
    holder.on_message = on_message
    holder.on_subscribe = lambda *_: subacked.set()
    holder.connect("127.0.0.1", broker.port)
    holder.loop_start()
    try:
        eventually(holder.is_connected, what="the holder connected")
        holder.subscribe("held/#", qos=1)
        # What is published before the SUBSCRIBE is read is not the holder's.
        eventually(subacked.is_set, what="the holder's SUBACK")
        publisher = Client(broker.port, "pub")
        publisher.connect()
        for i in range(5):
            publisher.publish("held/x", b"h%d" % i, qos=1)
        eventually(
            lambda: len(got) == 5,
            what="5 messages at the holder",
            explain=lambda: [m.payload for m in got],
        )

        def in_flight() -> tuple[float, int]:
            samples = _samples(api)
            stats = api.get("/api/v1/stats").json()
            return _value(samples, "riverbed_messages_in_flight"), stats["in_flight"]

        assert in_flight() == (5, 5)
        with arrived:
            for message in got:
                holder.ack(message.mid, message.qos)
        eventually(lambda: in_flight() == (0, 0), what="in flight back to 0 after the PUBACKs")
        publisher.close()
    finally:
        holder.loop_stop()
        holder.disconnect()


def test_shared_group_counters_move_when_a_second_member_joins(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    group = ("g/s/#",)
    first = Client(broker.port, "member-1")
    first.connect()
    first.subscribe("$share/g/s/#", qos=1)

    def rebalances() -> float:
        samples = _samples(api)
        return samples.get(("riverbed_shared_rebalances_total", (("group", group[0]),)), 0)

    before = eventually(rebalances, what="the first member's streams granted")
    samples = _samples(api)
    assert _value(samples, "riverbed_shared_leader_claims_total", outcome="won") == 1
    assert _value(samples, "riverbed_shared_leader_claims_total", outcome="lost") == 0
    # Once the first has them all, the count stays until someone joins.
    publisher = Client(broker.port, "pub")
    publisher.connect()
    publisher.publish("s/x", b"marker", qos=1)
    first.wait_payloads(b"marker")
    before = rebalances()
    second = Client(broker.port, "member-2")
    second.connect()
    second.subscribe("$share/g/s/#", qos=1)
    eventually(lambda: rebalances() > before, what="a rebalance for the second member")
    # Still the one Leader on this node.
    samples = _samples(api)
    assert _value(samples, "riverbed_shared_leader_claims_total", outcome="won") == 1
    for client in (first, second, publisher):
        client.close()


def test_stats_under_riverbed_admin_reads_the_storage_itself(sqlite_url: str) -> None:
    for args in (
        ("topic", "create", "events", "--partitions", "2"),
        ("subscription", "create", "quiet", "--topic", "events"),
    ):
        done = rb(sqlite_url, *args)
        assert done.exit_code == 0, done.output
    with AdminApi(sqlite_url) as admin, admin.client() as api:
        stats = api.get("/api/v1/stats").json()
        assert stats["connections"] == stats["publish_in"] == stats["bytes_out"] == 0
        assert stats["commit"] == {
            "count": 0,
            "sum_seconds": 0.0,
            "p50_seconds": None,
            "p99_seconds": None,
        }
        assert stats["subscriptions"] == [
            {"name": "quiet", "lag": 0, "retry_queue": None, "dead_letter_queue": None}
        ]
        assert stats["readings_at"] > 0
        # Polled again within the interval: the same reading, not a new query.
        assert api.get("/api/v1/stats").json()["readings_at"] == stats["readings_at"]
