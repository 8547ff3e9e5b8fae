"""The broker: an asyncio MQTT server whose sessions live on the log.

    broker = Broker(config, Log.open(url))
    await broker.start()          # listening
    await broker.stop()           # graceful: see below
    broker.log.close()

`Broker` owns what the connections share: the listening socket, the client id
registry (for takeover), the topic trie of online sessions' filters, the live
fan-out, the commit pacer, the session store, the authenticator/authorizer and
the runtime of durable shared subscriptions (`sharedsub/runtime.py`). A background task
discards sessions whose expiry passed (also those left behind by a broker that
stopped: their expiry counts from when they were last seen) and renews this
node's liveness lease: several brokers may share a database, and a session
connected to another running node is never expired here.

Its duties as one node among others on the same database (liveness lease and
fence, takeover across nodes, node directory, drain) are its `cluster`
(`mqtt/node.py`, `ClusterNode`).
A thread applies the topics' retention every `[retention] interval` seconds
(`log/retention.py: Retainer`; off with 0). What the broker does is counted
once, in plain ints (`counts`, a `riverbed.metrics.Counts`), which two readers
share: a task publishes the `$SYS/broker/...` topics from them every
`[sys] interval` seconds (`mqtt/sys.py`; off with 0), and with `[metrics]
enabled` the broker's `metrics` expose them to Prometheus at each scrape
(with what it keeps anyway, such as in-flight messages), while a thread
reads the storage-derived ones every `[metrics] refresh_interval` seconds.

Stopping: stop the retention thread (after its transaction in progress), stop
accepting, send every MQTT 5 client DISCONNECT 0x8B Server shutting down,
checkpoint every session and mark it disconnected, stop the fan-out. The caller
closes the log (which commits what is queued). `serve` bounds all of it by
`limits.stop_grace`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable
from ssl import SSLContext
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from riverbed.clock import now_us
from riverbed.errors import CannotListen, PreconditionFailed, RiverbedError
from riverbed.log.log import Log
from riverbed.log.retention import Holds, Retainer
from riverbed.metrics import Counts, Metrics, Refresher
from riverbed.mqtt.auth import load_auth
from riverbed.mqtt.codec import DisconnectReason
from riverbed.mqtt.config import Address, BrokerConfig
from riverbed.mqtt.connection import CLOSE_LINGER, Connection
from riverbed.mqtt.deadlines import Deadlines
from riverbed.mqtt.fanout import Fanout
from riverbed.mqtt.node import ClusterNode
from riverbed.mqtt.pacer import CommitPacer
from riverbed.mqtt.readings import read_storage
from riverbed.mqtt.retained import RetainedStore
from riverbed.mqtt.shapes import TopicShapes
from riverbed.mqtt.sys import SysPublisher
from riverbed.mqtt.tls import server_context
from riverbed.mqtt.turns import EndOfTurn
from riverbed.mqtt.wills import Wills
from riverbed.sessions.reader import ResumeReader
from riverbed.sessions.store import SessionRecord, SessionStore, Stored
from riverbed.sessions.writer import SessionWriter
from riverbed.sharedsub.runtime import SharedRuntime
from riverbed.topics.trie import TopicTrie

if TYPE_CHECKING:  # imported when a WebSocket listener is configured (wsproto, h11)
    from riverbed.mqtt.websocket import WebSocket

log = logging.getLogger(__name__)

T = TypeVar("T")

ORPHAN_SWEEP = 60.0
"""Seconds between two looks for cursors of sessions that have no record
(`SessionStore.drop_orphans`)."""
CLIENT_SUMMARY = 60.0
"""Seconds between two info lines counting the clients that came and went (each
one is a debug line: docs/broker.md, Logging)."""
NODE_LEASE_TTL = 30.0
"""Seconds a node's liveness lease lasts unless renewed (at each expiry sweep):
how long after a crash other nodes still count its sessions as in use (after
that they expire counting from when they were last seen, as on one node), and
so how long a client taking its session over on another node waits."""


LISTEN_BACKLOG = 4096
"""Connections the kernel queues for `accept` (capped by net.core.somaxconn).
asyncio's default, 100, drops the SYNs of a fleet reconnecting at once while
the loop is busy; each dropped one waits a second or more for its retry."""

RETAINER_STOP_TIMEOUT = 10.0
"""Seconds `stop` waits for the retention thread to end its transaction."""
WILLS_STOP_TIMEOUT = 10.0
"""Seconds `stop` waits for the Wills its closed connections left to be published."""
LINGER_LOOK = 0.05
"""How often `stop` looks whether the clients closed their ends of the connections."""


class Broker:
    """An MQTT 3.1.1 / 5 broker over one log.

    `checkpoint_every` / `checkpoint_interval`: a session commits its cursors
    after that many acknowledgements or that many seconds after they moved, and
    at disconnect. `expiry_sweep`: seconds between looks for expired sessions.
    `client_summary`: seconds between info lines counting connections made and
    ended (none when nobody came or went).
    """

    def __init__(
        self,
        config: BrokerConfig,
        log: Log,
        *,
        checkpoint_every: int = 100,
        checkpoint_interval: float = 1.0,
        expiry_sweep: float = 5.0,
        client_summary: float = CLIENT_SUMMARY,
        node_lease_ttl: float = NODE_LEASE_TTL,
    ) -> None:
        self.config = config
        self.log = log
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self.expiry_sweep = expiry_sweep
        self.client_summary = client_summary
        self._arrived = 0
        self._left = 0
        """Connections made and ended since the last summary line."""
        self._summarizer: asyncio.Task[None] | None = None
        self.store = SessionStore(log.storage)
        self.store.held_here = self._held_here
        self.writer = SessionWriter(self.store)
        """Session writes of all connections, group-committed (`sessions/writer.py`)."""
        self.resumes = ResumeReader(self.store)
        """Resuming sessions' records and cursors, many per read (`sessions/reader.py`)."""
        self.retained = RetainedStore(log.storage)
        self.trie: TopicTrie[Hashable] = TopicTrie()
        self.fanout = Fanout(
            log.storage,
            self.trie,
            poll_interval=config.storage.poll_interval_ms / 1000,
            pass_interval=config.storage.idle_cursor_interval,
        )
        self.fanout.on_new_streams = self._streams_changed
        self.holds = Holds()
        """Where SUBSCRIBEs taken here start, until their cursors are committed:
        retention keeps those messages (`log.retention.Holds`)."""
        self.shapes = TopicShapes(log, self.read_shared)
        """Topics' shapes and bindings, read once for all sessions (`mqtt/shapes.py`)."""
        self.fanout.on_passed = _passed
        self.turns = EndOfTurn()
        """The sessions' offers and the connections' writes, at the end of a turn
        of the loop or of a commit (`mqtt/turns.py`)."""
        self.pacer = CommitPacer(log, config.storage.commit_interval_ms / 1000, self.turns.finish)
        self.deadlines = Deadlines()
        """Every connection's CONNECT timeout and keep alive, on one timer."""
        self.authenticator, self.authorizer = load_auth(config.auth)
        self.may_publish = self.authorizer.allows_publish
        """What every connection's core asks before it takes a PUBLISH in (made
        once: one object for all of them)."""
        self.node = (
            config.cluster.node_name
            or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        """This broker node's name: in the session records of its connections,
        and in its liveness lease (`sessions.store.node_lease`)."""
        clustered = log.storage.networked
        self.wills = Wills(self, self.node, cluster=clustered)
        self._may_defer = not clustered
        self.cluster = ClusterNode(
            self,
            self.node,
            log.storage,
            lease_ttl=max(node_lease_ttl, 3 * expiry_sweep),
            sweep=expiry_sweep,
        )
        """Its duties as a node among others on the same database (`mqtt/node.py`)."""
        self.drained = asyncio.Event()
        """Set once a drain (`ClusterNode.drain`) has closed the listeners:
        `serve` then stops the broker, which sends its clients elsewhere."""
        self.connections: dict[str, Connection] = {}
        """Client id -> the connection holding its session."""
        self._shared_reads: dict[Hashable, asyncio.Future[Any]] = {}
        """Reads running for `read_shared`, by key."""
        self._all: set[Connection] = set()
        self._locks: dict[str, _ClientLock] = {}
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._ws_server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._orphans_at = 0.0
        """When the expiry sweep next looks for orphaned session cursors."""
        self.shared: SharedRuntime | None = None
        """Durable shared subscriptions (`sharedsub/`), unless disabled."""
        self.retainer: Retainer | None = None
        """Retention on a schedule (`[retention]`), unless its interval is 0."""
        self.counts = Counts()
        """What it counted since the start (connections, PUBLISHes and bytes in
        and out, QoS 0 messages dropped, ...): read by `$SYS` and the metrics."""
        self.sys: SysPublisher | None = None
        """The `$SYS` topics (`[sys] interval`), unless off."""
        self.metrics: Metrics | None = None
        """Its Prometheus metrics (`metrics.render()`), unless `[metrics] enabled` is false."""
        self._refresher: Refresher | None = None
        if config.metrics.enabled:
            self.metrics = self._count()

    def _count(self) -> Metrics:
        """Its metrics, with what the broker keeps anyway read at scrape time."""
        metrics = Metrics(self.counts)
        metrics.gauge(
            "riverbed_connections_current",
            "Client connections open now.",
            lambda: self.open_connections,
        )
        metrics.gauge(
            "riverbed_sessions_online",
            "Sessions held by a connection to this node now.",
            lambda: len(self.connections),
        )
        metrics.gauge(
            "riverbed_messages_in_flight",
            "QoS 1 and 2 messages sent to online clients and not yet acknowledged.",
            self.in_flight,
        )
        counts = self.counts
        metrics.counter(
            "riverbed_qos0_dropped",
            "QoS 0 messages dropped for clients not reading fast enough.",
            lambda: counts.qos0_dropped,
        )
        metrics.counter(
            "riverbed_slow_consumers_disconnected",
            "Connections aborted because their write buffer stayed full.",
            lambda: counts.slow_consumers_disconnected,
        )
        metrics.labelled_counter(
            "riverbed_shared_rebalances",
            "Changes of a shared group's assignments made by this node's Leader, by group.",
            ("group",),
            lambda: {} if self.shared is None else self.shared.host.rebalances(),
        )
        metrics.labelled_counter(
            "riverbed_shared_leader_claims",
            "Leader claims of shared groups on this node, by outcome (won, lost, released).",
            ("outcome",),
            lambda: {} if self.shared is None else self.shared.host.claims(),
        )
        self.log.appender.metrics = metrics
        return metrics

    async def start(self) -> None:
        """Start the fan-out and listen on `config.listeners.mqtt` (and `.tls`, `.ws` if set).

        The listening sockets are bound first, taking no client yet: an address
        in use is refused (`CannotListen`) before anything else has started."""
        loop = asyncio.get_running_loop()
        address = self.config.listeners.mqtt
        self._server = await _listen(loop, self._accept, address, "--mqtt", "listeners.mqtt")
        tls = self.config.listeners.tls
        if tls is not None:
            try:
                self._tls_server = await _listen(
                    loop,
                    self._accept,
                    tls.address,
                    "--tls",
                    "listeners.tls.address",
                    ssl=server_context(tls),
                )
            except BaseException:
                self._server.close()
                raise
        ws = self.config.listeners.ws
        if ws is not None:
            try:
                self._ws_server = await _listen(
                    loop,
                    self._accept_ws,
                    ws.address,
                    "--ws",
                    "listeners.ws.address",
                    ssl=server_context(ws) if ws.secure else None,
                )
            except BaseException:
                for server in (self._server, self._tls_server):
                    if server is not None:
                        server.close()
                raise
        await self.fanout.start()
        # On SQLite a session write with nothing queued before it commits on
        # the loop (sessions/writer.py), as a small batch of messages does.
        self.writer.commit_here()
        storage = self.log.storage
        shared = self.config.shared_subscriptions
        if shared.enabled:
            # Nodes sharing a PostgreSQL database reach each other's Leaders
            # over it (LISTEN/NOTIFY, cluster/bus.py).
            remote = storage.url if storage.networked else None
            self.shared = SharedRuntime(storage, shared.timers, self.node, remote_url=remote)
            await self.shared.start()
        await self.cluster.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="riverbed-session-expiry")
        self._summarizer = asyncio.create_task(self._summarize(), name="riverbed-client-summary")
        retention = self.config.retention
        if retention.interval:
            self.retainer = Retainer(
                self.log.storage,
                retention.interval,
                pin_warning_hours=retention.pin_warning_hours,
                batch=retention.batch,
                holds=self.holds,
            )
            self.retainer.start()
        else:
            log.info("retention is off ([retention] interval = 0): `riverbed retention run`")
        if self.metrics is not None:
            storage = self.log.storage
            sessions = self.store  # its decoded records shared with the sweeps
            every = self.config.metrics.refresh_interval
            self._refresher = Refresher(
                self.metrics, lambda: read_storage(storage, sessions, every), every
            )
            self._refresher.start()
        await self.wills.restore()
        if self.config.sys.interval:
            self.sys = SysPublisher(self, self.config.sys.interval)
            await self.sys.start()
        else:
            log.info("$SYS topics are off ([sys] interval = 0)")
        await _serve(self._server, address, "--mqtt", "listeners.mqtt")
        if self._tls_server is not None and tls is not None:
            await _serve(self._tls_server, tls.address, "--tls", "listeners.tls.address")
        listening = self.addresses()
        if self._ws_server is not None and ws is not None:
            await _serve(self._ws_server, ws.address, "--ws", "listeners.ws.address")
            scheme = "wss" if ws.secure else "ws"
            listening += [f"{scheme}://{name}{ws.path}" for name in _names(self._ws_server)]
        log.info("listening for MQTT on %s", ", ".join(listening))
        self.cluster.urls = tuple(self.listener_urls())
        await self.cluster.publish()

    def addresses(self) -> list[str]:
        """HOST:PORT of each socket listened on for MQTT and MQTT over TLS."""
        servers = (self._server, self._tls_server)
        return [name for server in servers if server is not None for name in _names(server)]

    def listener_urls(self) -> list[str]:
        """Every listener as a URL: `mqtt://HOST:PORT`, `mqtts://...`, `ws://HOST:PORT/PATH`."""
        out: list[str] = []
        if self._server is not None:
            out += [f"mqtt://{name}" for name in _names(self._server)]
        if self._tls_server is not None:
            out += [f"mqtts://{name}" for name in _names(self._tls_server)]
        ws = self.config.listeners.ws
        if self._ws_server is not None and ws is not None:
            scheme = "wss" if ws.secure else "ws"
            out += [f"{scheme}://{name}{ws.path}" for name in _names(self._ws_server)]
        return out

    def serving(self) -> bool:
        """Whether the MQTT listener takes clients (started and not stopping)."""
        return self._server is not None and self._server.is_serving()

    @property
    def port(self) -> int:
        """The port listened on (useful with port 0)."""
        assert self._server is not None
        return cast(int, self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop accepting, disconnect every client (0x8B), save their sessions."""
        if self.retainer is not None:
            # It stops between two of its transactions; one stuck on a database
            # that does not answer is a daemon thread and does not hold us up.
            await asyncio.to_thread(self.retainer.stop, RETAINER_STOP_TIMEOUT)
        if self._refresher is not None:
            # A daemon thread: one stuck in a database that does not answer is left.
            await asyncio.to_thread(self._refresher.stop, RETAINER_STOP_TIMEOUT)
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        if self._ws_server is not None:
            self._ws_server.close()
        await self.cluster.stop_renewing()
        for task in (self._sweeper, self._summarizer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.sys is not None:
            await self.sys.stop()
        connections = list(self._all)
        drain = self.cluster.drain_request
        for connection in connections:
            if drain is None:
                connection.close(DisconnectReason.SERVER_SHUTTING_DOWN)
            else:
                # MQTT 5 clients are told to move (with where, if configured);
                # MQTT 3.1.1 ones only see the connection close.
                connection.close(
                    DisconnectReason.USE_ANOTHER_SERVER, self.config.cluster.server_reference
                )
        for connection in connections:
            await connection.done.wait()
        self.deadlines.close()
        # The Wills the closed connections left go before the log closes.
        await self.wills.published_all(WILLS_STOP_TIMEOUT)
        leaders = 0
        if self.shared is not None:
            leaders = len(self.shared.host.leaders)
            # After the members left (their progress is with the Leaders): save
            # and release this node's Leaders' claims, so that another node's
            # Borrowers find a new Leader at once.
            await self.shared.close()
        self.pacer.commit_now()
        await asyncio.to_thread(self.writer.close)
        await self.fanout.stop()
        await self.cluster.stop(len(connections), leaders)
        await self._lingered(connections)
        for server in (self._server, self._tls_server, self._ws_server):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 1.0)
        if drain is not None:
            log.info("drained; %d clients asked to move, their sessions saved", len(connections))
        else:
            log.info("stopped; %d sessions saved", len(connections))

    async def _lingered(self, connections: list[Connection]) -> None:
        """Until the clients of `connections` closed their ends (each got its
        DISCONNECT and FIN), `CLOSE_LINGER` seconds at most: a socket closed
        under a client still writing would lose it its DISCONNECT
        (`Connection._close_transport`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_LINGER
        while any(c.lingering for c in connections) and loop.time() < deadline:
            await asyncio.sleep(LINGER_LOOK)  # pacing of the look

    async def read(self, read: Callable[..., T], *args: object) -> T:
        """A storage read for a connection: on an embedded database right here
        on the loop (a few indexed rows cost less than the hand-over to a
        thread and back, as `Fanout.refresh` finds for the heads), otherwise
        in a worker thread. Never for a write: that may wait for a lock."""
        if self.log.storage.appends_inline:
            return read(*args)
        return await asyncio.to_thread(read, *args)

    async def read_shared(self, key: Hashable, read: Callable[..., T], *args: object) -> T:
        """`read` (as `read` does it), but a read of the same `key` already
        running answers this call too: what every session asks alike (a
        topic's streams) is read once for a storm of resumes, not once each.
        Joining a read that started before the call is fine for what is read
        so: heads and generations only move forward."""
        if self.log.storage.appends_inline:
            return read(*args)
        running = self._shared_reads.get(key)
        if running is None:
            running = asyncio.ensure_future(asyncio.to_thread(read, *args))
            self._shared_reads[key] = running
            running.add_done_callback(lambda _: self._shared_reads.pop(key, None))
        result: T = await asyncio.shield(running)
        return result

    @property
    def open_connections(self) -> int:
        """Client connections open now (accepted, not yet closed), with or without CONNECT."""
        return len(self._all)

    def in_flight(self) -> int:
        """QoS 1 and 2 messages sent to this node's online clients and not yet
        acknowledged (read from their sessions; safe from another thread)."""
        total = 0
        for connection in list(self.connections.values()):
            session = connection.session
            if session is not None:
                total += session.inflight
        return total

    def _streams_changed(self) -> None:
        self.shapes.forget()
        for connection in list(self.connections.values()):
            connection.following.streams_changed()

    @contextlib.asynccontextmanager
    async def client_lock(self, client_id: str) -> AsyncIterator[None]:
        """Hold `client_id`'s lock: serializes its CONNECTs (takeover) and an
        administrator's deletion of its session. The lock is dropped once
        nobody holds or waits for it, so client ids that never come back
        leave nothing behind."""
        entry = self._locks.get(client_id)
        if entry is None:
            entry = self._locks[client_id] = _ClientLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[client_id]

    @property
    def client_locks(self) -> int:
        """Client ids whose lock is held or awaited now (0 when no CONNECT is
        in progress)."""
        return len(self._locks)

    @property
    def defers_ephemeral(self) -> bool:
        """Whether a session that ends with its connection (expiry 0) and has no
        Will is written only when it first needs the store (a subscription's
        cursors, a QoS 2 marker or window), not at CONNECT: a CONNECT that
        commits nothing. Only on SQLite, and only while no other process serves
        the same file (`ClusterNode.alone`): a CONNECT on another node finds the
        connection it takes over by its record."""
        return self._may_defer and self.cluster.alone

    def unwritten_sessions(self) -> int:
        """`Services.unwritten_sessions`."""
        return len(self.unwritten_records())

    def unwritten_records(self) -> dict[str, SessionRecord]:
        """The records of sessions connections here hold unwritten
        (`defers_ephemeral`), by client id: what the admin API shows of them.
        From any thread (the connections taken in one step, each `stored`
        read once)."""
        out: dict[str, SessionRecord] = {}
        for conn in list(self.connections.values()):
            stored = conn.stored
            if stored is not None and stored.version is None:
                out[stored.record.client_id] = stored.record
        return out

    async def store_unwritten(self) -> None:
        """`Host.store_unwritten`: another node came; each session kept in
        memory is written, and one that node created meanwhile is its own."""
        for conn in list(self.connections.values()):
            stored = conn.stored
            if stored is None or stored.version is not None:
                continue
            try:
                await conn.store_unwritten()
            except PreconditionFailed:
                log.info("client %s: session taken over on another node", conn.client_id)
                conn.close(DisconnectReason.SESSION_TAKEN_OVER)
            except RiverbedError:
                log.exception("client %s: writing its session failed", conn.client_id)

    def _held_here(self, client_id: str) -> Stored | None:
        """The record a connection here last wrote for its session (for
        `SessionStore.all`, from any thread: two reads, each atomic)."""
        connection = self.connections.get(client_id)
        return None if connection is None else connection.stored

    def _accept(self) -> Connection:
        """A new client connection (the listeners' protocol factory)."""
        return Connection(self)

    def _accept_ws(self) -> WebSocket:
        """A new MQTT over WebSockets client (the WebSocket listener's protocol
        factory): an MQTT connection once its handshake is accepted."""
        from riverbed.mqtt.websocket import WebSocket

        listener = self.config.listeners.ws
        assert listener is not None
        limit = self.config.limits.maximum_packet_size
        return WebSocket(listener, limit, self._accept)

    def connection_opened(self, connection: Connection) -> None:
        """The connection is made (for TLS: after the handshake succeeded)."""
        self._all.add(connection)
        self._arrived += 1
        self.counts.connections += 1

    def connection_closed(self, connection: Connection) -> None:
        """The connection's teardown finished (its session is saved)."""
        self._all.discard(connection)
        self._left += 1

    # --- what the node needs of its broker (`mqtt/node.py`: Host) ------------------
    def every_connection(self) -> list[Connection]:
        """Every open connection, with a session or not yet."""
        return list(self._all)

    async def will_settled(self, client_id: str) -> None:
        await self.wills.settled(client_id)

    async def adopt_wills(self) -> None:
        await self.wills.adopt()

    def stop_listening(self) -> None:
        """Take no more clients and have `serve` stop the broker (a drain)."""
        for server in (self._server, self._tls_server, self._ws_server):
            if server is not None:
                server.close()
        self.drained.set()

    # --- what its connections ask of the node ------------------------------------
    async def claim(self, stored: Stored) -> Stored | None:
        """`ClusterNode.claim`: the node holding `stored` lets go of it."""
        return await self.cluster.claim(stored)

    def fenced(self) -> bool:
        """`ClusterNode.fenced`: this node must deliver nothing now."""
        return self.cluster.fenced()

    def lease_lapsed(self) -> bool:
        """`ClusterNode.lease_lapsed`: this node takes no session now."""
        return self.cluster.lease_lapsed()

    async def _summarize(self) -> None:
        while True:
            await asyncio.sleep(self.client_summary)
            if self._arrived or self._left:
                log.info(
                    "%d connected, %d disconnected in the last %g s; %d connected now",
                    self._arrived, self._left, self.client_summary, len(self._all),
                )  # fmt: skip
                self._arrived = self._left = 0

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.expiry_sweep)
            await self.cluster.reap()
            # Alone on SQLite every record is written through this store,
            # which then knows when the first session is due.
            sparse = self._may_defer and self.cluster.alone
            try:
                gone = await asyncio.to_thread(
                    self.store.expire, now_us(), set(self.connections), self.node, sparse=sparse
                )
            except RiverbedError:
                log.exception("looking for expired sessions failed")
                continue
            for client_id in gone:
                log.info("session of client %s expired", client_id)
            await self.cluster.sweep()
            if time.monotonic() >= self._orphans_at:
                self._orphans_at = time.monotonic() + ORPHAN_SWEEP
                try:
                    orphans = await asyncio.to_thread(self.store.drop_orphans)
                except RiverbedError:
                    log.exception("looking for sessions' orphaned cursors failed")
                else:
                    for session_id in orphans:
                        log.info("dropped the cursors of session %s (no record)", session_id)


_LISTEN_ERRORS = {
    errno.EADDRINUSE: "is another broker running? choose another address",
    errno.EADDRNOTAVAIL: "it is no address of this machine; choose one that is",
    errno.EACCES: "ports below 1024 need privileges; choose another port",
}


def _passed(handle: Hashable, positions: dict[int, int]) -> None:
    """`Fanout.on_passed`: a session's waiting fetches moved past messages that
    matched none of its subscriptions (its handle in the trie is its connection)."""
    if isinstance(handle, Connection):
        handle.passed(positions)


def check_listeners(config: BrokerConfig) -> None:
    """Raise `CannotListen` if a listener's address cannot be listened on now:
    for a caller that would rather learn it before opening the database (the
    broker's own start refuses it too, whatever happened in between)."""
    listeners = [(config.listeners.mqtt, "--mqtt", "listeners.mqtt")]
    if config.listeners.tls is not None:
        listeners.append((config.listeners.tls.address, "--tls", "listeners.tls.address"))
    if config.listeners.ws is not None:
        listeners.append((config.listeners.ws.address, "--ws", "listeners.ws.address"))
    for address, flag, key in listeners:
        try:
            # Every address the name stands for, as `create_server` binds them all.
            found = socket.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
            for family, _, _, _, where in found:
                with socket.create_server(where[:2], family=family):
                    pass
        except OSError as exc:
            raise _cannot_listen(exc, address, flag, key) from None


def _names(server: asyncio.Server) -> list[str]:
    """HOST:PORT of each socket `server` listens on."""
    out = []
    for sock in server.sockets:
        host, port = cast(tuple[str, int], sock.getsockname()[:2])
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return out


async def _listen(
    loop: asyncio.AbstractEventLoop,
    accept: Callable[[], asyncio.Protocol],
    address: Address,
    flag: str,
    key: str,
    ssl: SSLContext | None = None,
) -> asyncio.Server:
    """A server bound to `address` that serves nobody until `start_serving`; a
    refusal to bind becomes `CannotListen` naming the address and the way out."""
    try:
        return await loop.create_server(
            accept,
            address.host,
            address.port,
            ssl=ssl,
            start_serving=False,
            backlog=LISTEN_BACKLOG,
        )
    except OSError as exc:
        raise _cannot_listen(exc, address, flag, key) from None


async def _serve(server: asyncio.Server, address: Address, flag: str, key: str) -> None:
    """Start taking clients on a server from `_listen`."""
    try:
        await server.start_serving()
    except OSError as exc:  # another process listened there since we bound it
        raise _cannot_listen(exc, address, flag, key) from None


def _cannot_listen(exc: OSError, address: Address, flag: str, key: str) -> Exception:
    if exc.errno is None:
        return exc  # not the system refusing the address: a bug, with its traceback
    # The system's words for it, without what Python adds ("while attempting to bind").
    reason = os.strerror(exc.errno) if exc.errno > 0 else (exc.strerror or str(exc))
    reason = reason.partition(" (while")[0].lower()
    hint = _LISTEN_ERRORS.get(exc.errno, "choose another address")
    return CannotListen(
        f"cannot listen on {address}: {reason} ({hint} with {flag} HOST:PORT or {key} in"
        " the config file)"
    )


EXIT_MARGIN = 5.0
"""Seconds after `limits.stop_grace` that a stopping process is ended whatever
it is doing (closing the log, threads still in the database)."""


class Companion(Protocol):
    """A server that runs beside the broker on its loop (the admin HTTP API):
    started after the broker, stopped before it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ExitDeadline:
    """The time by which a stopping process must have ended: past it, the
    process exits at once (status 1), as after a crash, which the log and the
    sessions are made to survive. `arm()` starts the clock, `disarm()` stops it;
    a process that stopped in time and goes on (an application embedding the
    broker, a test) is never ended later."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, _exit_now, (self.seconds,))
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


async def serve(
    config: BrokerConfig,
    log_: Log,
    stop: asyncio.Event,
    *,
    beside: Callable[[Broker], Companion] | None = None,
    deadline: ExitDeadline | None = None,
    **options: float,
) -> None:
    """Run a broker until `stop` is set, then stop it gracefully, within
    `limits.stop_grace` seconds: past that the process exits at once (status
    1), as after a crash, which the log and the sessions are made to survive. A
    database that stopped answering must not keep a broker from stopping.
    `beside(broker)` makes a companion server run alongside (the layer above
    supplies it: this one does not know it).

    The process is ended if stopping overruns `stop_grace` + `EXIT_MARGIN`
    (threads stuck in the database). Once `serve` returns, that deadline is
    disarmed, unless the caller passed its own `deadline`: then it is armed at
    the stop and left to the caller (the CLI's, to bound closing the log too)."""
    broker = Broker(config, log_, **options)  # type: ignore[arg-type]
    await broker.start()
    companion = None
    try:
        if beside is not None:
            companion = beside(broker)
            await companion.start()
        stopped = asyncio.ensure_future(stop.wait())
        drained = asyncio.ensure_future(broker.drained.wait())
        try:
            await asyncio.wait([stopped, drained], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (stopped, drained):
                waiting.cancel()
    finally:
        if companion is not None:
            await companion.stop()
        grace = config.limits.stop_grace
        watchdog = deadline or ExitDeadline(grace + EXIT_MARGIN)
        watchdog.arm()
        try:
            await asyncio.wait_for(broker.stop(), grace)
            # Storage work still running in worker threads (a sweep cancelled in
            # the middle of its reads) ends before the caller closes the storage:
            # a SQLite connection closed while another thread uses it can crash
            # the process (seen once: SIGSEGV at the end of a test).
            await asyncio.wait_for(asyncio.get_running_loop().shutdown_default_executor(), grace)
        except TimeoutError:
            _exit_now(grace)
        if deadline is None:
            watchdog.disarm()


def _exit_now(after: float) -> None:
    """End the process: stopping took longer than it may."""
    log.error(
        "stopping took over %g s (limits.stop_grace): exiting now; what was not saved is"
        " recovered at the next start, as after a crash",
        after,
    )
    logging.shutdown()
    os._exit(1)


class _ClientLock:
    """One client id's lock and how many tasks hold or await it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
