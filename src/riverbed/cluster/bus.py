"""Messages between broker nodes over PostgreSQL LISTEN/NOTIFY.

`PostgresBus` carries the shared subscriptions' Borrower <-> Leader messages
(`sharedsub/protocol.py`, whose `encode` / `decode` it is given: this package
sits below `sharedsub` and knows no message of it) between processes, as the
in-process bus of `sharedsub/bus.py` does within one: each node LISTENs on its own channel
(`riverbed_ss_` and 16 hex digits of a hash of the node name) and an address is
found on its node through a directory in the storage's KV namespace
`sharedsub.addresses` (address -> node), written when the address starts
(`announce`) and deleted when it ends (`forget`), read once per address and
remembered. A message is a NOTIFY on the node's channel whose payload is the
address, a newline and the JSON of `protocol.encode` (PostgreSQL's limit is
8000 bytes; a message above it is dropped and counted, like a message to an
address nobody announced).

What the protocol asks of a bus holds: a message may be lost (a node gone, its
LISTEN connection down: the protocol's resends and timeouts recover), and
messages from one sender to one address arrive in order (one sending connection
per node; NOTIFYs are delivered in commit order).

The event loop never waits for any of it: `post_announce`, `post_forget` and
`post_send` queue the work for one sending thread, which does it in order and
writes the directory changes that queued up together in one transaction (1,000
Borrowers announced at a mass reconnect: one commit, not 1,000; they were a
queue of single writes that kept a stopping broker waiting for minutes).
A message posted after an address's announce goes out after the announce
committed, so the address is found by the time an answer comes back.
`close` drops what is still queued, deletes this node's addresses in one
statement and gives up on all of it after its timeout.

`NodeBus` beside it carries JSON messages to a node by its name (on the
node's `node_channel`, no directory): the session takeover's requests and
answers between brokers. Its listening connection is named after that
channel, which makes it the node's presence: `listening(node)` finds it
among the server's connections while the node's process is connected.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import psycopg

from riverbed.errors import NotFound, PreconditionFailed, RiverbedError
from riverbed.storage.base import Storage
from riverbed.storage.transactions import transaction

log = logging.getLogger(__name__)

NAMESPACE = "sharedsub.addresses"
MAX_PAYLOAD = 7999
"""Bytes a NOTIFY payload may have (PostgreSQL: less than 8000)."""
RETRY_DIRECTORY = 1.0
"""Seconds before a directory write that failed is tried again."""

Address = str
"""Where a message goes: found on its node through the directory."""
Message = TypeVar("Message")
"""What the bus carries (the shared subscriptions' `protocol.Message`)."""


def channel(node: str) -> str:
    """The LISTEN channel of a node (a valid identifier whatever the name)."""
    return "riverbed_ss_" + hashlib.sha256(node.encode()).hexdigest()[:16]


class PostgresBus(Generic[Message]):
    """Carries messages to addresses on other nodes; hands what comes for this
    node to `deliver(address, message)` (on its listener thread). `encode` /
    `decode` turn a message into bytes and back (`decode` raises for bytes
    that are no message)."""

    def __init__(
        self,
        url: str,
        storage: Storage,
        node: str,
        deliver: Callable[[Address, Message], None],
        *,
        encode: Callable[[Message], bytes],
        decode: Callable[[bytes], Message],
        poll: float = 0.2,
    ) -> None:
        self.url = url
        self._encode = encode
        self._decode = decode
        self.storage = storage
        self.node = node
        self._deliver = deliver
        self._poll = poll
        self._nodes: dict[Address, str] = {}
        self._send_lock = threading.Lock()
        self._sender: psycopg.Connection[tuple[object, ...]] | None = None
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        """Messages not sent: unknown address, or too large."""
        self._work: queue.SimpleQueue[tuple[str, Address, Message | None] | None]
        """What the sending thread does: ("announce" | "forget" | "send", address, message)."""
        self._work = queue.SimpleQueue()
        self._sending = threading.Thread(
            target=self._send_all, name="riverbed-shared-sends", daemon=True
        )
        self._sending.start()

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 10.0) -> None:
        """Start listening; returns once the LISTEN is in place."""
        self._thread = threading.Thread(
            target=self._listen, name="riverbed-shared-bus", daemon=True
        )
        self._thread.start()
        if not self._listening.wait(timeout):
            raise TimeoutError(f"node {self.node}: could not LISTEN within {timeout} s")

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and sending; what is still queued is dropped and this
        node's addresses are deleted. Returns within about `timeout` seconds
        whatever the database does (the threads are daemons)."""
        self._stopping.set()
        self._work.put(None)
        self._sending.join(timeout)
        if self._thread is not None:
            self._thread.join(min(timeout, 1.0))
        if self._sending.is_alive():
            log.warning("node %s: the shared-subscription bus did not stop in time", self.node)
            return  # the sender is stuck in the database: leave its connection to it
        with self._send_lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None

    # ----------------------------------------------------------------- directory

    def announce(self, address: Address) -> None:
        """`address` lives on this node now (blocking: a storage write)."""
        self.storage.kv_put(NAMESPACE, address, self.node.encode())

    def forget(self, address: Address) -> None:
        """`address` is gone (blocking)."""
        entry = self.storage.kv_get(NAMESPACE, address)
        if entry is not None and entry.value.decode() == self.node:
            with contextlib.suppress(PreconditionFailed, NotFound):
                self.storage.kv_delete_if_version(NAMESPACE, address, entry.version)

    def post_announce(self, address: Address) -> None:
        """`announce`, by the sending thread (what is posted after it waits for it)."""
        self._work.put(("announce", address, None))

    def post_forget(self, address: Address) -> None:
        """`forget`, by the sending thread."""
        self._work.put(("forget", address, None))

    def post_send(self, to: Address, message: Message) -> None:
        """`send`, by the sending thread, after everything posted before it."""
        self._work.put(("send", to, message))

    def node_of(self, address: Address) -> str | None:
        node = self._nodes.get(address)
        if node is None:
            entry = self.storage.kv_get(NAMESPACE, address)
            if entry is None:
                return None
            node = self._nodes[address] = entry.value.decode()
        return node

    # ----------------------------------------------------------------- sending

    def send(self, to: Address, message: Message) -> None:
        """Send to an address on another node (blocking: a directory read the
        first time, then a NOTIFY). Never raises: a failure loses the message."""
        try:
            node = self.node_of(to)
            payload = f"{to}\n{self._encode(message).decode()}"
            if node is None or len(payload.encode()) > MAX_PAYLOAD:
                self.dropped += 1
                return
            with self._send_lock:
                if self._sender is None or self._sender.closed:
                    self._sender = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                self._sender.execute("SELECT pg_notify(%s, %s)", (channel(node), payload))
        except Exception:
            log.warning("node %s: a message to %s was lost", self.node, to, exc_info=True)
            self.dropped += 1
            with self._send_lock:
                if self._sender is not None and self._sender.broken:
                    self._sender = None

    # ----------------------------------------------------------------- the sending thread

    def _send_all(self) -> None:
        directory: list[tuple[str, Address]] = []
        while True:
            item = self._work.get()
            batch = [item]
            with contextlib.suppress(queue.Empty):
                while item is not None:
                    item = self._work.get_nowait()
                    batch.append(item)
            for work in batch:
                if work is None or self._stopping.is_set():
                    self._forget_node()
                    return
                kind, address, message = work
                if kind != "send":
                    directory.append((kind, address))
                    continue
                self._write_directory(directory)  # the announces before it first
                directory = []
                assert message is not None
                self.send(address, message)
            self._write_directory(directory)
            directory = []

    def _write_directory(self, changes: list[tuple[str, Address]]) -> None:
        """Announces and forgets in one transaction, tried again until written
        (a Borrower nobody can find would wait for its Leader forever)."""
        node = self.node.encode()
        while changes and not self._stopping.is_set():
            try:
                with transaction(self.storage) as tx:
                    for kind, address in changes:
                        if kind == "announce":
                            tx.execute(
                                "INSERT INTO kv (namespace, key, value, version)"
                                " VALUES (?, ?, ?, 1) ON CONFLICT (namespace, key)"
                                " DO UPDATE SET value = excluded.value, version = kv.version + 1",
                                (NAMESPACE, address, node),
                            )
                        else:
                            tx.execute(
                                "DELETE FROM kv WHERE namespace = ? AND key = ? AND value = ?",
                                (NAMESPACE, address, node),
                            )
                return
            except RiverbedError:
                log.warning(
                    "node %s: writing %d shared-subscription addresses failed; trying again",
                    self.node,
                    len(changes),
                    exc_info=True,
                )
                self._stopping.wait(RETRY_DIRECTORY)

    def _forget_node(self) -> None:
        """At close: every address of this node leaves the directory at once."""
        with contextlib.suppress(RiverbedError), transaction(self.storage) as tx:
            tx.execute(
                "DELETE FROM kv WHERE namespace = ? AND value = ?", (NAMESPACE, self.node.encode())
            )

    # ----------------------------------------------------------------- receiving

    def _listen(self) -> None:
        _listen(
            self.url,
            channel(self.node),
            self._arrived,
            self._stopping,
            self._listening.set,
            self._poll,
            f"node {self.node}: the shared-subscription listener reconnects",
        )

    def _arrived(self, payload: str) -> None:
        address, sep, raw = payload.partition("\n")
        if not sep:
            return
        try:
            message = self._decode(raw.encode())
        except Exception:
            log.warning("node %s: an undecodable message for %s", self.node, address)
            return
        self._deliver(address, message)


def _listen(
    url: str,
    name: str,
    arrived: Callable[[str], None],
    stopping: threading.Event,
    up: Callable[[], None],
    poll: float,
    reconnects: str,
    *,
    down: Callable[[], None] | None = None,
    application_name: str = "",
) -> None:
    """LISTEN on channel `name` and hand each payload to `arrived` until
    `stopping` is set (a listener thread's body): `up()` once listening,
    `down()` when the connection is lost, made again a second later."""
    while not stopping.is_set():
        try:
            with psycopg.connect(
                url, autocommit=True, connect_timeout=10, application_name=application_name
            ) as conn:
                conn.execute(f"LISTEN {name}")
                up()
                while not stopping.is_set():
                    for note in conn.notifies(timeout=poll):
                        arrived(note.payload)
        except psycopg.Error:
            if down is not None:
                down()
            log.warning(reconnects)
            stopping.wait(1.0)


def node_channel(node: str) -> str:
    """The LISTEN channel of a node's `NodeBus` (beside its `channel`)."""
    return "riverbed_node_" + hashlib.sha256(node.encode()).hexdigest()[:16]


class NodeBus:
    """Messages from one broker node to another by the node's name (the
    session takeover's requests and answers, `mqtt/broker.py`): a JSON object
    per NOTIFY on the receiver's `node_channel`, handed to `deliver(message)`
    on the listener thread.

    Like `PostgresBus`, a message may be lost (its node gone, or not
    listening): whoever asks waits a bounded time for the answer. `send`
    blocks (one NOTIFY on the sending connection; call it from a worker
    thread) and never raises: it says whether the message went out.

    The listening connection is the node's presence: it carries the node's
    `node_channel` as its application name, and `listening(node)` looks for it
    among the server's connections. A node whose process ended is not there
    any more (the server dropped its connections with it); `down()` (on the
    listener thread) tells a node that it lost its own, `up()` that it is back.
    """

    def __init__(
        self,
        url: str,
        node: str,
        deliver: Callable[[dict[str, object]], None],
        *,
        up: Callable[[], None] | None = None,
        down: Callable[[], None] | None = None,
        poll: float = 0.2,
    ) -> None:
        self.url = url
        self.node = node
        self._deliver = deliver
        self._up = up
        self._down = down
        self._poll = poll
        self._send_lock = threading.Lock()
        self._sender: psycopg.Connection[tuple[object, ...]] | None = None
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start listening; returns once the LISTEN is in place."""
        self._thread = threading.Thread(
            target=_listen,
            args=(
                self.url,
                node_channel(self.node),
                self._arrived,
                self._stopping,
                self._listened,
                self._poll,
                f"node {self.node}: the node bus listener reconnects",
            ),
            kwargs={"down": self._down, "application_name": node_channel(self.node)},
            name="riverbed-node-bus",
            daemon=True,
        )
        self._thread.start()
        if not self._listening.wait(timeout):
            raise TimeoutError(f"node {self.node}: could not LISTEN within {timeout} s")

    def close(self, timeout: float = 1.0) -> None:
        """Stop listening and close the sending connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._send_lock:
            if self._sender is not None:
                self._sender.close()
                self._sender = None

    def _listened(self) -> None:
        self._listening.set()
        if self._up is not None:
            self._up()

    def listening(self, node: str) -> bool:
        """Whether `node` has its listening connection to the server now
        (blocking); True when that cannot be told (the question failed)."""
        try:
            with self._send_lock:
                if self._sender is None or self._sender.closed:
                    self._sender = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                row = self._sender.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s)",
                    (node_channel(node),),
                ).fetchone()
        except psycopg.Error:
            log.warning("node %s: cannot tell whether node %s listens", self.node, node)
            with self._send_lock:
                if self._sender is not None and self._sender.broken:
                    self._sender = None
            return True
        return bool(row and row[0])

    def send(self, node: str, message: dict[str, object]) -> bool:
        """NOTIFY `node` of `message` (blocking); False if it could not be sent."""
        payload = json.dumps(message, separators=(",", ":"))
        if len(payload.encode()) > MAX_PAYLOAD:
            raise ValueError(
                f"a node message of {len(payload.encode())} bytes (at most {MAX_PAYLOAD})"
            )
        try:
            with self._send_lock:
                if self._sender is None or self._sender.closed:
                    self._sender = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                self._sender.execute("SELECT pg_notify(%s, %s)", (node_channel(node), payload))
        except psycopg.Error:
            log.warning("node %s: a message to node %s was lost", self.node, node, exc_info=True)
            with self._send_lock:
                if self._sender is not None and self._sender.broken:
                    self._sender = None
            return False
        return True

    def _arrived(self, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            log.warning("node %s: an undecodable node message", self.node)
            return
        if isinstance(message, dict):
            self._deliver(message)
