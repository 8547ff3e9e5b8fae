"""Broker nodes on one PostgreSQL with names and timings a test chooses.

    with named_node(url, tmp_path, "node-a") as a:   # [cluster] node_name = "node-a"
        ...
        a.kill(); a.start()                          # comes back with the same name

A node runs `tests/harness/node.py` (the broker's timings as options): an
expiry sweep every `SWEEP` seconds and a liveness lease of `SHORT_LEASE`
seconds, so that a test can wait out a dead node's lease.
"""

from __future__ import annotations

from pathlib import Path

from harness.broker import BrokerProcess
from riverbed.sessions.store import node_lease
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases

NODE = Path(__file__).resolve().parent / "node.py"
SWEEP = 1.0
"""Seconds between two expiry sweeps (each renews the node's lease)."""
SHORT_LEASE = 6.0
"""Seconds a node's liveness lease lasts unrenewed: short enough to wait out,
long enough that a loaded machine renews it in time (a node that cannot
fences itself and refuses CONNECTs with 0x89)."""


def named_node(
    url: str,
    directory: Path,
    name: str,
    *,
    config: str = "",
    extra_args: tuple[str, ...] = (),
    http: bool = False,
    **options: float,
) -> BrokerProcess:
    """A broker node named `name` (with `config`'s further TOML lines)."""
    path = directory / f"{name}.toml"
    path.write_text(f'[cluster]\nnode_name = "{name}"\n{config}')
    timings = {"expiry_sweep": SWEEP, "node_lease_ttl": SHORT_LEASE, **options}
    launcher: list[str] = [str(NODE)]
    for option, value in timings.items():
        launcher += [f"--{option.replace('_', '-')}", str(value)]
    return BrokerProcess(
        url,
        launcher=tuple(launcher),
        extra_args=("--config", str(path), *extra_args),
        http=http,
    )


def lease_of(url: str, node: str) -> int:
    """When a node's liveness lease expires (µs since the epoch)."""
    storage = open_storage(url)
    try:
        lease = Leases(storage).get(node_lease(node))
    finally:
        storage.close()
    assert lease is not None, f"node {node} holds no lease"
    return lease.expires_us
