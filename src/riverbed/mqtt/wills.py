"""Will Messages (MQTT 5.0 §3.1.2.5, §3.1.3.2).

A connection that closes without DISCONNECT 0x00 (or with 0x04 Disconnect with
Will Message) leaves its Will to this broker's `Wills`: published after the
Will Delay Interval or when the session ends, whichever comes first
[MQTT-3.1.3-9]; a new connection to the session before then cancels it, and a
clean start (which ends the old session) publishes it at once. MQTT 3.1.1 has
no delay. The Will is published like a PUBLISH from its client: authorized for
its topic, retained if it asks to be (and retain is available), with its QoS.

Durable: the Will is in the session record (`SessionRecord.will`) from CONNECT
until a DISCONNECT 0x00 or until it is published. A broker that starts finds
the Wills its predecessor left pending (or that a crash left behind: a record
still marked connected) and publishes them when they are due.

Several nodes (docs/cluster.md): a node whose liveness lease lapsed (it died)
publishes no Will any more; at each expiry sweep the other nodes adopt the
Wills in its records (`adopt`) and publish them when due: the Will Delay
counted from when the record was last seen, and not before the lease lapsed.

Exactly once, whoever publishes it: a Will belongs to one connection
(`Owner`: its session id and the record's epoch, as the connection left the
record or as `adopt` found it) and is appended with a marker naming it
(`will_marker`) in the same transaction (`Storage.append_once`), then cleared
from the record by a compare-and-set. Two survivors, or a dead node coming
back, racing for one Will: one appends it, the others find its marker (or the
Will cleared) and publish nothing. A Will that waited for its delay (or was
adopted) goes only if the record still holds it for that connection: a newer
connection in the record, on any node, resumed the session within the delay.
A Will whose session record is already gone (a session expiry of 0 ends with
its connection) is appended without a marker: nobody else can find it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from dataclasses import dataclass, replace

from riverbed.clock import now_us
from riverbed.errors import PreconditionFailed, RiverbedError
from riverbed.log.appender import Position
from riverbed.mqtt.codec import Publish, PublishProperties, Will, WillProperties
from riverbed.mqtt.messages import append_exactly_once, committed_row, message_from_publish
from riverbed.mqtt.ports import Services
from riverbed.mqtt.sys import is_sys_topic
from riverbed.sessions.store import NEVER_EXPIRES, SessionRecord, Stored, will_marker

log = logging.getLogger(__name__)


def will_publish(will: Will) -> Publish:
    """The PUBLISH a Will stands for (its properties, the delay aside)."""
    props = will.properties
    return Publish(
        will.topic,
        will.payload,
        will.qos,
        will.retain,
        packet_id=1 if will.qos else None,  # a PUBLISH's needs one; never sent
        properties=PublishProperties(
            payload_format_indicator=props.payload_format_indicator,
            message_expiry_interval=props.message_expiry_interval,
            response_topic=props.response_topic,
            correlation_data=props.correlation_data,
            user_properties=props.user_properties,
            content_type=props.content_type,
        ),
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def will_to_json(will: Will, username: str | None) -> str:
    """The Will (and who may publish it) as the session record keeps it."""
    p = will.properties
    return json.dumps(
        {
            "topic": will.topic,
            "payload": _b64(will.payload),
            "qos": will.qos,
            "retain": will.retain,
            "username": username,
            "delay": p.will_delay_interval,
            "format": p.payload_format_indicator,
            "expiry": p.message_expiry_interval,
            "content_type": p.content_type,
            "response_topic": p.response_topic,
            "correlation": _b64(p.correlation_data),
            "user": [list(pair) for pair in p.user_properties],
        },
        separators=(",", ":"),
    )


def will_from_json(text: str) -> tuple[Will, str | None]:
    data = json.loads(text)
    correlation = data["correlation"]
    props = WillProperties(
        will_delay_interval=data["delay"],
        payload_format_indicator=data["format"],
        message_expiry_interval=data["expiry"],
        content_type=data["content_type"],
        response_topic=data["response_topic"],
        correlation_data=None if correlation is None else base64.b64decode(correlation),
        user_properties=tuple((k, v) for k, v in data["user"]),
    )
    will = Will(
        data["topic"], base64.b64decode(data["payload"]), data["qos"], data["retain"], props
    )
    return will, data["username"]


RESCAN = 60.0
"""Seconds between two looks at every session record for Wills to adopt while
no node went (a look costs a read of every record; a node that dies or
stops makes the next sweep look at once)."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose Will it is: the connection of session `session_id` that wrote the
    record at `epoch`. `adopted`: found in the record (`Wills.adopt`), not
    left by a connection to this node."""

    session_id: str
    epoch: int
    adopted: bool = False

    def marker(self) -> str:
        return will_marker(self.session_id, self.epoch)

    def wrote(self, record: SessionRecord) -> bool:
        """Whether `record` is still this connection's (no newer one took it)."""
        return record.session_id == self.session_id and record.epoch == self.epoch


@dataclass(frozen=True, slots=True)
class _Pending:
    timer: asyncio.TimerHandle
    username: str | None
    will: Will
    owner: Owner | None
    delayed: bool


class Wills:
    """The Wills waiting for their delay, by client id. `node`: this broker
    node's name (the Wills of records connected to it are its own); `cluster`:
    other nodes may run beside it, so a record of another node whose lease
    runs is left to that node, even at the start."""

    def __init__(self, broker: Services, node: str, *, cluster: bool = False) -> None:
        self.broker = broker
        self.node = node
        self.cluster = cluster
        """Whether other nodes may run beside this one (PostgreSQL)."""
        self._pending: dict[str, _Pending] = {}
        self._publishing: dict[str, asyncio.Task[None]] = {}
        """Wills being published now, by client id."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: frozenset[str] = frozenset()
        """The nodes whose lease ran at the last look at the records (`adopt`)."""
        self._rescan_us = 0
        """When `adopt` looks at the records again even if no node went."""

    def schedule(
        self,
        client_id: str,
        username: str | None,
        will: Will,
        delay: float,
        stored: Stored | None = None,
        *,
        adopted: bool = False,
    ) -> None:
        """Publish `will` in `delay` seconds unless the client comes back first.
        `stored`: the session record of the connection whose Will it is, as
        that connection left it (None: the session ended with it) or as
        `adopt` found it (`adopted`)."""
        self.cancel(client_id)
        owner = None if stored is None else Owner(stored.record.session_id, stored.record.epoch)
        if owner is not None and adopted:
            owner = replace(owner, adopted=True)
        loop = asyncio.get_running_loop()
        handle = loop.call_later(max(delay, 0.0), self._fire, client_id)
        self._pending[client_id] = _Pending(handle, username, will, owner, delay > 0)
        if delay <= 0:
            # Now, not on a later turn: a connection taking this one over must not
            # cancel a Will without delay (MQTT 5.0 §3.1.4, takeover).
            handle.cancel()
            self._fire(client_id)

    def cancel(self, client_id: str) -> bool:
        """The client reconnected to its session: its Will is not sent [MQTT-3.1.3-9]."""
        pending = self._pending.pop(client_id, None)
        if pending is None:
            return False
        pending.timer.cancel()
        return True

    def fire_now(self, client_id: str) -> None:
        """The session ended (a clean start): publish a pending Will now."""
        pending = self._pending.get(client_id)
        if pending is not None:
            pending.timer.cancel()
            self._pending[client_id] = replace(pending, delayed=False)
            self._fire(client_id)

    def _fire(self, client_id: str) -> None:
        pending = self._pending.pop(client_id, None)
        if pending is None:
            return
        task = asyncio.get_running_loop().create_task(
            self.publish(client_id, pending.username, pending.will, pending.owner, pending.delayed)
        )
        self._publishing[client_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._published(client_id, done))

    def _published(self, client_id: str, task: asyncio.Task[None]) -> None:
        if self._publishing.get(client_id) is task:
            del self._publishing[client_id]

    async def settled(self, client_id: str) -> None:
        """Once the Will of `client_id` being published now (if any) is
        published and cleared from its session record: a node answering that
        it let a session go must not write that record after its answer (the
        node taking it over would find its own write refused)."""
        task = self._publishing.get(client_id)
        if task is not None:
            await asyncio.wait({task})  # however it ends (its own errors are logged)

    async def published_all(self, timeout: float) -> None:
        """Once every Will being published now is published (or `timeout`
        seconds passed): a broker that stops waits for them before its log
        closes (a Will whose session ended with its connection is nowhere else)."""
        tasks = set(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def restore(self) -> None:
        """At start: schedule the Wills that stored sessions still hold (their
        broker stopped or crashed before publishing them), this node's
        predecessor's and those of nodes that died."""
        await self.adopt(starting=True)

    async def adopt(self, *, starting: bool = False) -> int:
        """Schedule the Wills in session records that no running node will
        publish: those of nodes whose liveness lease lapsed (or that hold none),
        and (`starting`) this node's own from before it started. Returns how
        many were adopted. Called at start and at each expiry sweep."""
        broker = self.broker
        store = broker.store
        leases = await asyncio.to_thread(store.node_leases)
        at = now_us()
        live = frozenset(node for node, lease in leases.items() if not lease.expired(at))
        if not starting and live == self._live and at < self._rescan_us:
            # No node died or stopped since the last look: no record was left
            # to us since (a dead node writes none).
            return 0
        self._live = live
        self._rescan_us = at + int(RESCAN * 1_000_000)
        records = await asyncio.to_thread(store.all)
        adopted = 0
        for stored in records:
            record = stored.record
            client_id = record.client_id
            if (
                record.will is None
                or client_id in broker.connections
                or client_id in self._pending
                or client_id in self._publishing
            ):
                continue
            mine = record.node is None or record.node == self.node
            if starting and not self.cluster:
                # One node (SQLite): whatever node name its predecessor had,
                # no other node runs to publish them (its lease may still run).
                mine = True
            if (mine and not starting) or (not mine and record.node in live):
                continue  # pending here already, or another running node's
            will, username = will_from_json(record.will)
            since = record.disconnected_us if record.disconnected_us is not None else record.seen_us
            delay = will.properties.will_delay_interval or 0
            if record.expiry_interval != NEVER_EXPIRES:
                delay = min(delay, record.expiry_interval)
            due_in = (since + delay * 1_000_000 - at) / 1_000_000
            if mine:
                log.info("client %s: will pending from before the start", client_id)
            else:
                log.info("client %s: will left by node %s, which is gone", client_id, record.node)
            self.schedule(client_id, username, will, due_in, stored, adopted=True)
            adopted += 1
        return adopted

    async def publish(
        self,
        client_id: str,
        username: str | None,
        will: Will,
        owner: Owner | None = None,
        delayed: bool = False,
    ) -> None:
        """Commit the Will like a PUBLISH from `client_id`, route it, and clear
        it from the session record (see the module's docstring). A Will that
        waited (`delayed`, or `adopted`) is published only if its connection's
        record still holds it: not if a newer connection took the session
        meanwhile (on any node), nor if another node published it already."""
        text = will_to_json(will, username)
        stored: Stored | None = None
        if owner is not None:
            try:
                stored = await asyncio.to_thread(self.broker.store.load, client_id)
                check = owner.adopted or delayed
                if check and not await asyncio.to_thread(self._pending_in, stored, text, owner):
                    log.info("client %s: will no longer pending: not published", client_id)
                    return
            except RiverbedError:
                log.exception("client %s: reading its session before its will failed", client_id)
                return
        marker = None if owner is None else owner.marker()
        if not await self._publish(client_id, username, will, marker):
            return
        if stored is None or owner is None:
            return
        if owner.wrote(stored.record) and stored.record.will == text:
            try:
                await asyncio.to_thread(self._clear, stored)
            except RiverbedError:
                log.exception("client %s: clearing its published will failed", client_id)

    def _pending_in(self, stored: Stored | None, will: str, owner: Owner) -> bool:
        """Whether the record `stored` still holds the Will `will` of the
        connection `owner`, which is gone: not published meanwhile (cleared),
        its session not taken by a newer connection (here, or on a running node)."""
        if stored is None:
            # The session ended (it expired): its end is when a Will left here
            # is due [MQTT-3.1.3-9]. One adopted from a record that is gone
            # since is not: its session was ended elsewhere (deleted).
            return not owner.adopted
        record = stored.record
        if record.will != will or not owner.wrote(record):
            return False
        if record.client_id in self.broker.connections:
            return False
        return not self.broker.store.held_elsewhere(record, self.node, now_us())

    def _clear(self, stored: Stored) -> None:
        """Clear the published Will from the record it was read from (a
        compare-and-set: a record rewritten since, by a new connection, keeps
        that connection's Will)."""
        with contextlib.suppress(PreconditionFailed):
            self.broker.store.write(replace(stored.record, will=None), stored.version)

    async def _publish(
        self, client_id: str, username: str | None, will: Will, marker: str | None
    ) -> bool:
        """Append and route the Will (with `marker`: unless it was before).
        False if it could not be appended (an error, logged): it stays in the
        record, and is tried again at a start or once this node is gone."""
        broker = self.broker
        if is_sys_topic(will.topic) or not broker.authorizer.can_publish(
            username, client_id, will.topic
        ):
            # Like its PUBLISH would be (mqtt/inbound.py): $SYS is the broker's.
            log.info("client %s: not authorized to publish its will to %r", client_id, will.topic)
            return True
        try:
            log_topic, key_mode = broker.log.route(will.topic)
            message = message_from_publish(will_publish(will), will.topic, client_id, key_mode)
            if marker is None:
                positions = await asyncio.wrap_future(
                    broker.log.produce_async(log_topic, [message])
                )
                position: Position | None = positions[0]
            else:
                position = await asyncio.to_thread(
                    append_exactly_once, broker.log, log_topic, message, marker
                )
                if position is None:
                    log.info("client %s: will published already (by another node)", client_id)
                    return True
            if will.retain and broker.config.limits.retain_available:
                await asyncio.to_thread(broker.retained.put, message, now_us())
        except Exception:
            log.exception("client %s: publishing its will failed", client_id)
            return False
        assert position is not None
        stream, offset = position
        broker.fanout.committed(stream, offset, [committed_row(message, offset, now_us())])
        log.info("client %s: will published to %r", client_id, will.topic)
        return True
