"""Several `riverbed serve` nodes on one PostgreSQL (issue 19).

One throwaway PostgreSQL server (tests/harness/postgres.py) and up to three
Riverbed nodes on it, each `riverbed serve` on a loopback port with the same
database (bench/mqtt.py's `Riverbed`). Clients are bench/mqtt.py's paho
publisher and subscriber processes (100-byte QoS 1 messages carrying their
send time) and, for takeover and failover, bench/sessions.py's raw MQTT 5
clients in this process. In this order:

  a. latency: 2 nodes A and B; `--paced` messages at `--rate` msg/s published
     on A, received by the persistent subscriber on A (same node) and on B
     (cross node), `--rounds` times each in turn; end-to-end p50/p99 (receive time -
     send time), and the nodes' CPU per message. Target: cross node p50 <= 5 ms
     and p99 <= 20 ms at 1,000 msg/s;
  b. throughput: with 1, 2 and 3 nodes, one publisher per node at full speed
     (`--messages` in all, split among them) and the subscriber on the first;
     acknowledged publishes/s and delivered msg/s. On 2 cores every node, the
     clients and PostgreSQL share them: it need not rise with the nodes;
  c. takeover: `--takeovers` times, a client connected on one node (clean
     start 0, subscribed, receiving the paced stream published on A) connects
     again with the same client id on the other node: the time from CONNECT to
     CONNACK and to its first message there;
  d. failover: `--clients` clients connected on A (publisher on B, paced);
     SIGKILL of A; each client connects again to B at once (same id, clean
     start 0): the time from the kill until each has its CONNACK and its first
     message again (p50, max).

    .venv/bin/python bench/cluster.py [--paced 5000] [--rate 1000] [--rounds 2]
        [--messages 20000] [--takeovers 10] [--clients 20]
        [--phases latency,throughput,takeover,failover] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.postgres import PostgresServer
from mqtt import TOPIC, Riverbed, Run  # bench/mqtt.py
from riverbed.mqtt.codec import Puback, Publish
from sessions import Client, Refused, pct  # bench/sessions.py

TARGET_P50 = 0.005
TARGET_P99 = 0.020
TIMEOUT = 60.0


class Node(Riverbed):
    """One `riverbed serve` of the cluster, in a work directory of its own."""

    def __init__(self, workdir: Path, name: str) -> None:
        workdir.mkdir()
        self.name = name
        super().__init__(workdir)


@dataclass
class Delivery:
    """What one publisher -> subscriber run measured."""

    latencies: list[float]
    """Seconds, one per message received."""
    received: int
    sent: int
    cpu: dict[str, float]
    """Node name -> its CPU seconds during the run."""

    def line(self) -> str:
        cpu = ", ".join(f"{n} {s / self.sent * 1e6:.0f}" for n, s in self.cpu.items())
        return (
            f"p50 {pct(self.latencies, 0.5) * 1e3:6.1f} ms   p99"
            f" {pct(self.latencies, 0.99) * 1e3:6.1f} ms   received {self.received}/{self.sent}"
            f"   node CPU µs/msg: {cpu}"
        )


class Cluster:
    """The nodes, and one sequence of message numbers for every run."""

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir = workdir
        self.args = args
        self.nodes: list[Node] = []
        self.next_seq = 0

    def add(self) -> Node:
        node = Node(self.workdir / f"node{len(self.nodes) + 1}", "ABC"[len(self.nodes)])
        node.start()
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
            node.kill()

    def numbers(self, count: int) -> int:
        first = self.next_seq
        self.next_seq += count
        return first

    def deliver(self, pub: Node, sub: Node, count: int, rate: float) -> Delivery:
        """`count` messages published on `pub` at `rate`/s (0: full speed) to the
        subscriber on `sub`."""
        first = self.numbers(count)
        sub_proc, out = Run(sub, self.args).sub_start(
            first, count, subscribe=True, idle=15, timeout=600
        )
        publisher = Run(pub, self.args)
        publisher.next_seq = first
        before = {n.name: n.cpu() for n in self.nodes if n.process and n.process.poll() is None}
        publisher.pub(count, rate)
        got = Run.finish(sub_proc, out)
        cpu = {n.name: n.cpu() - before[n.name] for n in self.nodes if n.name in before}
        mine = [
            lat / 1e9
            for seq, lat in zip(got["got"], got["lat"], strict=True)
            if first <= seq < first + count
        ]
        return Delivery(mine, len(mine), count, cpu)

    def throughput(self, count: int) -> tuple[float, float]:
        """One publisher per node at full speed, `count` messages in all; the
        subscriber on the first node. (acknowledged/s, delivered/s)."""
        first = self.numbers(count)
        sub_proc, out = Run(self.nodes[0], self.args).sub_start(
            first, count, subscribe=True, idle=15, timeout=900
        )
        share = count // len(self.nodes)
        pubs: list[tuple[subprocess.Popen[str], Path]] = []
        start = first
        for i, node in enumerate(self.nodes):
            n = count - share * (len(self.nodes) - 1) if i == 0 else share
            pubs.append(
                Run(node, self.args)._role("pub", first=start, count=n, rate=0, timeout=900)
            )
            start += n
        results = [Run.finish(proc, path) for proc, path in pubs]
        got = Run.finish(sub_proc, out)
        begin = min(r["start_ns"] for r in results)
        acked = sum(len(r["acked"]) for r in results)
        published = acked / ((max(r["end_ns"] for r in results) - begin) / 1e9)
        received = len({s for s in got["got"] if first <= s < first + count})
        delivered = received / ((got["last_ns"] - begin) / 1e9) if got["last_ns"] else 0.0
        if received < count:
            print(f"  ! the subscriber received {received}/{count}", flush=True)
        return published, delivered


# --- takeover and failover: raw MQTT 5 clients in this process ---------------------------


class Subscriber(Client):
    """A bench/sessions.py client that takes messages (QoS 1, acknowledged)."""

    async def first_message(self) -> None:
        """Wait for a PUBLISH; acknowledge it."""
        while True:
            packet = await self.next()
            if isinstance(packet, Publish):
                # Not into a connection that broke (a killed node): asyncio
                # would log each write.
                if packet.qos and packet.packet_id is not None and not self.writer.is_closing():
                    self.send(Puback(packet.packet_id))
                return

    async def drain(self) -> None:
        """Acknowledge what comes until the connection closes."""
        with contextlib.suppress(Refused, ConnectionError):
            while True:
                await self.first_message()


async def joined(port: int, client_id: str) -> tuple[Subscriber, float, float]:
    """Connect (clean start 0) and subscribe if new; (client, when its CONNACK
    came, when its first message came: `time.perf_counter()`)."""
    client = await Subscriber.open(port, TIMEOUT)
    present = await client.connect_session(client_id)
    connack = time.perf_counter()
    if not present:
        await client.subscribe_or_refuse(TOPIC)
    await asyncio.wait_for(client.first_message(), TIMEOUT)
    return client, connack, time.perf_counter()


def paced_publisher(cluster: Cluster, node: Node, seconds: float) -> subprocess.Popen[str]:
    """bench/mqtt.py's publisher at `--rate` on `node` for about `seconds`."""
    count = int(cluster.args.rate * seconds)
    proc, _ = Run(node, cluster.args)._role(
        "pub", first=cluster.numbers(count), count=count, rate=cluster.args.rate, timeout=900
    )
    return proc


async def takeovers(a: Node, b: Node, times: int) -> tuple[list[float], list[float]]:
    """A client on one node connects again on the other, `times` times."""
    connacks: list[float] = []
    firsts: list[float] = []
    client, _, _ = await joined(a.port, "bench-takeover")
    here = a
    for _ in range(times):
        there = b if here is a else a
        old = asyncio.create_task(client.drain())
        t = time.perf_counter()
        client_there, connack, first = await joined(there.port, "bench-takeover")
        connacks.append(connack - t)
        firsts.append(first - t)
        client.close()
        await old
        client, here = client_there, there
    client.close()
    return connacks, firsts


async def failover(a: Node, b: Node, count: int) -> tuple[list[float], list[float]]:
    """`count` clients on `a`; SIGKILL `a`; each connects again to `b` at once.
    Seconds from the kill to each one's CONNACK and first message on `b`."""
    ids = [f"bench-failover-{i:03d}" for i in range(count)]
    clients = [c for c, _, _ in await asyncio.gather(*(joined(a.port, i) for i in ids))]
    connacks: list[float] = []
    firsts: list[float] = []
    killed = asyncio.get_running_loop().create_future()

    async def fail_over(client: Subscriber, client_id: str) -> None:
        await client.drain()  # until the broker is gone
        await killed
        client.close()
        again, connack, first = await joined(b.port, client_id)
        connacks.append(connack - killed.result())
        firsts.append(first - killed.result())
        again.close()

    tasks = [asyncio.create_task(fail_over(c, i)) for c, i in zip(clients, ids, strict=True)]
    await asyncio.sleep(0.5)  # a steady stream to all of them
    at = time.perf_counter()
    a.kill()
    killed.set_result(at)
    await asyncio.wait_for(asyncio.gather(*tasks), 5 * TIMEOUT)
    return connacks, firsts


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def spread(values: list[float]) -> str:
    return f"p50 {ms(pct(values, 0.5))}, max {ms(max(values))}"


def verdict(ok: bool, rule: str) -> str:
    return f"  ok ({rule})" if ok else f"  MISSED ({rule})"


PHASES = ("latency", "throughput", "takeover", "failover")


def run(cluster: Cluster, args: argparse.Namespace) -> None:
    a, b = cluster.add(), cluster.add()
    cluster.deliver(a, a, 500, 0)  # the subscriber's session, warm caches (not measured)
    cluster.deliver(a, b, 500, 0)
    if "latency" in args.phases:
        latency(cluster, args, a, b)
    if "throughput" in args.phases:
        throughput(cluster, args)
    if "takeover" in args.phases:
        takeover(cluster, args, a, b)
    if "failover" in args.phases:
        failover_phase(cluster, args, a, b)


def latency(cluster: Cluster, args: argparse.Namespace, a: Node, b: Node) -> None:
    print(f"\n== a. end-to-end latency, {args.paced} messages at {args.rate:,.0f}/s", flush=True)
    same: list[Delivery] = []
    cross: list[Delivery] = []
    for _ in range(args.rounds):
        same.append(cluster.deliver(a, a, args.paced, args.rate))
        print(f"  same node  (A -> A)  {same[-1].line()}", flush=True)
        cross.append(cluster.deliver(a, b, args.paced, args.rate))
        print(f"  cross node (A -> B)  {cross[-1].line()}", flush=True)
    same_lat = [x for d in same for x in d.latencies]
    cross_lat = [x for d in cross for x in d.latencies]
    p50, p99 = pct(cross_lat, 0.5), pct(cross_lat, 0.99)
    print(
        f"  cross node p50 {ms(p50)}{verdict(p50 <= TARGET_P50, '<= 5 ms')},"
        f" p99 {ms(p99)}{verdict(p99 <= TARGET_P99, '<= 20 ms')}"
    )
    print(
        f"  cross / same node: p50 {p50 / pct(same_lat, 0.5):.2f}x"
        f" ({ms(pct(same_lat, 0.5))} same), p99 {p99 / pct(same_lat, 0.99):.2f}x"
        f" ({ms(pct(same_lat, 0.99))} same)",
        flush=True,
    )


def throughput(cluster: Cluster, args: argparse.Namespace) -> None:
    print(
        f"\n== b. throughput, {args.messages} messages at full speed, one publisher per node"
        f" (on {os.cpu_count()} cores the nodes, clients and PostgreSQL share the CPUs:"
        " it need not rise with the nodes)",
        flush=True,
    )
    rates: dict[int, tuple[float, float]] = {}
    for n in (1, 2, 3):
        while len(cluster.nodes) < n:
            cluster.add()
        nodes, cluster.nodes = cluster.nodes, cluster.nodes[:n]
        try:
            rates[n] = cluster.throughput(args.messages)
        finally:
            cluster.nodes = nodes
        acked, delivered = rates[n]
        print(
            f"  {n} node{'s' if n > 1 else ' '}  {acked:8,.0f} publishes/s acknowledged"
            f"  {delivered:8,.0f} msg/s delivered"
            f"  ({acked / rates[1][0]:.2f}x / {delivered / rates[1][1]:.2f}x one node)",
            flush=True,
        )


def takeover(cluster: Cluster, args: argparse.Namespace, a: Node, b: Node) -> None:
    print(f"\n== c. takeover A <-> B, {args.takeovers} times, stream at {args.rate:,.0f}/s on A")
    publisher = paced_publisher(cluster, a, 3 + args.takeovers * 2)
    try:
        connacks, firsts = asyncio.run(takeovers(a, b, args.takeovers))
    finally:
        publisher.kill()
        publisher.wait()
    print(f"  CONNECT -> CONNACK        {spread(connacks)}")
    print(f"  CONNECT -> first message  {spread(firsts)}", flush=True)


def failover_phase(cluster: Cluster, args: argparse.Namespace, a: Node, b: Node) -> None:
    print(f"\n== d. failover: {args.clients} clients on A, SIGKILL A, they connect to B")
    publisher = paced_publisher(cluster, b, 120)
    try:
        connacks, firsts = asyncio.run(failover(a, b, args.clients))
    finally:
        publisher.kill()
        publisher.wait()
    print(f"  kill -> CONNACK on B        {spread(connacks)}")
    print(f"  kill -> first message on B  {spread(firsts)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--paced", type=int, default=5000, help="messages per latency run")
    p.add_argument("--rate", type=float, default=1000.0, help="paced rate, msg/s")
    p.add_argument("--messages", type=int, default=20_000, help="messages per throughput run")
    p.add_argument("--takeovers", type=int, default=10)
    p.add_argument("--clients", type=int, default=20, help="clients of the killed node")
    p.add_argument("--rounds", type=int, default=2, help="latency runs of each kind, in turn")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"which to run, of {','.join(PHASES)} (the order is always that)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = p.parse_args()
    args.phases = args.phases.split(",")
    for phase in args.phases:
        if phase not in PHASES:
            p.error(f"--phases {phase!r}: each must be one of {', '.join(PHASES)}")
    args.transport = "tcp"
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    on_postgres("cluster", args, lambda cluster, _url: run(cluster, args))


def on_postgres(name: str, args: argparse.Namespace, body: Callable[[Cluster, str], None]) -> None:
    """Run `body(cluster, database URL)` with a throwaway PostgreSQL server and
    a `Cluster` of no nodes yet on one database of it; stop everything after
    (`args.keep`: keep the work directory, with the nodes' logs)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    server = PostgresServer()
    server.start()
    url = Riverbed.db_url = server.new_database(f"bench_{name}")
    cluster = Cluster(workdir, args)
    try:
        body(cluster, url)
    finally:
        cluster.stop()
        server.stop()
        print(f"\nload after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.keep:
            print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
