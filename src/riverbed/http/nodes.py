"""Broker node routes of the admin API, and the cluster view they share with
`riverbed cluster status`.

    GET /api/v1/nodes   the broker nodes on this database, alive or lapsed

Each running broker node holds the lease `broker-node/NODE` and renews it at
every expiry sweep (`sessions.store.node_lease`); a node that stopped cleanly
released it, one that crashed or stalls left it to lapse. `alive` is whether it
runs now; `sessions` counts the session records marked connected on the node.
What only the node knows (its listeners, start, process, version, connections
now) it writes into the node directory (`cluster/directory.py`) at its start
and at every sweep; `leaders` counts the shared-subscription groups whose
unexpired leader claim one of its Leaders holds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter

from riverbed.clock import now_us
from riverbed.cluster.directory import Directory
from riverbed.http.context import HttpContext
from riverbed.log.jsonlines import format_time
from riverbed.sessions.store import SessionStore
from riverbed.sharedsub.claims import GroupStore
from riverbed.storage.base import Storage

LEADER_INFIX = "/leader/"
"""A Leader's id is `NODE/leader/RANDOM` (`sharedsub/host.py`)."""


def cluster_nodes(storage: Storage, at_us: int, here: str | None = None) -> list[dict[str, Any]]:
    """Every broker node that holds a liveness lease (alive or lapsed) or has
    an entry in the node directory, by name, with what is known of it."""
    store = SessionStore(storage)
    leases = store.node_leases()
    info = Directory(storage).nodes()
    held = Counter(s.record.node for s in store.all() if s.record.connected and s.record.node)
    groups = GroupStore(storage)
    leaders: Counter[str] = Counter()
    for group in groups.list():
        claim = groups.leader_of(group.group, at_us)
        if claim is not None and LEADER_INFIX in claim.owner:
            leaders[claim.owner.partition(LEADER_INFIX)[0]] += 1
    out = []
    for node in sorted(set(leases) | set(info)):
        lease = leases.get(node)
        entry = info.get(node)
        alive = lease is not None and not lease.expired(at_us)
        out.append(
            {
                "node": node,
                "owner": None if lease is None else lease.owner,
                "expires_at": None if lease is None else format_time(lease.expires_us),
                "alive": alive,
                "here": node == here,
                "sessions": held[node],
                "addresses": [] if entry is None else list(entry.addresses),
                "started_at": None if entry is None else format_time(entry.started_us),
                "pid": None if entry is None else entry.pid,
                "host": None if entry is None else entry.host,
                "version": None if entry is None else entry.version,
                "connections": entry.connections if entry is not None and alive else None,
                "updated_at": None if entry is None else format_time(entry.updated_us),
                "leaders": leaders[node],
            }
        )
    return out


def routes(context: HttpContext) -> APIRouter:
    """The node routes over `context.log` (the module docstring)."""
    storage = context.log.storage
    api = APIRouter()

    @api.get("/nodes", tags=["nodes"])
    def nodes() -> list[dict[str, Any]]:
        """The broker nodes on this database, alive or lapsed: their lease,
        listeners, start, process, version, connections now (alive ones),
        sessions held and shared-subscription Leaders."""
        return cluster_nodes(storage, now_us(), context.node)

    return api
