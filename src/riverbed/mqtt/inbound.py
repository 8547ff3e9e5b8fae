"""PUBLISH from a client, as the connection core accepted it: commit, then
the core's acknowledgement.

The connection core (`mqtt/protocol.py`) owns the rules a PUBLISH must pass
(topic aliases, Receive Maximum, authorization, a resent QoS 2) and the order
of the acknowledgements [MQTT-4.6.0-2]; what it accepts comes here (the
`Publish` itself, or an `Append` effect for one that waits or came under a
topic alias), and the commits are reported back in arrival order: how many in
a row succeeded (`ConnectionCore.committed`), and the reason for one that
failed (`ConnectionCore.refused`). The core answers with the PUBACKs/PUBRECs
to send. QoS 0 and 1 wait in a
batch per log topic for the broker's commit pacer (`mqtt/pacer.py`), which
commits every connection's batches for a topic together.

QoS 2, exactly once across broker restarts: the message and a marker
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
is refused too (not committed; the core refuses what it reads from then on)
and the connection is closed once those answers are out: MQTT 5 DISCONNECT
0x97 Quota exceeded after the PUBACKs/PUBRECs 0x97; MQTT 3.1.1, which cannot
refuse, closes without them and the client sends them all again. Without that,
a later PUBLISH the client sent before it read the refusal could be committed
once the store was back, ahead of the refused one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from riverbed.clock import now_us
from riverbed.errors import RiverbedError
from riverbed.log.appender import Position, store_refused
from riverbed.model import Message
from riverbed.mqtt.codec import MQTT_5, PubackReason, Publish
from riverbed.mqtt.messages import (
    append_exactly_once,
    committed_row,
    committed_runs,
    message_from_publish,
)
from riverbed.mqtt.pacer import TopicBatch, refusal_reason
from riverbed.mqtt.ports import Services
from riverbed.mqtt.protocol import ConnectionCore
from riverbed.mqtt.protocol_effects import Append, Effect
from riverbed.sessions.store import qos2_marker

log = logging.getLogger(__name__)


class Inbound:
    """The accepted PUBLISHes of one connection, from `Append` to commit.

    `apply` carries out the core's answers (the acknowledgements to send, a
    close); `quickack` has the kernel acknowledge the bytes read so far.
    """

    __slots__ = (
        "_acks",
        "_apply",
        "_batches",
        "_broker",
        "_core",
        "_progress",
        "_quickack",
        "_refused",
        "_taken",
        "session_id",
        "stored_first",
    )

    def __init__(
        self,
        broker: Services,
        core: ConnectionCore,
        apply: Callable[[list[Effect]], None],
        quickack: Callable[[], None],
    ) -> None:
        self._broker = broker
        self._core = core
        self._apply = apply
        self._quickack = quickack
        self.session_id = ""
        """The session's id, for the QoS 2 markers (set once the session is open)."""
        self.stored_first: Callable[[], Awaitable[None]] | None = None
        """Writes the session's record if it was not written yet (`Stored.version`
        None), before its first QoS 2 marker: a marker without a record would
        outlive a crash, with nothing to find it."""
        self._acks: deque[TopicBatch | asyncio.Future[Any]] = deque()
        """The commit of each append not yet reported to the core, in arrival
        order (a batch once per message it holds)."""
        self._batches: dict[str, TopicBatch] = {}
        """QoS 0/1 PUBLISHes by topic that the pacer has not taken yet."""
        self._taken: list[TopicBatch] = []
        """The batches the pacer took last: until they are done, it takes no more."""
        self._refused: BaseException | None = None
        """Why the store refused a commit of this connection: the batches not
        taken yet are refused with it."""
        self._progress: asyncio.Future[None] | None = None
        """A QoS 2 PUBLISH waiting for the commits before it."""

    def append_now(self, packet: Publish, topic: str) -> None:
        """Take a PUBLISH that needs no waiting (QoS 0/1, not retained) into this
        read's batch, under `topic` (its name, or the one its alias stands for)."""
        # The binding that stores the topic name gives the log topic and the
        # message's key mode, both remembered by the log (`Log.route`).
        route = self._broker.log.route(topic)
        log_topic = route.topic
        batch = self._batches.get(log_topic)
        if batch is None:
            batch = self._batches[log_topic] = TopicBatch(self, log_topic)
        batch.messages.append(
            message_from_publish(packet, topic, self._core.client_id, route.key_mode)
        )
        self._acks.append(batch)

    def _message(self, append: Append) -> tuple[str, Message]:
        """The log topic and message of an accepted PUBLISH (`Log.route`)."""
        route = self._broker.log.route(append.topic)
        client_id = self._core.client_id
        return route.topic, message_from_publish(
            append.publish, append.topic, client_id, route.key_mode
        )

    def flush(self, now: bool = False) -> None:
        """Hand the batches to the commit pacer; `now`: commit them (and every
        other connection's) at once."""
        pacer = self._broker.pacer
        if self._batches and pacer.want(self):
            # The PUBACKs wait: acknowledge the bytes at once, or a client with
            # Nagle's algorithm on (paho-mqtt) holds its next PUBLISH until they go.
            self._quickack()
        if now:
            pacer.commit_now()

    def take_batches(self) -> list[TopicBatch]:
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

    async def publish(self, append: Append) -> None:
        """A PUBLISH that waits: retained (stored before the acknowledgement) or QoS 2."""
        self.flush(now=True)  # the PUBLISHes before it first (per-publisher order)
        packet = append.publish
        log_topic, message = self._message(append)
        broker = self._broker
        if packet.retain and broker.config.limits.retain_available:
            # Durable before the acknowledgement, like the message (mqtt/retained.py).
            broker.log.check(log_topic, message)
            await asyncio.to_thread(broker.retained.put, message, now_us())
        if packet.qos == 2:
            await self._publish_exactly_once(append, log_topic, message)
            return
        batch = self._batches.get(log_topic)
        if batch is None:
            batch = self._batches[log_topic] = TopicBatch(self, log_topic)
        batch.messages.append(message)
        self._acks.append(batch)
        self.flush(now=True)

    async def _publish_exactly_once(self, append: Append, log_topic: str, message: Message) -> None:
        """QoS 2: append with its marker, in order with this client's other
        PUBLISHes (per-publisher order): after those before it are committed, and
        before the next is read. One transaction per QoS 2 message, not pipelined;
        QoS 0 and 1 keep the group commit."""
        packet_id = append.publish.packet_id
        assert packet_id is not None
        loop = asyncio.get_running_loop()
        while any(not f.done() for f in self._acks):
            self._progress = loop.create_future()
            await self._progress  # `_send_acks` wakes it when a commit is done
        if self._refused is not None:  # one before it was refused meanwhile
            reason = refusal_reason(self._refused)
            self._apply(self._core.refused(reason, store_refused=True))
            return
        marker = qos2_marker(self.session_id, packet_id)
        once: asyncio.Future[Position | None]
        if self.stored_first is None:
            once = loop.run_in_executor(
                None, append_exactly_once, self._broker.log, log_topic, message, marker
            )
        else:
            stored_first, self.stored_first = self.stored_first, None
            once = loop.create_task(
                self._stored_then_appended(stored_first, log_topic, message, marker)
            )
        self._acks.append(once)

        def exactly_once(f: asyncio.Future[Position | None]) -> None:
            ok = not f.cancelled() and f.exception() is None
            self._committed(f.result() if ok else None, message)

        once.add_done_callback(exactly_once)
        await asyncio.wait([once])

    async def _stored_then_appended(
        self,
        stored_first: Callable[[], Awaitable[None]],
        log_topic: str,
        message: Message,
        marker: str,
    ) -> Position | None:
        """The record written, then the message appended with its marker (a
        failure of either refuses the PUBLISH)."""
        await stored_first()
        return await asyncio.to_thread(
            append_exactly_once, self._broker.log, log_topic, message, marker
        )

    async def release(self, packet_id: int) -> bool:
        """PUBREL: forget the packet id, durably before the PUBCOMP: a client may
        reuse it once it has the PUBCOMP, and a marker left behind would drop
        that new message as a duplicate. True if a marker was there."""
        if not self.session_id:
            return False
        marker = qos2_marker(self.session_id, packet_id)
        return await asyncio.to_thread(self._broker.log.storage.delete_marker, marker)

    def committed(self, batch: TopicBatch) -> None:
        """The pacer committed a batch (or it failed): route it, report it."""
        positions = batch.positions
        if positions is not None:
            broker = self._broker
            broker.counts.committed += len(batch.messages)
            fanout = broker.fanout
            for stream, first, rows in committed_runs(batch.messages, positions, batch.start):
                fanout.committed(stream, first, rows)
        self._send_acks()
        if self._batches:
            self.flush()  # what gathered while this commit was at the writer

    def _committed(self, position: Position | None, message: Message) -> None:
        """A QoS 2 PUBLISH was committed (at `position`; None: failed, or resent
        and committed before): route it, and report the commits now done."""
        if position is not None:
            self._broker.counts.committed += 1
            stream, offset = position
            self._broker.fanout.committed(
                stream, offset, [committed_row(message, offset, now_us())]
            )
        self._send_acks()

    def _send_acks(self) -> None:
        """Report the commits that are done to the core, in arrival order; it
        answers with the acknowledgements [MQTT-4.6.0-2]."""
        acks = self._acks
        core = self._core
        progress = self._progress
        if progress is not None:
            self._progress = None
            if not progress.done():
                progress.set_result(None)
        count = 0  # commits done and successful in a row: reported in one call
        ok: object = None  # the last of them (a batch comes once per message)
        while acks:
            done = acks[0]
            if done is ok:
                acks.popleft()
                count += 1
                continue
            if not done.done():
                break
            acks.popleft()
            if not done.cancelled() and done.exception() is None:
                ok = done
                count += 1
                continue
            if count:
                self._apply(core.committed(count))
                count = 0
            error = None if done.cancelled() else done.exception()
            reason = refusal_reason(error)
            refused = error is not None and store_refused(error)
            # A store that refuses writes is logged once per episode (the appender).
            log.log(
                logging.DEBUG if reason == PubackReason.QUOTA_EXCEEDED else logging.ERROR,
                "client %s: committing a PUBLISH failed: %s",
                core.client_id,
                error,
            )
            if self._refused is None and (refused or core.level != MQTT_5):
                # MQTT 3.1.1 is closed (the client sends it again, and what came
                # after, not committed); MQTT 5 refuses what follows.
                self._refuse_the_rest(error or RiverbedError("commit cancelled"))
            self._apply(core.refused(reason, refused))
        if count:
            self._apply(core.committed(count))

    def _refuse_the_rest(self, error: BaseException) -> None:
        """The store refused a commit: the batches not yet taken are refused with
        it (never committed)."""
        self._refused = error
        for batch in self._batches.values():
            batch.error = error
        self._batches.clear()
