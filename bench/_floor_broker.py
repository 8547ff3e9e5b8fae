"""The `floor` broker of `bench/mqtt.py`: a minimal MQTT broker in Python on uvloop.

It answers one question: what does a broker written in Python cost per message
for the benchmark's traffic before it does anything durable? Riverbed's CPU per
message beside mosquitto's mixes what Python and the event loop cost with what
durability and Riverbed's own checks cost; this broker has only the first part.

What it does, the way a careful minimal broker would: one `asyncio.Protocol` per
connection, Riverbed's codec (`riverbed.mqtt.codec`) for the packets and its
topic trie (`riverbed.topics.trie`) for the routing; MQTT 5 and 3.1.1; any user
name and password; sessions that outlive their connection (Session Expiry
Interval, or Clean Session 0), with their subscriptions, their in-flight
messages (resent with DUP on resume) and the messages queued beyond the
client's Receive Maximum; QoS 0 and 1; each connection's writes gathered into
one per loop turn. Everything is in memory: a SIGKILL loses it all.

`--durable DIR`: the same broker doing the least durable work that Riverbed's
guarantees need, so that its cost is the floor of a durable Python broker. A
SQLite file, DIR/floor.db, written on the event loop's thread with Riverbed's
settings (WAL, synchronous NORMAL), holds the log of PUBLISHes and a row per
session with a Session Expiry Interval above 0. A PUBLISH, QoS 0 or 1, is
acknowledged and routed only after the commit that logged it; commits are paced
as Riverbed's are (at most one per `COMMIT_INTERVAL`, every connection's
messages in it). The CONNACK, SUBACK and UNSUBACK of such a session leave only
after its row is committed, in a commit that does not wait for the interval (as
Riverbed's session writer does not; what waits for the pacer joins it); it
writes the log offset
it has acknowledged up to every `CHECKPOINT_EVERY` acknowledgements or
`CHECKPOINT_INTERVAL` seconds, and at the end of its connection. Deliveries
still come from memory, never read back from the file, and the file is never
read at start: a cost floor, not a broker that recovers (its SIGKILL phase
loses everything all the same).

`--durable-url postgresql://...`: the same on PostgreSQL (the tables made in
that database if missing), with psycopg on the event loop's thread. Each commit
is one round trip to the server: BEGIN, the statements and COMMIT sent in one
pipeline (psycopg's pipeline mode), the loop waiting for the answer. That is
the least a Python broker can wait for a PostgreSQL commit; Riverbed commits
on a writer thread instead, so that the loop goes on meanwhile.

Left out: QoS 2 and retained messages (refused: the connection is closed),
wills, topic aliases, shared subscriptions, subscription options beyond the
QoS, message expiry, keep-alive timeouts; with `--durable`, handling a failed
commit (a benchmark's disk does not fill up) and writing the new Session Expiry
Interval a DISCONNECT may bring (kept in memory only).

    python bench/_floor_broker.py --port N [--durable DIR | --durable-url URL]   # on 127.0.0.1:N
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import signal
import sqlite3
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import uvloop

from riverbed.mqtt.broker import LISTEN_BACKLOG
from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    Connack,
    ConnackProperties,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    ProtocolError,
    Puback,
    Publish,
    PublishProperties,
    Suback,
    SubackReason,
    Subscribe,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
    encode,
    encode_pubacks,
    encode_publish,
)
from riverbed.topics.trie import TopicTrie
from riverbed.tuning import tune_process

MAX_INFLIGHT = 100
"""Deliveries awaiting their PUBACK per session, at most (Riverbed's
`limits.max_inflight`, mosquitto's `max_inflight_messages` in the benchmark);
the client's Receive Maximum can lower it."""
RECEIVE_MAXIMUM = 100
"""The Receive Maximum told to MQTT 5 clients, as Riverbed and the benchmark's
mosquitto do."""
NEVER = 0xFFFFFFFF
"""A Session Expiry Interval that never ends (MQTT 5.0 §3.1.2.11.2)."""
COMMIT_INTERVAL = 0.003
"""`--durable`: the least time between two commits, in seconds (Riverbed's
`storage.commit_interval_ms` default)."""
CHECKPOINT_EVERY = 100
CHECKPOINT_INTERVAL = 1.0
"""`--durable`: a session writes how far it has acknowledged every this many
acknowledgements or seconds (Riverbed's `checkpoint_every` and
`checkpoint_interval` defaults)."""

Message = tuple[str, bytes, int, PublishProperties, int]
"""A delivery: topic name, payload, QoS, the publisher's properties and the
message's offset in the log (`--durable`; 0 without)."""


class Session:
    """A client's state, online or not: its subscriptions (filter -> granted
    QoS), the QoS 1 messages sent and not yet acknowledged (packet id ->
    message, in the order sent) and those waiting for room in the window."""

    __slots__ = (
        "client_id",
        "connection",
        "expiry",
        "expiry_timer",
        "inflight",
        "next_id",
        "queue",
        "subscriptions",
        "window",
    )

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.connection: Connection | None = None
        self.expiry = 0
        self.expiry_timer: asyncio.TimerHandle | None = None
        self.subscriptions: dict[str, int] = {}
        self.inflight: dict[int, Message] = {}
        self.queue: deque[Message] = deque()
        self.next_id = 1
        self.window = MAX_INFLIGHT

    def deliver(self, message: Message) -> None:
        """Send now if online and the window has room, else queue; QoS 0 to
        an offline session is dropped (which QoS 0 allows)."""
        connection = self.connection
        if message[2] == 0:
            if connection is not None:
                connection.publish(message, None, False)
        elif connection is not None and len(self.inflight) < self.window:
            self._send(connection, message)
        else:
            self.queue.append(message)

    def acknowledged(self, packet_id: int) -> None:
        """A PUBACK frees its place in the window for the next queued message."""
        if self.inflight.pop(packet_id, None) is not None:
            self._fill()

    def attach(self, connection: Connection, window: int) -> None:
        """Go online: resend what is in flight (DUP, same packet ids), then
        send from the queue as far as the window allows."""
        self.connection = connection
        self.window = window
        for packet_id, message in self.inflight.items():
            connection.publish(message, packet_id, True)
        self._fill()

    def _fill(self) -> None:
        connection = self.connection
        queue = self.queue
        while connection is not None and queue and len(self.inflight) < self.window:
            self._send(connection, queue.popleft())

    def _send(self, connection: Connection, message: Message) -> None:
        inflight = self.inflight
        packet_id = self.next_id
        while packet_id in inflight:
            packet_id = packet_id % 0xFFFF + 1
        self.next_id = packet_id % 0xFFFF + 1
        inflight[packet_id] = message
        connection.publish(message, packet_id, False)


S = TypeVar("S", bound=Session)


class Broker(Generic[S]):
    """The sessions by client id and the subscriptions of all of them; the
    sessions are `S`, made by `new_session` (`DurableBroker`'s are durable)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, new_session: Callable[[str], S]) -> None:
        self.loop = loop
        self.sessions: dict[str, S] = {}
        self.trie: TopicTrie[tuple[S, int]] = TopicTrie()
        self._new_session = new_session
        self._client_ids = itertools.count(1)

    def assign_client_id(self) -> str:
        """For a client that sent an empty one [MQTT-3.1.3-6]."""
        return f"floor-{next(self._client_ids)}"

    def open(self, connection: Connection, client_id: str, clean: bool) -> tuple[S, bool]:
        """The client's session and whether it existed (Session Present). A
        connection still holding it is closed: the newest wins [MQTT-3.1.4-3]."""
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            session.connection.transport.close()
            session.connection = None
        if session is not None and clean:
            self._discard(session)
            session = None
        if session is None:
            session = self.sessions[client_id] = self._new_session(client_id)
            return session, False
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
            session.expiry_timer = None
        return session, True

    def detach(self, session: S) -> None:
        """The session's connection is gone: keep it for its expiry interval."""
        session.connection = None
        if session.expiry == 0:
            self._discard(session)
        elif session.expiry != NEVER:
            session.expiry_timer = self.loop.call_later(session.expiry, self._discard, session)

    def subscribe(self, session: S, topic_filter: str, qos: int) -> None:
        old = session.subscriptions.get(topic_filter)
        if old is not None:
            self.trie.remove(topic_filter, (session, old))
        session.subscriptions[topic_filter] = qos
        self.trie.add(topic_filter, (session, qos))

    def unsubscribe(self, session: S, topic_filter: str) -> bool:
        qos = session.subscriptions.pop(topic_filter, None)
        if qos is None:
            return False
        self.trie.remove(topic_filter, (session, qos))
        return True

    def route(self, packet: Publish, offset: int = 0) -> None:
        """Deliver to every session with a matching filter, once per session,
        at the lower of the message's QoS and the highest one granted to it;
        `offset` is the message's place in the log (`--durable`)."""
        matches = self.trie.match(packet.topic)
        if not matches:
            return
        granted: dict[S, int] = {}
        for session, qos in matches:
            if qos >= granted.get(session, 0):
                granted[session] = qos
        topic, payload, properties = packet.topic, packet.payload, packet.properties
        for session, qos in granted.items():
            session.deliver((topic, payload, min(packet.qos, qos), properties, offset))

    def _discard(self, session: S) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for topic_filter in list(session.subscriptions):
            self.unsubscribe(session, topic_filter)


class Connection(asyncio.Protocol):
    """One client connection: decodes its packets, answers them, and sends
    what its session delivers."""

    def __init__(self, broker: Broker[Any]) -> None:
        self.broker = broker
        self.decoder = Decoder()
        self.session: Session | None = None
        self.v5 = True
        self._out: list[bytes] = []
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        session = self.session
        if session is not None and session.connection is self:
            self.broker.detach(session)

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except ProtocolError:
            self.transport.close()
            return
        acks: list[int] = []
        session = self.session
        for packet in packets:
            if type(packet) is Publish:
                if packet.qos == 2 or packet.retain:
                    self.transport.close()  # not supported (CONNACK says so to MQTT 5)
                    return
                self.broker.route(packet)
                if packet.packet_id is not None:  # QoS 1
                    acks.append(packet.packet_id)
            elif type(packet) is Puback:
                if session is not None:
                    session.acknowledged(packet.packet_id)
            elif self._control(packet):
                session = self.session  # a CONNECT sets it
            else:
                return
        if acks:
            self.send(encode_pubacks(acks))

    def _control(self, packet: Packet) -> bool:
        """A packet other than PUBLISH and PUBACK; False if the connection is
        closed (a DISCONNECT, or a packet this broker does not take)."""
        session = self.session
        if type(packet) is Connect:
            self._connect(packet)
        elif type(packet) is Subscribe and session is not None:
            self._subscribe(session, packet)
        elif type(packet) is Unsubscribe and session is not None:
            self._unsubscribe(session, packet)
        elif type(packet) is Pingreq:
            self.send(encode(Pingresp(), self._level))
        elif type(packet) is Disconnect and session is not None:
            interval = packet.properties.session_expiry_interval
            if interval is not None:
                session.expiry = interval
            self._close()
            return False
        else:
            self.transport.close()
            return False
        return True

    @property
    def _level(self) -> int:
        level = self.decoder.protocol_level
        assert level is not None  # known since the CONNECT
        return level

    def _connect(self, packet: Connect) -> None:
        self.v5 = v5 = self._level == MQTT_5
        client_id = packet.client_id or self.broker.assign_client_id()
        props = packet.properties
        if v5:
            expiry = props.session_expiry_interval or 0
            window = min(props.receive_maximum or 0xFFFF, MAX_INFLIGHT)
        else:
            expiry = 0 if packet.clean_start else NEVER
            window = MAX_INFLIGHT
        session, present = self.broker.open(self, client_id, packet.clean_start)
        session.expiry = expiry
        self.session = session
        if v5:
            properties = ConnackProperties(
                receive_maximum=RECEIVE_MAXIMUM,
                maximum_qos=1,
                retain_available=False,
                assigned_client_identifier=None if packet.client_id else client_id,
                shared_subscription_available=False,
                subscription_identifier_available=False,
            )
            self.send(encode(Connack(present, properties=properties), MQTT_5))
        else:
            self.send(encode(Connack(present), self._level))
        session.attach(self, window)

    def _subscribe(self, session: Session, packet: Subscribe) -> None:
        codes: list[SubackReason] = []
        for topic in packet.topics:
            if topic.topic_filter.startswith("$share/"):
                refused = SubackReason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                codes.append(refused if self.v5 else SubackReason.UNSPECIFIED_ERROR)
                continue
            qos = min(topic.qos, 1)
            self.broker.subscribe(session, topic.topic_filter, qos)
            codes.append(SubackReason(qos))
        self.send(encode(Suback(packet.packet_id, tuple(codes)), self._level))

    def _unsubscribe(self, session: Session, packet: Unsubscribe) -> None:
        codes = [
            UnsubackReason.SUCCESS
            if self.broker.unsubscribe(session, topic_filter)
            else UnsubackReason.NO_SUBSCRIPTION_EXISTED
            for topic_filter in packet.topic_filters
        ]
        # MQTT 3.1.1's UNSUBACK has no reason codes.
        unsuback = Unsuback(packet.packet_id, tuple(codes) if self.v5 else ())
        self.send(encode(unsuback, self._level))

    def publish(self, message: Message, packet_id: int | None, dup: bool) -> None:
        topic, payload, qos, properties, _ = message
        if not self.v5:
            properties = NO_PUBLISH_PROPERTIES
        self.send(encode_publish(topic, payload, qos, False, dup, packet_id, properties, self.v5))

    def send(self, data: bytes) -> None:
        """Queue bytes for the client; they leave in one write at the end of
        this loop turn, with whatever else the turn adds."""
        if not self._out:
            self.broker.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.transport.is_closing():
            self.transport.writelines(out)

    def _close(self) -> None:
        self._flush()
        self.transport.close()


# --- --durable ------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    stream INTEGER, off INTEGER, topic TEXT, payload BLOB, qos INTEGER,
    PRIMARY KEY (stream, off)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY, expiry INTEGER, subscriptions TEXT, acked INTEGER
) WITHOUT ROWID;
"""
"""One stream (0) of messages, enough for the floor; a session's subscriptions
as JSON (filter -> QoS), `acked` the log offset it has acknowledged up to."""


class Store:
    """The SQLite file of `--durable`, on the event loop's thread, with
    Riverbed's settings: WAL, synchronous NORMAL (a commit is durable once the
    WAL is synced at a checkpoint, as Riverbed's are)."""

    def __init__(self, path: Path) -> None:
        self.db = db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        last = db.execute("SELECT max(off) FROM messages").fetchone()[0]
        self.next_offset: int = 0 if last is None else last + 1

    def commit(
        self,
        messages: list[Publish],
        saves: dict[str, DurableSession | None],
        positions: dict[str, DurableSession],
    ) -> int:
        """One transaction: the messages appended to the log, the sessions'
        rows written whole (or deleted: None), the acknowledged positions of
        the others. Returns the first message's offset."""
        db = self.db
        first = self.next_offset
        db.execute("BEGIN")
        for statement, rows in _writes(messages, saves, positions, first, _SQLITE_UPSERT):
            db.executemany(statement, rows)
        db.execute("COMMIT")
        self.next_offset = first + len(messages)
        return first


_SQLITE_UPSERT = "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?)"
_PG_UPSERT = (
    "INSERT INTO sessions VALUES (?, ?, ?, ?) ON CONFLICT (client_id) DO UPDATE SET"
    " expiry = excluded.expiry, subscriptions = excluded.subscriptions, acked = excluded.acked"
)
"""Each dialect's statement that writes a session's row whole."""


def _writes(
    messages: list[Publish],
    saves: dict[str, DurableSession | None],
    positions: dict[str, DurableSession],
    first: int,
    upsert: str,
) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The statements of one commit (`?` placeholders) with their rows, in
    order, those with no rows left out: the messages from offset `first`,
    the sessions' rows deleted (None) or written whole (`upsert`), then the
    acknowledged positions of the other sessions."""
    writes: list[tuple[str, list[tuple[Any, ...]]]] = [
        (
            "INSERT INTO messages VALUES (0, ?, ?, ?, ?)",
            [(off, p.topic, p.payload, p.qos) for off, p in enumerate(messages, first)],
        ),
        ("DELETE FROM sessions WHERE client_id = ?", [(c,) for c, s in saves.items() if s is None]),
        (
            upsert,
            [
                (c, s.expiry, json.dumps(s.subscriptions), s.acked)
                for c, s in saves.items()
                if s is not None
            ],
        ),
        (
            "UPDATE sessions SET acked = ? WHERE client_id = ?",
            [(s.acked, c) for c, s in positions.items() if c not in saves],
        ),
    ]
    return [(statement, rows) for statement, rows in writes if rows]


PG_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages (stream INTEGER, off BIGINT, topic TEXT,"
    " payload BYTEA, qos INTEGER, PRIMARY KEY (stream, off))",
    "CREATE TABLE IF NOT EXISTS sessions (client_id TEXT PRIMARY KEY, expiry BIGINT,"
    " subscriptions TEXT, acked BIGINT)",
)
"""`SCHEMA` in PostgreSQL's words."""


class PgStore:
    """`Store` on PostgreSQL: the same tables and writes, each commit one
    round trip (the transaction sent as one pipeline)."""

    def __init__(self, url: str) -> None:
        import psycopg  # only for --durable-url

        self.db = db = psycopg.connect(url, autocommit=True)
        for statement in PG_SCHEMA:
            db.execute(statement)
        row = db.execute("SELECT max(off) FROM messages").fetchone()
        last = None if row is None else row[0]
        self.next_offset: int = 0 if last is None else last + 1

    def commit(
        self,
        messages: list[Publish],
        saves: dict[str, DurableSession | None],
        positions: dict[str, DurableSession],
    ) -> int:
        """As `Store.commit`."""
        db = self.db
        first = self.next_offset
        with db.pipeline(), db.cursor() as cur:
            cur.execute("BEGIN")
            for statement, rows in _writes(messages, saves, positions, first, _PG_UPSERT):
                cur.executemany(statement.replace("?", "%s"), rows)
            cur.execute("COMMIT")
        self.next_offset = first + len(messages)
        return first


class DurableSession(Session):
    """A session of `DurableBroker`: also whether it has a row (`stored`: its
    expiry was above 0 at a CONNECT) and the highest log offset it has
    acknowledged, which a stored one writes every `CHECKPOINT_EVERY`
    acknowledgements or `CHECKPOINT_INTERVAL` seconds."""

    __slots__ = ("acked", "acks", "broker", "checkpointed_at", "stored", "timer")

    def __init__(self, client_id: str, broker: DurableBroker) -> None:
        super().__init__(client_id)
        self.broker = broker
        self.stored = False
        self.acked = -1
        self.acks = 0
        """Acknowledgements since `acked` was last written."""
        self.checkpointed_at = broker.loop.time()
        self.timer: asyncio.TimerHandle | None = None
        """Writes `acked` at `CHECKPOINT_INTERVAL` after the last write."""

    def acknowledged(self, packet_id: int) -> None:
        message = self.inflight.pop(packet_id, None)
        if message is None:
            return
        if self.stored:
            if message[4] > self.acked:
                self.acked = message[4]
            self.acks += 1
            if self.acks >= CHECKPOINT_EVERY:
                self.checkpoint()
            elif self.timer is None:
                due = self.checkpointed_at + CHECKPOINT_INTERVAL
                self.timer = self.broker.loop.call_at(due, self.checkpoint)
        self._fill()

    def checkpoint(self) -> None:
        """Write `acked` with the next commit."""
        self.cancel_checkpoint()
        self.acks = 0
        self.checkpointed_at = self.broker.loop.time()
        self.broker.write_acked(self)

    def cancel_checkpoint(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class DurableBroker(Broker[DurableSession]):
    """The broker of `--durable`, and its commit pacer (Riverbed's
    `mqtt.pacer.CommitPacer`): what the connections read waits here, and one
    transaction commits it all at the end of the loop turn, or once
    `COMMIT_INTERVAL` has passed since the last commit. After the commit, the
    connections held for it are let go, the publishers get their PUBACKs and
    the messages are routed, in log order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, store: Store | PgStore) -> None:
        super().__init__(loop, self._session)
        self.store = store
        self._messages: list[Publish] = []
        self._acks: dict[Connection, list[int]] = {}
        """The packet ids to acknowledge after the commit, by connection."""
        self._saves: dict[str, DurableSession | None] = {}
        """Session rows to write whole, by client id (None: to delete)."""
        self._positions: dict[str, DurableSession] = {}
        """Sessions whose `acked` to write."""
        self._held: list[DurableConnection] = []
        self._handle: asyncio.Handle | None = None
        self._timed = False
        """`_handle` waits for the interval (`call_later`)."""
        self._last = -math.inf
        """The loop's time of the last commit."""

    def _session(self, client_id: str) -> DurableSession:
        return DurableSession(client_id, self)

    def log(self, connection: Connection, messages: list[Publish], acks: list[int]) -> None:
        """A read's PUBLISHes, and the packet ids of its QoS 1 ones: to the log."""
        self._messages += messages
        if acks:
            waiting = self._acks.get(connection)
            if waiting is None:
                self._acks[connection] = acks
            else:
                waiting += acks
        self._want()

    def save(self, session: DurableSession) -> None:
        """Write the session's row whole (CONNECT, SUBSCRIBE, UNSUBSCRIBE)."""
        session.stored = True
        self._saves[session.client_id] = session
        self._want(at_once=True)

    def write_acked(self, session: DurableSession) -> None:
        self._positions[session.client_id] = session
        self._want()

    def unsaved(self, client_id: str) -> bool:
        """Whether a write of this client's row waits for the commit."""
        return client_id in self._saves

    def hold(self, connection: DurableConnection) -> None:
        """Let the connection go on after the commit (`DurableConnection.release`)."""
        self._held.append(connection)

    def detach(self, session: DurableSession) -> None:
        """A stored session also writes how far it has acknowledged."""
        if session.stored:
            session.checkpoint()
        super().detach(session)

    def _discard(self, session: DurableSession) -> None:
        """A stored session's row goes too."""
        super()._discard(session)
        if session.stored:
            session.cancel_checkpoint()
            self._saves[session.client_id] = None
            self._want(at_once=True)

    def _want(self, *, at_once: bool = False) -> None:
        """Commit at the end of this loop turn, or when `COMMIT_INTERVAL` has
        passed since the last commit, whichever is later. A session's row
        (`at_once`) does not wait for the interval: Riverbed's session writer
        commits whatever queued while its last transaction ran, unpaced."""
        handle = self._handle
        if handle is not None:
            if not at_once or not self._timed:
                return
            handle.cancel()
        wait = 0.0 if at_once else self._last + COMMIT_INTERVAL - self.loop.time()
        # Remembered: uvloop's timer handles are not `asyncio.TimerHandle`s.
        self._timed = wait > 0
        if self._timed:
            self._handle = self.loop.call_later(wait, self._commit)
        else:
            self._handle = self.loop.call_soon(self._commit)

    def _commit(self) -> None:
        """Everything waiting, in one transaction; then what waited for it."""
        self._handle = None
        self._last = self.loop.time()
        messages, self._messages = self._messages, []
        acks, self._acks = self._acks, {}
        saves, self._saves = self._saves, {}
        positions, self._positions = self._positions, {}
        held, self._held = self._held, []
        first = self.store.commit(messages, saves, positions)
        for waiting in held:
            waiting.release()
        for connection, packet_ids in acks.items():
            connection.send(encode_pubacks(packet_ids))
        route = self.route
        for offset, packet in enumerate(messages, first):
            route(packet, offset)


SESSION_CHANGES = (Connect, Subscribe, Unsubscribe)
"""The packets that change a session's row."""


class DurableConnection(Connection):
    """A connection to `DurableBroker`: its PUBLISHes go to the log, and what
    changes its session's row holds all it sends until the commit."""

    broker: DurableBroker
    session: DurableSession | None

    def __init__(self, broker: DurableBroker) -> None:
        super().__init__(broker)
        self._held = False

    def data_received(self, data: bytes) -> None:
        """As `Connection.data_received`, but the read's PUBLISHes are logged
        and the broker acknowledges and routes them after the commit."""
        try:
            packets = self.decoder.feed(data)
        except ProtocolError:
            self.transport.close()
            return
        messages: list[Publish] = []
        acks: list[int] = []
        session = self.session
        for packet in packets:
            if type(packet) is Publish:
                if packet.qos == 2 or packet.retain:
                    self.transport.close()
                    return
                messages.append(packet)
                if packet.packet_id is not None:
                    acks.append(packet.packet_id)
            elif type(packet) is Puback:
                if session is not None:
                    session.acknowledged(packet.packet_id)
            elif self._control(packet):
                session = self.session
            else:
                return
        if messages:
            self.broker.log(self, messages, acks)

    def _control(self, packet: Packet) -> bool:
        """A CONNECT, SUBSCRIBE or UNSUBSCRIBE of a session with an expiry
        writes its row; its answer, and all after it, wait for the commit (so
        does a CONNECT whose clean start deletes a stored session's row)."""
        if not super()._control(packet):
            return False
        if type(packet) in SESSION_CHANGES:
            session = self.session
            assert session is not None  # else the connection was closed
            if session.expiry > 0:
                self.broker.save(session)
            if self.broker.unsaved(session.client_id):
                self._hold()
        return True

    def _hold(self) -> None:
        if not self._held:
            self._held = True
            self.broker.hold(self)

    def release(self) -> None:
        """The commit is done: send what waited, with what the commit adds."""
        self._held = False
        self.broker.loop.call_soon(self._flush)

    def _flush(self) -> None:
        # Held: the bytes stay in `_out`, in order (a DISCONNECT in the same
        # read closes without them: the client is leaving).
        if not self._held:
            super()._flush()


async def serve(port: int, durable: Path | None, durable_url: str | None) -> None:
    loop = asyncio.get_running_loop()
    protocol: Callable[[], Connection]
    if durable_url is not None:
        broker = DurableBroker(loop, PgStore(durable_url))
        protocol = functools.partial(DurableConnection, broker)
    elif durable is not None:
        broker = DurableBroker(loop, Store(durable / "floor.db"))
        protocol = functools.partial(DurableConnection, broker)
    else:
        protocol = functools.partial(Connection, Broker(loop, Session))
    # Riverbed's listen backlog: with asyncio's default (100) a storm of
    # reconnecting clients overflows the queue and waits for SYN retries.
    server = await loop.create_server(protocol, "127.0.0.1", port, backlog=LISTEN_BACKLOG)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--durable", type=Path, metavar="DIR", help="SQLite file DIR/floor.db")
    where.add_argument("--durable-url", metavar="URL", help="a PostgreSQL database")
    args = parser.parse_args()
    tune_process()  # the interpreter settings Riverbed's broker runs with
    uvloop.run(serve(args.port, args.durable, args.durable_url))


if __name__ == "__main__":
    main()
