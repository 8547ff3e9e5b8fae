"""A fleet on one machine: many stored sessions, many connected clients, and a
full restart of every node (issue 19, scale).

One throwaway PostgreSQL server and `--nodes` Riverbed nodes on it
(bench/cluster.py's `Cluster`); raw MQTT 5 clients on asyncio in this process
(tests/harness/raw_mqtt.py), spread round robin over the nodes. In this order:

  a. store: `--stored` persistent sessions made (CONNECT clean start 0 with a
     1-day Session Expiry Interval, SUBSCRIBE `fleet/<i>` QoS 1, DISCONNECT),
     `--concurrency` at a time; the rate, and the nodes' memory (RSS) and the
     database's size per stored session;
  b. connect: the first `--connected` of them connect again and stay; the
     nodes' memory per connected client;
  c. backlog: one QoS 1 message to each of `--sample` offline sessions (spread
     over the ones not connected), published while they are away;
  d. restart: every node stopped (SIGTERM; `--kill`: SIGKILL) and started
     again; then the connected clients come back at once and the sampled
     offline sessions resume (at most `--concurrency` CONNECTs waiting at a
     time, all with Session Present 1), each sample receiving its backlog
     message. Reported from the moment the last node listens: when every
     connected client has its CONNACK, when every sample has its message.
     Target: all of them within 10 s of the nodes listening.

    .venv/bin/python bench/fleet.py [--nodes 2] [--stored 100000]
        [--connected 10000] [--sample 1000] [--concurrency 500] [--kill] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, Node, on_postgres  # bench/cluster.py
from harness.raw_mqtt import AsyncRawClient
from riverbed.mqtt.codec import Puback, Publish

EXPIRY = 86_400
TIMEOUT = 120.0
TARGET = 10.0


def client_id(i: int) -> str:
    return f"fleet-{i:06d}"


class Fleet:
    """The nodes and the clients' side of the benchmark."""

    def __init__(self, cluster: Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.gate = asyncio.Semaphore(args.concurrency)
        self.connected: dict[int, AsyncRawClient] = {}

    def node_for(self, i: int) -> Node:
        nodes = self.cluster.nodes
        return nodes[i % len(nodes)]

    async def open(self, i: int) -> tuple[AsyncRawClient, bool]:
        client = await AsyncRawClient.open(self.node_for(i).port, TIMEOUT)
        connack = await client.connect(client_id(i), expiry=EXPIRY)
        if connack.reason_code:
            raise RuntimeError(f"{client_id(i)}: CONNACK {connack!r}")
        return client, connack.session_present

    async def store(self, i: int) -> None:
        async with self.gate:
            client, _ = await self.open(i)
            suback = await client.subscribe(f"fleet/{i}")
            if suback.reason_codes != (1,):
                raise RuntimeError(f"{client_id(i)}: SUBACK {suback!r}")
            await client.leave()

    async def connect(self, i: int) -> None:
        async with self.gate:
            client, present = await self.open(i)
            if not present:
                raise RuntimeError(f"{client_id(i)}: Session Present 0")
            self.connected[i] = client

    async def publish_backlog(self, samples: list[int]) -> None:
        client = await AsyncRawClient.open(self.cluster.nodes[0].port, TIMEOUT)
        await client.connect("fleet-publisher", expiry=0)
        for n, i in enumerate(samples):
            client.send(Publish(f"fleet/{i}", b"backlog %d" % i, 1, packet_id=n % 60_000 + 1))
            await client.expect(Puback)
        await client.leave()

    async def resume_sample(self, i: int) -> float:
        """Resume offline session `i`; seconds until its backlog message came."""
        async with self.gate:
            client, present = await self.open(i)
        try:
            if not present:
                raise RuntimeError(f"{client_id(i)}: Session Present 0 after the restart")
            while True:
                packet = await client.next()
                if isinstance(packet, Publish):
                    if packet.payload != b"backlog %d" % i:
                        raise RuntimeError(f"{client_id(i)}: got {packet.payload!r}")
                    if packet.packet_id is not None:
                        client.send(Puback(packet.packet_id))
                    return time.perf_counter()
        finally:
            client.close()


def rss_mib(nodes: list[Node]) -> float:
    return sum(n.rss_mb() for n in nodes if n.process and n.process.poll() is None)


def database_bytes(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


async def run(cluster: Cluster, args: argparse.Namespace, url: str) -> None:
    fleet = Fleet(cluster, args)
    nodes = cluster.nodes
    base_rss = rss_mib(nodes)

    print(f"\n== a. store {args.stored:,} sessions, {args.concurrency} at a time", flush=True)
    t = time.perf_counter()
    await asyncio.gather(*(fleet.store(i) for i in range(args.stored)))
    took = time.perf_counter() - t
    stored_rss = rss_mib(nodes)
    print(f"  {args.stored / took:,.0f} sessions/s ({took:.1f} s)")
    print(
        f"  nodes' RSS {base_rss:.0f} -> {stored_rss:.0f} MiB:"
        f" {(stored_rss - base_rss) * 1024 / args.stored:.2f} KiB per stored offline session"
    )
    size = database_bytes(url)
    if size:
        print(f"  database {size / 2**20:.0f} MiB: {size / args.stored / 1024:.1f} KiB per session")

    print(f"\n== b. {args.connected:,} of them connect and stay", flush=True)
    t = time.perf_counter()
    await asyncio.gather(*(fleet.connect(i) for i in range(args.connected)))
    took = time.perf_counter() - t
    connected_rss = rss_mib(nodes)
    print(f"  {args.connected / took:,.0f} connections/s ({took:.1f} s)")
    print(
        f"  nodes' RSS {stored_rss:.0f} -> {connected_rss:.0f} MiB:"
        f" {(connected_rss - stored_rss) * 1024 / max(1, args.connected):.2f} KiB"
        " per connected client"
    )

    offline = range(args.connected, args.stored)
    step = max(1, len(offline) // max(1, args.sample))
    samples = list(offline[::step])[: args.sample]
    print(f"\n== c. a message to each of {len(samples):,} offline sessions", flush=True)
    await fleet.publish_backlog(samples)

    how = "SIGKILL" if args.kill else "SIGTERM"
    print(f"\n== d. restart every node ({how}), then everyone comes back", flush=True)
    for client in fleet.connected.values():
        client.close()
    fleet.connected.clear()
    t = time.perf_counter()
    # All at once, as an operator restarting the fleet would (each in a thread:
    # `stop` and `start` wait for their process).
    with ThreadPoolExecutor(len(nodes)) as each:
        list(each.map(Node.kill if args.kill else Node.stop, nodes))
        stopped = time.perf_counter()
        list(each.map(lambda node: node.start(timeout=300), nodes))
    listening = time.perf_counter()
    print(f"  stopped in {stopped - t:.1f} s, all listening {listening - stopped:.1f} s later")
    back: list[float] = []

    async def come_back(i: int) -> None:
        await fleet.connect(i)
        back.append(time.perf_counter())

    results = await asyncio.gather(
        asyncio.gather(*(come_back(i) for i in range(args.connected))),
        asyncio.gather(*(fleet.resume_sample(i) for i in samples)),
    )
    got = results[1]
    all_back = max(back) - listening if back else 0.0
    all_got = max(got) - listening if got else 0.0
    print(f"  every connected client back (Session Present 1) {all_back:.1f} s after listening")
    print(f"  every sampled offline session with its backlog  {all_got:.1f} s after listening")
    worst = max(all_back, all_got)
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"  target: all within {TARGET:.0f} s of the nodes listening: {verdict} ({worst:.1f} s)")
    for client in fleet.connected.values():
        client.close()


def raise_open_files() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--stored", type=int, default=100_000)
    p.add_argument("--connected", type=int, default=10_000)
    p.add_argument("--sample", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--kill", action="store_true", help="SIGKILL the nodes instead of SIGTERM")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = p.parse_args()
    if not 0 <= args.connected <= args.stored:
        p.error(f"--connected {args.connected} must be between 0 and --stored {args.stored}")
    args.transport = "tcp"
    raise_open_files()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.nodes} nodes,"
        f" {args.stored:,} stored sessions, {args.connected:,} connected",
        flush=True,
    )

    def body(cluster: Cluster, url: str) -> None:
        for _ in range(args.nodes):
            cluster.add()
        asyncio.run(run(cluster, args, url))

    on_postgres("fleet", args, body)


if __name__ == "__main__":
    main()
