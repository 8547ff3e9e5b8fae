"""What a message costs a broker with a fleet of idle subscribers online:
Riverbed beside mosquitto (issue 17, a lean hot path).

A fleet's devices each subscribe to a topic of their own (`devices/<i>/cmd`)
and mostly wait; telemetry flows past them. A message that matches none of a
session's subscriptions should cost that session nothing. Raw MQTT 5 clients
(the project's codec), against each broker on a fresh store, in this order:

  a. alone: one publisher sends `--messages` QoS 1 PUBLISHes to
     `telemetry/<j % 100>` (nobody subscribes), up to 100 unacknowledged;
     the broker's CPU per message;
  b. idle: `--idle` persistent sessions connect (Session Expiry 1 day) and
     each subscribes to its own `devices/<i>/cmd` at QoS 1, `--concurrency`
     at a time, and stay connected; then the same publishing as in (a): CPU
     per message, and what each 1,000 idle sessions add to it;
  c. commands: one QoS 1 message to each of the first `--commands` idle
     sessions; each must receive its own, and only it.

    .venv/bin/python bench/idle_subscribers.py [--idle 2000] [--messages 20000]
        [--commands 200] [--brokers riverbed,mosquitto] [--riverbed-db sqlite|postgres]

Brokers as `bench/mqtt.py` runs them (Riverbed `riverbed serve` on SQLite in a
temp dir, or on a throwaway PostgreSQL server; mosquitto with persistence on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.postgres import PostgresServer
from harness.raw_mqtt import AsyncRawClient, RawClient
from mqtt import Broker, Mosquitto, Riverbed  # bench/mqtt.py
from riverbed.mqtt.codec import Puback, Publish


class MosquittoNoDelay(Mosquitto):
    """mosquitto with `set_tcp_nodelay true`: its PUBACKs go out at once, not
    behind Nagle's algorithm waiting for the client's delayed ACK (without it
    a window of PUBLISHes here is answered about every 20 ms: 2,273 msg/s)."""

    def settings(self) -> str:
        return super().settings() + "set_tcp_nodelay true\n"


EXPIRY = 86_400
TIMEOUT = 60.0


def publish(port: int, count: int, client_id: str) -> float:
    """`count` QoS 1 PUBLISHes nobody subscribes to; the seconds they took."""
    with RawClient(port, timeout=TIMEOUT) as c:
        # Each window's PUBLISHes go out at once, not behind Nagle's algorithm
        # waiting for the broker's delayed ACK.
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.connect(client_id, clean=True)
        t = time.perf_counter()
        c.publish_many((f"telemetry/{j % 100}", b"t" * 64) for j in range(count))
        return time.perf_counter() - t


async def connect_idle(port: int, count: int, concurrency: int) -> list[AsyncRawClient]:
    gate = asyncio.Semaphore(concurrency)
    clients: list[AsyncRawClient] = [None] * count  # type: ignore[list-item]

    async def one(i: int) -> None:
        async with gate:
            c = await AsyncRawClient.open(port, TIMEOUT)
            ack = await c.connect(f"device-{i:06d}", expiry=EXPIRY)
            if ack.reason_code:
                raise RuntimeError(f"device {i}: {ack!r}")
            granted = await c.subscribe(f"devices/{i}/cmd", 1)
            if granted.reason_codes[0] != 1:
                raise RuntimeError(f"device {i}: {granted!r}")
            clients[i] = c

    await asyncio.gather(*(one(i) for i in range(count)))
    return clients


async def commands(port: int, clients: list[AsyncRawClient]) -> None:
    """One QoS 1 message to each of `clients`' own topic; each gets its own."""
    sender = await AsyncRawClient.open(port, TIMEOUT)
    await sender.connect("commander", expiry=0)
    for i in range(len(clients)):
        sender.send(Publish(f"devices/{i}/cmd", b"%d" % i, qos=1, packet_id=i % 0xFFFF + 1))
        await sender.expect(Puback)
    for i, c in enumerate(clients):
        got = await c.expect(Publish)
        if got.topic != f"devices/{i}/cmd" or got.payload != b"%d" % i:
            raise RuntimeError(f"device {i} got {got.topic} {got.payload!r}")
        if got.packet_id is not None:
            c.send(Puback(got.packet_id))
    sender.close()


def run_broker(broker: Broker, args: argparse.Namespace) -> dict[str, float]:
    """CPU µs per message alone and with the idle fleet online."""
    out: dict[str, float] = {}
    broker.start()
    try:
        publish(broker.port, 2000, "warm-up")
        cpu = broker.cpu()
        seconds = publish(broker.port, args.messages, "telemetry-a")
        out["alone"] = (broker.cpu() - cpu) / args.messages * 1e6
        print(
            f"  alone        {args.messages / seconds:8.0f} msg/s   CPU {out['alone']:7.1f} us/msg",
            flush=True,
        )

        async def with_fleet() -> None:
            t = time.perf_counter()
            clients = await connect_idle(broker.port, args.idle, args.concurrency)
            print(f"  {args.idle} idle sessions online in {time.perf_counter() - t:.1f} s")
            cpu = broker.cpu()
            seconds = await asyncio.to_thread(publish, broker.port, args.messages, "telemetry-b")
            out["idle"] = (broker.cpu() - cpu) / args.messages * 1e6
            per_k = (out["idle"] - out["alone"]) / args.idle * 1000
            print(
                f"  idle {args.idle:>6}  {args.messages / seconds:8.0f} msg/s"
                f"   CPU {out['idle']:7.1f} us/msg   (+{per_k:.2f} us per 1,000 idle)",
                flush=True,
            )
            t = time.perf_counter()
            await asyncio.wait_for(commands(broker.port, clients[: args.commands]), TIMEOUT)
            print(
                f"  commands     {args.commands} delivered, each to its own device,"
                f" in {time.perf_counter() - t:.2f} s",
                flush=True,
            )
            for c in clients:
                c.close()

        asyncio.run(with_fleet())
    except Exception as exc:
        print(f"  ! {broker.name} failed: {exc!r}\n{broker.tail()}", flush=True)
    finally:
        broker.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--idle", type=int, default=2000)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--commands", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--brokers", default="riverbed,mosquitto")
    p.add_argument("--riverbed-db", choices=["sqlite", "postgres"], default="sqlite")
    args = p.parse_args()
    args.commands = min(args.commands, args.idle)
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {os.getloadavg()[0]:.2f}; {args.idle} idle sessions, {args.messages} messages;"
        f" Riverbed on {args.riverbed_db}",
        flush=True,
    )
    kinds: dict[str, type[Broker]] = {"riverbed": Riverbed, "mosquitto": MosquittoNoDelay}
    results: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        if args.riverbed_db == "postgres" and "riverbed" in args.brokers:
            server = PostgresServer()
            server.start()
            stack.callback(server.stop)
            Riverbed.db_url = server.new_database("bench_idle")
        for name in args.brokers.split(","):
            workdir = Path(tempfile.mkdtemp(prefix=f"bench-idle-{name}-"))
            print(f"-- {name}: {workdir}", flush=True)
            results[name] = run_broker(kinds[name](workdir), args)
            shutil.rmtree(workdir, ignore_errors=True)
    r, m = results.get("riverbed", {}), results.get("mosquitto", {})
    if "idle" in r and "idle" in m:
        print("\n== Riverbed / mosquitto, broker CPU per message")
        print(f"  alone  {r['alone'] / m['alone']:5.2f}")
        print(f"  idle   {r['idle'] / m['idle']:5.2f}   (with {args.idle} idle sessions online)")


if __name__ == "__main__":
    main()
