"""Memory per idle MQTT connection (issue 3, Robustness): Riverbed beside mosquitto.

Per broker: start it on a loopback port (as `bench/mqtt.py` does: Riverbed on
SQLite in a temp dir, mosquitto from its Debian package with a generated
config), open `--warm-up` connections, read the broker's VmRSS, open `--count`
more (MQTT 3.1.1 CONNECT, clean session, keep alive 0, each CONNACKed:
`tests/harness/idle.py`), wait a second, read VmRSS again. Prints the RSS
growth per connection and Riverbed / mosquitto. Kernel socket buffers are not
in either figure.

    .venv/bin/python bench/idle_connections.py [--count 10000] [--brokers riverbed,mosquitto]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness.idle import close_all, open_idle, raise_open_files_limit
from mqtt import Broker, Mosquitto, Riverbed  # bench/mqtt.py, next to this file


def rss_kib(broker: Broker) -> int:
    assert broker.process is not None
    for line in Path(f"/proc/{broker.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {broker.name}")


def measure(broker: Broker, count: int, warm_up: int) -> float:
    """KiB of RSS per idle connection."""
    broker.start()
    try:
        warm = open_idle(broker.port, warm_up, prefix="warm-")
        time.sleep(0.5)
        before = rss_kib(broker)
        started = time.monotonic()
        idle = open_idle(broker.port, count)
        opened = time.monotonic() - started
        time.sleep(1.0)
        after = rss_kib(broker)
        per = (after - before) / count
        print(
            f"  {broker.name}: {count:,} connections in {opened:.1f} s; RSS"
            f" {before / 1024:.1f} -> {after / 1024:.1f} MiB: {per:.2f} KiB per connection",
            flush=True,
        )
        close_all(idle)
        close_all(warm)
        return per
    finally:
        broker.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--warm-up", type=int, default=200)
    p.add_argument("--brokers", default="riverbed,mosquitto")
    args = p.parse_args()
    # this process holds every client socket; the brokers inherit the limit
    limit = raise_open_files_limit(args.count + args.warm_up + 100)
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {os.getloadavg()[0]:.2f}; {args.count:,} idle connections"
        f" after {args.warm_up} warm-up ones; open files limit {limit}",
        flush=True,
    )
    kinds: dict[str, type[Broker]] = {"riverbed": Riverbed, "mosquitto": Mosquitto}
    per: dict[str, float] = {}
    for name in args.brokers.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-idle-{name}-"))
        try:
            per[name] = measure(kinds[name](workdir), args.count, args.warm_up)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if "riverbed" in per and "mosquitto" in per and per["mosquitto"] > 0:
        ratio = per["riverbed"] / per["mosquitto"]
        print(f"Riverbed / mosquitto, RSS per idle connection: {ratio:.1f}")


if __name__ == "__main__":
    main()
