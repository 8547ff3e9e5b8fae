"""Broker node routes of the admin API.

    GET /api/v1/nodes   the broker-node liveness leases on this database

Each running broker node holds the lease `broker-node/NODE` and renews it at
every expiry sweep (`sessions.store.node_lease`); a node that stopped cleanly
released it, one that crashed or stalls left it to lapse. `alive` is whether it
runs now; `sessions` counts the session records marked connected on the node.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter

from riverbed.http.context import HttpContext
from riverbed.log.jsonlines import format_time
from riverbed.sessions.store import SessionStore, now_us


def routes(context: HttpContext) -> APIRouter:
    """The node routes over `context.log` (the module docstring)."""
    store = SessionStore(context.log.storage)
    api = APIRouter()

    @api.get("/nodes", tags=["nodes"])
    def nodes() -> list[dict[str, Any]]:
        """The broker nodes holding a liveness lease on this database, alive or lapsed."""
        at = now_us()
        leases = store.node_leases()
        held = Counter(
            s.record.node for s in store.all() if s.record.connected and s.record.node in leases
        )
        return [
            {
                "node": node,
                "owner": lease.owner,
                "expires_at": format_time(lease.expires_us),
                "alive": not lease.expired(at),
                "here": node == context.node,
                "sessions": held[node],
            }
            for node, lease in sorted(leases.items())
        ]

    return api
