"""What a broker costs while nothing happens, holding many stored sessions:
Riverbed beside mosquitto.

Per broker (started on loopback as `bench/mqtt.py` starts it: Riverbed on
SQLite in a temp dir with its default configuration, mosquitto from its
Debian package with persistence on): `--stored` persistent sessions made as
`bench/sessions.py` makes them (CONNECT with clean start 0 and a day's
Session Expiry Interval, one SUBSCRIBE, DISCONNECT; `--concurrency` at a
time), then `--online` of them connected again and left idle (no keep alive),
a pause of `--settle` seconds, then the broker's CPU time (utime + stime)
over `--seconds` seconds in which no client sends anything. What it spends
then is its periodic work: sweeps for expired sessions, retention, metrics,
`$SYS`; a broker whose periodic work reads every stored session pays for it
in proportion.

    .venv/bin/python bench/idle_stored.py [--stored 20000] [--online 0] [--seconds 40]
        [--brokers riverbed,mosquitto]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mqtt import Broker, Mosquitto, Riverbed  # bench/mqtt.py
from sessions import TIMEOUT, Client, client_id, make_session  # bench/sessions.py


async def _fill(port: int, stored: int, online: int, concurrency: int) -> list[Client]:
    gate = asyncio.Semaphore(concurrency)

    async def made(i: int) -> None:
        async with gate:
            await make_session(port, i)

    await asyncio.gather(*(made(i) for i in range(stored)))
    clients: list[Client] = []

    async def back(i: int) -> None:
        async with gate:
            client = await Client.open(port, TIMEOUT)
            if not await client.connect_session(client_id(i)):
                raise RuntimeError(f"{client_id(i)} came back to no session")
            clients.append(client)

    await asyncio.gather(*(back(i) for i in range(online)))
    return clients


async def _idle(broker: Broker, args: argparse.Namespace) -> float:
    assert broker.port is not None
    clients = await _fill(broker.port, args.stored, args.online, args.concurrency)
    try:
        await asyncio.sleep(args.settle)
        before, started = broker.cpu(), time.monotonic()
        await asyncio.sleep(args.seconds)
        return (broker.cpu() - before) / (time.monotonic() - started)
    finally:
        for client in clients:
            client.close()


def measure(broker: Broker, args: argparse.Namespace) -> float:
    """The broker's CPU while idle, as a share of one core."""
    broker.start()
    try:
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        share = asyncio.run(_idle(broker, args))
        print(
            f"  {broker.name}: {args.stored:,} stored sessions, {args.online:,} online:"
            f" idle CPU {share * 100:.2f}% of a core",
            flush=True,
        )
        return share
    finally:
        broker.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stored", type=int, default=20_000)
    p.add_argument("--online", type=int, default=0)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--settle", type=float, default=6.0, help="seconds before measuring")
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--brokers", default="riverbed,mosquitto")
    args = p.parse_args()
    if not 0 <= args.online <= args.stored:
        p.error(f"--online {args.online} is not between 0 and --stored {args.stored}")
    if args.seconds <= 0 or args.concurrency < 1:
        p.error("--seconds must be positive and --concurrency at least 1")
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    kinds: dict[str, type[Broker]] = {"riverbed": Riverbed, "mosquitto": Mosquitto}
    shares: dict[str, float] = {}
    for name in args.brokers.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-idle-stored-{name}-"))
        try:
            shares[name] = measure(kinds[name](workdir), args)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if "riverbed" in shares and "mosquitto" in shares:
        print(
            f"idle CPU, Riverbed {shares['riverbed'] * 100:.2f}% against mosquitto's"
            f" {shares['mosquitto'] * 100:.2f}% of a core"
        )


if __name__ == "__main__":
    main()
