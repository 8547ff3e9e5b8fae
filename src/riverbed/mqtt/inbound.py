"""PUBLISH from a client: topic aliases, authorization, commit, acknowledgements.

A PUBLISH is committed to the log (the topic `Log.route` picks, with its key mode) before its
PUBACK/PUBREC goes out, and acknowledgements go out in the order the PUBLISHes
came in [MQTT-4.6.0-2], refusals included: a PUBLISH refused on arrival (not
authorized) waits behind the commits before it, already answered (`_Answered`).
QoS 0 and 1 wait in a batch per log topic for the broker's commit pacer
(`mqtt/pacer.py`), which commits every connection's batches for a topic together.

Receive Maximum [MQTT-3.3.4-7]: a QoS 1 PUBLISH counts until its PUBACK is sent,
a QoS 2 one until its PUBCOMP is sent; QoS 0 never counts. One more is refused
with DISCONNECT 0x93 (MQTT 3.1.1, which has no Receive Maximum to announce: the
connection is closed at the same limit). A QoS 2 PUBLISH sent again with the
packet id of one awaiting PUBREL is the same message: answered, not counted
again. Packet ids a previous connection of the session left awaiting PUBREL
are not counted (this connection has not seen them; the markers are in storage).

QoS 2, exactly once across broker restarts (issue 3): the message and a marker
`(session id, packet id)` are committed in one transaction
(`Appender.append_once`) before the PUBREC goes out. A PUBLISH the client sends
again with the same packet id (DUP=1, its PUBREC lost, perhaps
across a broker crash) finds the marker and is not appended again; PUBREL
deletes the marker before the PUBCOMP, so the client may reuse the packet id.
A marker whose PUBREL never comes goes with the session (`SessionStore.discard`).

Not group-committed (the marker's transaction must hold exactly this message):
QoS 2 pays a transaction per message, QoS 0 and 1 keep the group commit.

A store that refuses writes (full, read-only, unreachable) never lets a later
PUBLISH of a connection into the log after an earlier one was refused, so a
client that publishes the refused messages again, in order, keeps its order per
key: a connection has one commit at a time in the writer's hands (its later
PUBLISHes gather meanwhile), and once one is refused everything it read after
is refused too (not committed) and the connection is closed once those answers
are out: MQTT 5 DISCONNECT 0x97 Quota exceeded after the PUBACKs/PUBRECs 0x97;
MQTT 3.1.1, which cannot refuse, closes without them and the client sends them
all again. Without that, a later PUBLISH the client sent before it read the
refusal could be committed once the store was back, ahead of the refused one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from riverbed.errors import ProtocolError, RiverbedError
from riverbed.log.appender import Position, store_refused
from riverbed.log.log import Log
from riverbed.model import Message, StoredMessage, StreamId, encode_properties
from riverbed.mqtt.codec import (
    MQTT_5,
    DisconnectReason,
    Puback,
    PubackReason,
    Pubcomp,
    PubcompReason,
    Publish,
    Pubrec,
    PubrecReason,
)
from riverbed.mqtt.messages import committed_row, message_from_publish
from riverbed.mqtt.pacer import Batch, refusal_reason
from riverbed.mqtt.sys import is_sys_topic
from riverbed.sessions.store import now_us, qos2_marker
from riverbed.storage.base import Row

if TYPE_CHECKING:
    from riverbed.mqtt.connection import Connection

log = logging.getLogger(__name__)


def append_exactly_once(bus: Log, log_topic: str, message: Message, marker: str) -> Position | None:
    """Append `message` to `log_topic` with `marker`, blocking; its (stream,
    offset), or None if the marker was recorded before (already committed)."""
    bus.check(log_topic, message)
    ((id_bytes, ts),) = bus.appender.ids.reserve(1)
    row: Row = (
        id_bytes,
        ts,
        message.mqtt_topic,
        message.key,
        message.payload,
        encode_properties(message.properties) if message.properties else None,
        message.qos,
        int(message.retain),
    )
    firsts = bus.appender.append_once(log_topic, [row], marker)
    if firsts is None:
        return None
    ((key, offset),) = firsts.items()
    stream = bus.appender.stream_of(log_topic, key)
    return None if stream is None else (stream, offset)


class _Answered:
    """An acknowledgement decided when its PUBLISH arrived (a refusal, or the
    PUBREC of a resent QoS 2 PUBLISH), waiting in `Inbound._acks` behind the
    commits before it [MQTT-4.6.0-2]: done from the start, like a finished commit."""

    __slots__ = ("answer",)

    def __init__(self, answer: Puback | Pubrec) -> None:
        self.answer = answer

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return None


class Inbound:
    """The PUBLISHes of one connection, from arrival to acknowledgement."""

    __slots__ = (
        "_acks",
        "_aliases",
        "_batches",
        "_loop",
        "_progress",
        "_qos2",
        "_refused",
        "_taken",
        "_unacked",
        "conn",
    )

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._loop = asyncio.get_running_loop()
        self._aliases: dict[int, str] = {}
        self._acks: deque[tuple[Batch | asyncio.Future[Any] | _Answered, Publish]] = deque()
        """Commits not yet acknowledged, in arrival order."""
        self._unacked = 0
        """How many of `_acks` are QoS 1/2 (Receive Maximum counts those)."""
        self._batches: dict[str, Batch] = {}
        """QoS 0/1 PUBLISHes by topic that the pacer has not taken yet."""
        self._qos2: set[int] = set()
        """Packet ids committed at QoS 2 whose PUBREL has not come (this connection)."""
        self._taken: list[Batch] = []
        """The batches the pacer took last: until they are done, it takes no more."""
        self._refused: BaseException | None = None
        """Why the store refused a commit of this connection: what it reads after
        is refused too, and the connection closes once the answers are out."""
        self._progress: asyncio.Future[None] | None = None
        """A QoS 2 PUBLISH waiting for the commits before it."""

    def publish_now(self, packet: Publish) -> bool:
        """Take a PUBLISH that needs no waiting (QoS 0/1, not retained) into this
        read's batch; False if it needs `publish` (QoS 2, retained)."""
        if packet.qos == 2 or packet.retain:
            return False
        accepted = self._accept(packet)
        if accepted is None:
            return True
        log_topic, message = accepted
        batch = self._batches.get(log_topic)
        if batch is None:
            batch = self._batches[log_topic] = Batch(self, log_topic)
        batch.messages.append(message)
        self._acks.append((batch, packet))
        if packet.qos:
            self._unacked += 1
        return True

    def flush(self, now: bool = False) -> None:
        """Hand the batches to the commit pacer; `now`: commit them (and every
        other connection's) at once."""
        pacer = self.conn.broker.pacer
        if self._batches and pacer.want(self):
            # The PUBACKs wait: acknowledge the bytes at once, or a client with
            # Nagle's algorithm on (paho-mqtt) holds its next PUBLISH until they go.
            self.conn.quickack()
        if now:
            pacer.commit_now()

    def take_batches(self) -> list[Batch]:
        """For the pacer: the batches to commit; they leave this connection's
        hands. None while the last ones are still at the writer thread (one
        commit at a time per connection: a later one must not succeed where an
        earlier one is refused); they follow when those are done."""
        for batch in self._taken:
            if not batch.done():
                return []
        batches = list(self._batches.values())
        self._batches.clear()
        self._taken = batches
        return batches

    def _accept(self, packet: Publish) -> tuple[str, Message] | None:
        """Checks every PUBLISH passes: topic alias, Receive Maximum, retain,
        authorization. Returns (log topic, message), or None when refused here."""
        conn = self.conn
        conn.require_session()
        if self._refused is not None:
            # Read after a PUBLISH the store refused: refused as well, never
            # committed ahead of it; the connection closes once answered.
            reason = refusal_reason(self._refused)
            if packet.qos == 1:
                self._answer(packet, Puback(packet.packet_id or 0, reason))
            elif packet.qos == 2:
                self._answer(packet, Pubrec(packet.packet_id or 0, PubrecReason(reason)))
            return None
        properties = packet.properties
        if properties.subscription_identifiers:
            raise ProtocolError(
                DisconnectReason.PROTOCOL_ERROR,
                "a PUBLISH from a client must not carry a Subscription Identifier [MQTT-3.3.4-6]",
            )
        limits = conn.broker.config.limits
        topic = packet.topic
        alias = properties.topic_alias
        if alias is not None:
            if alias > limits.topic_alias_maximum:
                raise ProtocolError(
                    DisconnectReason.TOPIC_ALIAS_INVALID,
                    f"Topic Alias {alias} above the maximum"
                    f" {limits.topic_alias_maximum} [MQTT-3.3.2-9]",
                )
            if topic:
                self._aliases[alias] = topic
            else:
                found = self._aliases.get(alias)
                if found is None:
                    raise ProtocolError(
                        DisconnectReason.PROTOCOL_ERROR,
                        f"Topic Alias {alias} was never set on this connection [3.3.2.3.4]",
                    )
                topic = found
        qos = packet.qos
        if qos == 2 and packet.packet_id in self._qos2:
            # A resent QoS 2 PUBLISH whose PUBREC was lost: committed already,
            # and counted already (not a new PUBLISH for Receive Maximum).
            self._answer(packet, Pubrec(packet.packet_id or 0))
            return None
        # [MQTT-3.3.4-7]: QoS 1/2 PUBLISHes not yet acknowledged (PUBACK, PUBREC
        # not sent) and QoS 2 ones whose PUBCOMP is not sent; QoS 0 not at all.
        if qos and self._unacked + len(self._qos2) >= limits.receive_maximum:
            raise ProtocolError(
                DisconnectReason.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than Receive Maximum {limits.receive_maximum} QoS 1/2"
                " PUBLISHes unacknowledged [MQTT-3.3.4-7]",
            )
        if packet.retain and not limits.retain_available and conn.level == MQTT_5:
            raise ProtocolError(
                DisconnectReason.RETAIN_NOT_SUPPORTED,
                "retained messages are not available (CONNACK Retain Available 0) [MQTT-3.2.2-14]",
            )
        # Topic names starting with `$` are the server's (MQTT 5.0 §4.7.2): the
        # broker's own `$SYS` tree (mqtt/sys.py) is refused to every client.
        sys_topic = is_sys_topic(topic)
        if sys_topic or not conn.broker.authorizer.can_publish(
            conn.username, conn.client_id, topic
        ):
            why = "only the broker publishes to $SYS" if sys_topic else "not authorized"
            log.info("client %s: %s: refused PUBLISH to %r", conn.client_id, why, topic)
            v5 = conn.level == MQTT_5
            if qos == 1:
                refused = PubackReason.NOT_AUTHORIZED if v5 else PubackReason.SUCCESS
                self._answer(packet, Puback(packet.packet_id or 0, refused))
            elif qos == 2:
                denied = PubrecReason.NOT_AUTHORIZED if v5 else PubrecReason.SUCCESS
                self._answer(packet, Pubrec(packet.packet_id or 0, denied))
            return None
        # The binding that stores the topic name gives the log topic and the
        # message's key mode, both remembered by the log (`Log.route`).
        route = conn.broker.log.route(topic)
        return route.topic, message_from_publish(packet, topic, conn.client_id, route.key_mode)

    def _answer(self, packet: Publish, answer: Puback | Pubrec) -> None:
        """Acknowledge `packet` with `answer`, decided now, in arrival order: at
        once if nothing before it waits for a commit, else behind that
        [MQTT-4.6.0-2]."""
        if self._acks:
            self._acks.append((_Answered(answer), packet))
            self._unacked += 1
        else:
            self.conn.send(answer)

    async def publish(self, packet: Publish) -> None:
        """A PUBLISH that waits: retained (stored before the acknowledgement) or QoS 2."""
        self.flush(now=True)  # the PUBLISHes before it first (per-publisher order)
        accepted = self._accept(packet)
        if accepted is None:
            return
        log_topic, message = accepted
        broker = self.conn.broker
        retain = packet.retain and broker.config.limits.retain_available
        if retain:
            # Durable before the acknowledgement, like the message (mqtt/retained.py).
            broker.log.check(log_topic, message)
            await asyncio.to_thread(broker.retained.put, message, now_us())
        if packet.qos == 2:
            await self._publish_exactly_once(packet, log_topic, message)
            return
        batch = self._batches[log_topic] = Batch(self, log_topic)
        batch.messages.append(message)
        self._acks.append((batch, packet))
        if packet.qos:
            self._unacked += 1
        self.flush(now=True)

    async def _publish_exactly_once(
        self, packet: Publish, log_topic: str, message: Message
    ) -> None:
        """QoS 2: append with its marker, in order with this client's other
        PUBLISHes (per-publisher order): after those before it are committed, and
        before the next is read. One transaction per QoS 2 message, not pipelined;
        QoS 0 and 1 keep the group commit."""
        assert self.conn.stored is not None and packet.packet_id is not None
        while any(not f.done() for f, _ in self._acks):
            self._progress = self._loop.create_future()
            await self._progress  # `_send_acks` wakes it when a commit is done
        if self._refused is not None:  # one before it was refused meanwhile
            reason = PubrecReason(refusal_reason(self._refused))
            self._answer(packet, Pubrec(packet.packet_id, reason))
            return
        marker = qos2_marker(self.conn.stored.record.session_id, packet.packet_id)
        once = self._loop.run_in_executor(
            None, append_exactly_once, self.conn.broker.log, log_topic, message, marker
        )
        self._acks.append((once, packet))
        self._unacked += 1

        def exactly_once(f: asyncio.Future[Position | None]) -> None:
            ok = not f.cancelled() and f.exception() is None
            self._committed(f.result() if ok else None, message)

        once.add_done_callback(exactly_once)
        await asyncio.wait([once])

    async def release(self, packet_id: int) -> None:
        """PUBREL: forget the packet id, durably before the PUBCOMP: a client may
        reuse it once it has the PUBCOMP, and a marker left behind would drop
        that new message as a duplicate."""
        known = packet_id in self._qos2
        if self.conn.stored is not None:
            marker = qos2_marker(self.conn.stored.record.session_id, packet_id)
            deleted = await asyncio.to_thread(self.conn.broker.log.storage.delete_marker, marker)
            known = known or deleted
        # It counts toward Receive Maximum until its PUBCOMP is sent [MQTT-3.3.4-7].
        self._qos2.discard(packet_id)
        if known or self.conn.level != MQTT_5:
            self.conn.send(Pubcomp(packet_id))
        else:
            # Nothing awaits release under that id (a PUBREL resent after our
            # PUBCOMP was lost, or a stray one): MQTT 5 says so, 3.1.1 cannot.
            self.conn.send(Pubcomp(packet_id, PubcompReason.PACKET_IDENTIFIER_NOT_FOUND))

    def committed(self, batch: Batch) -> None:
        """The pacer committed a batch (or it failed): route it, send the
        acknowledgements due."""
        positions = batch.positions
        if positions is not None:
            self.conn.broker.counts.committed += len(batch.messages)
            # One run per stream of what this batch added there in a row: a key
            # mode that spreads (`none`, keys per topic) interleaves streams
            # message by message, and routing each message alone costs a wake-up
            # of each waiting session per message.
            router = self.conn.broker.router
            runs: dict[StreamId, tuple[int, list[StoredMessage]]] = {}
            for i, message in enumerate(batch.messages, batch.start):
                stream, offset = positions[i]
                run = runs.get(stream)
                if run is not None:
                    if offset == run[0] + len(run[1]):
                        run[1].append(committed_row(message, offset))
                        continue
                    router.committed(stream, *run)  # a gap: others appended between
                runs[stream] = (offset, [committed_row(message, offset)])
            for stream, (first, rows) in runs.items():
                router.committed(stream, first, rows)
        self._send_acks()
        if self._batches:
            self.flush()  # what gathered while this commit was at the writer

    def _committed(self, position: Position | None, message: Message) -> None:
        """A QoS 2 PUBLISH was committed (at `position`; None: failed, or resent
        and committed before): route it, and send the acknowledgements now due."""
        if position is not None:
            self.conn.broker.counts.committed += 1
            stream, offset = position
            self.conn.broker.router.committed(stream, offset, [committed_row(message, offset)])
        self._send_acks()

    def _send_acks(self) -> None:
        """Acknowledge the PUBLISHes whose commits are done, in arrival order."""
        acks = self._acks
        conn = self.conn
        progress = self._progress
        if progress is not None:
            self._progress = None
            if not progress.done():
                progress.set_result(None)
        while acks and acks[0][0].done():
            done, packet = acks.popleft()
            if packet.qos:
                self._unacked -= 1
            if type(done) is _Answered:
                conn.send(done.answer)
                continue
            failed = done.cancelled() or done.exception() is not None
            refusal = PubackReason.SUCCESS
            if failed:
                error = None if done.cancelled() else done.exception()
                refusal = refusal_reason(error)
                # A store that refuses writes is logged once per episode (the appender).
                log.log(
                    logging.DEBUG if refusal == PubackReason.QUOTA_EXCEEDED else logging.ERROR,
                    "client %s: committing a PUBLISH to %r failed: %s",
                    conn.client_id,
                    packet.topic,
                    error,
                )
                if conn.level != MQTT_5:
                    # The client sends it again, and what came after (not committed).
                    self._refuse_the_rest(error or RiverbedError("commit cancelled"))
                    conn.close(DisconnectReason.UNSPECIFIED_ERROR)
                    return
                if self._refused is None and error is not None and store_refused(error):
                    self._refuse_the_rest(error)
            packet_id = packet.packet_id
            if packet_id is None:
                continue
            if packet.qos == 1:
                if failed:
                    conn.send(Puback(packet_id, refusal))
                else:
                    conn._write(_puback(packet_id))
            elif packet.qos == 2:
                if not failed:
                    self._qos2.add(packet_id)
                conn.send(Pubrec(packet_id, PubrecReason(refusal)))
        if self._refused is not None and not acks:
            conn.close(DisconnectReason.QUOTA_EXCEEDED)

    def _refuse_the_rest(self, error: BaseException) -> None:
        """The store refused a commit: the batches not yet taken are refused with
        it (never committed), and so is whatever this connection reads next."""
        self._refused = error
        for batch in self._batches.values():
            batch.error = error
        self._batches.clear()


def _puback(packet_id: int) -> bytes:
    """A successful PUBACK, the same bytes at both protocol levels (MQTT 5 leaves
    out reason code 0 and properties [MQTT-3.4.2.1])."""
    return b"\x40\x02" + packet_id.to_bytes(2, "big")
