"""Durable shared subscriptions end to end (issue 5; docs/shared-subscriptions.md).

paho-mqtt clients against `riverbed serve` in a subprocess. Members of a group
(`$share/GROUP/FILTER`, `$queue/FILTER`) split the streams of the builtin topic
(16 partitions; a message's partition follows its ordering key, set here with
the user property `key`). Each test checks what the issue asks: every message
to exactly one member (or, where a member dies with messages in flight, at
least one), per-key order within what a member received, and how long a
rebalance takes. The protocol's timers are shortened (`harness/sharedsub.py`)
so the tests run in seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.postgres import PostgresServer, PostgresUnavailable
from harness.sharedsub import short_timers_config
from harness.waiting import eventually
from riverbed.mqtt.broker import EXIT_MARGIN
from riverbed.sharedsub.claims import LEASE_PREFIX, GroupStore
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases

KEYS = 48
"""Ordering keys of the test messages: enough to reach most of the 16 partitions."""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return short_timers_config(tmp_path)


def shared_broker(url: str, config: Path) -> BrokerProcess:
    return BrokerProcess(url, extra_args=("--config", str(config)))


@pytest.fixture
def broker(storage_url: str, config: Path) -> Iterator[BrokerProcess]:
    with shared_broker(storage_url, config) as running:
        yield running


def member(port: int, name: str, text: str = "$share/g/w/#", **connect: object) -> Client:
    client = Client(port, name)
    client.connect(**connect)  # type: ignore[arg-type]
    assert client.subscribe(text, qos=1) == [1]
    return client


def publish(
    client: Client, first: int, count: int, *, pace: float = 0.0, topic: str = "w/x"
) -> list[bytes]:
    """Publish messages `first` .. `first + count - 1` (payload `KEY:N`, key
    `kN mod KEYS`); wait for every PUBACK."""
    sent: list[bytes] = []
    infos = []
    for n in range(first, first + count):
        key = f"k{n % KEYS}"
        payload = f"{key}:{n}".encode()
        infos.append(client.publish(topic, payload, qos=1, key=key))
        sent.append(payload)
        if pace:
            time.sleep(pace)  # pacing: publishing spread over time, while members come and go
    for info in infos:
        info.wait_for_publish(15)
    return sent


def wait_union(members: Iterable[Client], expected: Iterable[bytes], timeout: float = 60.0) -> None:
    want = set(expected)

    def missing() -> list[bytes]:
        return sorted(want - {p for m in members for p in m.payloads()})

    eventually(
        lambda: not missing(),
        timeout,
        f"all {len(want)} delivered",
        explain=lambda: f"{len(missing())} never delivered, e.g. {missing()[:5]}",
    )


def check_exactly_once(members: Iterable[Client], expected: Iterable[bytes]) -> None:
    counts = Counter(p for m in members for p in m.payloads())
    want = set(expected)
    assert set(counts) >= want, f"lost: {sorted(want - set(counts))[:5]}"
    twice = [p for p, c in counts.items() if c > 1]
    assert not twice, f"{len(twice)} delivered more than once, e.g. {twice[:5]}"


def check_key_order(members: Iterable[Client], *, redelivered: bool = False) -> None:
    """Within what each member received, every key's sequence numbers increase.

    `redelivered`: after a crash a new holder may start again from the last
    progress saved, so messages come again; the first delivery of each message
    (all members' arrivals in time order) must still be in order."""
    arrivals = sorted((r.at, m.client_id, r.payload) for m in members for r in m.received)
    seen: set[bytes] = set()
    last: dict[tuple[str, str], int] = {}
    for _, member_id, payload in arrivals:
        if redelivered and payload in seen:
            continue
        seen.add(payload)
        key, n = payload.decode().split(":")
        before = last.get((member_id, key), -1)
        assert int(n) > before, f"{member_id}: {key} went from {before} back to {n}"
        last[(member_id, key)] = int(n)


MARKER_BASE = 10_000_000
"""Sequence numbers from here on are markers (`settle`), not test messages."""
_settles = itertools.count()


def settle(members: Iterable[Client], pub: Client, topic: str = "w/x") -> None:
    """Wait until nothing published so far can still arrive: a marker on every
    key's stream, each after the rest of its stream (what a stream delivers
    again after a move comes before its marker), instead of a pause."""
    base = MARKER_BASE + next(_settles) * KEYS
    markers = [f"k{i}:{base + i}".encode() for i in range(KEYS)]
    infos = [pub.publish(topic, m, qos=1, key=f"k{i}") for i, m in enumerate(markers)]
    for info in infos:
        info.wait_for_publish(30)
    wait_union(members, markers)


def messages_of(client: Client) -> list[bytes]:
    """What a member received, markers left out."""
    return [p for p in client.payloads() if int(p.split(b":")[1]) < MARKER_BASE]


def wait_holding(url: str, members: int, text: str = "$share/g/w/#") -> None:
    """Until `members` Borrowers of the group hold streams (as its Leader last saved)."""
    group = GroupId.parse(text)

    def holding() -> int:
        storage = open_storage(url)
        try:
            record = GroupStore(storage).get(group)
        finally:
            storage.close()
        return 0 if record is None else sum(1 for held in record.holdings.values() if held)

    eventually(lambda: holding() >= members, what=f"{members} members holding streams")


def wait_for_leader(url: str, text: str = "$share/g/w/#") -> None:
    group = GroupId.parse(text)

    def leader() -> bool:
        storage = open_storage(url)
        try:
            return GroupStore(storage).leader_of(group, time.time_ns() // 1000) is not None
        finally:
            storage.close()

    eventually(leader, what="the group's Leader")


def keys_of(client: Client, since: float = 0.0) -> set[str]:
    return {r.payload.decode().split(":")[0] for r in client.received if r.at >= since}


def close_all(*clients: Client) -> None:
    for c in clients:
        c.disconnect()


# --------------------------------------------------------------------- sharing


def test_one_member_gets_what_the_group_holds_before_and_after_it_subscribed(
    storage_url: str, config: Path
) -> None:
    with shared_broker(storage_url, config) as broker:
        pub = Client(broker.port, "pub")
        pub.connect()
        publish(pub, 0, 30)  # before the group's start: not the group's
        time.sleep(0.05)  # the start is a time: after these messages' timestamps
        storage = open_storage(storage_url)
        try:
            GroupStore(storage).create(
                GroupId("g", "w/#"), start_us=time.time_ns() // 1000, now_us=time.time_ns() // 1000
            )
        finally:
            storage.close()
        time.sleep(0.05)  # ... and these after it
        before = publish(pub, 30, 60)
        a = member(broker.port, "a")
        after = publish(pub, 90, 60)
        wait_union([a], before + after)
        settle([a], pub)
        check_exactly_once([a], before + after)
        assert len(messages_of(a)) == 120  # nothing from before the group's start
        check_key_order([a])
        close_all(a, pub)


def test_two_members_split_the_work_without_loss_or_duplicate(broker: BrokerProcess) -> None:
    a = member(broker.port, "a")
    b = member(broker.port, "b")
    wait_holding(broker.db_url, 2)
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 480)
    wait_union([a, b], sent)
    settle([a, b], pub)
    check_exactly_once([a, b], sent)
    check_key_order([a, b])
    assert a.payloads() and b.payloads()
    assert not keys_of(a) & keys_of(b)  # a key's stream is held by one member
    close_all(a, b, pub)


def test_mqtt_311_members_and_queue_groups(broker: BrokerProcess) -> None:
    a = Client(broker.port, "a", protocol=paho.MQTTv311)
    a.connect()
    assert a.subscribe("$queue/w/#", qos=1) == [1]
    b = member(broker.port, "b", "$queue/w/#")
    wait_holding(broker.db_url, 2, "$queue/w/#")
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 200)
    wait_union([a, b], sent)
    settle([a, b], pub)
    check_exactly_once([a, b], sent)
    assert a.payloads() and b.payloads()
    close_all(a, b, pub)


def test_a_dead_members_streams_move_to_the_survivor(broker: BrokerProcess) -> None:
    a = member(broker.port, "a", keepalive=2)
    b = member(broker.port, "b")
    wait_holding(broker.db_url, 2)
    pub = Client(broker.port, "pub")
    pub.connect()
    first = publish(pub, 0, 200)
    wait_union([a, b], first)
    a.close()  # silent: the broker finds out after 1.5 keep alives
    died = time.monotonic()
    rest = publish(pub, 200, 700, pace=0.01)  # 7 s and more
    wait_union([a, b], first + rest)
    # Everything a missed reached b, and b has every stream once the keep alive
    # (3 s) and a rebalance (1 s) passed.
    assert keys_of(b, since=died + 3 + 1) == {f"k{n}" for n in range(KEYS)}
    check_key_order([a, b], redelivered=True)
    close_all(b, pub)


def test_a_new_member_takes_streams_over_by_revoke(broker: BrokerProcess) -> None:
    a = member(broker.port, "a")
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 150, pace=0.004)
    b = member(broker.port, "b")
    joined = time.monotonic()
    sent += publish(pub, 150, 300, pace=0.004)
    wait_union([a, b], sent)
    settle([a, b], pub)
    check_exactly_once([a, b], sent)
    check_key_order([a, b])
    b_first = min(r.at for r in b.received)
    assert b_first - joined < 2.0
    close_all(a, b, pub)


def test_a_graceful_unsubscribe_rebalances_within_two_seconds(broker: BrokerProcess) -> None:
    a = member(broker.port, "a")
    b = member(broker.port, "b")
    wait_holding(broker.db_url, 2)
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 200)
    wait_union([a, b], sent)
    assert b.unsubscribe("$share/g/w/#") == [0]
    left = time.monotonic()
    sent += publish(pub, 200, 600, pace=0.005)
    wait_union([a, b], sent)
    settle([a, b], pub)
    check_exactly_once([a, b], sent)
    # From 2 s after the UNSUBACK on, a receives every key.
    assert keys_of(a, since=left + 2.0) == {f"k{n}" for n in range(KEYS)}
    close_all(a, b, pub)


def test_two_members_joining_during_200_publishes(broker: BrokerProcess) -> None:
    a = member(broker.port, "a")
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 70, pace=0.01)
    b = member(broker.port, "b")
    sent += publish(pub, 70, 60, pace=0.01)
    c = member(broker.port, "c")
    sent += publish(pub, 130, 70, pace=0.01)
    wait_union([a, b, c], sent)
    settle([a, b, c], pub)
    check_exactly_once([a, b, c], sent)
    check_key_order([a, b, c])
    close_all(a, b, c, pub)


def test_quick_unsubscribe_resubscribe_cycles_under_load(broker: BrokerProcess) -> None:
    a = member(broker.port, "a")
    b = member(broker.port, "b")
    pub = Client(broker.port, "pub")
    pub.connect()
    sent: list[bytes] = []
    for cycle in range(10):
        infos = [
            pub.publish("w/x", f"k{n % KEYS}:{n}".encode(), qos=1, key=f"k{n % KEYS}")
            for n in range(cycle * 60, cycle * 60 + 60)
        ]
        sent += [f"k{n % KEYS}:{n}".encode() for n in range(cycle * 60, cycle * 60 + 60)]
        assert b.unsubscribe("$share/g/w/#") == [0]
        assert b.subscribe("$share/g/w/#", qos=1) == [1]
        for info in infos:
            info.wait_for_publish(15)
    wait_union([a, b], sent, timeout=30)
    settle([a, b], pub)
    check_exactly_once([a, b], sent)
    check_key_order([a, b])
    close_all(a, b, pub)


def test_20000_messages_with_a_member_leaving_mid_replay(storage_url: str, config: Path) -> None:
    with shared_broker(storage_url, config) as broker:
        storage = open_storage(storage_url)
        try:
            GroupStore(storage).create(GroupId("g", "w/#"), start_us=None, now_us=0)
        finally:
            storage.close()
        pubs = [Client(broker.port, f"pub{i}") for i in range(4)]
        for p in pubs:
            p.connect()
        sent: list[bytes] = []
        infos = []
        for n in range(20_000):
            key = f"k{n % KEYS}"
            sent.append(f"{key}:{n}".encode())
            infos.append(pubs[n % 4].publish("w/x", sent[-1], qos=1, key=key))
        for info in infos:
            info.wait_for_publish(60)
        a = member(broker.port, "a")
        b = member(broker.port, "b")
        eventually(lambda: len(a.payloads()) >= 3000, what="a mid-replay", interval=0.005)
        a.drop()  # mid-replay, messages in flight
        wait_union([a, b], sent, timeout=60)
        check_key_order([a, b], redelivered=True)
        close_all(b, *pubs)


@pytest.mark.timeout(900)  # 50,000 deliveries: minutes on a loaded machine, bounded by stalls
def test_50_groups_of_20_members_and_1000_messages(storage_url: str, tmp_path: Path) -> None:
    """Every group gets every message once: 20 sessions are members of all 50
    groups (each SUBSCRIBE with the group's number as Subscription Identifier,
    which each delivery carries). The protocol's default timers: 1,000
    Borrowers pinging every second would be a load test of their own."""
    defaults = tmp_path / "defaults.toml"
    defaults.write_text("")
    with shared_broker(storage_url, defaults) as broker:
        _fifty_groups(broker)


def _fifty_groups(broker: BrokerProcess) -> None:
    groups = 50
    members = []
    for i in range(20):
        client = Client(broker.port, f"m{i}")
        client.connect()
        for g in range(1, groups + 1):
            assert client.subscribe(f"$share/g{g}/load/#", qos=1, identifier=g) == [1]
        members.append(client)
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = set(publish(pub, 0, 1000, topic="load/x"))
    want = groups * len(sent)

    def per_group() -> dict[int, Counter[bytes]]:
        counts: dict[int, Counter[bytes]] = {g: Counter() for g in range(1, groups + 1)}
        for m in members:
            for r in m.received_now():
                assert len(r.identifiers) == 1, r
                counts[r.identifiers[0]][r.payload] += 1
        return counts

    def missing() -> dict[int, int]:
        return {g: len(sent - set(c)) for g, c in per_group().items() if sent - set(c)}

    # Per group and per message: a total that counts duplicates proves nothing.
    eventually(
        lambda: not missing(),
        120,
        "every group's messages",
        explain=missing,
        progress=lambda: sum(len(m.received_now()) for m in members),
    )
    duplicates = sum(sum(c.values()) - len(c) for c in per_group().values())
    # At least once: a Borrower that misses its Leader's answers under this load
    # lets go (its fence) and what it had in flight (at most its window of 100)
    # goes to another member again. None on SQLite here; on PostgreSQL, where
    # the leader thread's writes are server round trips, 0.1-1.3% of the
    # deliveries (docs/shared-subscriptions.md, Known limits).
    assert duplicates <= want // 20, (
        f"{duplicates} duplicates in {want} deliveries; Borrowers replaced, by reason: "
        f"{_replaced(broker)}"
    )
    close_all(*members, pub)


def _replaced(broker: BrokerProcess) -> Counter[str]:
    """Why the broker's Borrowers were replaced (its log), by reason."""
    text = broker.log_path.read_text(errors="replace")
    return Counter(re.findall(r"borrower \S+ replaced by \S+: (.*)", text))


# --------------------------------------------------------------------- the Leader


def test_the_group_exists_when_the_suback_arrives(storage_url: str, broker: BrokerProcess) -> None:
    """What is published right after the SUBACK belongs to a new group."""
    a = member(broker.port, "a", "$share/fresh/w/#")
    acked_us = time.time_ns() // 1000
    storage = open_storage(storage_url)
    try:
        record = GroupStore(storage).get(GroupId("fresh", "w/#"))
    finally:
        storage.close()
    assert record is not None and record.start_us is not None
    assert record.start_us <= acked_us
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 20)  # no pause after the SUBACK
    wait_union([a], sent)
    close_all(a, pub)


def test_retained_messages_are_not_sent_to_a_shared_subscription(broker: BrokerProcess) -> None:
    pub = Client(broker.port, "pub")
    pub.connect()
    pub.publish("w/r", b"kept", qos=1, retain=True).wait_for_publish(5)
    a = member(broker.port, "a")
    sent = publish(pub, 0, 20)
    wait_union([a], sent)
    assert b"kept" not in a.payloads()
    close_all(a, pub)


def test_leader_lookup_failing_then_recovering(storage_url: str, config: Path) -> None:
    """The group's claim is held by a Leader nobody can reach until it expires:
    the member keeps asking and is served once the claim is free."""
    group = GroupId("g", "w/#")
    with shared_broker(storage_url, config) as broker:
        storage = open_storage(storage_url)
        try:
            GroupStore(storage).create(group, start_us=None, now_us=0)
            # Taken once the broker is up (its start may take seconds on a busy machine).
            lease = Leases(storage).acquire(LEASE_PREFIX + group.key, "gone/leader/1", 8_000_000)
        finally:
            storage.close()
        a = member(broker.port, "a")
        pub = Client(broker.port, "pub")
        pub.connect()
        sent = publish(pub, 0, 50)
        # The claim lasts 8 s: a second of it passing is the point here.
        time.sleep(1.0)
        if time.time_ns() // 1000 < lease.expires_us:
            assert not a.payloads()  # no Leader yet
        wait_union([a], sent)
        sent += publish(pub, 50, 50)
        wait_union([a], sent)
        settle([a], pub)
        check_exactly_once([a], sent)
        close_all(a, pub)


def test_leader_state_survives_a_broker_restart(storage_url: str, config: Path) -> None:
    with shared_broker(storage_url, config) as broker:
        a = Client(broker.port, "a")
        a.connect(clean=False, expiry=600)
        assert a.subscribe("$share/g/w/#", qos=1) == [1]
        pub = Client(broker.port, "pub")
        pub.connect()
        first = publish(pub, 0, 100)
        wait_union([a], first)
        settle([a], pub)
        pub.close()
        a.close()
        broker.restart()  # saves the group's progress
        a = Client(broker.port, "a")
        assert a.connect(clean=False, expiry=600) is True  # still a member
        pub = Client(broker.port, "pub")
        pub.connect()
        rest = publish(pub, 100, 100)
        wait_union([a], rest)
        settle([a], pub)
        check_exactly_once([a], rest)
        assert not set(a.payloads()) & set(first)  # progress resumed, nothing again
        close_all(a, pub)


@pytest.mark.slow
def test_a_qos2_group_gets_each_message_once_across_a_broker_kill(
    storage_url: str, config: Path
) -> None:
    """SIGKILL the one broker while two QoS 2 members take a stream of QoS 2
    messages: its Leader dies with progress not saved yet, the members' sessions
    with messages half-way (PUBREC in, PUBREL not yet answered). After the
    restart the clients reconnect on their own; the group's new Leader resumes
    from the saved progress, and what a member's client already has (its PUBREC
    was recorded) goes to no member again: every message the publisher
    completed reaches the group once."""
    total = 600
    with shared_broker(storage_url, config) as broker:
        members = []
        for name in ("a", "b"):
            client = Client(broker.port, name)
            client.connect(clean=False, expiry=600)
            assert client.subscribe("$share/g/q/#", qos=2) == [2]
            members.append(client)
        wait_holding(storage_url, 2, "$share/g/q/#")
        pub = Client(broker.port, "pub")
        pub.connect(clean=False, expiry=600)
        payloads = [f"k{n % KEYS}:{n}".encode() for n in range(total)]

        def produce() -> None:
            for payload in payloads:
                key = payload.split(b":")[0].decode()
                pub.publish(f"q/{key}", payload, qos=2, key=key)

        producer = threading.Thread(target=produce)
        producer.start()

        def delivered() -> int:
            return len({p for m in members for p in m.payloads()})

        eventually(lambda: delivered() >= total // 3, 60, f"{total // 3} at the group")
        broker.kill()
        producer.join(60)
        broker.start()
        # paho reconnects by itself (1 s, 2 s, ...): the publisher completes
        # its stream, the members resume their sessions.
        eventually(lambda: len(pub.acked) >= total, 120, f"{total} PUBCOMPs")
        wait_union(members, payloads, timeout=120)
        pub.disconnect()
        counts = Counter(p for m in members for p in m.payloads())
        twice = sorted(p for p, n in counts.items() if n > 1)
        assert not twice, f"{len(twice)} QoS 2 messages reached the group twice: {twice[:10]}"
        check_key_order(members)
        close_all(*members)


def test_a_killed_leader_is_replaced_and_resumes_from_its_progress(
    postgres_url: str, config: Path
) -> None:
    """Two nodes on one PostgreSQL: the node leading the group is killed; the
    other node's member finds no Leader, takes the claim once it expires and
    resumes from the progress the dead Leader saved. Nothing is lost (what the
    dead Leader had not saved yet may come again)."""
    with shared_broker(postgres_url, config) as one, shared_broker(postgres_url, config) as two:
        a = member(one.port, "a")  # the Leader starts on node one
        wait_for_leader(postgres_url)
        b = member(two.port, "b")
        pub = Client(two.port, "pub")
        pub.connect()
        sent = publish(pub, 0, 200)
        wait_union([a, b], sent)
        assert a.payloads() and b.payloads()
        one.kill()
        sent += publish(pub, 200, 200)
        wait_union([a, b], sent, timeout=30)
        check_key_order([a, b], redelivered=True)
        storage = open_storage(postgres_url)
        try:
            lease = GroupStore(storage).leader_of(GroupId("g", "w/#"), time.time_ns() // 1000)
        finally:
            storage.close()
        assert lease is not None
        close_all(b, pub)


def test_concurrent_candidates_elect_exactly_one_leader(postgres_url: str, config: Path) -> None:
    with shared_broker(postgres_url, config) as one, shared_broker(postgres_url, config) as two:
        a = Client(one.port, "a")
        b = Client(two.port, "b")
        a.connect()
        b.connect()
        # Both nodes look for the group's Leader at the same time.
        assert a.paho is not None and b.paho is not None
        a.paho.subscribe("$share/g/w/#", 1)
        b.paho.subscribe("$share/g/w/#", 1)
        eventually(lambda: "leading as" in one.tail(400) + two.tail(400), what="a Leader")
        wait_holding(postgres_url, 2)  # both members hold streams before the messages come
        pub = Client(one.port, "pub")
        pub.connect()
        sent = publish(pub, 0, 300)
        wait_union([a, b], sent)
        settle([a, b], pub)
        check_exactly_once([a, b], sent)
        # Both members were served by then: a second Leader would have said so.
        logs = one.tail(400) + two.tail(400)
        assert logs.count("leading as") == 1, logs
        assert a.payloads() and b.payloads()
        close_all(a, b, pub)


# --------------------------------------------------------------------- bad input


def test_a_bad_shared_filter_is_refused_and_changes_nothing(broker: BrokerProcess) -> None:
    a = Client(broker.port, "a")
    a.connect()
    # `$queue/` names no filter: refused (0x8F Topic Filter invalid), the rest granted.
    assert a.subscribe("$queue/", "$share/g/w/#", qos=1) == [0x8F, 1]
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 20)
    wait_union([a], sent)
    # A `$share/` filter without a ShareName and a filter is malformed (the
    # codec: Protocol Error, [MQTT-4.8.2-1], [MQTT-4.8.2-2]).
    bad = Client(broker.port, "bad")
    bad.connect()
    assert bad.paho is not None
    bad.paho.subscribe("$share/g", 1)
    assert bad.wait_disconnected(5)
    assert bad.disconnects == [0x82]
    bad.close()
    close_all(a, pub)


def test_no_local_on_a_shared_subscription_is_a_protocol_error(broker: BrokerProcess) -> None:
    a = Client(broker.port, "a")
    a.connect()
    assert a.paho is not None
    from paho.mqtt.subscribeoptions import SubscribeOptions

    a.paho.subscribe([("$share/g/w/#", SubscribeOptions(1, noLocal=True))])
    assert a.wait_disconnected(5)
    assert a.disconnects == [0x82]  # Protocol Error [MQTT-3.8.3-4]
    a.close()
    # The broker carries on.
    b = member(broker.port, "b")
    pub = Client(broker.port, "pub")
    pub.connect()
    sent = publish(pub, 0, 10)
    wait_union([b], sent)
    close_all(b, pub)


def test_shared_subscriptions_can_be_switched_off(storage_url: str, tmp_path: Path) -> None:
    path = tmp_path / "off.toml"
    path.write_text("[shared_subscriptions]\nenabled = false\n")
    with shared_broker(storage_url, path) as broker:
        a = Client(broker.port, "a")
        a.connect()
        assert a.connack_properties.SharedSubscriptionAvailable == 0
        assert a.subscribe("$share/g/w/#", qos=1) == [0x9E]
        a.disconnect()


# --------------------------------------------------------------------- stopping


@pytest.mark.postgres
def test_a_broker_stops_within_its_grace_whatever_its_database_does(tmp_path: Path) -> None:
    """SIGTERM while the PostgreSQL server is hung (SIGSTOPped: it neither
    answers nor refuses) and 20 members' Borrowers are on the bus: the broker
    exits within `limits.stop_grace` and a margin (status 1: cut short, as
    after a crash). It used to wait for its queue of bus writes forever."""
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL could not start: {exc}")
    config = tmp_path / "riverbed.toml"
    config.write_text("[limits]\nstop_grace = 2\n")
    broker = shared_broker(server.url, config)
    pids: list[int] = []
    try:
        broker.start()
        members = [member(broker.port, f"m{i}") for i in range(20)]
        pids = server.pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        assert broker.process is not None
        stopping = time.monotonic()
        broker.process.send_signal(signal.SIGTERM)
        code = broker.process.wait(60)
        took = time.monotonic() - stopping
        assert took < 2 + EXIT_MARGIN + 10, f"stopping took {took:.1f} s"
        assert code in (0, 1), broker.tail()
        if code == 1:
            assert "stopping took over" in broker.tail()
        close_all(*members)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        broker.kill()
        server.stop()
