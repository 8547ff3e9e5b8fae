"""A session taken over across broker nodes (docs/cluster.md, "Takeover across nodes"):
held by one connection at a time.

The node taking a session asks the node holding it, over the nodes' bus, to let
go of it: that node closes its connection (0x8E) and saves the session before
the new connection gets its CONNACK, so no message reaches both, a QoS 2
message is delivered once and a QoS 1 message is not lost, whatever the
number of takeovers (here 100 for each; `bench/takeover.py` makes 1,000). A
node that was killed (its connections to the database gone with it) is not
waited for; one that stalls, alive but silent, is waited for until its liveness
lease lapses, and then delivers nothing more when it comes back (it fenced
itself).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import AsyncRawClient
from harness.takeover import Takeovers
from harness.waiting import eventually
from riverbed.cluster.bus import node_channel
from riverbed.mqtt.codec import Disconnect, Pingreq, Pingresp
from riverbed.sessions.store import SessionStore, node_lease
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases

NODE = Path(__file__).resolve().parent.parent / "harness" / "node.py"
TAKEOVERS = 100
"""Takeovers per stream in a test (the full 1,000: bench/takeover.py)."""
LONG_SWEEP = 600.0
"""An expiry sweep that never comes during a test: it cannot be what closes a
connection whose session was taken."""
SHORT_LEASE = 3.0
"""A liveness lease (s) a test can wait out (with a sweep, its renewal, of 1 s)."""


def node(url: str, **options: float) -> BrokerProcess:
    """A broker node with the given `Broker` timings (`harness/node.py`)."""
    launcher: list[str] = [str(NODE)]
    for name, value in options.items():
        launcher += [f"--{name.replace('_', '-')}", str(value)]
    return BrokerProcess(url, launcher=tuple(launcher))


@pytest.fixture
def two_nodes(postgres_url: str) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with (
        node(postgres_url, expiry_sweep=LONG_SWEEP) as a,
        node(postgres_url, expiry_sweep=LONG_SWEEP) as b,
    ):
        yield a, b


def test_the_old_connection_is_closed_before_the_new_one_is_accepted(
    two_nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = two_nodes
    on_a = connected(a.port, "roaming", clean=True)
    on_a.subscribe("r/#", qos=1)
    started = time.monotonic()
    on_b = connected(b.port, "roaming", clean=False)
    assert on_b.connack == (True, 0)
    # 0x8E at once (the sweep, 600 s away, had nothing to do with it).
    assert on_a.wait_disconnected(10)
    assert on_a.disconnects == [0x8E], on_a.disconnects
    assert time.monotonic() - started < 30
    pub = Client(a.port, "r-pub")
    pub.connect()
    pub.publish("r/1", b"after", qos=1).wait_for_publish(30)
    pub.disconnect()
    assert [r.payload for r in on_b.wait_for(1)] == [b"after"]
    assert on_a.received == []
    on_b.disconnect()
    on_a.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_session_taken_back_and_forth_is_never_delivered_to_twice(
    two_nodes: tuple[BrokerProcess, BrokerProcess], qos: int
) -> None:
    a, b = two_nodes
    run = Takeovers([a.port, b.port], qos=qos)
    try:
        run.start()
        for i in range(1, TAKEOVERS + 1):
            run.take_over(b.port if i % 2 else a.port)
        run.finish()
    finally:
        run.close()
    assert run.interleaved() == []
    assert run.not_taken_over() == []
    assert run.missing() == []
    if qos == 2:
        assert run.duplicates() == []
    assert run.published > TAKEOVERS


def test_a_session_on_a_killed_node_is_taken_without_waiting_for_its_lease(
    postgres_url: str,
) -> None:
    with node(postgres_url) as a, node(postgres_url) as b:
        on_a = connected(a.port, "roaming", clean=True)
        on_a.subscribe("r/#", qos=1)
        record = a.session("roaming")
        assert record is not None and record.node is not None
        a.kill()
        # Its connections to the database went with it: it is gone, not silent.
        on_b = connected(b.port, "roaming", clean=False, timeout=60)
        assert on_b.connack == (True, 0)
        assert time.time_ns() // 1000 < lease_of(postgres_url, record.node)
        pub = Client(b.port, "r-pub")
        pub.connect()
        pub.publish("r/1", b"to-b", qos=1).wait_for_publish(30)
        pub.disconnect()
        assert [r.payload for r in on_b.wait_for(1)] == [b"to-b"]
        on_b.disconnect()
        on_a.close()


def test_a_stalled_node_delivers_nothing_once_its_session_was_taken(postgres_url: str) -> None:
    with (
        node(postgres_url, expiry_sweep=1, node_lease_ttl=SHORT_LEASE) as a,
        node(postgres_url, expiry_sweep=1, node_lease_ttl=SHORT_LEASE) as b,
    ):
        on_a = connected(a.port, "roaming", clean=True)
        on_a.subscribe("r/#", qos=1)
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGSTOP)  # a stall: alive, but silent
        try:
            record = a.session("roaming")
            assert record is not None and record.node is not None
            lease = lease_of(postgres_url, record.node)
            on_b = connected(b.port, "roaming", clean=False, timeout=60)
            assert on_b.connack == (True, 0)
            # Not before A's lease lapsed: A might have been delivering still.
            assert time.time_ns() // 1000 >= lease
            pub = Client(b.port, "r-pub")
            pub.connect()
            for i in range(5):
                pub.publish("r/1", f"m{i}".encode(), qos=1).wait_for_publish(30)
        finally:
            os.kill(a.process.pid, signal.SIGCONT)
        # A comes back: its lease lapsed, it closes its connections (0x89)
        # without delivering what B's connection now owns.
        assert on_a.wait_disconnected(30)
        assert on_a.received == []
        assert [r.payload for r in on_b.wait_for(5)] == [f"m{i}".encode() for i in range(5)]
        for i in range(5, 8):
            pub.publish("r/1", f"m{i}".encode(), qos=1).wait_for_publish(30)
        assert len(on_b.wait_for(8)) == 8
        assert on_a.received == []
        pub.disconnect()
        on_b.disconnect()
        on_a.close()


def lease_of(url: str, node_name: str) -> int:
    """When a node's liveness lease expires (µs since the epoch)."""
    storage = open_storage(url)
    try:
        lease = Leases(storage).get(node_lease(node_name))
    finally:
        storage.close()
    assert lease is not None
    return lease.expires_us


RACES = 20
"""New client ids whose first CONNECTs reach both nodes at once."""


async def _holds(client: AsyncRawClient) -> bool:
    """Whether `client`'s connection still holds its session: a PINGREQ is
    answered, where a connection taken over has its DISCONNECT 0x8E (sent
    before its successor's CONNACK) and then the end of the connection."""
    client.send(Pingreq())
    try:
        packet = await client.next()
    except ConnectionError:
        return False
    if isinstance(packet, Disconnect):
        assert packet.reason_code == 0x8E, packet
        return False
    assert isinstance(packet, Pingresp), packet
    return True


def test_first_connects_of_a_new_client_on_two_nodes_at_once_leave_one_holder(
    two_nodes: tuple[BrokerProcess, BrokerProcess], postgres_url: str
) -> None:
    """Neither node has seen the client id, so each makes its session record
    without reading first (a create that another record refuses). The node
    whose create is refused reads the winner's record and takes the session
    over as any takeover does, or refuses the CONNECT (0x89, server busy):
    either way one connection holds the session afterwards, and the record
    says it is connected."""
    a, b = two_nodes

    opened: list[AsyncRawClient] = []

    async def race(client_id: str) -> tuple[list[int], int]:
        clients = await asyncio.gather(*(AsyncRawClient.open(n.port, 30) for n in (a, b)))
        opened.extend(clients)
        acks = await asyncio.gather(*(c.connect(client_id, expiry=600) for c in clients))
        accepted = [c for c, ack in zip(clients, acks, strict=True) if ack.reason_code == 0]
        holders = [await _holds(c) for c in accepted]
        return [ack.reason_code for ack in acks], holders.count(True)

    def connected_records() -> list[bool]:
        storage = open_storage(postgres_url)
        try:
            store = SessionStore(storage)
            records = [store.load(f"race-{i}") for i in range(RACES)]
            return [r is not None and r.record.connected for r in records]
        finally:
            storage.close()

    async def scenario() -> None:
        try:
            outcomes = await asyncio.gather(*(race(f"race-{i}") for i in range(RACES)))
            for i, (codes, holding) in enumerate(outcomes):
                assert all(code in (0, 0x89) for code in codes), (i, codes)
                assert 0 in codes and holding == 1, (i, codes, holding)
            # Held still (the connections are open): the records say so.
            assert await asyncio.to_thread(connected_records) == [True] * RACES
        finally:
            for client in opened:
                client.close()

    asyncio.run(scenario())


def connected(port: int, client_id: str, *, clean: bool, timeout: float = 30) -> Client:
    """A client connected with session expiry 600 s that stays disconnected
    once the broker closes its connection (paho would connect again, taking
    the session back)."""
    client = Client(port, client_id)
    client.connect(clean=clean, expiry=600, timeout=timeout)
    assert client.paho is not None
    client.paho._reconnect_on_failure = False  # no public setter
    return client


def test_a_subscribe_that_finds_its_session_taken_gives_it_up(sqlite_url: str) -> None:
    with BrokerProcess(sqlite_url) as broker:
        client = connected(broker.port, "roaming", clean=True)
        client.subscribe("r/1", qos=1)
        # Another writer took the record meanwhile (as a connection elsewhere would).
        storage = open_storage(sqlite_url)
        try:
            store = SessionStore(storage)
            stored = store.load("roaming")
            assert stored is not None
            taken = store.write(stored.record, stored.version)
        finally:
            storage.close()
        assert client.paho is not None
        client.paho.subscribe("r/2", qos=1)
        assert client.wait_disconnected(30)
        assert client.disconnects == [0x8E]  # not an error: the session is elsewhere
        assert broker.session("roaming") == taken.record  # and nothing written over it
        client.close()


def test_a_clean_session_kept_unwritten_is_given_up_once_another_node_shares_the_file(
    sqlite_url: str,
) -> None:
    """Alone on its SQLite file, a node writes no record for a session that
    ends with its connection. Once another node serves the file, a CONNECT
    there must find that connection by its record: at its next sweep the first
    node sees the other and writes what it kept unwritten; the CONNECT on the
    other node then takes the session over, and the first connection is
    closed (0x8E)."""
    with node(sqlite_url, expiry_sweep=1.0) as a:
        first = Client(a.port, "eph-shared")
        first.connect(clean=True, expiry=0)
        assert first.paho is not None
        first.paho._reconnect_on_failure = False  # no public setter
        assert a.session("eph-shared") is None  # alone: kept in memory
        with node(sqlite_url, expiry_sweep=1.0) as b:
            eventually(lambda: a.session("eph-shared") is not None, what="the record written")
            second = Client(b.port, "eph-shared")
            second.connect(clean=True, expiry=0)
            assert b.session("eph-shared") is not None  # not alone: written at CONNECT
            assert first.wait_disconnected(30)
            assert first.disconnects == [0x8E]
            second.disconnect()
        first.close()


def test_a_node_cut_from_the_others_delivers_nothing_until_it_is_back(
    postgres_url: str,
) -> None:
    with node(postgres_url, expiry_sweep=LONG_SWEEP) as a:
        on_a = connected(a.port, "roaming", clean=True)
        on_a.subscribe("r/#", qos=1)
        record = a.session("roaming")
        assert record is not None and record.node is not None
        # Cut its listening connection, its presence for the other nodes (who
        # may now count it gone and take its sessions).
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (node_channel(record.node),),
            ).fetchall()
        assert cut == [(True,)]
        a.wait_logged("lost its connection to the other nodes")
        pub = Client(a.port, "r-pub")
        pub.connect()
        pub.publish("r/1", b"while-cut", qos=1).wait_for_publish(30)
        # Nothing delivered while it may count as gone: the connection closes.
        assert on_a.wait_disconnected(30)
        assert on_a.disconnects == [0x89]  # Server busy
        assert on_a.received == []
        # Back, it delivers again (the session kept the message).
        a.wait_logged("connected to the other nodes again")
        again = connected(a.port, "roaming", clean=False)
        assert [r.payload for r in again.wait_for(1)] == [b"while-cut"]
        pub.disconnect()
        again.disconnect()
        on_a.close()


def test_a_sweep_slower_than_the_lease_does_not_fence_the_node(postgres_url: str) -> None:
    """The liveness lease is renewed on a thread of its own, never behind the
    expiry sweep's read of every session (with 100,000 sessions a sweep took
    longer than the lease, and the node fenced itself: every client closed
    with 0x89)."""
    with node(
        postgres_url, expiry_sweep=1.0, node_lease_ttl=SHORT_LEASE, sweep_delay=2 * SHORT_LEASE
    ) as a:
        client = connected(a.port, "steady", clean=True)
        a.wait_logged("slow expiry sweep done", count=2, timeout=120)
        assert not client.disconnects, client.disconnects
        assert a.logged("lease lapsed|fenc") == 0, a.tail()
        client.disconnect()
