"""`riverbed serve` applies retention by itself (issue 14 item 10): on a schedule
(`[retention] interval`), never deleting what a session still needs, deleting
past a topic's max age regardless, off with interval 0, stopping promptly on
SIGTERM; and the `[retention]` section is validated."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.waiting import eventually, holds
from riverbed.errors import InvalidConfig
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.mqtt.config import RetentionConfig, load_config
from riverbed.storage import open_storage
from riverbed.storage.base import RetentionPolicy, StreamHead

SECOND = 1_000_000


def head(url: str, topic: str) -> StreamHead:
    storage = open_storage(url)
    try:
        (found,) = storage.list_streams(topic)
        return found
    finally:
        storage.close()


def make_topics(url: str, *topics: tuple[str, dict[str, object]]) -> None:
    with Log(open_storage(url)) as log:
        for name, options in topics:
            log.topics.create(name, 1, **options)  # type: ignore[arg-type]


def broker_with(tmp_path: Path, url: str, retention: str) -> BrokerProcess:
    config = tmp_path / "riverbed.toml"
    config.write_text(f"[retention]\n{retention}\n")
    return BrokerProcess(url, extra_args=("--config", str(config)))


def publish(port: int, topic: str, count: int) -> None:
    pub = Client(port, f"pub-{topic}")
    pub.connect()
    try:
        for i in range(count):
            pub.publish(topic, b"m%d" % i, qos=1).wait_for_publish(30)
    finally:
        pub.disconnect()


def persistent(port: int, client_id: str, *filters: str) -> Client:
    client = Client(port, client_id)
    client.connect(clean=False, expiry=3600)
    if filters:
        client.subscribe(*filters, qos=1)
    return client


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/retention.db"


@pytest.fixture
def every_second(tmp_path: Path, url: str) -> Iterator[BrokerProcess]:
    make_topics(
        url,
        ("fast", {"binding": "fast/#", "retention_us": SECOND}),
        ("capped", {"binding": "capped/#", "max_age_us": SECOND}),
        # After "capped" and "fast" in a pass (by name): gone means they were looked at.
        ("zz-marker", {"binding": "zz/#", "retention_us": SECOND}),
    )
    with broker_with(tmp_path, url, "interval = 1") as broker:
        yield broker


def marker_pass(broker: BrokerProcess, url: str) -> None:
    """Wait for a retention pass that ran after everything published so far was
    more than a second old (it deletes a marker published now)."""
    publish(broker.port, "zz/m", 1)
    target = head(url, "zz-marker").next_offset
    eventually(lambda: head(url, "zz-marker").start_offset == target, what="a retention pass")


@pytest.mark.slow
def test_consumed_and_expired_messages_go_by_themselves_but_not_before_every_session_has_them(
    every_second: BrokerProcess, url: str
) -> None:
    broker = every_second
    offline = persistent(broker.port, "offline", "fast/#")
    offline.disconnect()
    reader = persistent(broker.port, "reader", "fast/#")
    try:
        publish(broker.port, "fast/x", 20)
        eventually(lambda: len(reader.received) >= 20, what="the reader's 20 messages")
        marker_pass(broker, url)
        # Read and expired, but the offline session has not had them.
        assert head(url, "fast").start_offset == 0
        back = persistent(broker.port, "offline")
        try:
            eventually(lambda: len(back.received) >= 20, what="the offline session's backlog")
            assert sorted(r.payload for r in back.received) == sorted(b"m%d" % i for i in range(20))
            # Now every session has them: they go without anyone asking.
            eventually(lambda: head(url, "fast").start_offset == 20, what="deleted by the broker")
        finally:
            back.disconnect()
    finally:
        reader.disconnect()
    assert "retention deleted" in broker.tail(400)


@pytest.mark.slow
def test_max_age_deletes_what_an_offline_session_has_not_read(
    every_second: BrokerProcess, url: str
) -> None:
    broker = every_second
    persistent(broker.port, "asleep", "capped/#").disconnect()
    publish(broker.port, "capped/x", 5)
    eventually(lambda: head(url, "capped").start_offset == 5, what="max age applied")


@pytest.mark.slow
def test_interval_0_turns_it_off(tmp_path: Path, url: str) -> None:
    make_topics(url, ("t", {"binding": "t/#", "retention_policy": RetentionPolicy.CONSUMED}))
    with broker_with(tmp_path, url, "interval = 0") as broker:
        publish(broker.port, "t/x", 3)
        # Nothing to wait for: nothing may happen. Three seconds are three passes
        # at the shortest interval.
        assert holds(lambda: head(url, "t").start_offset == 0, 3.0)
        assert "retention is off" in broker.tail()


@pytest.mark.slow
def test_sigterm_during_a_large_deletion_stops_at_once(tmp_path: Path, url: str) -> None:
    make_topics(url, ("big", {"binding": "big/#", "retention_policy": RetentionPolicy.CONSUMED}))
    with Log(open_storage(url)) as log:
        for _ in range(20):
            log.produce("big", [Message(b"x" * 100, key="k")] * 10_000)
    with broker_with(tmp_path, url, "interval = 1\nbatch = 100") as broker:
        eventually(lambda: head(url, "big").start_offset > 0, what="the deletion under way")
        began = time.monotonic()
        assert broker.stop() == 0
        stopped_in = time.monotonic() - began
    # A bound on a hang, not a performance claim: 2,000 transactions to go
    # would take longer than a stop that waits for them.
    assert stopped_in < 10, stopped_in


# --------------------------------------------------------------------- configuration


def test_retention_config_defaults_and_values(tmp_path: Path) -> None:
    assert RetentionConfig() == RetentionConfig(interval=60, pin_warning_hours=24, batch=10_000)
    config = tmp_path / "riverbed.toml"
    config.write_text('[retention]\ninterval = "5m"\npin_warning_hours = 6\nbatch = 500\n')
    loaded = load_config(config, {"auth.allow_anonymous": True}).retention
    assert loaded == RetentionConfig(interval=300, pin_warning_hours=6, batch=500)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("interval = -1", "retention.interval = -1: must be whole seconds from 0 to 604800"),
        ('interval = "soon"', "retention.interval = 'soon': must be whole seconds"),
        ("pin_warning_hours = 0", "retention.pin_warning_hours = 0: must be an integer of at"),
        ("batch = 5", "retention.batch = 5: must be an integer from 100 to 1000000"),
        ("every = 5", "unknown key 'retention.every'"),
    ],
)
def test_bad_retention_config_is_refused(tmp_path: Path, line: str, message: str) -> None:
    config = tmp_path / "riverbed.toml"
    config.write_text(f"[retention]\n{line}\n")
    with pytest.raises(InvalidConfig, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(config, {"auth.allow_anonymous": True})
