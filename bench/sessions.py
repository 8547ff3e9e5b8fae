"""Sessions at the rate clients arrive (issue 17): Riverbed beside mosquitto.

Raw MQTT 5 clients on asyncio (the project's own codec, no paho threads), all
in this process, against each broker on a fresh store, in this order:

  a. sequential: `--sequential` persistent sessions made one after another,
     each CONNECT (clean start 0, Session Expiry Interval 1 day) + SUBSCRIBE
     (one filter, QoS 1) + DISCONNECT on a connection of its own; sessions/s,
     the p50/p99 of the whole exchange, and the median of each step the
     client waits for (TCP connection, CONNACK, SUBACK, close);
  b. stored: `--storm` sessions made the same way, `--concurrency` at a time
     (setting up the storm; its rate is printed too);
  c. storm: all `--storm` sessions come back at once, at most `--concurrency`
     CONNECTs waiting for their CONNACK at a time (a fleet after a network blip
     or a broker restart); every CONNACK must say Session Present 1. A client
     that has its CONNACK stays connected until all have theirs. Sessions/s
     (first CONNECT to last CONNACK), and CONNACK latency p50/p99 (from opening
     the TCP connection to the CONNACK);
  d. leave: the storm's clients send DISCONNECT together (the session saves
     at disconnect); time until every connection is closed by the broker.

Each phase also prints the broker's CPU time per session (utime + stime of its
pid), which a busy machine disturbs less than the rates; read once the broker
is idle again (what it does after the clients are done, such as saving the
sessions of closed connections, counts in its phase, and the next phase starts
on an idle broker).

Brokers: Riverbed (`riverbed serve`, SQLite in a temp dir, or a database on a
throwaway PostgreSQL server with `--riverbed-db postgres`), mosquitto (Debian
package, persistence on), started and stopped as `bench/mqtt.py` does; `floor`
(`bench/_floor_broker.py`: sessions in memory, nothing durable) for what a
Python broker on uvloop costs without writing anything, and `floor-durable`
(the same with `--durable`: each session's row in SQLite, its CONNACK, SUBACK
after the commit; with `--riverbed-db postgres`, in a database of its own on
the same PostgreSQL server, each commit one round trip) for what it costs
writing no more than Riverbed's guarantees need.

    .venv/bin/python bench/sessions.py [--sequential 2000] [--storm 5000] [--concurrency 500]
        [--brokers riverbed,mosquitto[,floor,floor-durable]] [--riverbed-db sqlite|postgres]

Targets (issue 17): Riverbed at least 0.5x mosquitto's rate in (a) and (c), and
CONNACK p99 at most 1 s in the storm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.postgres import PostgresServer
from harness.raw_mqtt import AsyncRawClient
from mqtt import Broker, Floor, FloorDurable, Mosquitto, Riverbed  # bench/mqtt.py

EXPIRY = 86_400
SETTLE_LOOK = 0.05
SETTLED = 0.002
"""CPU seconds per `SETTLE_LOOK` below which the broker counts as idle."""
SETTLE_MAX = 10.0
TIMEOUT = 60.0
FLOORS = {
    "floor": "a Python broker with sessions in memory",
    "floor-durable": "the same, its sessions' rows in the same database as Riverbed's",
}
"""The floor brokers, compared with mosquitto and Riverbed at the end."""


class Refused(Exception):
    pass


class Client(AsyncRawClient):
    """A raw client that refuses what a benchmark cannot count."""

    async def connect_session(self, client_id: str) -> bool:
        packet = await self.connect(client_id, expiry=EXPIRY)
        if packet.reason_code:
            raise Refused(f"{client_id}: {packet!r}")
        return packet.session_present

    async def subscribe_or_refuse(self, topic_filter: str) -> None:
        packet = await self.subscribe(topic_filter)
        if packet.reason_codes[0] != 1:
            raise Refused(f"SUBSCRIBE {topic_filter}: {packet!r}")


def client_id(i: int) -> str:
    return f"bench-session-{i:06d}"


STEPS = ("open", "CONNACK", "SUBACK", "close")
"""A session's steps as its client waits for them: the TCP connection, the
CONNECT's answer, the SUBSCRIBE's, the broker's close after DISCONNECT."""


async def make_session(port: int, i: int) -> tuple[float, ...]:
    """CONNECT + SUBSCRIBE + DISCONNECT for session `i`: the seconds each of
    `STEPS` took."""
    t0 = time.perf_counter()
    c = await Client.open(port, TIMEOUT)
    t1 = time.perf_counter()
    await c.connect_session(client_id(i))
    t2 = time.perf_counter()
    await c.subscribe_or_refuse(f"bench/sessions/{i}/#")
    t3 = time.perf_counter()
    await c.leave()
    return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Result:
    broker: str
    cpu: Callable[[], float]
    """The broker's CPU seconds so far (utime + stime)."""
    rows: dict[str, tuple[int, float, list[float]]] = field(default_factory=dict)
    """phase -> (count, seconds, latencies)"""
    used: dict[str, float] = field(default_factory=dict)
    """phase -> broker CPU seconds"""
    _cpu_at: float = 0.0

    def begin(self) -> float:
        self._cpu_at = self.cpu()
        return time.perf_counter()

    async def settle(self) -> None:
        """Wait until the broker has finished what a phase left it (its CPU
        time grows by less than `SETTLED` in each of two `SETTLE_LOOK`s; at
        most `SETTLE_MAX`): a broker that saves a session after closing its
        connection is still working when the clients are done, and that work
        is the phase's, not the next one's."""
        deadline = time.monotonic() + SETTLE_MAX
        quiet = 0
        last = self.cpu()
        while quiet < 2 and time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_LOOK)
            now = self.cpu()
            quiet = quiet + 1 if now - last < SETTLED else 0
            last = now

    def add(self, phase: str, count: int, seconds: float, latencies: list[float]) -> None:
        self.rows[phase] = (count, seconds, latencies)
        self.used[phase] = self.cpu() - self._cpu_at
        line = (
            f"  {phase:<11} {count:>6} in {seconds:7.2f} s = {count / seconds:8.0f}/s"
            f"   CPU {self.used[phase] / count * 1e6:6.0f} us each"
        )
        if latencies:
            line += (
                f"   p50 {pct(latencies, 0.5) * 1000:7.1f} ms"
                f"   p99 {pct(latencies, 0.99) * 1000:7.1f} ms"
            )
        print(line, flush=True)

    def cpu_each(self, phase: str) -> float:
        return self.used[phase] / self.rows[phase][0]

    def rate(self, phase: str) -> float:
        count, seconds, _ = self.rows[phase]
        return count / seconds

    def p99(self, phase: str) -> float:
        return pct(self.rows[phase][2], 0.99)


async def run(port: int, args: argparse.Namespace, result: Result) -> None:
    # a. sequential creation (ids from `args.storm` on, apart from the storm's)
    base = args.storm
    steps = []
    t = result.begin()
    for i in range(base, base + args.sequential):
        steps.append(await make_session(port, i))
    seconds = time.perf_counter() - t
    await result.settle()
    result.add("sequential", args.sequential, seconds, [sum(s) for s in steps])
    medians = ", ".join(
        f"{name} {pct([s[k] for s in steps], 0.5) * 1e6:.0f}" for k, name in enumerate(STEPS)
    )
    print(f"  {'':<11} where a session's time goes, median us: {medians}", flush=True)

    # b. the storm's stored sessions, made concurrently
    gate = asyncio.Semaphore(args.concurrency)

    async def made(i: int) -> float:
        async with gate:
            return sum(await make_session(port, i))

    t = result.begin()
    latencies = list(await asyncio.gather(*(made(i) for i in range(args.storm))))
    seconds = time.perf_counter() - t
    await result.settle()
    result.add("stored", args.storm, seconds, latencies)

    # c. the storm: every stored session resumes, `concurrency` CONNECTs at a time
    clients: list[Client] = []
    connack: list[float] = []

    async def resume(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            c = await Client.open(port, TIMEOUT)
            present = await c.connect_session(client_id(i))
            connack.append(time.perf_counter() - t0)
            if not present:
                raise Refused(f"{client_id(i)}: Session Present 0 in the storm")
            clients.append(c)

    t = result.begin()
    await asyncio.wait_for(asyncio.gather(*(resume(i) for i in range(args.storm))), args.timeout)
    seconds = time.perf_counter() - t
    await result.settle()
    result.add("storm", args.storm, seconds, connack)

    # d. all of them leave at once
    t = result.begin()
    await asyncio.wait_for(asyncio.gather(*(c.leave() for c in clients)), args.timeout)
    seconds = time.perf_counter() - t
    await result.settle()
    result.add("leave", len(clients), seconds, [])


def run_broker(broker: Broker, args: argparse.Namespace) -> Result:
    result = Result(broker.name, broker.cpu)
    broker.start()
    try:
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(run(broker.port, args, result))
    except Exception as exc:
        print(f"  ! {broker.name} failed: {exc!r}\n{broker.tail()}", flush=True)
    finally:
        cpu = broker.cpu() if broker.process and broker.process.poll() is None else 0.0
        print(f"  broker CPU {cpu:.1f} s, RSS {broker.rss_mb() if cpu else 0:.0f} MiB")
        broker.stop()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sequential", type=int, default=2000)
    p.add_argument("--storm", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--brokers", default="riverbed,mosquitto")
    p.add_argument("--riverbed-db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores)")
    args = p.parse_args()
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {os.getloadavg()[0]:.2f}; sequential {args.sequential}, storm {args.storm}"
        f" at {args.concurrency} concurrent; Riverbed on {args.riverbed_db}",
        flush=True,
    )
    kinds: dict[str, type[Broker]] = {
        "riverbed": Riverbed,
        "mosquitto": Mosquitto,
        "floor": Floor,
        "floor-durable": FloorDurable,
    }
    results: dict[str, Result] = {}
    with contextlib.ExitStack() as stack:
        wanted = args.brokers.split(",")
        if args.riverbed_db == "postgres" and {"riverbed", "floor-durable"} & set(wanted):
            server = PostgresServer()
            server.start()
            stack.callback(server.stop)
            if "riverbed" in wanted:
                Riverbed.db_url = server.new_database("bench_sessions")
            if "floor-durable" in wanted:
                FloorDurable.db_url = server.new_database("bench_sessions_floor")
        for name in args.brokers.split(","):
            workdir = Path(tempfile.mkdtemp(prefix=f"bench-sessions-{name}-"))
            print(f"-- {name}: {workdir}", flush=True)
            results[name] = run_broker(kinds[name](workdir), args)
            if args.keep:
                print(f"  log: {results[name].broker} in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    r, m = results.get("riverbed"), results.get("mosquitto")
    if r is None or m is None or "storm" not in r.rows or "storm" not in m.rows:
        return
    print("\n== targets (issue 17)")
    for phase in ("sequential", "stored", "storm"):
        ratio = r.rate(phase) / m.rate(phase)
        mark = "" if phase == "stored" else ("  ok" if ratio >= 0.5 else "  MISSED (>= 0.5)")
        cost = r.cpu_each(phase) / m.cpu_each(phase) if m.cpu_each(phase) else float("nan")
        print(f"  {phase:<11} Riverbed / mosquitto {ratio:5.2f}{mark}   (CPU each {cost:.0f}x)")
    p99 = r.p99("storm")
    print(f"  storm CONNACK p99 {p99 * 1000:.0f} ms{'  ok' if p99 <= 1.0 else '  MISSED (<= 1 s)'}")
    for name, what in FLOORS.items():
        f = results.get(name)
        if f is None or "storm" not in f.rows:
            continue
        print(f"\n== the floor ({what}): {name} / mosquitto")
        for phase in ("sequential", "stored", "storm"):
            ratio, ours = f.rate(phase) / m.rate(phase), r.rate(phase) / f.rate(phase)
            print(f"  {phase:<11} {name} / mosquitto {ratio:5.2f}   Riverbed / {name} {ours:5.2f}")


if __name__ == "__main__":
    main()
