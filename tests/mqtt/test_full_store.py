"""A store that refuses writes (issue 14 item 11; docs/storage.md): a full SQLite
database (its `max_size` cap: `PRAGMA max_page_count`), a read-only PostgreSQL
(`default_transaction_read_only`), a PostgreSQL server that is down.

PUBLISHes that cannot be committed are refused (MQTT 5: PUBACK/PUBREC 0x97
Quota exceeded, then DISCONNECT 0x97; MQTT 3.1.1: no PUBACK, the connection is
closed), nothing read after a refused PUBLISH on its connection is committed
ahead of it, nothing is acknowledged that was not written, subscribers keep
receiving what was
committed, the broker logs one line when the episode starts and one when it
ends, and it recovers by itself once the store takes writes again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.broker import BrokerProcess, Client
from harness.postgres import PostgresServer
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.log.log import BINDINGS_TTL
from riverbed.mqtt.codec import (
    MQTT_3_1_1,
    MQTT_5,
    Connack,
    Connect,
    ConnectReason,
    Disconnect,
    DisconnectReason,
    Puback,
    PubackReason,
    Publish,
    Pubrec,
    PubrecReason,
    encode,
)
from riverbed.storage import open_storage

REFUSED = "the store refuses writes"
RECOVERED = "the store takes writes again"
PAYLOAD = 2000
"""Bytes of padding per message: a 256 KiB database fills after some dozens."""


def payload(n: int) -> bytes:
    return b"%06d:" % n + b"x" * PAYLOAD


def number(data: bytes) -> int:
    return int(data[:6])


def stored_numbers(url: str) -> set[int]:
    """The messages in the `mqtt` topic, read by another connection."""
    storage = open_storage(url)
    try:
        found: set[int] = set()
        for head in storage.list_streams("mqtt"):
            offset = head.start_offset
            while batch := storage.read(head.key, offset, 500):
                found.update(number(m.payload) for m in batch)
                offset = batch[-1].offset + 1
        return found
    finally:
        storage.close()


def free_space(url: str) -> None:
    """Delete every message of the `mqtt` topic (the space comes back)."""
    storage = open_storage(url)
    try:
        for head in storage.list_streams("mqtt"):
            storage.delete_before(head.key, head.next_offset)
    finally:
        storage.close()


def closed_for_quota(pub: RawClient) -> None:
    """After a refusal the broker closes the connection: DISCONNECT 0x97."""
    assert pub.expect(Disconnect).reason_code == DisconnectReason.QUOTA_EXCEEDED
    with pytest.raises(ConnectionError):
        pub.next()


def refused_on_a_new_connection(port: int, client_id: str, packet: Publish) -> None:
    """`packet` on a connection of its own is refused with 0x97, and the
    connection closed."""
    with RawClient(port) as pub:
        pub.connect(client_id, clean=True)
        pub.send(packet)
        ack = pub.expect(Puback if packet.qos == 1 else Pubrec)
        assert ack.reason_code == PubackReason.QUOTA_EXCEEDED, ack
        closed_for_quota(pub)


def accepted_on_a_new_connection(port: int, client_id: str, n: int) -> bool:
    """Publish message `n` (QoS 1) on a connection of its own: accepted?"""
    with RawClient(port) as pub:
        pub.connect(client_id, clean=True)
        pub.send(Publish("full/t", payload(n), qos=1, packet_id=1))
        return pub.expect(Puback).reason_code == PubackReason.SUCCESS


def publish_until_refused(pub: RawClient, first: int, limit: int = 2000) -> tuple[set[int], int]:
    """QoS 1 PUBLISHes one at a time until one is refused: (numbers acknowledged
    with success, the number refused). The broker closes the connection then."""
    acked: set[int] = set()
    for n in range(first, first + limit):
        pub.send(Publish("full/t", payload(n), qos=1, packet_id=n % 60000 + 1))
        ack = pub.expect(Puback)
        assert ack.packet_id == n % 60000 + 1
        if ack.reason_code == PubackReason.SUCCESS:
            acked.add(n)
            continue
        assert ack.reason_code == PubackReason.QUOTA_EXCEEDED, ack
        closed_for_quota(pub)
        return acked, n
    raise AssertionError(f"{limit} PUBLISHes and none refused: is the store capped?")


def subscriber(port: int) -> Client:
    sub = Client(port, "full-watcher")
    sub.connect()
    sub.subscribe("full/#", qos=1)
    return sub


def received(sub: Client) -> set[int]:
    return {number(r.payload) for r in list(sub.received)}


# --------------------------------------------------------------------- SQLite full


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    url = f"sqlite:///{tmp_path}/capped.db"
    with BrokerProcess(f"{url}?max_size=256KiB") as broker:
        yield broker, url


def test_mqtt5_full_sqlite_refuses_with_0x97_and_recovers(
    capped: tuple[BrokerProcess, str],
) -> None:
    broker, url = capped
    sub = subscriber(broker.port)
    try:
        with RawClient(broker.port) as pub:
            pub.connect("full-pub", clean=True)
            acked, refused = publish_until_refused(pub, 0)
        assert len(acked) > 10
        # Every PUBLISH while it is full is refused, QoS 2 too (PUBREC 0x97).
        for n in range(refused + 1, refused + 4):
            packet = Publish("full/t", payload(n), qos=1, packet_id=n)
            refused_on_a_new_connection(broker.port, "full-pub", packet)
        packet = Publish("full/t", payload(refused + 4), qos=2, packet_id=refused + 4)
        refused_on_a_new_connection(broker.port, "full-pub", packet)
        refused_all = set(range(refused, refused + 5))

        # Acknowledged = written; refused = not written; deliveries went on.
        stored = stored_numbers(url)
        assert acked <= stored
        assert not refused_all & stored
        eventually(lambda: received(sub) >= acked, what="every acknowledged message delivered")
        assert not received(sub) & refused_all
        assert broker.tail(400).count(REFUSED) == 1

        # Space returns: the client's next connection publishes, unprompted.
        free_space(url)
        after = refused + 10
        assert accepted_on_a_new_connection(broker.port, "full-pub", after)
        eventually(lambda: after in received(sub), what="the message after recovery")
        broker.wait_logged(RECOVERED)  # from the writer's thread, maybe after the PUBACK
        log = broker.tail(400)
        assert log.count(REFUSED) == 1
        assert log.count(RECOVERED) == 1
    finally:
        sub.disconnect()


def test_nothing_read_after_a_refused_publish_is_committed_ahead_of_it(
    capped: tuple[BrokerProcess, str],
) -> None:
    """A QoS 2 PUBLISH too big for the capped store, then, in the same write, a
    small QoS 1 one that would fit: the second is refused too (never in the log
    ahead of the first, which the client may publish again), then DISCONNECT."""
    broker, url = capped
    too_big = b"%06d:" % 1 + b"x" * 300_000
    with RawClient(broker.port) as pub:
        pub.connect("gap-pub", clean=True)
        pub.sock.sendall(
            encode(Publish("full/t", too_big, qos=2, packet_id=1), MQTT_5)
            + encode(Publish("full/t", payload(2), qos=1, packet_id=2), MQTT_5)
        )
        assert pub.expect(Pubrec).reason_code == PubrecReason.QUOTA_EXCEEDED
        # The QoS 1 PUBLISH is refused if it was read before the connection
        # closed, else left unanswered (the client sends it again); never accepted.
        answer = pub.next()
        if isinstance(answer, Puback):
            assert answer.reason_code == PubackReason.QUOTA_EXCEEDED, answer
            answer = pub.next()
        assert answer == Disconnect(DisconnectReason.QUOTA_EXCEEDED), answer
    assert stored_numbers(url) == set()
    # It fits on its own: the store refused the first, not the second.
    assert accepted_on_a_new_connection(broker.port, "gap-pub", 2)
    assert stored_numbers(url) == {2}


def test_mqtt311_full_sqlite_closes_without_puback_and_recovers(
    capped: tuple[BrokerProcess, str],
) -> None:
    broker, url = capped
    acked: set[int] = set()
    with RawClient(broker.port, level=MQTT_3_1_1) as pub:
        pub.send(Connect("full-311", True, 60))
        pub.expect(Connack)
        n = 0
        while True:
            pub.send(Publish("full/t", payload(n), qos=1, packet_id=n + 1))
            try:
                ack = pub.expect(Puback)
            except ConnectionError:
                break  # closed without a PUBACK: 3.1.1 has no way to refuse
            assert ack.packet_id == n + 1 and ack.reason_code == PubackReason.SUCCESS
            acked.add(n)
            n += 1
            assert n < 2000, "2000 PUBLISHes and none refused: is the store capped?"
    stored = stored_numbers(url)
    assert acked <= stored
    assert n not in stored
    free_space(url)
    with RawClient(broker.port, level=MQTT_3_1_1) as pub:
        pub.send(Connect("full-311", True, 60))
        pub.expect(Connack)
        pub.send(Publish("full/t", payload(n), qos=1, packet_id=1))
        assert pub.expect(Puback).reason_code == PubackReason.SUCCESS
    assert n in stored_numbers(url)
    broker.wait_logged(RECOVERED)  # from the writer's thread, maybe after the PUBACK
    log = broker.tail(400)
    assert log.count(REFUSED) == 1 and log.count(RECOVERED) == 1


# --------------------------------------------------------------------- PostgreSQL


def _set_read_only(server: PostgresServer, on: bool) -> None:
    """ALTER SYSTEM and a reload: open sessions take it too (no reconnect)."""
    with psycopg.connect(server.url, autocommit=True) as admin:
        if on:
            admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        admin.execute("SELECT pg_reload_conf()")


@pytest.mark.postgres
def test_read_only_postgres_refuses_with_0x97_and_recovers(
    own_postgres: PostgresServer,
) -> None:
    url = own_postgres.new_database("read_only")
    with BrokerProcess(url) as broker:
        sub = subscriber(broker.port)
        try:
            with RawClient(broker.port) as pub:
                pub.connect("ro-pub", clean=True)
                pub.send(Publish("full/t", payload(0), qos=1, packet_id=1))
                assert pub.expect(Puback).reason_code == PubackReason.SUCCESS
                _set_read_only(own_postgres, True)
                try:
                    acked, refused = publish_until_refused(pub, 1)
                    # Reads and deliveries go on meanwhile.
                    eventually(lambda: received(sub) >= acked | {0}, what="deliveries")
                    # A new connection: its session cannot be written.
                    with RawClient(broker.port) as again:
                        connack = again.connect("ro-pub2", clean=True)
                        assert connack.reason_code == ConnectReason.SERVER_UNAVAILABLE
                finally:
                    _set_read_only(own_postgres, False)
            stored = stored_numbers(url)
            assert acked | {0} <= stored
            assert not {refused, refused + 1} & stored
            after = refused + 10

            # A reload reaches the server's sessions within moments, not at once.
            eventually(
                lambda: accepted_on_a_new_connection(broker.port, "ro-pub", after),
                what="a PUBLISH accepted after the reload",
            )
            eventually(lambda: after in received(sub), what="delivery after recovery")
            # The line comes from the writer's thread, maybe after the PUBACK.
            broker.wait_logged(RECOVERED)
            log = broker.tail(400)
            assert log.count(REFUSED) == 1 and log.count(RECOVERED) == 1
        finally:
            sub.disconnect()


@pytest.mark.postgres
@pytest.mark.slow
def test_postgres_down_refuses_with_0x97_recovers_and_stops(
    own_postgres: PostgresServer,
) -> None:
    url = own_postgres.new_database("goes_down")
    with BrokerProcess(url) as broker:
        with RawClient(broker.port) as pub:
            pub.connect("down-pub", clean=True)
            pub.send(Publish("full/t", payload(0), qos=1, packet_id=1))
            assert pub.expect(Puback).reason_code == PubackReason.SUCCESS
            own_postgres.halt()
            # The condition is time itself: the broker's cached view of the
            # bindings has expired, so the PUBLISH meets the database on its way
            # in too (it used to close the connection there, 0x80).
            time.sleep(2 * BINDINGS_TTL)
            try:
                pub.send(Publish("full/t", payload(1), qos=1, packet_id=2))
                assert pub.expect(Puback).reason_code == PubackReason.QUOTA_EXCEEDED
                closed_for_quota(pub)
            finally:
                own_postgres.resume()
        # The store's connection broken by the restart is replaced by itself.
        assert accepted_on_a_new_connection(broker.port, "down-pub", 3)
        assert stored_numbers(url) == {0, 3}
        broker.wait_logged(RECOVERED)  # from the writer's thread, maybe after the PUBACK
        log = broker.tail(400)
        assert log.count(REFUSED) == 1 and log.count(RECOVERED) == 1
        # Stopping while the database is down does not hang (BrokerProcess.stop
        # fails the test after its timeout).
        own_postgres.halt()
        try:
            broker.stop()
        finally:
            own_postgres.resume()
