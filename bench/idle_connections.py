"""Memory per idle MQTT connection (issue 3, Robustness): Riverbed beside mosquitto.

Per broker: start it on a loopback port (as `bench/mqtt.py` does: Riverbed on
SQLite in a temp dir, mosquitto from its Debian package with a generated
config), open `--warm-up` connections, read the broker's VmRSS, open `--count`
more (MQTT 3.1.1 CONNECT, clean session, keep alive 0, each CONNACKed:
`tests/harness/idle.py`), wait `--settle` seconds (12: past the broker's
periodic readers, the expiry sweep every 5 s and the metrics, whose caches
count too), read VmRSS again. Prints the RSS
growth per connection and Riverbed / mosquitto. Kernel socket buffers are not
in either figure.

    .venv/bin/python bench/idle_connections.py [--count 10000] [--brokers riverbed,mosquitto]

`--keep-alive S`: the clients ask for a keep alive of S seconds (default 0,
none), as a real fleet does: the broker then watches a deadline per
connection. Longer than the run, so no PINGREQ is needed.

`--sites N`: where Riverbed's bytes go instead. It runs the broker under
tracemalloc (`bench/_idle_trace.py`), opens N idle connections after the
warm-up ones and prints the Python heap's growth per connection by allocation
site (file:line), largest first. tracemalloc makes the broker slower and
larger, so this mode prints no RSS.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness.idle import close_all, open_idle, raise_open_files_limit
from mqtt import Broker, Mosquitto, Riverbed  # bench/mqtt.py, next to this file

HERE = Path(__file__).resolve().parent


class TracedRiverbed(Riverbed):
    """Riverbed under tracemalloc: `snapshot` asks it for its heap."""

    name = "riverbed-traced"

    def command(self) -> list[str]:
        python, _, _, *arguments = super().command()  # python -m riverbed.cli serve ...
        return [python, str(HERE / "_idle_trace.py"), *arguments]

    def snapshot(self, name: str, timeout: float = 120.0) -> tracemalloc.Snapshot:
        (self.workdir / f"snap-{name}").touch()
        deadline = time.monotonic() + timeout
        while not (self.workdir / f"{name}.done").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no heap snapshot from the broker within {timeout} s")
            time.sleep(0.1)
        return tracemalloc.Snapshot.load(str(self.workdir / f"{name}.snap"))


def short(filename: str) -> str:
    """A source file's name from where its package starts."""
    for marker in ("/site-packages/", "/src/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if "/lib/python3" in filename:  # the standard library: asyncio/runners.py
        return filename.split("/lib/python3", 1)[1].partition("/")[2]
    return filename


def sites(count: int, warm_up: int, top: int, settle: float, keep_alive: int) -> None:
    """Print the Python heap's growth per idle connection by allocation site."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-idle-sites-"))
    os.environ["RIVERBED_TRACE_DIR"] = str(workdir)  # the broker inherits it
    broker = TracedRiverbed(workdir)
    try:
        broker.start(timeout=120.0)
        warm = open_idle(broker.port, warm_up, prefix="warm-")
        time.sleep(0.5)
        before = broker.snapshot("before")
        idle = open_idle(broker.port, count, keep_alive=keep_alive)
        time.sleep(settle)
        after = broker.snapshot("after")
        close_all(idle)
        close_all(warm)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ours = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, str(HERE / "_idle_trace.py")),
    ]
    grown = after.filter_traces(ours).compare_to(before.filter_traces(ours), "lineno")
    total = sum(stat.size_diff for stat in grown)
    print(f"  Python heap: +{total / count:.0f} bytes per connection; by site:", flush=True)
    for stat in grown[:top]:
        frame = stat.traceback[0]
        print(
            f"  {stat.size_diff / count:7.0f} B {stat.count_diff / count:5.2f} blocks"
            f"  {short(frame.filename)}:{frame.lineno}"
        )


def rss_kib(broker: Broker) -> int:
    assert broker.process is not None
    for line in Path(f"/proc/{broker.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {broker.name}")


def measure(broker: Broker, count: int, warm_up: int, settle: float, keep_alive: int) -> float:
    """KiB of RSS per idle connection."""
    broker.start()
    try:
        warm = open_idle(broker.port, warm_up, prefix="warm-")
        time.sleep(0.5)
        before = rss_kib(broker)
        started = time.monotonic()
        idle = open_idle(broker.port, count, keep_alive=keep_alive)
        opened = time.monotonic() - started
        time.sleep(settle)
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
    p.add_argument("--settle", type=float, default=12.0, help="seconds before the second reading")
    p.add_argument("--brokers", default="riverbed,mosquitto")
    p.add_argument(
        "--sites",
        type=int,
        default=0,
        metavar="N",
        help="Riverbed's heap growth by allocation site over N idle connections (tracemalloc)",
    )
    p.add_argument("--top", type=int, default=25, help="how many sites --sites prints")
    p.add_argument(
        "--keep-alive", type=int, default=0, metavar="S", help="the clients' keep alive, seconds"
    )
    args = p.parse_args()
    if not 0 <= args.keep_alive <= 65535:
        p.error(f"--keep-alive {args.keep_alive} is not an MQTT keep alive (0-65535 seconds)")
    # this process holds every client socket; the brokers inherit the limit
    limit = raise_open_files_limit(max(args.count, args.sites) + args.warm_up + 100)
    count = args.sites or args.count
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load {os.getloadavg()[0]:.2f}; {count:,} idle connections"
        f" after {args.warm_up} warm-up ones, keep alive {args.keep_alive} s;"
        f" open files limit {limit}",
        flush=True,
    )
    if args.sites:
        sites(args.sites, args.warm_up, args.top, args.settle, args.keep_alive)
        return
    kinds: dict[str, type[Broker]] = {"riverbed": Riverbed, "mosquitto": Mosquitto}
    per: dict[str, float] = {}
    for name in args.brokers.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-idle-{name}-"))
        try:
            per[name] = measure(
                kinds[name](workdir), args.count, args.warm_up, args.settle, args.keep_alive
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if "riverbed" in per and "mosquitto" in per and per["mosquitto"] > 0:
        ratio = per["riverbed"] / per["mosquitto"]
        print(f"Riverbed / mosquitto, RSS per idle connection: {ratio:.1f}")


if __name__ == "__main__":
    main()
