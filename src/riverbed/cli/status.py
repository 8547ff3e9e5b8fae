"""`riverbed status`: the broker, its sessions, topics and lag at a glance.

Everything comes from the database, so it answers with the broker stopped too:

- broker nodes: each running node holds a liveness lease
  (`sessions.store.node_lease`) that it renews at every expiry sweep and
  releases when it stops. A node is *up* while its lease is fresh; a node whose
  lease ran out (it crashed, or stalls) is *down*, and so is one that session
  records name but that holds no lease any more. Nodes record no address.
- sessions: the records in the `sessions` namespace; *online* when marked
  connected on a node that is up.
- topics with their messages and heads; named subscriptions with their lag (and,
  for one that delivers, its retry and dead-letter queues); shared groups with
  their Leader and lag.

Read-only: it opens the storage without the log (no built-in topic, no
appender), and refuses a database that does not exist rather than create it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from riverbed.cli._app import (
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_storage_of_command,
    print_json,
)
from riverbed.clock import now_us
from riverbed.errors import NotFound
from riverbed.log.jsonlines import format_time
from riverbed.sessions.store import SessionStore
from riverbed.sharedsub.claims import GroupStore, group_progress
from riverbed.storage import Storage, redact_url
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.pipeline import queue_depths


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A broker node as the database knows it."""

    node: str
    up: bool
    lease_expires_us: int | None
    """When its liveness lease runs out (None: it holds none)."""
    sessions: int
    """Sessions whose record says a connection on this node holds them."""


def node_statuses(storage: Storage, at_us: int) -> list[NodeStatus]:
    """Nodes holding a liveness lease, fresh or not, and nodes that session
    records name as holding a connection."""
    sessions = SessionStore(storage)
    leases = sessions.node_leases()
    holding = Counter(s.record.node for s in sessions.all() if s.record.connected and s.record.node)
    out = []
    for node in sorted(set(leases) | set(holding)):
        lease = leases.get(node)
        out.append(
            NodeStatus(
                node,
                lease is not None and not lease.expired(at_us),
                None if lease is None else lease.expires_us,
                holding[node],
            )
        )
    return out


def collect(storage: Storage, at_us: int) -> dict[str, Any]:
    """Everything `status` shows, as JSON-ready values."""
    nodes = node_statuses(storage, at_us)
    up = {n.node for n in nodes if n.up}
    records = [s.record for s in SessionStore(storage).all()]
    online = sum(1 for r in records if r.connected and r.node in up)

    heads: dict[str, list[Any]] = {}
    for head in storage.list_streams():
        heads.setdefault(head.stream.topic, []).append(head)
    topics = []
    for record in storage.list_topics():
        generations = storage.list_storage_topics(record.name)
        streams = heads.get(record.name, [])
        topics.append(
            {
                "name": record.name,
                "partitions": generations[record.produce_pointer].partitions,
                "messages": sum(h.next_offset - h.start_offset for h in streams),
                "appended": sum(h.next_offset for h in streams),
            }
        )

    deliveries = {d.name for d in Definitions(storage).list()}
    subscriptions = []
    retry = parked = 0
    lags = Subscriptions(storage)
    # Not the `$`-named cursors of sessions and shared groups: counted with those.
    for sub in storage.list_subscriptions(named_only=True):
        try:
            lag = sum(s.lag for s in lags.lag(sub.name))
        except NotFound:
            continue  # deleted meanwhile
        row: dict[str, Any] = {"name": sub.name, "topic": sub.topic, "lag": lag}
        if sub.name in deliveries:
            row["retry_queue"], row["dead_letter_queue"] = queue_depths(storage, sub.name)
            retry += row["retry_queue"]
            parked += row["dead_letter_queue"]
        subscriptions.append(row)

    groups = GroupStore(storage)
    shared = []
    for group in sorted(groups.list(), key=lambda g: g.group.key):
        leader = groups.leader_of(group.group, at_us)
        shared.append(
            {
                "group": group.group.name,
                "filter": group.group.topic_filter,
                "leader": None if leader is None else leader.owner,
                "lag": sum(p.lag for p in group_progress(storage, group)),
            }
        )

    return {
        "database": redact_url(storage.url),
        "at": format_time(at_us),
        "broker": {"up": bool(up), "nodes_up": len(up), "nodes": len(nodes)},
        "nodes": [
            {
                "node": n.node,
                "up": n.up,
                "lease_expires": None
                if n.lease_expires_us is None
                else format_time(n.lease_expires_us),
                "lease_seconds_left": None
                if n.lease_expires_us is None
                else round((n.lease_expires_us - at_us) / 1e6, 1),
                "address": None,
                "sessions": n.sessions,
            }
            for n in nodes
        ],
        "sessions": {"total": len(records), "online": online, "offline": len(records) - online},
        "topics": topics,
        "subscriptions": subscriptions,
        "groups": shared,
        "queues": {"retry": retry, "dead_letter": parked},
    }


@cli.command("status")
@json_option
@db_option
def status(as_json: bool) -> None:
    """Show whether the broker is up, its nodes, sessions, topics and lag.

    Read from the database, so it works with the broker stopped too; it
    changes nothing.
    """
    storage = open_storage_of_command()  # a database that is not there is refused
    try:
        info = collect(storage, now_us())
    finally:
        storage.close()
    if as_json:
        print_json(info)
    else:
        _print(info)


def _lease_text(node: dict[str, Any]) -> str:
    left = node["lease_seconds_left"]
    if left is None:
        return "holds no lease"
    if left > 0:
        return f"fresh, expires in {left:g}s"
    return f"expired {-left:g}s ago"


def _print(info: dict[str, Any]) -> None:
    console = make_console()
    broker = info["broker"]
    if broker["up"]:
        state = f"up ({broker['nodes_up']} of {broker['nodes']} nodes with a fresh lease)"
    elif broker["nodes"]:
        state = f"down (none of {broker['nodes']} known nodes has a fresh lease)"
    else:
        state = "down (no broker node holds a lease)"
    console.print(f"database: {info['database']}", markup=False)
    console.print(f"broker: {state}", markup=False)
    if info["nodes"]:
        console.print(
            make_table(
                "Nodes",
                ["node", "state", "lease", "sessions held"],
                [
                    [n["node"], "up" if n["up"] else "down", _lease_text(n), n["sessions"]]
                    for n in info["nodes"]
                ],
            )
        )
    sessions = info["sessions"]
    console.print(
        f"sessions: {sessions['total']} ({sessions['online']} online,"
        f" {sessions['offline']} offline)",
        markup=False,
    )
    console.print(
        make_table(
            "Topics",
            ["topic", "partitions", "messages", "appended"],
            [[t["name"], t["partitions"], t["messages"], t["appended"]] for t in info["topics"]],
        )
    )
    if info["subscriptions"]:
        console.print(
            make_table(
                "Subscriptions",
                ["subscription", "topic", "lag", "retry queue", "dead-letter queue"],
                [
                    [
                        s["name"],
                        s["topic"],
                        s["lag"],
                        s.get("retry_queue"),
                        s.get("dead_letter_queue"),
                    ]
                    for s in info["subscriptions"]
                ],
            )
        )
    if info["groups"]:
        console.print(
            make_table(
                "Shared subscription groups",
                ["group", "filter", "leader", "lag"],
                [[g["group"], g["filter"], g["leader"], g["lag"]] for g in info["groups"]],
            )
        )
    queues = info["queues"]
    console.print(
        f"dead-letter queues: {queues['dead_letter']} parked; retry queues:"
        f" {queues['retry']} waiting",
        markup=False,
    )
