"""The broker as one node among others on one database: its liveness lease and
fence, the takeovers it asks for and answers over the nodes' bus, its entry in
the node directory and its drain (docs/cluster.md).

    node = ClusterNode(broker, name, storage, lease_ttl=30.0, sweep=5.0)
    await node.start()            # the bus (PostgreSQL), the lease, its renewal
    await node.sweep()            # at each expiry sweep of the broker
    await node.stop(saved, leaders)

Takeover across nodes (PostgreSQL): a session is held by one connection at a
time, whichever node it is on. A CONNECT for a session marked connected on
another node asks that node, over the nodes' bus (`cluster/bus.py`,
`NodeBus`), to let go of it (`claim`); that node closes its connection
(DISCONNECT 0x8E), saves the session and answers, and only then is the
session read and resumed here, with what the old connection sent last. A node
that does not answer within `RELEASE_TIMEOUT` (dead, or cut off) is waited for
until its liveness lease has lapsed, unless its connection to the database
(the bus's listening one) is gone, as it is once its process ended: then it is
counted gone after `PRESENCE_GRACE`.

A node fences itself (`fenced`): when its lease may have lapsed (it could not
renew it) it closes its connections and takes none until it holds the lease
again; while its listening connection is lost it delivers nothing (a
connection about to deliver is closed), and once it is back it first closes
the connections whose session another node took meanwhile. So a node coming
back from a stall or a cut never sends to a session another node took. Every
write of a connection whose session was taken is a compare-and-set that fails
(`sessions/store.py`). The sweep still closes (0x8E) any connection whose
session was taken over without asking (nodes sharing an SQLite file, which
have no bus).

The lease is renewed every `sweep` seconds on a thread of its own, never behind
the sweeps' reads of every session record (with 100,000 sessions a sweep took
longer than the lease, and the node fenced itself). A drain (`riverbed cluster
drain`) closes the listeners and has the broker stop, asking its clients to
move; the node's part is to notice the request and record it done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from riverbed import __version__
from riverbed.clock import now_us
from riverbed.cluster.directory import Directory, DrainRequest, NodeInfo
from riverbed.cluster.presence import FilePresence
from riverbed.errors import LeaseHeld, PreconditionFailed, RiverbedError
from riverbed.mqtt.codec import DisconnectReason
from riverbed.sessions.store import SessionRecord, SessionStore, Stored, node_lease
from riverbed.storage import Storage
from riverbed.storage.leases import Lease, Leases
from riverbed.storage.sqlite import SqliteStorage

if TYPE_CHECKING:
    from riverbed.cluster.bus import NodeBus

log = logging.getLogger(__name__)

T = TypeVar("T")

RELEASE_TIMEOUT = 3.0
"""Seconds a node taking a session over waits for the node holding it to
answer that it let go, before it asks again or finds that node's lease lapsed."""
PRESENCE_GRACE = 1.0
"""Seconds a node taking a session over waits, once it found the holding node's
listening connection gone from the database, before it counts that node as
gone: time for a node that lost its connection (and not its life) to notice
and fence itself."""
LEASE_MARGIN = 1.0
"""Seconds before its liveness lease may lapse that a node fences itself (at
most a quarter of the lease)."""


class Held(Protocol):
    """A client connection as the node sees it: the session record it holds."""

    @property
    def stored(self) -> Stored | None: ...

    def close(self, reason: DisconnectReason, server_reference: str | None = None) -> None: ...

    async def take_over(self) -> None: ...


class Host(Protocol):
    """What the node needs of its broker (`mqtt/broker.py`)."""

    @property
    def connections(self) -> Mapping[str, Held]:
        """Client id -> the connection holding its session."""
        ...

    @property
    def store(self) -> SessionStore: ...

    def every_connection(self) -> Collection[Held]:
        """Every open connection, with a session or not yet."""
        ...

    async def read(self, read: Any, *args: object) -> Any: ...

    async def will_settled(self, client_id: str) -> None:
        """Once the client's delay-0 Will (if any) has cleared it from its record."""
        ...

    async def adopt_wills(self) -> None:
        """Take over the Wills of nodes whose lease lapsed."""
        ...

    def stop_listening(self) -> None:
        """Take no more clients, and have the broker stop (a drain)."""
        ...

    async def store_unwritten(self) -> None:
        """Another node uses the store now: write the records of the sessions
        held in memory only (`ClusterNode.alone`)."""
        ...


class ClusterNode:
    """This broker among the nodes of one database (see the module)."""

    def __init__(
        self, host: Host, name: str, storage: Storage, *, lease_ttl: float, sweep: float
    ) -> None:
        self._host = host
        self.name = name
        self._storage = storage
        self.lease_ttl = lease_ttl
        """Seconds its liveness lease lasts unless renewed."""
        self._every = sweep
        """Seconds between two renewals."""
        self._leases = Leases(storage)
        self._lease: Lease | None = None
        self.bus: NodeBus | None = None
        """The bus to the other nodes on the same PostgreSQL (session takeover)."""
        self.presence = FilePresence(storage.path) if isinstance(storage, SqliteStorage) else None
        """On SQLite: this node's lock among the nodes of the file, which tells
        a node that crashed from one that runs (`cluster/presence.py`)."""
        self._asked: dict[str, asyncio.Future[None]] = {}
        """Takeover requests sent to other nodes and not answered yet, by id."""
        self._bus_lost = False
        """The nodes' bus lost its listening connection (the node's presence)."""
        self._lease_until: float | None = None
        """With `bus`: until when (`time.monotonic`) this node's liveness lease
        surely runs, less `LEASE_MARGIN`; past it the node is fenced."""
        self._fence_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Another node's requests being carried out here."""
        self._renewer: asyncio.Task[None] | None = None
        self._lease_thread = ThreadPoolExecutor(1, thread_name_prefix="riverbed-node-lease")
        """Where the liveness lease is renewed (`_renew`)."""
        self.directory = Directory(storage)
        """Where this node says what it is (`cluster/directory.py`)."""
        self.started_us = now_us()
        self.urls: tuple[str, ...] = ()
        """Its listeners as URLs (set once listening: a drain closes the sockets)."""
        self.drain_request: DrainRequest | None = None
        """The drain being carried out (`drain`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.alone = False
        """No other node held a running liveness lease at the last look (start,
        then every sweep; SQLite only): only then may a session that ends with
        its connection go unwritten (`Broker.defers_ephemeral`), since no
        CONNECT elsewhere can look for it."""

    # --- start and stop ------------------------------------------------------------
    async def start(self) -> None:
        """The bus (on PostgreSQL), the liveness lease, and its renewal."""
        self._loop = asyncio.get_running_loop()
        storage = self._storage
        if storage.networked:
            from riverbed.cluster.bus import NodeBus  # psycopg: not for SQLite

            self.bus = NodeBus(
                storage.url, self.name, self._from_node, up=self._bus_up, down=self._bus_down
            )
            await asyncio.to_thread(self.bus.start)
        if self.presence is not None:
            await asyncio.to_thread(self.presence.hold, self.name)
        await asyncio.to_thread(self._take_lease)
        # Its predecessor, killed, holds its sessions and Wills by its lease
        # no longer than it takes to find that its process ended.
        await self.reap()
        if self.bus is None:  # with a bus (PostgreSQL) every record is written anyway
            self.alone = await asyncio.to_thread(self._no_other_node)
        self._arm_fence()
        self._renewer = asyncio.create_task(self._renew(), name="riverbed-node-lease")

    async def stop_renewing(self) -> None:
        """Renew the lease no more (the broker stops; it is released at `stop`)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def stop(self, saved: int, leaders: int) -> None:
        """Leave the directory (recording a drain done, with the `saved`
        sessions and handed-over `leaders`), release the lease, close the bus."""
        await self.stop_renewing()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        drain = self.drain_request
        with contextlib.suppress(RiverbedError):
            await asyncio.to_thread(self.directory.forget, self.name)
            if drain is not None:
                # Before the lease goes: the command waiting for it reads this.
                done = replace(drain, done_us=now_us(), connections=saved, leaders=leaders)
                await asyncio.to_thread(self.directory.drained, done)
        if self._lease is not None:
            # Its sessions are marked disconnected now: nobody needs the lease.
            with contextlib.suppress(RiverbedError):
                await asyncio.to_thread(self._leases.release, self._lease)
            self._lease = None
        # Not behind a renewal on its way (the storage closes after this).
        await asyncio.to_thread(self._lease_thread.shutdown, True)
        if self.presence is not None:
            self.presence.leave()
        if self.bus is not None:
            await asyncio.to_thread(self.bus.close)

    # --- the directory -------------------------------------------------------------
    def info(self) -> NodeInfo:
        """This node's entry in the node directory, as of now."""
        return NodeInfo(
            self.name,
            self.urls,
            self.started_us,
            os.getpid(),
            socket.gethostname(),
            __version__,
            len(self._host.every_connection()),
            now_us(),
        )

    async def publish(self) -> None:
        """Write its entry in the node directory (a failure is logged)."""
        try:
            await asyncio.to_thread(self.directory.publish, self.info())
        except RiverbedError:
            log.exception("node %s: writing its entry in the node directory failed", self.name)

    async def sweep(self) -> None:
        """At each expiry sweep: a drain asked for, its directory entry, the
        Wills of nodes that died, sessions taken over without asking."""
        await self._drain_if_asked()
        await self.publish()
        try:
            # The Wills of nodes that died (their lease lapsed) are ours now.
            await self._host.adopt_wills()
        except RiverbedError:
            log.exception("looking for the wills of nodes that are gone failed")
        await self._look_for_others()
        await self._let_go_of_taken_over()

    async def reap(self) -> None:
        """SQLite: end the liveness leases of the nodes on the file whose
        process ended (`cluster/presence.py`), so that their sessions expire
        and their Wills go as if their leases had lapsed. Called at the start
        and at each expiry sweep, before the sweep looks at the sessions."""
        if self.presence is None:
            return
        try:
            ended = await asyncio.to_thread(self._reap)
        except (RiverbedError, OSError):
            log.exception("node %s: looking for nodes that are gone failed", self.name)
            return
        for name in ended:
            log.info("node %s is gone (its process ended): its liveness lease ends now", name)

    def _reap(self) -> list[str]:
        """`reap`, blocking: the names of the nodes whose lease it ended."""
        assert self.presence is not None
        gone = self.presence.reap()
        if not gone:
            return []
        at = now_us()
        leases = self._host.store.node_leases()
        ended: list[str] = []
        for name in sorted(gone):
            lease = leases.get(name)
            if name == self.name or lease is None or lease.expired(at):
                continue
            try:
                self._leases.end(lease, at)
            except PreconditionFailed:
                continue  # taken again since (a node restarted under its name)
            ended.append(name)
        return ended

    def _no_other_node(self) -> bool:
        """Whether no other node holds a running liveness lease (blocking)."""
        at = now_us()
        return all(
            name == self.name or lease.expired(at)
            for name, lease in self._host.store.node_leases().items()
        )

    async def _look_for_others(self) -> None:
        """Whether this node is still alone; if another came, the sessions it
        kept unwritten are written now (one a CONNECT there created meanwhile
        is found taken over). Not with a bus: PostgreSQL writes every record."""
        if self.bus is not None:
            return
        try:
            alone = await asyncio.to_thread(self._no_other_node)
        except RiverbedError:
            log.exception("looking for other nodes failed")
            alone = False
        was, self.alone = self.alone, alone
        if was and not alone:
            log.info("node %s: another node shares the store; all sessions are stored", self.name)
            await self._host.store_unwritten()

    # --- the liveness lease and the fence ------------------------------------------
    def _lease_ttl_us(self) -> int:
        return int(self.lease_ttl * 1_000_000)

    def _take_lease(self) -> None:
        """Take this node's liveness lease (blocking)."""
        since = time.monotonic()
        self._lease = self._leases.acquire(node_lease(self.name), self.name, self._lease_ttl_us())
        self._leased(since)

    def _leased(self, since: float) -> None:
        """The lease was taken or renewed by a request sent at `since`: it runs
        at least until `since` + its TTL, for every node."""
        if self.bus is not None:
            ttl = self.lease_ttl
            self._lease_until = since + ttl - min(LEASE_MARGIN, ttl / 4)

    def _keep_lease(self) -> bool:
        """Renew this node's liveness lease (blocking); False if it lapsed (a
        stall longer than its TTL let other nodes take our sessions over, or
        count them as orphaned): `fence`, then `_take_lease`."""
        lease = self._lease
        since = time.monotonic()
        try:
            if lease is None:
                raise PreconditionFailed("no lease yet")
            self._lease = self._leases.renew(lease, self._lease_ttl_us())
        except (PreconditionFailed, LeaseHeld):
            return False
        self._leased(since)
        return True

    async def _renew(self) -> None:
        """Renew the liveness lease every `sweep` seconds, on a thread of its own."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._every)
            try:
                if await loop.run_in_executor(self._lease_thread, self._keep_lease):
                    self._arm_fence()
                else:
                    log.warning("node %s: liveness lease lapsed; taking it again", self.name)
                    self.fence("its liveness lease lapsed")
                    await loop.run_in_executor(self._lease_thread, self._take_lease)
                    self._arm_fence()
            except RiverbedError:
                log.exception("node %s: renewing the liveness lease failed", self.name)

    def fenced(self) -> bool:
        """Whether this node must deliver nothing: its liveness lease may have
        lapsed (`lease_lapsed`), or its bus lost its listening connection, so
        other nodes may count it gone. Never without the nodes' bus."""
        return self._bus_lost or self.lease_lapsed()

    def lease_lapsed(self) -> bool:
        """Whether this node's liveness lease may have lapsed (it was not
        renewed in time): another node may have taken its sessions over."""
        until = self._lease_until
        return until is not None and time.monotonic() >= until

    def _arm_fence(self) -> None:
        """Fence when the lease may lapse unless renewed before (rearmed at
        every renewal)."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if self._lease_until is not None:
            delay = max(0.0, self._lease_until - time.monotonic())
            loop = asyncio.get_running_loop()
            self._fence_timer = loop.call_later(delay, self._fence_if_lapsed)

    def _fence_if_lapsed(self) -> None:
        self._fence_timer = None
        if self.fenced():
            self.fence("its liveness lease was not renewed in time")

    def _bus_down(self) -> None:
        """The bus lost its listening connection (on its thread): other nodes
        may count this one gone and take its sessions, so nothing is delivered
        (a connection that would deliver is closed) until it is back."""
        lost, self._bus_lost = self._bus_lost, True
        if not lost:
            log.warning("node %s: lost its connection to the other nodes", self.name)

    def _bus_up(self) -> None:
        """The bus listens again (on its thread): `_regained`."""
        if self._bus_lost and self._loop is not None:
            self._loop.call_soon_threadsafe(self._regain)

    def _regain(self) -> None:
        self._run(self._regained())

    def _run(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _regained(self) -> None:
        """Present again: once a takeover decided while this node was absent has
        had time to write its record, close the connections whose session
        another node took meanwhile, then deliver again."""
        await asyncio.sleep(2 * PRESENCE_GRACE)
        await self._let_go_of_taken_over()
        self._bus_lost = False
        log.info("node %s: connected to the other nodes again", self.name)

    def fence(self, why: str) -> None:
        """Close every connection (DISCONNECT 0x89 Server busy; each saves its
        session unless another node took it): another node may take its
        sessions over now. CONNECTs are refused while `lease_lapsed`."""
        connections = list(self._host.every_connection())
        if not connections:
            return
        log.warning("node %s: %s: closing %d connections", self.name, why, len(connections))
        for connection in connections:
            connection.close(DisconnectReason.SERVER_BUSY)

    # --- takeover across nodes -------------------------------------------------------
    async def claim(self, stored: Stored) -> Stored | None:
        """Have the node holding `stored` (marked connected on another node) let
        go of it, and return the record as it is then (None: gone with its
        connection). That node answered that its connection is closed and the
        session saved, or it is gone from the database, or its liveness lease
        lapsed (it stopped, or fenced itself); `PreconditionFailed` if none of
        it happened in about the lease's TTL plus `RELEASE_TIMEOUT`. Without
        the nodes' bus: `stored` at once (that node learns of it at its sweep)."""
        record = stored.record
        node = record.node
        if self.bus is None or node is None:
            return stored
        if await self._claimed(stored.record, node):
            host = self._host
            fresh: Stored | None = await host.read(host.store.load, record.client_id)
            return fresh
        raise PreconditionFailed(f"session of {record.client_id} held on node {node}")

    async def _claimed(self, record: SessionRecord, node: str) -> bool:
        """`claim`'s asking and waiting: whether `node` let go of the session."""
        bus = self.bus
        assert bus is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_ttl + RELEASE_TIMEOUT
        asked = False
        while True:
            lease = await asyncio.to_thread(self._host.store.node_lease, node)
            if lease is None or lease.expired(now_us()):
                if asked:
                    log.info(
                        "client %s: node %s did not answer; its lease lapsed: taking over",
                        record.client_id,
                        node,
                    )
                return True
            if not await self._present(node):
                log.info(
                    "client %s: node %s is gone (no connection to the database): taking over",
                    record.client_id,
                    node,
                )
                return True
            if loop.time() >= deadline:
                log.warning(
                    "client %s: node %s holds the session and neither answers nor stops",
                    record.client_id,
                    node,
                )
                return False
            ask = uuid.uuid4().hex
            answered: asyncio.Future[None] = loop.create_future()
            self._asked[ask] = answered
            request = {
                "kind": "release",
                "id": ask,
                "from": self.name,
                "client_id": record.client_id,
                "epoch": record.epoch,
            }
            try:
                if await asyncio.to_thread(bus.send, node, request):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(answered, RELEASE_TIMEOUT)
                        return True
                else:
                    await asyncio.sleep(min(RELEASE_TIMEOUT, max(0.0, deadline - loop.time())))
            finally:
                self._asked.pop(ask, None)
            asked = True

    async def _present(self, node: str) -> bool:
        """Whether `node` is connected to the database (its bus listens), or
        came back within `PRESENCE_GRACE` of being found absent."""
        bus = self.bus
        assert bus is not None
        if await asyncio.to_thread(bus.listening, node):
            return True
        await asyncio.sleep(PRESENCE_GRACE)
        return await asyncio.to_thread(bus.listening, node)

    def _from_node(self, message: dict[str, object]) -> None:
        """A message from another node (on the bus's listener thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_node_message, message)

    def _on_node_message(self, message: dict[str, object]) -> None:
        kind = message.get("kind")
        if kind == "release":
            self._run(self._release(message))
        elif kind == "drain":
            self._run(self._drain_if_asked())
        elif kind == "released":
            answered = self._asked.get(str(message.get("id")))
            if answered is not None and not answered.done():
                answered.set_result(None)

    async def _release(self, message: dict[str, object]) -> None:
        """Another node takes a session over: close its connection here (0x8E)
        and save the session, unless that connection took it after the one the
        other node found (a newer epoch); then answer."""
        client_id = str(message.get("client_id"))
        epoch = message.get("epoch")
        asker = str(message.get("from"))
        connection = self._host.connections.get(client_id)
        stored = None if connection is None else connection.stored
        if (
            connection is not None
            and stored is not None
            and isinstance(epoch, int)
            and stored.record.epoch <= epoch
        ):
            log.info("client %s: session taken over on node %s", client_id, asker)
            await connection.take_over()
            await self._host.will_settled(client_id)  # its Will clears it from the record
        assert self.bus is not None
        answer = {"kind": "released", "id": message.get("id"), "from": self.name}
        await asyncio.to_thread(self.bus.send, asker, answer)

    async def _let_go_of_taken_over(self) -> None:
        """Close the connections whose session a client took over on another
        node without asking (found at the sweep: a CONNECT on another node
        normally has this node let go of it at once, `claim`)."""
        connections = self._host.connections
        mine = {
            client_id: conn.stored.version
            for client_id, conn in connections.items()
            if conn.stored is not None
        }
        if not mine:
            return
        try:
            taken = await asyncio.to_thread(self._host.store.taken_over, mine, self.name)
        except RiverbedError:
            log.exception("looking for sessions taken over elsewhere failed")
            return
        for client_id in taken:
            conn = connections.get(client_id)
            if (
                conn is not None
                and conn.stored is not None
                and _not_written_since(conn.stored.version, mine[client_id])
            ):
                log.info("client %s: session taken over on another node", client_id)
                conn.close(DisconnectReason.SESSION_TAKEN_OVER)

    # --- drain ---------------------------------------------------------------------
    async def _drain_if_asked(self) -> None:
        """Drain if `riverbed cluster drain` asked this node to since it
        started (told over the bus, or found at the sweep)."""
        if self.drain_request is not None:
            return
        try:
            request = await asyncio.to_thread(self.directory.drain_request, self.name)
        except RiverbedError:
            log.exception("node %s: reading its drain request failed", self.name)
            return
        if request is None or request.done_us is not None or request.requested_us < self.started_us:
            return
        self.drain(request)

    def drain(self, request: DrainRequest) -> None:
        """Stop taking clients (the listeners close now) and have the broker
        stop: its clients are asked to use another server (DISCONNECT 0x9C,
        with `[cluster] server_reference`), their sessions saved, its
        shared-subscription Leaders handed over and its lease released."""
        if self.drain_request is not None:
            return
        self.drain_request = request
        log.info("node %s: draining (asked by riverbed cluster drain)", self.name)
        self._host.stop_listening()


def _not_written_since(now: int | None, seen: int | None) -> bool:
    """Whether a connection's record is still the one `taken_over` was asked
    about (the version then, `seen`; None: not written yet). One it wrote
    since is checked again at the next sweep."""
    if now is None:
        return True
    return seen is not None and now <= seen
