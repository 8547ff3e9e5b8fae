"""QoS 2 exactly once across broker restarts (issue 3), end to end.

Incoming: the message and a marker (session id, packet id) are committed in one
transaction before PUBREC; a PUBLISH resent after a crash is not appended again.
Outgoing: the window (packet ids, PUBREC seen, PUBCOMP seen) is in the session
record before a PUBLISH or PUBREL goes out; after a crash the same packet ids
go out again, PUBRELs are resent, completed messages are not.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.mqtt.codec import (
    Puback,
    Pubcomp,
    PubcompReason,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscribeTopic,
)
from riverbed.storage import open_storage


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url) as running:
        yield running


def _markers(url: str) -> int:
    storage = open_storage(url)
    try:
        # The marker table is private to storage; a prefix delete that finds
        # nothing is how to ask "are there any" without SQL here.
        return storage.delete_markers_with_prefix("mqtt.qos2/")
    finally:
        storage.close()


def _log_payloads(url: str) -> list[bytes]:
    storage = open_storage(url)
    try:
        return [
            m.payload
            for head in storage.list_streams("mqtt")
            for m in storage.read(head.key, 0, 1000)
        ]
    finally:
        storage.close()


def test_qos2_publish_resent_after_a_crash_is_committed_once(
    broker: BrokerProcess, storage_url: str
) -> None:
    sub = Client(broker.port, "q2-sub")
    sub.connect(clean=True, expiry=300)
    assert sub.subscribe("q2/#", qos=1) == [1]

    with RawClient(broker.port) as pub:
        pub.connect("q2-pub", clean=True, expiry=300)
        pub.send(Publish("q2/a", b"once", qos=2, packet_id=7))
        assert pub.expect(Pubrec).packet_id == 7  # committed, marker recorded
    assert [m.payload for m in sub.wait_for(1)] == [b"once"]
    sub.close()

    broker.kill()  # the PUBREC "was lost": the client sends the PUBLISH again
    broker.start()

    with RawClient(broker.port) as pub:
        assert pub.connect("q2-pub", clean=False, expiry=300).session_present
        pub.send(Publish("q2/a", b"once", qos=2, dup=True, packet_id=7))
        assert pub.expect(Pubrec).packet_id == 7
        pub.send(Pubrel(7))
        assert pub.expect(Pubcomp).packet_id == 7
        # Released: the packet id is free for a new message.
        pub.send(Publish("q2/a", b"again", qos=2, packet_id=7))
        assert pub.expect(Pubrec).packet_id == 7
        pub.send(Pubrel(7))
        assert pub.expect(Pubcomp).packet_id == 7

    again = Client(broker.port, "q2-sub")
    assert again.connect(clean=False, expiry=300) is True
    # A marker from the same client id (key, stream) after both: once it is
    # here, everything before it in the log came.
    with RawClient(broker.port) as pub:
        pub.connect("q2-pub", clean=True, expiry=0)
        pub.send(Publish("q2/a", b"end", qos=1, packet_id=8))
        assert pub.expect(Puback).packet_id == 8
    again.wait_payloads(b"end")
    # "once" may come again only as a QoS 1 redelivery (DUP=1: its PUBACK may not
    # have been checkpointed before the crash), never as a new message.
    assert [m.payload for m in again.received_now() if not m.dup] == [b"again", b"end"]
    again.disconnect()
    broker.stop()
    assert _log_payloads(storage_url) == [b"once", b"again", b"end"]  # appended once each
    assert _markers(storage_url) == 0  # PUBREL deleted them


def test_a_pubrel_nobody_awaits_gets_packet_identifier_not_found(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as pub:
        pub.connect("q2-stray", clean=True, expiry=0)
        pub.send(Publish("q2/s", b"x", qos=2, packet_id=3))
        assert pub.expect(Pubrec).packet_id == 3
        pub.send(Pubrel(3))
        assert pub.expect(Pubcomp) == Pubcomp(3)
        pub.send(Pubrel(3))  # our PUBCOMP "was lost": the client asks again
        assert pub.expect(Pubcomp) == Pubcomp(3, PubcompReason.PACKET_IDENTIFIER_NOT_FOUND)
        pub.send(Pubrel(9))  # never published
        assert pub.expect(Pubcomp) == Pubcomp(9, PubcompReason.PACKET_IDENTIFIER_NOT_FOUND)


def test_unreleased_qos2_markers_go_with_the_session(
    broker: BrokerProcess, storage_url: str
) -> None:
    with RawClient(broker.port) as pub:
        pub.connect("q2-gone", clean=True, expiry=0)
        pub.send(Publish("q2/b", b"x", qos=2, packet_id=1))
        pub.expect(Pubrec)
        # No PUBREL: the session (expiry 0) ends with the connection.
    # Logged once the connection is torn down, the session (markers too) ended.
    broker.wait_logged(r"client q2-gone \(.*\) disconnected")
    broker.stop()
    assert _markers(storage_url) == 0


def test_qos2_publishes_from_paho_arrive_once(broker: BrokerProcess, storage_url: str) -> None:
    sub = Client(broker.port, "q2-paho-sub")
    sub.connect()
    sub.subscribe("p/#", qos=1)
    pub = Client(broker.port, "q2-paho-pub")
    pub.connect(clean=True, expiry=60)
    payloads = [b"m%d" % i for i in range(200)]
    infos = [pub.publish("p/1", p, qos=2) for p in payloads]
    # A marker from the same publisher: after it, nothing of theirs is to come.
    infos.append(pub.publish("p/1", b"end", qos=2))
    for info in infos:
        info.wait_for_publish(30)
    sub.wait_payloads(b"end")
    assert sub.payloads() == [*payloads, b"end"]
    pub.disconnect()
    sub.disconnect()
    broker.stop()
    assert _markers(storage_url) == 0


def test_outgoing_qos2_window_survives_crashes(broker: BrokerProcess) -> None:
    with RawClient(broker.port) as sub:
        sub.connect("out2", clean=True, expiry=300)
        sub.send(Subscribe(1, (SubscribeTopic("o/#", 2),)))
        assert [int(c) for c in sub.expect(Suback).reason_codes] == [2]
        pub = Client(broker.port, "out2-pub")
        pub.connect()
        pub.publish("o/1", b"x", qos=2).wait_for_publish(30)
        pub.disconnect()
        first = sub.expect(Publish)
        assert (first.payload, first.qos, first.dup) == (b"x", 2, False)
        # No PUBREC: the broker dies with the message unacknowledged.
    broker.kill()
    broker.start()
    with RawClient(broker.port) as sub:
        assert sub.connect("out2", clean=False, expiry=300).session_present
        again = sub.expect(Publish)
        assert (again.payload, again.packet_id, again.dup) == (b"x", first.packet_id, True)
        sub.send(Pubrec(first.packet_id or 0))
        assert sub.expect(Pubrel).packet_id == first.packet_id
        # No PUBCOMP: the broker dies after the PUBREL.
    broker.kill()
    broker.start()
    with RawClient(broker.port) as sub:
        assert sub.connect("out2", clean=False, expiry=300).session_present
        # [MQTT-4.4.0-1]: the PUBREL again, never the PUBLISH (the client released it).
        assert sub.expect(Pubrel).packet_id == first.packet_id
        sub.send(Pubcomp(first.packet_id or 0))
        # Nothing but a marker from the same publisher (key, stream) after it.
        _publish_marker(broker.port, b"marker 1")
        marker = sub.expect(Publish)
        assert marker.payload == b"marker 1"
        sub.send(Puback(marker.packet_id or 0))
    broker.kill()  # completed, but perhaps before a checkpoint moved the cursor
    broker.start()
    with RawClient(broker.port) as sub:
        assert sub.connect("out2", clean=False, expiry=300).session_present
        _publish_marker(broker.port, b"marker 2")
        # Until the second marker (after everything of that stream): the PUBCOMP
        # or the PUBACK may not have been persisted, so a PUBREL or the first
        # marker again (DUP) may come; never the PUBLISH.
        while True:
            packet = sub.next()
            match packet:
                case Publish(payload=b"marker 2"):
                    break
                case Pubrel(packet_id=first.packet_id):
                    sub.send(Pubcomp(packet.packet_id))
                case Publish(payload=b"marker 1", dup=True):
                    sub.send(Puback(packet.packet_id or 0))
                case _:
                    raise AssertionError(f"unexpected {packet!r}")


def _publish_marker(port: int, payload: bytes) -> None:
    """PUBLISH `payload` to o/1 (QoS 1) as the publisher of the o/ tests."""
    pub = Client(port, "out2-pub")
    pub.connect()
    pub.publish("o/1", payload, qos=1).wait_for_publish(30)
    pub.disconnect()


@pytest.mark.slow
def test_crash_during_a_qos2_stream_loses_and_duplicates_nothing(broker: BrokerProcess) -> None:
    """SIGKILL the broker while a QoS 2 publisher streams to an offline persistent
    subscriber; paho resends its unfinished PUBLISHes/PUBRELs on reconnecting (clean
    start 0). The subscriber then gets every message exactly once, in order."""
    sub = Client(broker.port, "q2-durable")
    sub.connect(clean=True, expiry=600)
    assert sub.subscribe("k/#", qos=2) == [2]
    sub.disconnect()

    total = 600
    payloads = [b"m%d" % i for i in range(total)]
    pub = Client(broker.port, "q2-crash-pub")
    pub.connect(clean=False, expiry=600)
    infos: list[paho.MQTTMessageInfo] = []

    def produce() -> None:
        for payload in payloads:
            infos.append(pub.publish("k/1", payload, qos=2))

    producer = threading.Thread(target=produce)
    producer.start()
    eventually(lambda: len(pub.acked) >= total // 3, what=f"{total // 3} PUBCOMPs", interval=0.002)
    broker.kill()
    producer.join(60)
    broker.start()
    # paho reconnects by itself (1 s, 2 s, ...) and completes the rest.
    eventually(lambda: len(pub.acked) >= total, 120, f"{total} PUBCOMPs")
    assert len(pub.acked) == total, f"{len(pub.acked)} of {total} completed"
    # A marker from the same publisher (key, stream), after all of them.
    pub.publish("k/1", b"end", qos=2).wait_for_publish(30)
    pub.disconnect()

    again = Client(broker.port, "q2-durable")
    assert again.connect(clean=False, expiry=600) is True
    again.wait_payloads(b"end", timeout=120)
    got = again.received_now()
    again.disconnect()
    assert [m.payload for m in got] == [*payloads, b"end"]  # none lost, none twice, in order
    assert all(m.qos == 2 for m in got)
