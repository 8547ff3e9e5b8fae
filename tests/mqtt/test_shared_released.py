"""A `$share` group's QoS 2 message that a member's client acknowledged with
PUBREC goes to no other member (mqtt/sharing.py, docs/shared-subscriptions.md,
"QoS 2 once per group"), however soon after its PUBREC the member leaves; and
one whose PUBREC comes only after the stream was lent to another member is
not completed by the first (no PUBREL: its client never hands it over).

In process, over TCP, with raw MQTT 5 clients (each packet sent when the test
says so). The session writer is slowed down for the writes that record a
message as released, so that the member's leave would, if it did not wait for
that record, hand its stream over before the record is there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from harness.sharedsub import short_timers
from harness.waiting import eventually
from riverbed.mqtt.codec import (
    MQTT_5,
    Disconnect,
    DisconnectReason,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Unsuback,
    Unsubscribe,
    encode,
)
from riverbed.mqtt.config import SharedSubscriptions
from riverbed.sessions.qos2 import Phase
from riverbed.sessions.store import SessionRecord, Stored
from riverbed.sessions.writer import NewCursors, SessionWriter

DELAY = 1.0
"""Seconds the record of a released message waits before it is written (less
than `leader_borrower_timeout`: a member that waits longer to leave has its
streams taken anyway, a limit docs/shared-subscriptions.md states)."""


def slow_released_writes(writer: SessionWriter) -> None:
    """Make `writer` write a record that carries KV entries (a released
    message's) only DELAY seconds after it is asked to."""
    real = writer.write

    def write(
        record: SessionRecord,
        version: int | None,
        cursors: NewCursors | None = None,
        *,
        also: Sequence[tuple[str, str, bytes]] = (),
        holds: Sequence[tuple[str, str, int]] = (),
    ) -> Future[Stored]:
        if not also:
            return real(record, version, cursors, holds=holds)
        out: Future[Stored] = Future()

        def later() -> None:
            inner = real(record, version, cursors, also=also, holds=holds)
            inner.add_done_callback(
                lambda done: (
                    out.set_exception(error)
                    if (error := done.exception()) is not None
                    else out.set_result(done.result())
                )
            )

        threading.Timer(DELAY, later).start()
        return out

    writer.write = write  # type: ignore[method-assign]


async def publish_qos2(client: AsyncRawClient, packet_id: int, payload: bytes) -> None:
    """PUBLISH at QoS 2 and complete the exchange."""
    client.send(Publish("q/k", payload, qos=2, packet_id=packet_id))
    await client.expect(Pubrec)
    client.send(Pubrel(packet_id))
    await client.expect(Pubcomp)


async def next_publish(client: AsyncRawClient) -> Publish:
    while True:
        packet = await client.next()
        if isinstance(packet, Publish):
            return packet


async def first_at_member(
    port: int, *, then_leave: bool = False
) -> tuple[AsyncRawClient, AsyncRawClient, Publish]:
    """x, the group's one member, and a publisher, which publishes "first" at
    QoS 2; x's client is sent it (once the Leader lent x the stream) and, with
    `then_leave`, leaves the group (UNSUBSCRIBE) without answering it."""
    x = await AsyncRawClient.open(port)
    await x.connect("x", expiry=600)
    assert (await x.subscribe("$share/g/q/#", qos=2)).reason_codes == (2,)
    pub = await AsyncRawClient.open(port)
    await pub.connect("pub", expiry=600)
    await publish_qos2(pub, 1, b"first")
    got = await next_publish(x)
    assert got.payload == b"first" and got.qos == 2 and got.packet_id is not None
    if then_leave:
        x.send(Unsubscribe(2, ("$share/g/q/#",)))
        assert isinstance(await x.next(), Unsuback)
    return x, pub, got


def test_a_member_leaving_right_after_its_pubrec_keeps_the_message_from_the_others(
    storage_url: str,
) -> None:
    async def scenario() -> None:
        timers = SharedSubscriptions(timers=short_timers())
        async with running_broker(storage_url, shared_subscriptions=timers) as broker:
            slow_released_writes(broker.writer)
            x, pub, got = await first_at_member(broker.port)
            # x has it: PUBREC, and gone at once (the broker sends PUBREL
            # only after recording it; x's session would resend it).
            assert got.packet_id is not None
            x.writer.write(encode(Pubrec(got.packet_id), MQTT_5) + encode(Disconnect(), MQTT_5))
            # The broker closes the connection at once (its teardown, which
            # saves the session, may go on a while).
            assert await asyncio.wait_for(x.reader.read(), 30) == b""
            x.close()
            y = await AsyncRawClient.open(broker.port)
            await y.connect("y", expiry=600)
            assert (await y.subscribe("$share/g/q/#", qos=2)).reason_codes == (2,)
            await publish_qos2(pub, 2, b"second")
            # y gets the stream from the group's progress, which is before
            # "first" (x never completed it): "first" must be passed over.
            received = await next_publish(y)
            assert received.payload == b"second", (
                f"y got {received.payload!r} first: a message x's client had"
                " acknowledged went to another member"
            )
            y.close()
            pub.close()

    asyncio.run(scenario())


def test_a_pubrec_that_comes_after_the_stream_was_lent_to_another_member_gets_no_pubrel(
    storage_url: str,
) -> None:
    """x holds a QoS 2 message unanswered when it leaves the group; its
    stream goes to y after `unsubscribe_timeout` (x's Borrower lets go), and y
    is sent the message. x's PUBREC, coming now, must not complete it at x
    too: x's session cannot record it as released any more, and ends x's
    connection without the PUBREL. Without the lending key's fence, x got the
    PUBREL and both clients handed the message over."""

    async def scenario() -> None:
        timers = SharedSubscriptions(timers=short_timers())
        async with running_broker(storage_url, shared_subscriptions=timers) as broker:
            x, pub, got = await first_at_member(broker.port, then_leave=True)
            y = await AsyncRawClient.open(broker.port)
            await y.connect("y", expiry=600)
            assert (await y.subscribe("$share/g/q/#", qos=2)).reason_codes == (2,)
            lent = await next_publish(y)  # x's Borrower let go: the group lends it again
            assert lent.payload == b"first" and lent.packet_id is not None
            x.send(Pubrec(got.packet_id))
            answer = await x.next()
            assert not isinstance(answer, Pubrel), (
                "x got the PUBREL: the message is completed at two members of the group"
            )
            assert answer == Disconnect(DisconnectReason.SERVER_BUSY), answer
            with pytest.raises(ConnectionError):
                await x.next()  # and the connection ends
            x.close()
            # y completes it: the group's one delivery.
            y.send(Pubrec(lent.packet_id))
            assert (await y.expect(Pubrel)).packet_id == lent.packet_id
            y.send(Pubcomp(lent.packet_id))
            # x's record keeps the message as sent, which a resumed session
            # drops: no PUBREL after a restart either.
            await asyncio.to_thread(
                eventually,
                lambda: (found := broker.store.load("x")) and not found.record.connected,
                what="x's session saved as disconnected",
            )
            stored = broker.store.load("x")
            assert stored is not None
            assert [e.phase for e in stored.record.qos2] == [Phase.SENT]
            y.close()
            pub.close()

    asyncio.run(scenario())


def test_a_message_of_an_older_grant_and_its_resend_under_a_newer_one_are_not_both_completed(
    storage_url: str,
) -> None:
    """x leaves the group holding "first" unanswered and joins again: the
    stream is lent to x again, from before "first", which x is sent a second
    time under another packet id. Both PUBRECs come in one read, so one write
    would record both: the older grant's lending version must be held as
    well as the newer's (it cannot be: refused, no PUBREL for either)."""

    async def scenario() -> None:
        timers = SharedSubscriptions(timers=short_timers())
        async with running_broker(storage_url, shared_subscriptions=timers) as broker:
            x, pub, got = await first_at_member(broker.port, then_leave=True)
            assert (await x.subscribe("$share/g/q/#", qos=2)).reason_codes == (2,)
            again = await next_publish(x)  # lent again, from before "first"
            assert again.payload == b"first" and again.packet_id not in (None, got.packet_id)
            assert got.packet_id is not None and again.packet_id is not None
            x.writer.write(
                encode(Pubrec(got.packet_id), MQTT_5) + encode(Pubrec(again.packet_id), MQTT_5)
            )
            answer = await x.next()
            assert not isinstance(answer, Pubrel), (
                "x got a PUBREL: its client completes the message twice"
            )
            assert answer == Disconnect(DisconnectReason.SERVER_BUSY), answer
            x.close()
            pub.close()

    asyncio.run(scenario())
