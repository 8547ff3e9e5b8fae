"""One client connection: the asyncio side of the connection core and the session.

A thin `asyncio.Protocol`: it hands the socket's bytes to the connection core
(`mqtt/protocol.py`, which owns every connection-level rule of MQTT 5 and
3.1.1: CONNECT, takeover, keep alive, topic aliases, Receive Maximum, message
expiry, Maximum Packet Size, inbound QoS 2) and carries out the effects it
returns: bytes to write, credentials to check, the session to open, PUBLISHes
to commit (`mqtt/inbound.py`), packets for the session (`sessions.session`,
`mqtt/following.py`). The session's own effects become deliveries, storage
work and fan-out fetches. Session writes go through the session writer
(`sessions/writer.py`: many connections' writes in one transaction, each
answered once committed); storage reads run in worker threads, or on the loop
for SQLite (`Broker.read`).

- CONNECT: the core checks it; here the credentials are checked
  (`Authenticate`, in a thread when there is a password to hash) and the
  session opened (`OpenSession`): a
  connection already holding the client id is taken over (it gets DISCONNECT
  0x8E Session taken over and saves its session first), on this node or,
  over the nodes' bus, on another one (`ClusterNode.claim`); Clean Start=1
  discards the session and mints a new session id [MQTT-3.1.2-4]; Clean
  Start=0 resumes it with Session Present=1 [MQTT-3.1.2-5] unless it expired
  [MQTT-4.1.0-2].
- PUBLISH from the client is committed to the log (the topic `Log.route`
  picks) before its PUBACK/PUBREC goes out, in the order the PUBLISHes came
  in [MQTT-4.6.0-2] (the core keeps the order). Inbound QoS 2 is exactly once
  across broker restarts through a durable marker per packet id
  (`mqtt/inbound.py`). Outbound QoS 2 keeps its window in the session record
  (`sessions/qos2.py`): written (`Persist`) before a PUBLISH or PUBREL goes out.
- Slow consumers: the transport's write buffer is capped at
  `limits.write_buffer_limit` (asyncio's `pause_writing`/`resume_writing`).
  While it is over the mark, QoS 0 messages for the connection are dropped and
  counted (`Broker.counts.qos0_dropped`; one log line when an episode starts, one with
  the count when it ends); QoS 1/2 messages wait in the session's in-flight
  window and the log, as for any client that acknowledges slowly. A buffer that
  stays full for `limits.slow_consumer_timeout` seconds gets the connection
  aborted (no DISCONNECT could get through it); its session persists as usual.
- Closing from the server's side: the DISCONNECT with its reason, the FIN, and
  reading on (dropping what comes) until the client closes its end, for
  `CLOSE_LINGER` seconds at most, before the socket closes: closed with bytes
  unread, it would send a RST that can make the client lose the DISCONNECT
  (`_close_transport`). The session's teardown does not wait for that.
- Retained messages (`mqtt/retained.py`) go out after the SUBACK per Retain
  Handling; a Will (`mqtt/wills.py`) is left to the broker when the core says
  so (`ScheduleWill`: closed without DISCONNECT 0x00).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections import deque
from collections.abc import Coroutine, Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, assert_never

from riverbed.clock import Tick, now_us
from riverbed.errors import (
    LentElsewhere,
    LocalProtocolError,
    PreconditionFailed,
    ProtocolError,
    RiverbedError,
)
from riverbed.log.appender import store_refused
from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    ConnectReason,
    DisconnectReason,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Subscribe,
    Unsubscribe,
    Will,
    encode,
)
from riverbed.mqtt.following import Following
from riverbed.mqtt.inbound import Inbound
from riverbed.mqtt.messages import publish_properties, publisher, remaining_expiry
from riverbed.mqtt.passwords import Authenticator
from riverbed.mqtt.ports import Services
from riverbed.mqtt.protocol import (
    ConnectionCore,
    ProtocolLimits,
    State,
)
from riverbed.mqtt.protocol_effects import (
    Append,
    Authenticate,
    Authenticated,
    Close,
    ForgetPacketId,
    OpenSession,
    Released,
    ScheduleWill,
    Send,
    ServerClose,
    SessionOpened,
    SessionRefused,
    TakenOver,
    ToSession,
)
from riverbed.mqtt.protocol_effects import Effect as CoreEffect
from riverbed.mqtt.sharing import Sharing, is_shared
from riverbed.mqtt.wills import Wills, will_to_json
from riverbed.sessions.session import (
    Acked,
    Checkpoint,
    Completed,
    Deliver,
    Effect,
    Event,
    Fetch,
    FetchMany,
    GrantMoved,
    Offered,
    Persist,
    Persisted,
    Received,
    Release,
    Session,
    Subscription,
    cursors_by_topic,
)
from riverbed.sessions.store import SessionRecord, Stored
from riverbed.sessions.writer import outcome_of

log = logging.getLogger(__name__)

_NO_BACKLOG: deque[CoreEffect] = deque()
"""The empty backlog of every connection with nothing waiting (never appended to)."""


class _Starting:
    """A connection's worker while its first step runs at once (`_start_worker`),
    or its teardown until its first step has run (`_close_for`)."""

    __slots__ = ()


_STARTING = _Starting()
_AT_ONCE = (Authenticate, OpenSession, ToSession)
"""The effects whose worker may take its first step at once (`_start_worker`):
those that wait for a session write, if at all (an authentication without a
user name hashes nothing)."""


class _Resumed:
    """Awaits a coroutine already run to its first suspension, from there:
    what it waits for (`yielded`) is waited for by the task awaiting this,
    and what that task is sent or thrown (a cancellation) goes to the
    coroutine, as `await` would have done had the task run it from the start."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, None], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, None]:
        coro, yielded = self._coro, self._yielded
        del self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:  # closed unfinished: so is the coroutine
                coro.close()
                raise
            except BaseException as exc:  # thrown into the task: into the coroutine
                try:
                    yielded = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration:
                    return


async def _resume(coro: Coroutine[Any, Any, None], yielded: Any) -> None:
    await _Resumed(coro, yielded)


def _first_step(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Run `coro` now, up to its first wait: the task that carries it on from
    there, or None if it finished (what it raises passes through)."""
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_resume(coro, yielded))


CLOSE_LINGER = 5.0
"""Seconds a closed connection goes on reading (and dropping) what the client
still sends, waiting for it to close its end, before the socket is closed
(`_close_transport`)."""
MAX_BACKLOG = 1000
"""Effects queued behind a slow one before reading pauses."""
DROP_EPISODE_GAP = 1.0
"""Seconds a drained write buffer must stay below its mark before a drop
episode ends (logged with its count): a client reading slowly hovers around
the mark, and should cost two log lines per spell, not two per crossing."""
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_TCP = (socket.AF_INET, socket.AF_INET6)


class Server(Services, Protocol):
    """The broker, as far as its connections use it (`mqtt/broker.py`'s
    `Broker`, which this module does not import): `Services` and the registry
    of connections, their Wills and their credentials."""

    @property
    def connections(self) -> dict[str, Connection]:
        """Client id -> the connection holding its session on this node."""
        ...

    @property
    def wills(self) -> Wills: ...

    @property
    def authenticator(self) -> Authenticator: ...

    @property
    def node(self) -> str:
        """This broker node's name (in the session records of its connections)."""
        ...

    @property
    def defers_ephemeral(self) -> bool:
        """Whether a session that ends with its connection and has no Will is
        written only when it first needs the store (`mqtt/broker.py`)."""
        ...

    @property
    def checkpoint_every(self) -> int: ...

    @property
    def checkpoint_interval(self) -> float: ...

    def client_lock(self, client_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a connection takes the client id's session (one at a time)."""
        ...

    def connection_opened(self, connection: Connection) -> None: ...

    def connection_closed(self, connection: Connection) -> None: ...

    async def claim(self, stored: Stored) -> Stored | None:
        """Have the node whose connection holds `stored` let go of it, or find
        it gone; the record as it left it (`PreconditionFailed`: it still holds
        it; `mqtt/broker.py`)."""
        ...

    def fenced(self) -> bool:
        """Whether this node may not deliver now: other nodes may count it gone
        and hold its sessions (its liveness lease may have lapsed, or it lost
        its connection to them)."""
        ...

    def lease_lapsed(self) -> bool:
        """Whether this node's liveness lease may have lapsed: it takes no session."""
        ...


_LIMITS: dict[ProtocolLimits, ProtocolLimits] = {}
"""One `ProtocolLimits` object for every connection granted the same."""


def protocol_limits(broker: Services) -> ProtocolLimits:
    """What the connection core grants each client: the broker's `limits` (the
    same object for every connection while they stay the same)."""
    limits = broker.config.limits
    granted = ProtocolLimits(
        receive_maximum=limits.receive_maximum,
        topic_alias_maximum=limits.topic_alias_maximum,
        maximum_packet_size=limits.maximum_packet_size,
        server_keep_alive=limits.server_keep_alive,
        max_session_expiry=limits.max_session_expiry,
        v311_session_expiry=limits.v311_session_expiry,
        max_inflight=limits.max_inflight,
        retain_available=limits.retain_available,
        shared_subscription_available=broker.shared is not None,
        connect_timeout=limits.connect_timeout,
    )
    return _LIMITS.setdefault(granted, granted)


def _assigned_client_id() -> str:
    return f"auto-{uuid.uuid4().hex}"


class Connection(asyncio.Protocol):
    """One client's network connection and, once connected, its session.

    An `asyncio.Protocol`: the bytes of each read go to the connection core at
    once, and the effects that need no waiting (bytes to write, PUBLISH QoS 0/1
    for the commit pacer, the client's acknowledgements for the session, a
    close) are carried out right there, PUBLISHes of one read committed as one
    batch and acknowledgements of one read handed to the session together. An
    effect that must wait (authentication, opening the session, a QoS 2 or
    retained PUBLISH, SUBSCRIBE, UNSUBSCRIBE, PUBREL) starts a task that carries
    it out and every effect after it, in order; reading pauses while that
    backlog is long. A SUBSCRIBE takes effect in `_now` all the same (when it is
    read, or when its turn comes in the backlog); only its SUBACK waits
    (`mqtt/following.py`). Outgoing packets of one turn of the event loop go
    out in one write.
    """

    __slots__ = (
        "_acked",
        "_alive_tick",
        "_backlog",
        "_checkpoint",
        "_checkpointing",
        "_counts",
        "_done",
        "_drop_end",
        "_dropped",
        "_dropping_since",
        "_finished",
        "_following",
        "_full",
        "_inbound",
        "_linger",
        "_out",
        "_paused",
        "_persisting",
        "_quickack",
        "_record_lock",
        "_room",
        "_slow_timer",
        "_sock",
        "_teardown_task",
        "_timer",
        "_timer_at",
        "_worker",
        "broker",
        "closing",
        "connected_us",
        "core",
        "loop",
        "peer",
        "session",
        "sharing",
        "stored",
        "transport",
    )

    def __init__(self, broker: Server) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.peer = "-"
        self._sock: socket.socket | None = None
        """Our socket object on the transport's descriptor, for TCP_QUICKACK
        (made on the first `quickack`)."""
        self._quickack = False
        """TCP_QUICKACK applies (a TCP connection, on Linux)."""
        self.loop = asyncio.get_running_loop()
        """The event loop it runs on: its clock and timers, and its helpers' tasks."""
        self._counts = broker.counts
        """Where PUBLISHes and bytes are counted (the broker's, read by `$SYS` and metrics)."""
        self.core = ConnectionCore(
            protocol_limits(broker),
            self.loop.time(),
            new_client_id=_assigned_client_id,
            # Not a method of the connection: the core would refer back to it.
            may_publish=broker.may_publish,
            publish_in=self._counts.publish_in,
        )
        """The MQTT rules of this connection (`mqtt/protocol.py`)."""
        self.session: Session | None = None
        self.stored: Stored | None = None
        self.connected_us: int | None = None
        """When its session was opened for it, just before the CONNACK went out
        (µs since the epoch; the record's `seen_us` then, one int for both)."""
        self.closing = False
        self._done: asyncio.Event | None = None
        self._finished = False
        self._inbound: Inbound | None = None
        self._following: Following | None = None
        self.sharing: Sharing | None = None
        """Its shared subscriptions (made on the first: most connections have none)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._checkpoint: Checkpoint | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        self._persisting: asyncio.Task[None] | None = None
        self._record_lock: asyncio.Lock | None = None
        self._backlog: deque[CoreEffect] = _NO_BACKLOG
        """Effects waiting behind one that is being carried out asynchronously (a
        deque of their own only while there are: idle connections share one)."""
        self._worker: asyncio.Task[None] | _Starting | None = None
        self._paused = False
        self._acked: list[Event] | None = None
        """PUBACK/PUBREC/PUBCOMP of the current read, handed to the session
        together (a list only while there are)."""
        self._out: list[bytes] | None = None
        """What this turn of the event loop writes (a list only while there is)."""
        self._full = False
        """The transport's write buffer is over its high-water mark (`pause_writing`)."""
        self._linger: asyncio.TimerHandle | None = None
        """While the connection is closed on our side only (`_close_transport`):
        the timer that closes the socket if the client does not close its own."""
        self._slow_timer: asyncio.TimerHandle | None = None
        """Aborts the connection if its write buffer stays full (`limits.slow_consumer_timeout`)."""
        self._room: tuple[int, asyncio.Future[None]] | None = None
        """`retained_room` waiting: for at most this many queued retained messages."""
        self._dropped = 0
        """QoS 0 messages dropped in the current drop episode."""
        self._dropping_since = 0.0
        self._drop_end: asyncio.TimerHandle | None = None
        """Ends the drop episode once the buffer has stayed below its mark a while."""
        self._alive_tick: int | None = None
        """Its bucket in `broker.deadlines` (the CONNECT timeout, then keep alive)."""
        self._teardown_task: asyncio.Task[None] | _Starting | None = None

    # --- what the core knows, for the broker, the API and the session ----------------
    @property
    def client_id(self) -> str:
        return self.core.client_id

    @property
    def username(self) -> str | None:
        return self.core.username

    @property
    def level(self) -> int:
        """4 (MQTT 3.1.1) or 5."""
        return self.core.level

    @property
    def keep_alive(self) -> int:
        return self.core.keep_alive

    @property
    def expiry(self) -> int:
        """The Session Expiry Interval in force (DISCONNECT may have changed it)."""
        return self.core.expiry

    @property
    def will(self) -> Will | None:
        return self.core.will

    @property
    def connack_sent(self) -> bool:
        return self.core.connack_sent

    @property
    def inbound(self) -> Inbound:
        """Its PUBLISHes on their way to the log (`mqtt/inbound.py`; made on the
        first: many connections never publish)."""
        inbound = self._inbound
        if inbound is None:
            inbound = self._inbound = Inbound(self.broker, self.core, self._apply, self.quickack)
            if self.stored is not None:
                inbound.session_id = self.stored.record.session_id
                if self.stored.version is None:
                    inbound.stored_first = self.store_unwritten
        return inbound

    async def store_unwritten(self) -> None:
        """Write the session's record if it was never written (it ends with
        the connection, `Broker.defers_ephemeral`), so that what is stored in
        its name goes with it, even after a crash."""
        async with self.record_lock:
            if self.stored is not None and self.stored.version is None:
                self.stored = await outcome_of(self.broker.writer.write(self.record(), None))

    @property
    def following(self) -> Following:
        """Its subscriptions and followed streams (`mqtt/following.py`; made on
        first use: an idle connection needs none)."""
        following = self._following
        if following is None:
            following = self._following = Following(self)
        return following

    @property
    def record_lock(self) -> asyncio.Lock:
        """Held while the session record is written (one write at a time; made
        on first use)."""
        lock = self._record_lock
        if lock is None:
            lock = self._record_lock = asyncio.Lock()
        return lock

    @property
    def done(self) -> asyncio.Event:
        """Set once the connection is torn down and its session saved (made on
        first use: most connections never need one)."""
        if self._done is None:
            self._done = asyncio.Event()
            if self._finished:
                self._done.set()
        return self._done

    # --- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peername = transport.get_extra_info("peername")
        self.peer = peer_text(peername)
        # An IP address and port: TCP (a Unix socket's peer is a path).
        self._quickack = _QUICKACK is not None and isinstance(peername, tuple)
        limit = self.broker.config.limits.write_buffer_limit
        self.transport.set_write_buffer_limits(high=limit, low=limit // 4)  # type: ignore[union-attr]
        self.broker.connection_opened(self)
        self._arm_alive()

    def data_received(self, data: bytes) -> None:
        self._counts.bytes_in += len(data)
        if self.closing:
            return
        core = self.core
        effects = core.receive(data, self.loop.time())
        if effects:
            self._run(effects)
        if self._worker is None:
            self._end_of_read()
        elif core.held > MAX_BACKLOG and not self._paused and self.transport is not None:
            # The core holds what it reads while an effect is carried out.
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._stop_slow_consumer_timers()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._sock is not None:
            self._sock.detach()
            self._sock = None
        if self._teardown_task is None:
            self._teardown_task = self.loop.create_task(self._teardown())

    # --- the core's effects ----------------------------------------------------------
    def _run(self, effects: list[CoreEffect]) -> None:
        """Carry out effects in order: those that need no waiting now, the rest
        (and all after it) on the worker task."""
        if self._worker is not None:
            self._backlog.extend(effects)
            return
        inbound = self._inbound
        append_now = None if inbound is None else inbound.append_now
        try:
            for i, effect in enumerate(effects):
                kind = type(effect)
                # The hot path first: a QoS 0/1 PUBLISH into this read's batch,
                # a PUBACK for the session.
                if kind is Publish:
                    if append_now is None:
                        append_now = self.inbound.append_now
                    append_now(effect, effect.topic)  # type: ignore[arg-type, union-attr]
                elif kind is Puback:
                    self._to_session(Acked(effect.packet_id))  # type: ignore[arg-type, union-attr]
                elif not self._now(effect):
                    self._start_worker(effect, effects[i + 1 :])
                    return
        except ProtocolError as exc:
            self._protocol_error(exc)
        except PreconditionFailed:
            # A session write (SUBSCRIBE, UNSUBSCRIBE) found the record taken by
            # another connection: the session is not ours to write any more.
            log.warning("client %s: session taken over elsewhere", self.client_id)
            self.close(DisconnectReason.SESSION_TAKEN_OVER)
        except Exception:
            self._failed()

    def _start_worker(self, first: CoreEffect, rest: list[CoreEffect]) -> None:
        """`first` waits (`_now` said so): the worker carries it out, then `rest`.

        A CONNECT (its authentication and session), a SUBSCRIBE or UNSUBSCRIBE
        whose session write would commit at once (`SessionWriter.writes_wait`:
        on SQLite, the first of a turn of the loop) runs its first step now, up
        to its first wait: it then finishes in it, with no task and no turn of
        the loop to start one (a client making its session one exchange after
        another). Otherwise (clients coming back together, PostgreSQL; a QoS 2
        or retained PUBLISH, a PUBREL, which always wait) a task carries it
        from the start."""
        # A deque of its own, even if empty (never the shared one).
        self._backlog = deque(rest)
        work = self._work(first)
        if type(first) not in _AT_ONCE or self.broker.writer.writes_wait():
            self._worker = self.loop.create_task(work)
            return
        self._worker = _STARTING  # what comes meanwhile queues behind `first`
        task = _first_step(self.loop, work)
        if task is not None:  # else done: `_work` let go of `_worker`
            self._worker = task

    def _apply(self, effects: list[CoreEffect]) -> None:
        """Carry out the core's answer to an event (acknowledgements, a close)
        at once, not behind an effect being waited for. (Answers hold nothing
        that waits; were one to, it would go to the worker.)"""
        for i, effect in enumerate(effects):
            if type(effect) is Send:
                self._write(effect.data)  # the acknowledgements of a commit: at once
            elif not self._now(effect):
                if self._worker is None:
                    self._start_worker(effect, effects[i + 1 :])
                else:
                    self._backlog.extendleft(reversed(effects[i:]))
                return

    def _now(self, effect: CoreEffect) -> bool:
        """Carry out an effect that needs no waiting; False if it needs `_effect`."""
        match effect:
            case Send(data):
                self._write(data)
                return True
            case Publish():
                self.inbound.append_now(effect, effect.topic)
                return True
            case Append(publish, topic, waits):
                if waits:
                    return False
                self.inbound.append_now(publish, topic)
                return True
            case Puback(packet_id):
                self._to_session(Acked(packet_id))
                return True
            case Pubrec(packet_id, reason_code):
                self._to_session(Received(packet_id, reason_code < 0x80))
                return True
            case Pubcomp(packet_id):
                self._to_session(Completed(packet_id))
                return True
            case ToSession(packet):
                if type(packet) is Subscribe:
                    # In effect from now (mqtt/following.py); the SUBACK in `_effect`.
                    self.following.take(packet)
                return False
            case Close():
                self._close_for(effect)
                return True
            case ScheduleWill(client_id, username, will, delay):
                # With the record as this connection left it: whose Will it is.
                self.broker.wills.schedule(client_id, username, will, delay, self.stored)
                return True
            case Authenticate() | OpenSession() | ForgetPacketId():
                return False
            case _:
                assert_never(effect)

    async def _effect(self, effect: CoreEffect) -> list[CoreEffect]:
        """Carry out an effect that waits (right after `_now` said so); return
        what the core does next: its answer, or the packets it held meanwhile."""
        core = self.core
        match effect:
            case Authenticate():
                return await self._authenticate(effect)
            case OpenSession():
                return await self._open(effect)
            case Append():
                await self.inbound.publish(effect)
            case ForgetPacketId(packet_id):
                known = await self.inbound.release(packet_id)
                now = self.loop.time()
                return core.handle(Released(packet_id, known), now) + core.resume(now)
            case ToSession(packet):
                if type(packet) is Subscribe:
                    await self.following.subscribe(packet)
                elif type(packet) is Unsubscribe:
                    await self.following.unsubscribe(packet)
            case Publish() | Puback() | Pubrec() | Pubcomp() | Send() | Close() | ScheduleWill():
                self._now(effect)
                return []
            case _:
                assert_never(effect)
        return core.resume(self.loop.time())

    def _to_session(self, acked: Event) -> None:
        """An acknowledgement read now, for the session at the end of the read."""
        pending = self._acked
        if pending is None:
            self._acked = [acked]
        else:
            pending.append(acked)

    def _end_of_read(self) -> None:
        """Commit the read's PUBLISHes as a batch; give the session its acknowledgements."""
        if self._inbound is not None:
            self._inbound.flush()
        acked = self._acked
        if acked is not None:
            self._acked = None
            session = self.session
            if session is not None and not self.closing:
                try:
                    self.execute(session.handle_all(acked, self.loop.time()))
                except ProtocolError as exc:
                    self._protocol_error(exc)

    async def _work(self, first: CoreEffect) -> None:
        """Carry out `first` (which `_now` could not finish), then what the core
        does next, in order, waiting where an effect needs it."""
        try:
            self._end_of_read()
            backlog = self._backlog
            effect: CoreEffect | None = first
            waits = True  # `first` went through `_now` already
            while effect is not None and not self.closing:
                if waits or not self._now(effect):
                    self._end_of_read()
                    # An effect that waits is the last of its list: the core
                    # holds the packets after it until `resume`.
                    backlog.extend(await self._effect(effect))
                waits = False
                effect = backlog.popleft() if backlog else None
            self._end_of_read()
        except ProtocolError as exc:
            self._protocol_error(exc)
        except PreconditionFailed:
            # A session write (SUBSCRIBE, UNSUBSCRIBE) found the record taken by
            # another connection: the session is not ours to write any more.
            log.warning("client %s: session taken over elsewhere", self.client_id)
            self.close(DisconnectReason.SESSION_TAKEN_OVER)
        except Exception:
            self._failed()
        finally:
            self._worker = None
            self._backlog = _NO_BACKLOG
            if self._paused and self.transport is not None and not self.closing:
                self._paused = False
                self.transport.resume_reading()

    def _arm_alive(self) -> None:
        """Be told at the core's next deadline (the CONNECT timeout, then keep
        alive): `deadline_due`."""
        deadline = None if self.closing else self.core.next_deadline()
        self._alive_tick = self.broker.deadlines.arm(self, self._alive_tick, deadline)

    def deadline_due(self) -> None:
        """`broker.deadlines`: the deadline `_arm_alive` asked for has come."""
        self._alive_tick = None
        if self.closing:
            return
        self._apply(self.core.timer(self.loop.time()))
        self._arm_alive()  # read since: a later deadline

    def _failed(self) -> None:
        """What the connection was doing failed unexpectedly (a defect or the
        machine: logged with its traceback): close. A CONNECT in hand is
        answered first, as a refusal (0x80 Unspecified error; 3.1.1: 3 Server
        unavailable): its client learns that the server failed, not that the
        network did, and may come back."""
        log.exception("connection %s (%s) failed", self.client_id or "-", self.peer)
        if self.core.state is State.AUTHENTICATING and not self.closing:
            v5 = self.core.level == MQTT_5
            reason = ConnectReason.UNSPECIFIED_ERROR if v5 else ConnectReason.SERVER_UNAVAILABLE
            self._apply(self.core.handle(SessionRefused(reason), self.loop.time()))
        else:
            self.close(DisconnectReason.UNSPECIFIED_ERROR)

    def _protocol_error(self, exc: ProtocolError) -> None:
        """A rule broken that the session or a subscription found (the core
        finds its own): close, saying why (MQTT 5)."""
        try:
            reason = DisconnectReason(exc.reason_code)
        except ValueError:
            reason = DisconnectReason.PROTOCOL_ERROR
        self._log_protocol_error(f"{exc} (0x{exc.reason_code:02X})")
        self.close(reason)

    def _log_protocol_error(self, error: str) -> None:
        log.warning(
            "client %s (%s): closing for a protocol error: %s",
            self.client_id or "-",
            self.peer,
            error,
        )

    def _close_for(self, close: Close) -> None:
        """The core closes the connection (its last bytes are queued before this)."""
        if close.by_client:
            # DISCONNECT: its PUBLISHes acknowledged before the connection closes.
            if self._inbound is not None:
                self._inbound.flush(now=True)
            self._end_of_read()
        elif close.error:
            self._log_protocol_error(close.error)
        reason = close.reason
        if not self.core.connack_sent:
            if reason is None:
                log.info(
                    "client %s: no CONNECT within %ss",
                    self.peer,
                    self.broker.config.limits.connect_timeout,
                )
            elif isinstance(reason, ConnectReason):
                self._count_refusal(reason)
        elif reason is DisconnectReason.KEEP_ALIVE_TIMEOUT:
            log.info("client %s: keep alive timeout", self.client_id or self.peer)
        early = close.by_client and self._worker is None and self._teardown_task is None
        # The client sees its connection end (FIN) before the loop's next
        # callbacks, among them (early) the teardowns of the turn's DISCONNECTs.
        lingering = self._close_transport()
        if early:
            # The session's save submitted on the next turn of the loop (once
            # the FIN is out: the client is not kept waiting), right
            # after the transport's own callback, not in a task a turn later:
            # ahead of any write for what is read after this DISCONNECT (a
            # CONNECT on another connection, whose write waits for the turn's
            # end from now, `gather_turn`), so a crash after that is answered
            # cannot find a Will that a DISCONNECT 0x00 discarded still
            # stored. (A DISCONNECT behind a worker's effect: saved once that
            # is done, as before.)
            self.broker.writer.gather_turn()
        if early or lingering:
            self._tear_down_soon()

    # --- CONNECT ---------------------------------------------------------------------
    async def _authenticate(self, effect: Authenticate) -> list[CoreEffect]:
        authenticator = self.broker.authenticator
        if effect.username is None:
            # No user name: nothing to hash, no reason to hand over to a thread.
            result = authenticator.authenticate(effect.client_id, None, effect.password)
        else:
            result = await asyncio.to_thread(
                authenticator.authenticate, effect.client_id, effect.username, effect.password
            )
        if not result.accepted:
            log.info("client %s (%s): refused: %s", effect.client_id, self.peer, result.reason.name)
        event = Authenticated(result.reason, result.username)
        return self.core.handle(event, self.loop.time())

    async def _open(self, effect: OpenSession) -> list[CoreEffect]:
        broker = self.broker
        limits = broker.config.limits
        client_id = effect.client_id
        async with broker.client_lock(client_id):
            old = broker.connections.get(client_id)
            if old is not None and old is not self:
                log.info("client %s: session taken over from %s", client_id, old.peer)
                await old.take_over()
            if self.closing:
                return []
            # A clean start ends the old session: its pending Will goes now;
            # resuming it within the Will Delay cancels the Will [MQTT-3.1.3-9].
            if effect.clean_start:
                broker.wills.fire_now(client_id)
            else:
                broker.wills.cancel(client_id)
            broker.connections[client_id] = self
            refusal: ConnectReason | None = None
            try:
                if broker.lease_lapsed():
                    # Other nodes may have taken its sessions: it takes none.
                    raise PreconditionFailed("this node's liveness lease was not renewed")
                present, follow = await self._open_session(effect.clean_start, effect.level)
            except PreconditionFailed:
                # Another node wrote the record between our read and write.
                refusal = ConnectReason.SERVER_BUSY
            except RiverbedError as exc:
                if not store_refused(exc):
                    raise
                # The store refuses writes (full, read-only, unreachable): the
                # session cannot be kept. CONNACK 0x88 (3.1.1: 3), no traceback;
                # the client comes back later. The appender logs the episode.
                log.warning("client %s: cannot open its session: %s", client_id, exc)
                refusal = ConnectReason.SERVER_UNAVAILABLE
            if refusal is not None:
                broker.connections.pop(client_id, None)
                return self.core.handle(SessionRefused(refusal), self.loop.time())
        assert self.stored is not None
        subscriptions = self.stored.record.subscriptions
        self.session = Session(
            client_id,
            [s for s in subscriptions if not is_shared(s.topic_filter)],
            window=self.core.window,
            queue_limit=limits.session_queue_limit,
            checkpoint_every=broker.checkpoint_every,
            checkpoint_interval=broker.checkpoint_interval,
            publisher=publisher,
            qos2_window=self.stored.record.qos2,
            now=self.loop.time(),
            readable=broker.authorizer.read_check(self.username, client_id),
        )
        for sub in self.session.subscriptions:
            broker.trie.add(sub.topic_filter, self)
        effects = self.core.handle(SessionOpened(present), self.loop.time())
        # The CONNACK first (with whatever the packets read meanwhile answer at
        # once), written at once: the client waits for it, and the session's
        # first turn below need not hold it up. What the session sends
        # follows it, then those packets' effects.
        self._now(effects[0])
        self.flush_writes()
        self.connected_us = self.stored.record.seen_us
        self._arm_alive()
        # Per connection: debug (docs/broker.md, Logging), else a broker with many
        # clients coming and going logs little else.
        log.debug(
            "client %s (%s) connected: MQTT %s, session %s%s, expiry %ss",
            client_id,
            self.peer,
            "5" if self.level == MQTT_5 else "3.1.1",
            self.stored.record.session_id,
            " resumed" if present else "",
            self.expiry,
        )
        if not self.closing:
            # One turn of the session for all its streams (a resumed session
            # follows every partition its filters reach, 16 for `mqtt`).
            self.execute(self.session.handle_all([*follow, Tick()], self.loop.time()))
        shared = [s for s in subscriptions if is_shared(s.topic_filter)]
        if shared and broker.shared is not None and not self.closing:
            sharing = self.share()
            for sub in shared:
                sharing.subscribe(sub)
        return effects[1:]

    def share(self) -> Sharing:
        """The connection's shared subscriptions (made on first use)."""
        if self.sharing is None:
            assert self.stored is not None
            self.sharing = Sharing(self, self.stored.record.session_id)
        return self.sharing

    def subscriptions(self) -> tuple[Subscription, ...]:
        """Every subscription of the session, private and shared (for its record)."""
        assert self.session is not None
        if self.sharing is None:
            return self.session.subscriptions
        return (*self.session.subscriptions, *self.sharing.subscriptions.values())

    def _count_refusal(self, reason: ConnectReason) -> None:
        refused = self._counts.refused
        name = reason.name.lower()
        refused[name] = refused.get(name, 0) + 1

    async def _open_session(
        self, clean_start: bool, level: int, *, kept: bool = True
    ) -> tuple[bool, list[Event]]:
        """Resume or create the session record; return (Session Present, Follow
        events). `kept`: a session saved at its disconnect here may resume from
        what its save left (`SessionStore.take_resumable`), not read; if its
        record was written since, the compare-and-set says so and it reads."""
        broker = self.broker
        store = broker.store
        if not store.known(self.client_id) and not self._defers_record():
            # No record of this client id has been seen here: most likely a
            # new session. Made without reading first; if a record exists after
            # all (made since elsewhere), the create is refused, writing
            # nothing, and the session opens as below.
            try:
                self.stored = await outcome_of(
                    broker.writer.write(self._new_record(level, now_us(), 0), None)
                )
                return False, []
            except PreconditionFailed:
                pass
        cursors: Mapping[str, dict[int, int] | None] | None = None
        expected: bytes | None = None
        """The bytes its record must still be (what was kept of it)."""
        resumable = None if clean_start or not kept else store.take_resumable(self.client_id)
        if clean_start:
            stored = await broker.read(store.load, self.client_id)
        elif resumable is not None:
            stored, cursors, expected = resumable.stored, resumable.cursors(), resumable.raw
        else:
            # Its cursors with it: they are this record's while its version holds.
            stored, cursors = await broker.resumes.load_resuming(self.client_id)
        while stored is not None and store.connected_elsewhere(stored.record, broker.node):
            cursors = None  # read again once the other node has let go
            # Held by a connection to another node: that node lets go of it
            # first (closes it, saves it), so the two never both deliver.
            fresh = await broker.claim(stored)
            if fresh is None or fresh.record.epoch == stored.record.epoch:
                stored = fresh  # what the old connection saved last
                break
            stored = fresh  # yet another connection took it meanwhile
        at = now_us()
        live = stored is not None and (
            not stored.record.expired(at)
            # in use on another broker node: taken over, whatever its age
            or await asyncio.to_thread(store.held_elsewhere, stored.record, broker.node, at)
        )
        if stored is not None and not clean_start and live:
            old = stored.record
            crashed = old.connected  # nobody saved it: its broker stopped without a goodbye
            record = replace(
                old,
                protocol_level=level,
                expiry_interval=self.expiry,
                connected=True,
                seen_us=at,
                disconnected_us=None,
                will=self._will_json(),
                node=broker.node,
                epoch=old.epoch + 1,
            )
            written = await self._write_opening(record, stored.version, expected)
            if written is None:
                return await self._open_session(clean_start, level, kept=False)
            self.stored = written
            since = old.disconnected_us if old.disconnected_us is not None else old.seen_us
            private = tuple(s for s in record.subscriptions if not is_shared(s.topic_filter))
            follow = await self.following.follow(
                self.following.reachable_topics(private, self.following.bindings()),
                start_us=since,
                dup=old.sent,
                crashed=crashed,
                cursors=cursors,
            )
            return True, follow
        record = self._new_record(level, at, 0 if stored is None else stored.record.epoch + 1)
        if stored is None and self._defers_record():
            # It ends with the connection and nothing of it must survive a
            # crash: written when it first needs the store (its first write
            # creates it), if ever. A CONNACK with no commit to wait for.
            self.stored = Stored(record, None)
            return False, []
        written = await self._write_opening(
            record, None if stored is None else stored.version, expected
        )
        if written is None:
            return await self._open_session(clean_start, level, kept=False)
        self.stored = written
        if stored is not None:
            old = stored.record
            await asyncio.to_thread(store.drop_cursors, old.session_id, old.topics)
        return False, []

    async def _write_opening(
        self, record: SessionRecord, version: int | None, expected: bytes | None
    ) -> Stored | None:
        """The CONNECT's record write (a compare-and-set on `version`, and on
        the bytes kept of the session if `expected`). None: the record was
        written since it was kept here, and must be read; a refusal of a
        record that was read raises `PreconditionFailed`."""
        try:
            return await outcome_of(self.broker.writer.write(record, version, expected=expected))
        except PreconditionFailed:
            if expected is None:
                raise
            return None

    def _new_record(self, level: int, at: int, epoch: int) -> SessionRecord:
        """A new session's record (a new session id), connected here now."""
        return SessionRecord(
            self.client_id,
            uuid.uuid4().hex,
            level,
            self.expiry,
            True,
            at,
            None,
            will=self._will_json(),
            node=self.broker.node,
            epoch=epoch,
        )

    def _defers_record(self) -> bool:
        """Whether a new session of this connection is written only when it
        first needs the store (`Broker.defers_ephemeral`)."""
        return self.expiry == 0 and self.will is None and self.broker.defers_ephemeral

    def _will_json(self) -> str | None:
        return None if self.will is None else will_to_json(self.will, self.username)

    def require_session(self) -> Session:
        if self.session is None:
            raise ProtocolError(DisconnectReason.PROTOCOL_ERROR, "a packet before the CONNECT")
        return self.session

    # --- session events and effects ---------------------------------------------------------
    def handle(self, event: Event) -> None:
        session = self.session
        if session is None or self.closing:
            return
        self.execute(session.handle(event, self.loop.time()))

    def handle_all(self, events: Sequence[Event]) -> None:
        """`events` handled by the session as one (one pump, one set of effects)."""
        session = self.session
        if session is None or self.closing:
            return
        self.execute(session.handle_all(events, self.loop.time()))

    def execute(self, effects: list[Effect]) -> None:
        fenced: bool | None = None  # asked at the first delivery, once for all
        for effect in effects:
            match effect:
                case Deliver():
                    if fenced is None:
                        fenced = self.broker.fenced()
                    if fenced:
                        # Another node may hold the session now (self-fencing,
                        # `ClusterNode.fence`): nothing more goes out.
                        self.close(DisconnectReason.SERVER_BUSY)
                    else:
                        self._deliver(effect)
                case Fetch(stream, offset, limit):
                    if stream >= 0:
                        self.broker.fanout.fetch(stream, offset, limit, self, self.offer)
                    elif self.sharing is not None:
                        self.sharing.fetch(stream, offset, limit)
                case FetchMany(positions, limit):
                    self.broker.fanout.fetch_many(positions, limit, self, self.offer)
                case GrantMoved():
                    if self.sharing is not None:
                        self.sharing.moved(effect)
                case Checkpoint():
                    self._queue_checkpoint(effect)
                case Release(packet_id):
                    self._write(self.core.pubrel(packet_id))
                case Persist(seq):
                    self._persisting = asyncio.create_task(self._persist(seq))
                case _:
                    assert_never(effect)
        self._arm_timer()
        if self._room is not None:
            self._room_made()

    def _room_made(self) -> None:
        """Wake `retained_room` if the session's retained queue is short enough."""
        assert self._room is not None
        most, room = self._room
        session = self.session
        if not room.done() and (session is None or session.retained_queued <= most):
            room.set_result(None)

    def record(self, *, released: bool = False) -> SessionRecord:
        """The record to write: the last one written with the session's QoS 2
        window as it is now (every write carries it, so none writes an old one).
        A shared grant's message whose PUBREC came is written as released only
        by the write that records it so for its group (`released`: `_persist`);
        any other write keeps it as sent (mqtt/sharing.py)."""
        assert self.stored is not None
        if self.session is None:
            return self.stored.record
        window = self.session.window_entries()
        if self.sharing is not None and not released:
            window = self.sharing.as_recorded(window)
        record = self.stored.record
        if window == record.qos2:
            return record  # the common case: no QoS 2 window, before and now
        return replace(record, qos2=window)

    async def _persist(self, seq: int) -> None:
        """Write the QoS 2 window; then the PUBLISHes and PUBRELs it names may go."""
        try:
            async with self.record_lock:
                if self.stored is None:
                    return
                record = self.record(released=True)
                sharing = self.sharing
                # Shared grants' messages the client has (PUBREC came) are
                # recorded as the group's in the same transaction (mqtt/sharing.py).
                if sharing is None:
                    write = self.broker.writer.write(record, self.stored.version)
                else:
                    released = sharing.released(record.qos2)
                    write = self.broker.writer.write(
                        record, self.stored.version, also=released.also, holds=released.holds
                    )
                self.stored = await outcome_of(write)
                if sharing is not None:
                    sharing.recorded(record.qos2)
        except LentElsewhere as exc:
            # A shared grant's QoS 2 message whose PUBREC came only now was lent
            # to another member meanwhile: no PUBREL, so this client never
            # completes it (mqtt/sharing.py). Ending the connection drops it.
            log.warning(
                "client %s: a QoS 2 message of a shared subscription was lent to another"
                " member before its PUBREC came (%s); closing without its PUBREL",
                self.client_id,
                exc,
            )
            if sharing is not None:
                sharing.refused = True
            self.close(DisconnectReason.SERVER_BUSY)
            return
        except PreconditionFailed:
            log.warning("client %s: session taken over elsewhere", self.client_id)
            self.close(DisconnectReason.SESSION_TAKEN_OVER)
            return
        except RiverbedError:
            log.exception("client %s: persisting the QoS 2 window failed", self.client_id)
            self.close(DisconnectReason.UNSPECIFIED_ERROR)
            return
        self.handle(Persisted(seq))

    async def _record_released(self, session: Session) -> None:
        """Before its Borrowers leave (their streams go to other members at
        once): the shared grants' messages whose PUBREC came are recorded as
        released, or another member could be lent them before the record says
        so (mqtt/sharing.py). The session's last write may still be on its way,
        and what came after it was never asked for (a closing connection
        handles no more events)."""
        if self._persisting is not None:
            with contextlib.suppress(Exception):
                await self._persisting
        sharing = self.sharing
        if (
            sharing is not None
            and not sharing.refused
            and sharing.released(session.window_entries())
        ):
            await self._persist(0)

    def passed(self, positions: dict[int, int]) -> None:
        """The fan-out's messages of these streams passed the session by, up to
        these offsets, and its fetches wait on from there (`Fanout.passed`):
        its cursors move on, checkpointed when due."""
        session = self.session
        if session is None or self.closing or not positions:
            return
        session.passed(positions)
        self.handle(Tick())

    async def retained_room(self, most: int) -> None:
        """Return once at most `most` retained messages wait in the session's
        queue: at once if so (or if the connection is closing), else after the
        acknowledgements that free the window for the rest."""
        session = self.session
        if session is None or self.closing or session.retained_queued <= most:
            return
        room: asyncio.Future[None] = self.loop.create_future()
        self._room = (most, room)
        try:
            await room
        finally:
            self._room = None

    def take_passed(self) -> None:
        """`passed`, asked of the fan-out now for this session alone."""
        if self.session is not None and not self.closing:
            self.passed(self.broker.fanout.passed(self))

    def offer(self, stream: int, messages: object, upto: int) -> None:
        # Always at the end of the turn (mqtt/turns.py): a fetch answered from
        # memory must not re-enter the session while it is handing out effects.
        self.broker.turns.offer(self.handle, Offered(stream, messages, upto))  # type: ignore[arg-type]

    def _deliver(self, effect: Deliver) -> None:
        if self._full and effect.qos == 0:
            # The client is not keeping up: its write buffer is over the mark.
            # A QoS 0 message may be lost (MQTT 5.0 §4.3.1: at most once); queued,
            # it would grow the broker without bound (mosquitto drops past
            # max_queued_messages too). QoS 1/2 wait in the window and the log.
            self._drop_qos0()
            return
        message = effect.message
        core = self.core
        # What is left of its Message Expiry Interval: the core drops it if
        # nothing is (MQTT 5.0 §3.3.2.3.3), else it carries the rest.
        expiry = remaining_expiry(message, now_us)
        properties = NO_PUBLISH_PROPERTIES
        if core.level == MQTT_5 and (expiry is None or expiry > 0):
            properties = publish_properties(message, effect.subscription_identifiers, expiry)
        try:
            data = core.publish(
                message.mqtt_topic,
                message.payload,
                effect.qos,
                effect.retain,
                effect.dup,
                effect.packet_id,
                properties,
                expiry,
            )
        except LocalProtocolError:
            log.exception("client %s: delivery refused by the core", self.client_id)
            self.close(DisconnectReason.UNSPECIFIED_ERROR)
            return
        if data is None:
            # Expired, or larger than the client accepts [MQTT-3.1.2-25].
            self._discard(effect)
            return
        self._write(data)
        self._counts.publish_out[effect.qos] += 1

    def _discard(self, effect: Deliver) -> None:
        """Drop a delivery as if the client had acknowledged it."""
        packet_id = effect.packet_id
        if packet_id is not None:
            done = Received(packet_id, False) if effect.qos == 2 else Acked(packet_id)
            self.loop.call_soon(self.handle, done)

    def _arm_timer(self) -> None:
        session = self.session
        if session is None or self.closing:
            return
        deadline = session.next_deadline()
        timer = self._timer
        if timer is not None:
            if deadline == self._timer_at:
                return
            timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer_at = deadline
            self._timer = self.loop.call_at(max(deadline, self.loop.time()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.handle(Tick())

    def _queue_checkpoint(self, checkpoint: Checkpoint) -> None:
        if self._checkpoint is None:
            self._checkpoint = checkpoint
        else:
            self._checkpoint.cursors.update(checkpoint.cursors)
            self._checkpoint = Checkpoint(self._checkpoint.cursors, checkpoint.sent)
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.create_task(self._run_checkpoints())

    async def _run_checkpoints(self) -> None:
        while self._checkpoint is not None:
            checkpoint, self._checkpoint = self._checkpoint, None
            try:
                await self._save_checkpoint(checkpoint, disconnected=False)
                if self.session is not None:
                    self.session.forget_completed(checkpoint.cursors)
                    if self.following.lineage_wait:
                        self.following.check_soon()
            except PreconditionFailed:
                log.warning("client %s: session taken over elsewhere", self.client_id)
                self.close(DisconnectReason.SESSION_TAKEN_OVER)
                return
            except RiverbedError:
                log.exception("client %s: checkpoint failed", self.client_id)
                if self.session is not None:
                    self.session.unsaved(checkpoint.cursors)  # the next one writes them

    async def _save_checkpoint(self, checkpoint: Checkpoint, *, disconnected: bool) -> None:
        async with self.record_lock:
            if self.stored is None:
                return
            stored = Stored(self.record(), self.stored.version)
            if disconnected:
                at = now_us()
                record = replace(
                    stored.record,
                    connected=False,
                    disconnected_us=at,
                    expiry_interval=self.expiry,
                    # DISCONNECT 0x00 discards the Will [MQTT-3.1.2-10]; otherwise
                    # it stays until published (mqtt/wills.py).
                    will=None if self.core.normal else stored.record.will,
                )
                stored = Stored(record, stored.version)
            by_topic = cursors_by_topic(checkpoint.cursors, self.broker.fanout.topic_of())
            self.stored = await outcome_of(
                self.broker.writer.commit(stored, by_topic, checkpoint.sent)
            )

    # --- closing ------------------------------------------------------------------------
    def close(self, reason: DisconnectReason, server_reference: str | None = None) -> None:
        """Close the connection from the server's side (MQTT 5: DISCONNECT `reason`,
        with `server_reference` if given)."""
        if self.closing:
            return
        self._apply(self.core.handle(ServerClose(reason, server_reference), self.loop.time()))
        if self._close_transport():
            self._tear_down_soon()

    async def take_over(self) -> None:
        """Another connection claims this client id: leave, saving the session."""
        if not self.closing:
            self._apply(self.core.handle(TakenOver(), self.loop.time()))
            if self._close_transport():
                self._tear_down_soon()
        await self.done.wait()

    @property
    def lingering(self) -> bool:
        """Closed on our side, waiting (`CLOSE_LINGER` at most) for the client to close its end."""
        return self._linger is not None

    def _close_transport(self) -> bool:
        """Close the connection once what is queued is written. Over TCP: send
        the FIN after it at once, and go on reading (dropping what comes) until
        the client closes its end, for `CLOSE_LINGER` seconds at most, before
        the socket is closed: a socket closed with bytes unread sends a RST,
        and a client that gets one as it writes (an acknowledgement on its
        way) loses the DISCONNECT unread, as if the connection had broken.
        True if it lingers so: the teardown does not wait for the socket then
        (`_tear_down_soon`)."""
        self.closing = True
        transport = self.transport
        if transport is None or transport.is_closing() or self._linger is not None:
            return False
        if self._full:
            # Nothing more gets through a full buffer (not even a DISCONNECT),
            # and a graceful close would wait for it to drain, perhaps forever.
            self._out = None
            transport.abort()
            return False
        self.flush_writes()
        if not transport.can_write_eof():  # TLS and WebSockets close their own way
            self._close_socket(transport)
            return False
        transport.write_eof()
        self._linger = self.loop.call_later(CLOSE_LINGER, self._end_linger)
        if self._paused:
            transport.resume_reading()  # the client's end comes after what it sent
        return True

    def _end_linger(self) -> None:
        """`CLOSE_LINGER` passed and the client has not closed its end: close ours."""
        self._linger = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self._close_socket(transport)

    def _close_socket(self, transport: asyncio.Transport) -> None:
        transport.close()
        if transport.get_write_buffer_size() and self._slow_timer is None:
            # The close waits for the buffer to drain: no longer than a full
            # buffer is tolerated.
            self._slow_timer = self.loop.call_later(
                self.broker.config.limits.slow_consumer_timeout, self._slow_consumer
            )

    def _tear_down_soon(self) -> None:
        """Have the teardown start on the next turn of the loop (`_start_teardown`)
        rather than when the socket closes (`connection_lost`)."""
        if self._teardown_task is None:
            self._teardown_task = _STARTING
            self.loop.call_soon(self._start_teardown)

    def _start_teardown(self) -> None:
        """Tear the connection down (`_close_for`), at once up to the first
        wait (the session's save is submitted then, when nothing it waits
        for is under way), and from there in a task."""
        try:
            task = _first_step(self.loop, self._teardown())
        except Exception:
            log.exception("connection %s (%s): teardown failed", self.client_id or "-", self.peer)
            return
        if task is not None:
            self._teardown_task = task

    async def _teardown(self) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
        self.broker.deadlines.disarm(self, self._alive_tick)
        self._alive_tick = None
        if self._following is not None:
            self._following.cancel()
        broker = self.broker
        # Its PUBLISHes committed before its Will can be.
        if self._inbound is not None:
            self._inbound.flush(now=True)
        try:
            worker = self._worker
            if worker is not None:
                # It stops after the packet at hand (closing is set). (Never
                # `_STARTING` here: a first step runs to its end or its first wait
                # before anything else does.)
                assert not isinstance(worker, _Starting)
                with contextlib.suppress(Exception):
                    await asyncio.shield(worker)
            session = self.session
            if self.sharing is not None:
                if session is not None:
                    await self._record_released(session)
                self.sharing.close()
            if session is not None:
                # Where its waiting fetches got to: its last checkpoint moves
                # the cursors of streams whose messages passed it by there.
                session.passed(broker.fanout.forget(self, session.streams))
                for sub in session.subscriptions:
                    broker.trie.remove(sub.topic_filter, self)
                if self._checkpointing is not None:
                    with contextlib.suppress(Exception):
                        await self._checkpointing
                await self._end_session(session)
        finally:
            if self.client_id and broker.connections.get(self.client_id) is self:
                del broker.connections[self.client_id]
            self._leave_will()
            self._finished = True
            if self._done is not None:
                self._done.set()
            broker.connection_closed(self)
            log.debug("client %s (%s) disconnected", self.client_id or "-", self.peer)
            # Let go of the session and the helpers now: they and the connection
            # refer to each other, and left to the cycle collector a fleet's
            # closed sessions pile up until a full collection walks them all.
            self.session = None
            self.sharing = None
            self._following = None
            self._inbound = None

    def _leave_will(self) -> None:
        """The core says whether a Will is due, and when (`ScheduleWill`)."""
        self._apply(self.core.connection_lost())

    async def _end_session(self, session: Session) -> None:
        stored = self.stored
        if stored is None:
            return
        try:
            if self.expiry == 0:
                # Ends with the connection [MQTT-4.1.0-2 with an interval of 0].
                if stored.version is not None:
                    # The record through the writer, in turn with the other
                    # writes (a Will a DISCONNECT 0x00 discarded is gone
                    # before what is read after it is answered); what else
                    # it had, on a thread once it is gone.
                    await outcome_of(self.broker.writer.discard(stored))
                    await asyncio.to_thread(self.broker.store.drop_state, stored.record)
                self.stored = None
                return
            await self._save_checkpoint(session.checkpoint(self.loop.time()), disconnected=True)
        except PreconditionFailed:
            log.info("client %s: session was taken over; not saved", self.client_id)
        except RiverbedError:
            log.exception("client %s: saving the session failed", self.client_id)

    def quickack(self) -> None:
        """Have the kernel acknowledge the bytes received so far now, not with
        our next write (Linux TCP_QUICKACK)."""
        sock = self._sock
        if sock is None:
            if not self._quickack or self.closing or self.transport is None:
                return
            sock = self._sock = self._quickack_socket(self.transport)
            if sock is None:
                return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # type: ignore[arg-type]

    def _quickack_socket(self, transport: asyncio.Transport) -> socket.socket | None:
        """Our own object on the transport's descriptor (uvloop's makes a socket
        object per setsockopt); detached, never closed, when the connection is
        lost. Made on the first `quickack`: most connections never publish."""
        sock = transport.get_extra_info("socket")
        if sock is None or sock.family not in _TCP:
            self._quickack = False
            return None
        return socket.socket(sock.family, sock.type, sock.proto, sock.fileno())

    # --- writing --------------------------------------------------------------------------
    def send(self, packet: Packet, level: int | None = None) -> None:
        self._write(encode(packet, level or self.level))

    def send_now(self, packet: Packet) -> None:
        """An answer the client waits for before it goes on (SUBACK,
        UNSUBACK): written now with what is queued, not when the turn's work
        after it is done (a sequential client's next packet waits for it)."""
        self.send(packet)
        self.flush_writes()

    def _write(self, data: bytes) -> None:
        """Queue bytes; what a turn of the event loop queues goes out in one
        write, at its end (mqtt/turns.py)."""
        out = self._out
        if out is None:
            self._out = [data]
            self.broker.turns.written(self)
        else:
            out.append(data)

    def flush_writes(self) -> None:
        """Write what is queued, now."""
        out = self._out
        if out is None:
            return
        self._out = None
        transport = self.transport
        data = out[0] if len(out) == 1 else b"".join(out)
        if transport is not None and not transport.is_closing() and self._linger is None:
            transport.write(data)
            self._counts.bytes_out += len(data)

    # --- slow consumers -------------------------------------------------------------------
    def pause_writing(self) -> None:
        """The transport's buffer passed `limits.write_buffer_limit` (asyncio calls
        this): QoS 0 messages are dropped until it drains, and if it stays full
        for `limits.slow_consumer_timeout` the connection is aborted."""
        self._full = True
        if self._drop_end is not None:
            self._drop_end.cancel()  # the episode goes on
            self._drop_end = None
        if self._slow_timer is None:
            self._slow_timer = self.loop.call_later(
                self.broker.config.limits.slow_consumer_timeout, self._slow_consumer
            )

    def resume_writing(self) -> None:
        """The transport's buffer drained below a quarter of the limit."""
        self._full = False
        if self._slow_timer is not None and not self.closing:
            self._slow_timer.cancel()
            self._slow_timer = None
        if self._dropped and self._drop_end is None:
            self._drop_end = self.loop.call_later(DROP_EPISODE_GAP, self._end_drop_episode)

    def _drop_qos0(self) -> None:
        self._counts.qos0_dropped += 1
        if not self._dropped:
            self._dropping_since = self.loop.time()
            log.warning(
                "client %s (%s): not reading fast enough (write buffer over %d bytes);"
                " dropping QoS 0 messages for it",
                self.client_id or "-",
                self.peer,
                self.broker.config.limits.write_buffer_limit,
            )
        self._dropped += 1

    def _end_drop_episode(self) -> None:
        self._drop_end = None
        if self._dropped:
            log.warning(
                "client %s (%s): %d QoS 0 messages dropped in %.1f s while it did not keep up",
                self.client_id or "-",
                self.peer,
                self._dropped,
                self.loop.time() - self._dropping_since,
            )
            self._dropped = 0

    def _slow_consumer(self) -> None:
        """The write buffer stayed full (or, closing, did not drain) for
        `limits.slow_consumer_timeout`: abort the connection. Its session and
        Will are then handled as for any lost connection (`_teardown`)."""
        self._slow_timer = None
        transport = self.transport
        if transport is None:
            return
        self._counts.slow_consumers_disconnected += 1
        log.warning(
            "client %s (%s): its write buffer did not drain for %ss; disconnecting it",
            self.client_id or "-",
            self.peer,
            self.broker.config.limits.slow_consumer_timeout,
        )
        self.closing = True
        self._out = None
        transport.abort()

    def _stop_slow_consumer_timers(self) -> None:
        """The connection is gone: cancel its timers (they hold it), log the
        drop episode it was in."""
        if self._slow_timer is not None:
            self._slow_timer.cancel()
            self._slow_timer = None
        if self._drop_end is not None:
            self._drop_end.cancel()
        self._end_drop_episode()


def peer_text(peername: object) -> str:
    """A socket's peer as people write it: `127.0.0.1:52853`, `[::1]:52853`
    (a Unix socket's name, or "-" for none, as it is)."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return "-" if peername is None else str(peername)
