"""Borrower <-> Leader messages between broker nodes over PostgreSQL (issue 5).

The bus of `bus.py` between processes: each node LISTENs on its own channel
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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable

import psycopg

from riverbed.errors import NotFound, PreconditionFailed
from riverbed.sharedsub.protocol import Address, Message, decode, encode
from riverbed.storage.base import Storage

log = logging.getLogger(__name__)

NAMESPACE = "sharedsub.addresses"
MAX_PAYLOAD = 7999
"""Bytes a NOTIFY payload may have (PostgreSQL: less than 8000)."""


def channel(node: str) -> str:
    """The LISTEN channel of a node (a valid identifier whatever the name)."""
    return "riverbed_ss_" + hashlib.sha256(node.encode()).hexdigest()[:16]


class PostgresBus:
    """Carries messages to addresses on other nodes; hands what comes for this
    node to `deliver(address, message)` (on its listener thread)."""

    def __init__(
        self,
        url: str,
        storage: Storage,
        node: str,
        deliver: Callable[[Address, Message], None],
        *,
        poll: float = 0.2,
    ) -> None:
        self.url = url
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

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 10.0) -> None:
        """Start listening; returns once the LISTEN is in place."""
        self._thread = threading.Thread(
            target=self._listen, name="riverbed-shared-bus", daemon=True
        )
        self._thread.start()
        if not self._listening.wait(timeout):
            raise TimeoutError(f"node {self.node}: could not LISTEN within {timeout} s")

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5.0)
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
            payload = f"{to}\n{encode(message).decode()}"
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

    # ----------------------------------------------------------------- receiving

    def _listen(self) -> None:
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {channel(self.node)}")
                    self._listening.set()
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=self._poll):
                            self._arrived(note.payload)
            except psycopg.Error:
                log.warning("node %s: the shared-subscription listener reconnects", self.node)
                self._stopping.wait(1.0)

    def _arrived(self, payload: str) -> None:
        address, sep, raw = payload.partition("\n")
        if not sep:
            return
        try:
            message = decode(raw.encode())
        except Exception:
            log.warning("node %s: an undecodable message for %s", self.node, address)
            return
        self._deliver(address, message)
