"""Key modes end to end: how one publisher's messages spread over a `$share` group.

paho-mqtt clients against `riverbed serve`. Each test binds a topic of 16
partitions with one key mode, lets two members of a group share it (and the
built-in `mqtt`, which every group's filter reaches), and publishes with no
user property `key`, so the binding's mode alone decides the streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.sharedsub import short_timers_config
from harness.waiting import eventually
from riverbed.log.topics import KeyMode, Topics
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage import open_storage

PARTITIONS = 16


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return short_timers_config(tmp_path)


def bound_broker(url: str, config: Path, key: str) -> BrokerProcess:
    """A broker over a store with topic `jobs` bound to `jobs/#`, keyed by `key`."""
    storage = open_storage(url)
    try:
        topics = Topics(storage)
        topics.ensure_builtin()
        topics.create("jobs", PARTITIONS, binding="jobs/#", key_mode=KeyMode.parse(key))
    finally:
        storage.close()
    return BrokerProcess(url, extra_args=("--config", str(config)))


@pytest.fixture
def members() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


def join(port: int, made: list[Client], *names: str) -> list[Client]:
    for name in names:
        client = Client(port, name)
        client.connect()
        assert client.subscribe("$share/g/jobs/#", qos=1) == [1]
        made.append(client)
    return made


def wait_even(url: str, count: int) -> None:
    """Until `count` members hold an even share of the group's streams and
    each holds some of `jobs` (as the group's Leader last saved)."""
    group = GroupId.parse("$share/g/jobs/#")

    def even() -> list[int]:
        storage = open_storage(url)
        try:
            record = GroupStore(storage).get(group)
        finally:
            storage.close()
        held = [] if record is None else [s for s in record.holdings.values() if s]
        jobs = [sum(1 for s in streams if s.topic == "jobs") for streams in held]
        ok = len(held) == count and all(n == PARTITIONS // count for n in jobs)
        return jobs if ok else []

    eventually(even, what=f"{count} members holding {PARTITIONS // count} streams of jobs each")


def receipts(members: list[Client]) -> dict[str, list[bytes]]:
    return {m.client_id: m.payloads() for m in members}


def wait_all(members: list[Client], sent: list[bytes]) -> dict[str, list[bytes]]:
    """Until every message sent arrived at some member; then each arrived once."""
    want = set(sent)
    eventually(
        lambda: want <= {p for m in members for p in m.payloads()},
        60,
        f"all {len(sent)} delivered",
        explain=lambda: f"{len(want - {p for m in members for p in m.payloads()})} missing",
    )
    got = receipts(members)
    counts = Counter(p for payloads in got.values() for p in payloads)
    assert not [p for p, n in counts.items() if n > 1], "delivered twice"
    return got


@pytest.mark.parametrize("key", ["none", "client-id"])
def test_one_publisher_on_one_topic(
    sqlite_url: str, config: Path, members: list[Client], key: str
) -> None:
    """`none` spreads one publisher's messages over both members; `client-id`
    keeps them all at one (one key, one stream, one member)."""
    with bound_broker(sqlite_url, config, key) as broker:
        a, b = join(broker.port, members, "a", "b")
        wait_even(sqlite_url, 2)
        pub = Client(broker.port, "busy")
        pub.connect()
        sent = [b"m%d" % n for n in range(96)]
        infos = [pub.publish("jobs/x", payload, qos=1) for payload in sent]
        for info in infos:
            info.wait_for_publish(30)
        got = wait_all([a, b], sent)
        pub.disconnect()
    shares = sorted(len(payloads) for payloads in got.values())
    if key == "none":
        assert shares == [48, 48]  # spread message by message: each member's 8 streams
    else:
        assert shares == [0, 96]


@pytest.mark.parametrize("key", ["topic", "client-topic"])
def test_one_publisher_on_several_topics_spreads_in_order_per_topic(
    sqlite_url: str, config: Path, members: list[Client], key: str
) -> None:
    """Keyed by topic: a publisher's topics spread over both members, and each
    topic's messages reach one member, all of them, in the order sent."""
    topics = [f"jobs/{n}" for n in range(12)]
    with bound_broker(sqlite_url, config, key) as broker:
        a, b = join(broker.port, members, "a", "b")
        wait_even(sqlite_url, 2)
        pub = Client(broker.port, "busy")
        pub.connect()
        sent = [f"{n % 12}:{n}".encode() for n in range(240)]
        infos = [pub.publish(topics[n % 12], sent[n], qos=1) for n in range(240)]
        for info in infos:
            info.wait_for_publish(30)
        got = wait_all([a, b], sent)
        pub.disconnect()
    assert all(got.values()), f"one member got nothing: {[len(p) for p in got.values()]}"
    for payloads in got.values():
        per_topic: dict[str, list[int]] = {}
        for payload in payloads:
            topic, n = payload.decode().split(":")
            per_topic.setdefault(topic, []).append(int(n))
        for topic, seqs in per_topic.items():
            # the whole topic here (one stream, one member), in publish order
            assert seqs == list(range(int(topic), 240, 12)), f"jobs/{topic}: {seqs}"
