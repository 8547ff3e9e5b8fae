"""What each broker node says about itself, and the drain requests it obeys.

The database knows a node by its liveness lease (`broker-node/NODE`) and the
session records naming it; the rest only the node knows, so it writes it:
one KV entry per node in namespace `cluster.nodes` (key = node name, JSON):
its listeners' addresses, when it started, its process id and host, the
Riverbed version, and its connections now. Written at the start, rewritten
at every expiry sweep, deleted at a clean stop (a node that died leaves its
last one: `riverbed cluster status` shows it lapsed).

A drain request (`riverbed cluster drain NODE`) is an entry in namespace
`cluster.drain` (key = node name): when it was asked, and, once the node has
drained, what it did. The node looks for it at every expiry sweep (SQLite, or
a NOTIFY that was lost); on PostgreSQL the command also tells the node at
once over the nodes' bus (`NodeBus`). A node obeys only a request made after
it started: one left behind by a drain that timed out does not drain the
node that takes its name next.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from riverbed.errors import NotFound, PreconditionFailed
from riverbed.storage.base import Storage

NODES = "cluster.nodes"
DRAINS = "cluster.drain"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A running node's own account of itself (`NODES`)."""

    node: str
    addresses: tuple[str, ...]
    """Its listeners: `mqtt://HOST:PORT`, `mqtts://...`, `ws://HOST:PORT/PATH`."""
    started_us: int
    pid: int
    host: str
    version: str
    connections: int
    """Client connections open on it when it last wrote this."""
    updated_us: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node": self.node,
                "addresses": list(self.addresses),
                "started_us": self.started_us,
                "pid": self.pid,
                "host": self.host,
                "version": self.version,
                "connections": self.connections,
                "updated_us": self.updated_us,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> NodeInfo:
        data = json.loads(raw)
        return cls(
            data["node"],
            tuple(data["addresses"]),
            data["started_us"],
            data["pid"],
            data["host"],
            data["version"],
            data["connections"],
            data["updated_us"],
        )


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """A request that a node drain (`DRAINS`), and its outcome once done."""

    node: str
    requested_us: int
    done_us: int | None = None
    connections: int = 0
    """Client connections the node asked to move."""
    leaders: int = 0
    """Shared-subscription Leaders it handed over."""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node": self.node,
                "requested_us": self.requested_us,
                "done_us": self.done_us,
                "connections": self.connections,
                "leaders": self.leaders,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> DrainRequest:
        data = json.loads(raw)
        return cls(
            data["node"],
            data["requested_us"],
            data.get("done_us"),
            data.get("connections", 0),
            data.get("leaders", 0),
        )


class Directory:
    """The `cluster.nodes` and `cluster.drain` entries of one storage (blocking)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def publish(self, info: NodeInfo) -> None:
        """Write (or rewrite) a node's own entry."""
        self.storage.kv_put(NODES, info.node, info.to_json())

    def forget(self, node: str) -> None:
        """Delete a node's entry (it stops cleanly)."""
        entry = self.storage.kv_get(NODES, node)
        if entry is not None:
            with contextlib.suppress(PreconditionFailed, NotFound):
                self.storage.kv_delete_if_version(NODES, node, entry.version)

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node's last entry, by name."""
        return {e.key: NodeInfo.from_json(e.value) for e in self.storage.kv_list(NODES)}

    def request_drain(self, node: str, at_us: int) -> None:
        """Ask `node` to drain (it finds the request at its next sweep)."""
        self.storage.kv_put(DRAINS, node, DrainRequest(node, at_us).to_json())

    def drain_request(self, node: str) -> DrainRequest | None:
        entry = self.storage.kv_get(DRAINS, node)
        return None if entry is None else DrainRequest.from_json(entry.value)

    def drained(self, request: DrainRequest) -> None:
        """The node drained: record what it did, for the command waiting for it."""
        self.storage.kv_put(DRAINS, request.node, request.to_json())

    def clear_drain(self, node: str) -> None:
        entry = self.storage.kv_get(DRAINS, node)
        if entry is not None:
            with contextlib.suppress(PreconditionFailed, NotFound):
                self.storage.kv_delete_if_version(DRAINS, node, entry.version)
