"""`riverbed cluster ...`: the broker nodes sharing one database.

- `status`: every node alive (its liveness lease fresh) or lapsed, with what
  it says about itself in the node directory (`cluster/directory.py`: its
  listeners, start, process, version, connections at its last sweep), the
  sessions marked connected on it and the shared-subscription Leaders it
  holds. Read-only; the same view as `GET /api/v1/nodes`.
- `drain NODE`: ask a running node to hand its work to the others and exit
  (a rolling upgrade): it closes its listeners, sends its MQTT 5 clients
  DISCONNECT 0x9C Use another server (with `[cluster] server_reference`),
  closes its MQTT 3.1.1 clients' connections, saves their sessions, hands
  its Leaders over, releases its lease and exits 0. The request is an entry
  in the node directory that the node looks for at every expiry sweep (so it
  works on SQLite too, where the one node drains within a sweep); on
  PostgreSQL the node is also told at once over the nodes' bus. The command
  waits until the node released its lease, or `--timeout`. A node that is
  not alive is refused, and nothing is asked.
"""

from __future__ import annotations

import os
import time
from typing import Any

import click

from riverbed.cli._app import (
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_storage_of_command,
    plural,
    print_json,
)
from riverbed.clock import now_us
from riverbed.cluster.directory import Directory
from riverbed.errors import NotFound, PreconditionFailed, RiverbedError
from riverbed.sessions.store import SessionStore
from riverbed.storage import Storage

DRAIN_TIMEOUT = 60.0
"""Seconds `cluster drain` waits by default: its clients' sessions saved and
its Leaders handed over take a few seconds; `limits.stop_grace` bounds them."""
DRAIN_POLL = 0.2
"""Seconds between two looks at the draining node's lease."""


@cli.group()
def cluster() -> None:
    """Broker nodes sharing one database: see them, drain one (docs/cluster.md)."""


@cluster.command("status")
@json_option
@db_option
def cluster_status(as_json: bool) -> None:
    """Show the broker nodes, alive or lapsed, with their listeners, start,
    connections, sessions and shared-subscription Leaders. Changes nothing."""
    from riverbed.http.nodes import cluster_nodes

    storage = open_storage_of_command()
    try:
        nodes = cluster_nodes(storage, now_us())
    finally:
        storage.close()
    if as_json:
        print_json(nodes)
        return
    console = make_console()
    if not nodes:
        console.print("no broker node on this database", markup=False)
        return
    rows = [
        [
            n["node"],
            _state(n),
            " ".join(n["addresses"]) or None,
            n["started_at"],
            n["pid"],
            n["connections"],
            n["sessions"],
            n["leaders"],
        ]
        for n in nodes
    ]
    columns = ["node", "state", "listeners", "started", "pid", "connections", "sessions"]
    console.print(make_table("Broker nodes", [*columns, "leaders"], rows))


def _state(node: dict[str, Any]) -> str:
    if node["alive"]:
        return "alive"
    return "lapsed" if node["owner"] is not None else "no lease"


@cluster.command("drain")
@click.argument("node")
@click.option(
    "--timeout",
    type=click.FloatRange(0, 3600, min_open=True),
    default=DRAIN_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the node to release its lease (more than 0, at most 3600).",
)
@db_option
def cluster_drain(node: str, timeout: float) -> None:
    """Have NODE send its clients to the other nodes, hand its work over and exit.

    NODE closes its listeners, sends its MQTT 5 clients DISCONNECT 0x9C Use
    another server (with [cluster] server_reference), closes its MQTT 3.1.1
    clients' connections, saves their sessions, hands its shared-subscription
    Leaders over, releases its lease and exits 0. Waits until then, or
    --timeout seconds.
    """
    storage = open_storage_of_command()
    try:
        _drain(storage, node, timeout)
    finally:
        storage.close()


def _drain(storage: Storage, node: str, timeout: float) -> None:
    store = SessionStore(storage)
    directory = Directory(storage)
    at = now_us()
    lease = store.node_lease(node)
    if lease is None:
        alive = sorted(n for n, lease in store.node_leases().items() if not lease.expired(at))
        raise NotFound(
            f"no broker node {node!r} holds a lease on this database (alive: "
            f"{', '.join(alive) or 'none'}; see riverbed cluster status)"
        )
    if lease.expired(at):
        ago = (at - lease.expires_us) / 1e6
        raise PreconditionFailed(
            f"broker node {node!r} is not alive: its lease lapsed {ago:.0f} s ago; nothing to drain"
        )
    directory.request_drain(node, at)
    told = storage.networked and _tell(storage, node)
    how = "told it over the database" if told else "it looks at its next expiry sweep"
    click.echo(f"asked node {node} to drain ({how}); waiting up to {timeout:g} s", err=True)
    deadline = time.monotonic() + timeout
    while True:
        lease = store.node_lease(node)
        if lease is None:
            break
        if lease.expired(now_us()):
            raise RiverbedError(
                f"broker node {node!r} stopped renewing its lease without releasing it: it"
                " died while draining (its clients' sessions stay; other nodes take over its"
                " duties)"
            )
        if time.monotonic() >= deadline:
            raise RiverbedError(
                f"broker node {node!r} has not drained within {timeout:g} s (it still holds"
                " its lease; the request stays, and the node drains when it finds it: see"
                " riverbed cluster status)"
            )
        time.sleep(DRAIN_POLL)
    done = directory.drain_request(node)
    directory.clear_drain(node)
    if done is None or done.done_us is None:
        click.echo(f"node {node} released its lease (it stopped)")
        return
    click.echo(
        f"node {node} drained: {plural(done.connections, 'client connection')} asked to move,"
        f" {plural(done.leaders, 'shared-subscription Leader')} handed over; its lease released"
    )


def _tell(storage: Storage, node: str) -> bool:
    """Tell `node` over the nodes' bus to look for its drain request now."""
    from riverbed.cluster.bus import NodeBus

    bus = NodeBus(storage.url, f"riverbed-cli-{os.getpid()}", lambda _message: None)
    try:
        return bus.send(node, {"kind": "drain"})
    finally:
        bus.close()
