"""The broker's Prometheus metrics (riverbed.metrics): after a known workload
of real paho clients against a broker running in this process, the exposition
`Metrics.render()` gives (parsed by prometheus_client's own parser) counts what
was sent; the lag gauge equals `riverbed subscription lag`; `[metrics]` is
validated and `enabled = false` counts nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.broker import Client
from harness.raw_mqtt import RawClient
from harness.waiting import DEFAULT_TIMEOUT, eventually
from riverbed.errors import InvalidConfig, StorageUnavailable
from riverbed.log.log import Log
from riverbed.metrics import CONTENT_TYPE, Buckets, Metrics, Readings, Refresher
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.codec import MQTT_3_1_1, Connack, ConnectReason
from riverbed.mqtt.config import (
    Address,
    AuthConfig,
    BrokerConfig,
    Listeners,
    MetricsConfig,
    SysConfig,
    load_config,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _config(**metrics: object) -> BrokerConfig:
    return BrokerConfig(
        listeners=Listeners(Address("127.0.0.1", 0)),
        auth=AuthConfig(allow_anonymous=True),
        metrics=MetricsConfig(**metrics),  # type: ignore[arg-type]
        sys=SysConfig(interval=0),  # the $SYS updates would count as commits too
    )


@contextmanager
def _running(config: BrokerConfig, url: str) -> Iterator[Broker]:
    """A broker on its own event loop in a thread of this process (its metrics
    are read here directly: the HTTP listener is not part of these tests)."""
    ready = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []
    stop: list[asyncio.Event] = []
    held: list[Broker] = []
    failed: list[BaseException] = []

    async def run() -> None:
        with Log.open(url) as log:
            broker = Broker(config, log)
            await broker.start()
            loops.append(asyncio.get_running_loop())
            stop.append(asyncio.Event())
            held.append(broker)
            ready.set()
            try:
                await stop[0].wait()
            finally:
                await broker.stop()

    def main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=main, name="broker-under-test")
    thread.start()
    assert ready.wait(DEFAULT_TIMEOUT), "the broker did not start"
    if failed:
        raise failed[0]
    try:
        yield held[0]
    finally:
        loops[0].call_soon_threadsafe(stop[0].set)
        thread.join(DEFAULT_TIMEOUT)
        assert not thread.is_alive(), "the broker did not stop"
        assert not failed, failed


def _samples(metrics: Metrics) -> Samples:
    """Every sample of the exposition, parsed as Prometheus would."""
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


CONNECT_NO_ID_NOT_CLEAN = bytes.fromhex("100c00044d5154540400003c0000")
"""CONNECT, MQTT 3.1.1, CleanSession 0, keep alive 60, an empty client id."""

N_QOS1 = 40
M_QOS0 = 25
K_SUBSCRIBERS = 3


def test_counters_equal_the_workload_sent(sqlite_url: str) -> None:
    with _running(_config(), sqlite_url) as broker:
        assert broker.metrics is not None
        before = _samples(broker.metrics)
        assert _value(before, "riverbed_publish_received_total", qos="1") == 0
        subscribers = []
        for i in range(K_SUBSCRIBERS):
            sub = Client(broker.port, f"sub-{i}")
            sub.connect()
            sub.subscribe("m/#", qos=1)
            subscribers.append(sub)
        publisher = Client(broker.port, "pub")
        publisher.connect()
        payloads = []
        for i in range(N_QOS1):
            payloads.append(b"one-%d" % i)
            publisher.publish("m/x", payloads[-1], qos=1)
        for i in range(M_QOS0):
            payloads.append(b"zero-%d" % i)
            publisher.publish("m/y", payloads[-1], qos=0)
        for sub in subscribers:
            sub.wait_payloads(*payloads)
            assert len(sub.received_now()) == N_QOS1 + M_QOS0  # no duplicates to count
        # A 3.1.1 client with no client id must start clean [MQTT-3.1.3-8]: refused.
        # (Sent as bytes: riverbed's own codec refuses to build that packet.)
        with RawClient(broker.port, level=MQTT_3_1_1) as refused:
            refused.sock.sendall(CONNECT_NO_ID_NOT_CLEAN)
            assert refused.expect(Connack).reason_code == ConnectReason.CLIENT_IDENTIFIER_NOT_VALID
        log_topic = broker.log.route("m/x").topic
        assert broker.log.route("m/y").topic == log_topic
        connections = K_SUBSCRIBERS + 1

        def counted() -> Samples | None:
            assert broker.metrics is not None
            samples = _samples(broker.metrics)
            # The refused connection's teardown (and so its count) runs on the loop.
            gone = _value(samples, "riverbed_connections_current") == connections
            return samples if gone else None

        samples = eventually(counted, what="the refused connection gone")
        assert _value(samples, "riverbed_publish_received_total", qos="1") == N_QOS1
        assert _value(samples, "riverbed_publish_received_total", qos="0") == M_QOS0
        assert _value(samples, "riverbed_publish_received_total", qos="2") == 0
        # Each subscriber gets each message at the QoS it was published with.
        assert _value(samples, "riverbed_publish_sent_total", qos="1") == K_SUBSCRIBERS * N_QOS1
        assert _value(samples, "riverbed_publish_sent_total", qos="0") == K_SUBSCRIBERS * M_QOS0
        assert _value(samples, "riverbed_connections_total") == connections + 1
        refusals = "riverbed_connections_refused_total"
        assert _value(samples, refusals, reason="client_identifier_not_valid") == 1
        assert _value(samples, "riverbed_sessions_online") == connections
        assert _value(samples, "riverbed_qos0_dropped_total") == 0
        appended = N_QOS1 + M_QOS0
        assert _value(samples, "riverbed_messages_appended_total", topic=log_topic) == appended
        # Every commit is one observation; together they hold every message.
        commits = _value(samples, "riverbed_commit_seconds_count")
        assert 1 <= commits <= appended
        assert _value(samples, "riverbed_commit_messages_count") == commits
        assert _value(samples, "riverbed_commit_messages_sum") == appended
        assert _value(samples, "riverbed_commit_seconds_sum") > 0
        # Bytes: at least the payloads in, and K copies of them out.
        payload_bytes = sum(len(p) for p in payloads)
        assert _value(samples, "riverbed_received_bytes_total") > payload_bytes
        assert _value(samples, "riverbed_sent_bytes_total") > K_SUBSCRIBERS * payload_bytes
        for client in (*subscribers, publisher):
            client.close()


def _riverbed(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=DEFAULT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_lag_gauge_equals_riverbed_subscription_lag(sqlite_url: str) -> None:
    with _running(_config(refresh_interval=1), sqlite_url) as broker:
        assert broker.metrics is not None
        metrics = broker.metrics
        publisher = Client(broker.port, "pub")
        publisher.connect()
        for i in range(10):
            publisher.publish("lagging/x", b"early-%d" % i, qos=1)
        eventually(lambda: len(publisher.acked) == 10, what="10 PUBACKs")
        log_topic = broker.log.route("lagging/x").topic
        _riverbed("subscription", "create", "slow", "--topic", log_topic, "--db", sqlite_url)
        for i in range(7):
            publisher.publish("lagging/x", b"late-%d" % i, qos=1)
        eventually(lambda: len(publisher.acked) == 17, what="17 PUBACKs")
        cli = json.loads(_riverbed("subscription", "lag", "slow", "--json", "--db", sqlite_url))
        assert cli["total"] == 17  # nobody read it: it is behind by everything

        def lag() -> float | None:
            return _samples(metrics).get(("riverbed_subscription_lag", (("subscription", "slow"),)))

        eventually(
            lambda: lag() == cli["total"],
            what="the lag gauge to equal `riverbed subscription lag`",
            explain=lambda: f"gauge {lag()}, `riverbed subscription lag` {cli['total']}",
        )
        samples = _samples(metrics)
        assert _value(samples, "riverbed_storage_readings_timestamp_seconds") > 0
        assert _value(samples, "riverbed_sessions_offline") == 0
        assert ("riverbed_subscription_retry_queue", (("subscription", "slow"),)) not in samples
        publisher.close()


def test_off_exposes_nothing_and_leaves_the_appender_alone_but_sys_still_counts(
    sqlite_url: str,
) -> None:
    with _running(_config(enabled=False), sqlite_url) as broker:
        assert broker.metrics is None
        assert broker.log.appender.metrics is None
        client = Client(broker.port, "pub")
        client.connect()
        client.publish("off/x", b"m", qos=1)
        eventually(lambda: client.acked, what="the PUBACK")
        # The one set of counts `$SYS` reads is kept with metrics off.
        counts = broker.counts
        assert counts.publish_in == [0, 1, 0]
        assert counts.committed == 1
        assert counts.connections == 1
        assert counts.bytes_in > 0 and counts.bytes_out > 0
        client.close()


def test_the_exposition_is_the_prometheus_text_format() -> None:
    metrics = Metrics()
    metrics.counts.publish_in[1] += 3
    metrics.committed({"t": 5}, 0.002)
    text = metrics.render().decode()
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    assert "# HELP riverbed_publish_received_total PUBLISH packets received" in text
    assert "# TYPE riverbed_commit_seconds histogram" in text
    samples = _samples(metrics)
    assert _value(samples, "riverbed_publish_received_total", qos="1") == 3
    assert _value(samples, "riverbed_messages_appended_total", topic="t") == 5
    assert _value(samples, "riverbed_commit_seconds_bucket", le="0.002") == 1
    assert _value(samples, "riverbed_commit_seconds_bucket", le="0.001") == 0
    # A fresh registry each time: nothing from another Metrics.
    assert _value(_samples(Metrics()), "riverbed_publish_received_total", qos="1") == 0


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (
            "[metrics]\nrefresh_interval = 0\n",
            "metrics.refresh_interval = 0: must be whole seconds",
        ),
        ("[metrics]\nrefresh_interval = 3601\n", "from 1 to 3600"),
        ("[metrics]\nenabled = 'maybe'\n", "metrics.enabled = 'maybe'"),
        ("[metrics]\ninterval = 5\n", "unknown key 'metrics.interval'"),
    ],
)
def test_bad_metrics_settings_are_refused_naming_the_rule(
    tmp_path: Path, text: str, rule: str
) -> None:
    path = tmp_path / "riverbed.toml"
    path.write_text(text)
    with pytest.raises(InvalidConfig, match=rule):
        load_config(path)


def test_metrics_settings_are_read() -> None:
    given = {"metrics.enabled": "false", "metrics.refresh_interval": "2m"}
    config = load_config(None, {**given, "auth.allow_anonymous": "true"})
    assert config.metrics == MetricsConfig(enabled=False, refresh_interval=120)
    assert MetricsConfig() == MetricsConfig(enabled=True, refresh_interval=15)


def test_a_failed_reading_is_logged_and_the_last_stays(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    answers: list[Readings | Exception] = [
        Readings(subscription_lag={"s": 4}),
        StorageUnavailable("the database does not answer"),
    ]

    def read() -> Readings:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    refresher = Refresher(metrics, read, interval=60)
    refresher.refresh()
    first = metrics.readings
    assert first.subscription_lag == {"s": 4} and first.at > 0
    refresher.refresh()
    assert metrics.readings is first
    assert "reading the storage-derived metrics failed" in caplog.text
    assert _value(_samples(metrics), "riverbed_subscription_lag", subscription="s") == 4


def test_a_commit_slower_than_every_bucket_counts_only_in_plus_inf() -> None:
    metrics = Metrics()
    metrics.committed({"t": 20_000}, 9.0)
    samples = _samples(metrics)
    assert _value(samples, "riverbed_commit_seconds_bucket", le="5.0") == 0
    assert _value(samples, "riverbed_commit_seconds_bucket", le="+Inf") == 1
    assert _value(samples, "riverbed_commit_messages_bucket", le="10000.0") == 0
    assert _value(samples, "riverbed_commit_messages_sum") == 20_000


def test_quantiles_are_estimated_from_the_buckets_as_histogram_quantile_does() -> None:
    buckets = Buckets((0.001, 0.002, 0.005))
    assert buckets.quantile(0.5) is None  # nothing observed yet
    for value in (0.0005, 0.0015, 0.0015, 0.004):
        buckets.observe(value)
    # Ranks: 2 of 4 for the median, in (0.001, 0.002] holding 2 (1 below it).
    assert buckets.quantile(0.5) == pytest.approx(0.0015)
    assert buckets.quantile(0.99) == pytest.approx(0.002 + 0.003 * (3.96 - 3))
    buckets.observe(9.0)  # above every bound: the largest bound, as Prometheus says
    assert buckets.quantile(0.99) == 0.005
