"""Durable shared subscriptions benchmark (issue 5): throughput and rebalance times.

A group `$share/bench/b/#` over the builtin log topic `mqtt` (16 partitions).
Every message is a 100-byte QoS 1 MQTT 5 PUBLISH to `b/t` whose payload starts
with a unique sequence number and whose user property `key` is one of 1,000
keys, 62 or 63 in each partition, used in an order that sends consecutive
sequence numbers to consecutive partitions (a key's partition is Riverbed's
own router: `route(key_hash(key), 16, 1)`, generation 0). Publishers
and sharers are paho-mqtt 2.x clients, each in an OS process of its own (this
script run with `--role pub|sharer`); a sharer writes a record per message it
receives (sequence number, arrival time on the machine-wide monotonic clock,
the partition of the message's key) to its file as it arrives, before paho
acknowledges it, so even a SIGKILLed sharer leaves a complete record. The
parent reads those files as they grow.

1. Throughput with 1, 2 and 4 sharers (`--sharers`), each on a fresh store:
   a. live: the sharers subscribe one after the other (Riverbed: then wait
      until `riverbed group describe` shows the streams split evenly), a short
      warm-up, then `--publishers` processes publish `--messages` at full speed,
      each keeping the broker's receive maximum (100) in flight. msg/s from the
      first PUBLISH to the last delivery, loss (acknowledged by PUBACK but never
      delivered), duplicates, broker CPU per message. The same against
      mosquitto (non-durable `$share/`, messages handed round-robin), and the
      ratio Riverbed / mosquitto (mosquitto is the reference; no target).
   b. backlog (Riverbed only): the group created with `--start earliest`, the
      messages published with no member, then the sharers subscribe at once;
      msg/s from their SUBSCRIBEs to the last delivery, loss, duplicates.
2. Rebalance times (Riverbed): one publisher at `--rate` msg/s (2,000: each
   partition gets a message every 8 ms) for the whole experiment. A sharer
   *holds* partition p at time t if it received a message of p in (t - W, t]
   (`--window`, 100 ms); the group is *even* when every partition is held by
   exactly one current member and each member holds 16 div B or 16 div B + 1.
   The time of a change is from its moment (SUBACK of a joining sharer, UNSUBACK
   of a leaving one, the DISCONNECT sent, the SIGKILL) until the group is even
   again and stays so for 1 s (evaluated every 10 ms; W is part of it: the
   previous holder still "holds" for W after its last message, so W is the
   floor). Printed beside it: *handover*, from the change to the first message
   of the last partition that moved at its new holder (no W in it), how many
   partitions moved, the duplicates delivered after the change, and the pauses
   longer than W in which no sharer got anything (a machine hiccup that breaks
   "stays even" and lengthens a figure). A joining sharer connects, waits 0.5 s,
   then subscribes. Per repeat (`--repeats`): join 1->2, join 2->3, UNSUBSCRIBE
   (newest) 3->2, join 2->3, DISCONNECT (oldest) 3->2, join 2->3, SIGKILL
   (second oldest) 3->2, and before every repeat but the first a DISCONNECT
   2->1. Targets: join and graceful leave <= 1 s, killed <= ping_timeout + 1 s.
   Over the whole experiment: every message acknowledged to the publisher must
   reach some sharer (zero loss); duplicates (at-least-once redelivery) are
   counted. A SIGKILL closes the sharer's socket, so the broker learns of it at
   once (a sharer that hangs without closing it is not measured here).

Key modes (`--key-mode MODE`, throughput only): the store gets a topic `bench`
bound to `b/#` with that key mode (16 partitions) before the broker starts, and
the publishers send no user property `key` (with `property:NAME`, the message's
bench key goes in NAME instead), so the binding's mode alone decides the
streams; `--topics N` publishes round robin to `b/t/0` .. `b/t/N-1`. The group
then lends the 32 streams of `bench` and the builtin `mqtt`. A sharer knows a
message's partition only when the key is a bench key (no mode, `property:`).

Riverbed runs `riverbed serve --config FILE` with the shared subscription
timers at their defaults (printed; `--shared KEY=VALUE` changes one), SQLite in
a temp dir; mosquitto as in bench/mqtt.py. Everything listens on 127.0.0.1 only;
everything started is stopped by pid (SIGTERM, then SIGKILL), temp dirs removed.

    .venv/bin/python bench/shared.py [--messages 50000] [--repeats 3]
        [--brokers riverbed,mosquitto] [--sharers 1,2,4] [--publishers 2]
        [--rate 2000] [--window 0.1] [--phases throughput,rebalance]
        [--key-mode MODE --topics N --phases throughput]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import importlib.metadata
import itertools
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from mqtt import RECEIVE_MAXIMUM, Broker, Mosquitto  # noqa: E402
from riverbed.log.partitioning import key_hash, route  # noqa: E402
from riverbed.log.topics import BUILTIN_PARTITIONS  # noqa: E402
from riverbed.sharedsub.config import SharedSubConfig  # noqa: E402

GROUP = "bench"
FILTER = "b/#"
SHARE = f"$share/{GROUP}/{FILTER}"
TOPIC = "b/t"
PAYLOAD = 100
KEYS = 1000
PARTITIONS = BUILTIN_PARTITIONS  # the builtin topic `mqtt`
GENERATION0_K = 1  # a topic's first storage topic has scale factor 1
RECORD = struct.Struct("<qqbb")
"""A sharer's record of one message: sequence, arrival (monotonic ns), partition, DUP flag."""
STEP_NS = 10_000_000  # evenness is evaluated every 10 ms
STABLE_NS = 1_000_000_000  # ... and must hold this long
SETTLE = 0.5  # s between a joining sharer's CONNACK and its SUBSCRIBE


def partition_of(key: str) -> int:
    """The partition of `mqtt` (generation 0) that Riverbed routes `key` to."""
    return route(key_hash(key), PARTITIONS, GENERATION0_K)


def bench_keys() -> list[str]:
    """KEYS keys, as many per partition as can be, ordered so that consecutive
    keys fall in consecutive partitions (0, 1, ..., 15, 0, 1, ...)."""
    per: list[list[str]] = [[] for _ in range(PARTITIONS)]
    want = -(-KEYS // PARTITIONS)
    i = 0
    while sum(map(len, per)) < want * PARTITIONS:
        key = f"key-{i:05d}"
        bucket = per[partition_of(key)]
        if len(bucket) < want:
            bucket.append(key)
        i += 1
    ordered = [per[p][j] for j in range(want) for p in range(PARTITIONS)]
    return ordered[:KEYS]


def key_property(key_mode: str | None) -> str:
    """The user property the publishers put the bench key in: `key` without
    --key-mode, the property of `property:NAME`, none ("") for the other modes."""
    if key_mode is None:
        return "key"
    return key_mode.removeprefix("property:") if key_mode.startswith("property:") else ""


def payload(seq: int, pad: bytes = b"x" * (PAYLOAD - 20)) -> bytes:
    return b"%020d" % seq + pad


def now_ns() -> int:
    return time.monotonic_ns()  # CLOCK_MONOTONIC: the same clock in every process


# --- clients (subprocesses: --role pub / --role sharer) -------------------------------


def _client(client_id: str) -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    c = paho.Client(CallbackAPIVersion.VERSION2, client_id, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(RECEIVE_MAXIMUM)
    c.max_queued_messages_set(0)
    return c


def _connect(c: Any, port: int) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    done = threading.Event()
    state: dict[str, int] = {}

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        state["rc"] = int(reason.value) if hasattr(reason, "value") else int(reason)
        done.set()

    c.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.ReceiveMaximum = RECEIVE_MAXIMUM  # mosquitto honours the client's (65535)
    c.connect("127.0.0.1", port, 60, clean_start=True, properties=props)
    c.loop_start()
    if not done.wait(20):
        raise SystemExit("no CONNACK")
    if state["rc"] != 0:
        raise SystemExit(f"CONNECT refused: {state['rc']}")


def run_pub(args: argparse.Namespace) -> None:
    """Publish `--count` messages from `--first` (0: until `stop` on stdin), at
    `--rate` msg/s (0: full speed, the receive maximum in flight); write what
    was acknowledged to `--out`."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    keys = bench_keys()
    props: list[Any] = []
    name = key_property(args.key_mode)
    for key in keys:
        p = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        p.UserProperty = (name, key)
        props.append(p if name else None)
    topics = [TOPIC] if args.topics == 1 else [f"{TOPIC}/{i}" for i in range(args.topics)]
    c = _client(f"bench-pub-{args.first}")
    window = threading.Semaphore(RECEIVE_MAXIMUM)
    acks = [0]

    # paho calls on_publish holding its own lock: take no lock of ours here
    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, p: Any) -> None:
        acks[0] += 1  # only paho's network thread writes it
        window.release()

    c.on_publish = on_publish
    _connect(c, args.port)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    def acquire() -> bool:
        """A place in the window; False if told to stop while waiting for one."""
        while not window.acquire(timeout=1.0):
            if stop.is_set() and not args.count:
                return False
        return True

    infos: list[tuple[int, Any]] = []
    interval_ns = int(1e9 / args.rate) if args.rate else 0
    start = now_ns()
    i = 0
    while (i < args.count) if args.count else not stop.is_set():
        if interval_ns:
            delay = start + i * interval_ns - now_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
        if not acquire():
            break
        seq = args.first + i
        topic = topics[seq % len(topics)]
        infos.append((seq, c.publish(topic, payload(seq), 1, properties=props[seq % KEYS])))
        i += 1
    last = now_ns()
    deadline = time.monotonic() + args.timeout
    while acks[0] < len(infos) and time.monotonic() < deadline:
        time.sleep(0.01)
    end = now_ns()
    unacked = [seq for seq, info in infos if not info.is_published()]
    c.disconnect()
    c.loop_stop()
    result = {
        "first": args.first,
        "sent": len(infos),
        "unacked": unacked,
        "start_ns": start,
        "last_publish_ns": last,
        "end_ns": end,
    }
    Path(args.out).write_text(json.dumps(result))
    print("done", flush=True)


def run_sharer(args: argparse.Namespace) -> None:
    """Connect as `--client-id`; then obey stdin: `subscribe`, `unsubscribe`,
    `disconnect` (also on end of input). Each message received is a RECORD
    appended to `--out` before on_message returns (before paho's PUBACK)."""
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    parts = {key: partition_of(key) for key in bench_keys()}
    name = key_property(args.key_mode) or "\x00"  # no key known: partition -1
    c = _client(args.client_id)
    write, pack = os.write, RECORD.pack

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        arrived = time.monotonic_ns()
        part = -1
        for prop, value in getattr(msg.properties, "UserProperty", ()):
            if prop == name:
                part = parts.get(value, -1)
                if part < 0:
                    part = parts[value] = partition_of(value)
        write(fd, pack(int(msg.payload[:20]), arrived, part, 1 if msg.dup else 0))

    acked: queue.Queue[tuple[int, list[int]]] = queue.Queue()

    def on_ack(client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        acked.put((now_ns(), [int(r.value) for r in reasons]))

    c.on_message = on_message
    c.on_subscribe = on_ack
    c.on_unsubscribe = on_ack
    _connect(c, args.port)
    print("connected", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command in ("subscribe", "unsubscribe"):
            sent = now_ns()
            if command == "subscribe":
                c.subscribe(SHARE, qos=1)
            else:
                c.unsubscribe(SHARE)
            try:
                at, reasons = acked.get(timeout=30)
            except queue.Empty:
                print(f"error no {command.upper()} acknowledgement", flush=True)
                continue
            word = "suback" if command == "subscribe" else "unsuback"
            print(f"{word} {sent} {at} {','.join(map(str, reasons))}", flush=True)
        elif command == "disconnect":
            break
    sent = now_ns()
    c.disconnect()
    c.loop_stop()
    os.close(fd)
    print(f"disconnected {sent}", flush=True)


# --- processes ------------------------------------------------------------------------


class Child:
    """A client role process: commands on its stdin, one event per line on its stdout."""

    def __init__(self, args: list[str], name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        CHILDREN.append(self)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, word: str, timeout: float = 30.0) -> list[str]:
        """The words of the next line starting with `word`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{self.name}: no {word!r} within {timeout}s") from None
            if line is None:
                raise RuntimeError(f"{self.name} exited ({self.process.wait()}) before {word!r}")
            words = line.split()
            if words and words[0] == word:
                return words[1:]
            if words and words[0] == "error":
                raise RuntimeError(f"{self.name}: {line}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """End of input (a sharer disconnects, a publisher stops), then SIGTERM, SIGKILL."""
        p = self.process
        if p.poll() is None:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.close()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        with contextlib.suppress(OSError):
            assert p.stdin is not None
            p.stdin.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()


CHILDREN: list[Child] = []
BROKERS: list[Broker] = []


def cleanup() -> None:
    """Stop every client process and broker this run started, by pid."""
    for child in CHILDREN:
        if child.alive():
            child.process.terminate()
    for child in CHILDREN:
        try:
            child.process.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
    CHILDREN.clear()
    for broker in BROKERS:
        broker.stop()
        broker.kill()
    BROKERS.clear()


def client_options(args: argparse.Namespace) -> list[str]:
    """What a client role process needs to know of --key-mode and --topics."""
    return (["--key-mode", args.key_mode] if args.key_mode else []) + ["--topics", str(args.topics)]


class Riverbed(Broker):
    name = "riverbed"
    shared: ClassVar[dict[str, float]] = {}
    """[shared_subscriptions] of the config file."""
    key_mode: ClassVar[str | None] = None
    """--key-mode: a topic `bench` bound to FILTER with this key mode, made
    before the broker starts (None: the messages go to the builtin `mqtt`)."""

    @property
    def streams(self) -> int:
        """The streams the group lends: the builtin topic's, and `bench`'s."""
        return PARTITIONS * (2 if self.key_mode else 1)

    def start(self, timeout: float = 30.0) -> None:
        if self.key_mode:
            (self.workdir / "data").mkdir(exist_ok=True)
            create = ["topic", "create", "bench", "--partitions", str(PARTITIONS)]
            out = subprocess.run(
                [
                    *riverbed_cli(),
                    "--db",
                    self.url,
                    *create,
                    "--binding",
                    FILTER,
                    "--key",
                    self.key_mode,
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if out.returncode != 0 and "exists already" not in out.stderr:
                raise RuntimeError(f"riverbed topic create bench: {out.stderr.strip()}")
        super().start(timeout)

    @property
    def url(self) -> str:
        return f"sqlite:///{self.workdir / 'data' / 'r.db'}"

    def command(self) -> list[str]:
        (self.workdir / "data").mkdir(exist_ok=True)
        config = self.workdir / "riverbed.toml"
        lines = ["[shared_subscriptions]"] + [f"{k} = {v!r}" for k, v in self.shared.items()]
        config.write_text("\n".join(lines) + "\n")
        return [
            *riverbed_cli(),
            "serve",
            "--mqtt",
            f"127.0.0.1:{self.port}",
            "--db",
            self.url,
            "--allow-anonymous",
            "--config",
            str(config),
        ]

    def group(self, *args: str) -> str:
        out = subprocess.run(
            [*riverbed_cli(), "--db", self.url, "group", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"riverbed group {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def wait_balanced(self, members: int, timeout: float = 30.0) -> float:
        """Seconds until the group record (`group describe`, as of the Leader's
        last save) shows `members` Borrowers holding 16 div B or + 1 streams each."""
        start = time.monotonic()
        low = self.streams // members
        while time.monotonic() - start < timeout:
            with contextlib.suppress(RuntimeError, ValueError):
                held = json.loads(self.group("describe", GROUP, FILTER, "--json"))["borrowers"]
                counts = [len(streams) for streams in held.values()]
                if (
                    len(counts) == members
                    and sum(counts) == self.streams
                    and all(low <= n <= low + 1 for n in counts)
                ):
                    return time.monotonic() - start
            time.sleep(0.3)
        raise RuntimeError(f"group not balanced over {members} sharers within {timeout}s")


def riverbed_cli() -> list[str]:
    return [str(ROOT / ".venv" / "bin" / "python"), "-m", "riverbed.cli"]


# --- what the sharers received --------------------------------------------------------


class Receipts:
    """One sharer's records, read from its file as it grows."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        path.touch()
        self._file = path.open("rb")
        self._rest = b""
        self.seq = array("q")
        self.at = array("q")
        self.part = array("b")
        self.dup_flags = 0
        self.by_part = [array("q") for _ in range(PARTITIONS)]
        """Arrival times of each partition's messages (ascending)."""

    def poll(self) -> int:
        data = self._rest + self._file.read()
        whole = len(data) - len(data) % RECORD.size
        self._rest = data[whole:]
        for seq, at, part, dup in RECORD.iter_unpack(data[:whole]):
            self.seq.append(seq)
            self.at.append(at)
            self.part.append(part)
            self.dup_flags += dup
            if 0 <= part < PARTITIONS:
                self.by_part[part].append(at)
        return whole // RECORD.size

    def holds(self, part: int, t: int, window: int) -> bool:
        times = self.by_part[part]
        i = bisect.bisect_right(times, t)
        return i > 0 and times[i - 1] > t - window

    def close(self) -> None:
        self._file.close()


def tally(receipts: list[Receipts], lo: int, hi: int) -> dict[int, int]:
    """Deliveries per sequence number in [lo, hi)."""
    counts: dict[int, int] = {}
    for r in receipts:
        for seq in r.seq:
            if lo <= seq < hi:
                counts[seq] = counts.get(seq, 0) + 1
    return counts


def last_arrival(receipts: list[Receipts], lo: int, hi: int) -> int:
    """When the last message in [lo, hi) arrived (monotonic ns; 0: none did)."""
    return max(
        (at for r in receipts for seq, at in zip(r.seq, r.at, strict=True) if lo <= seq < hi),
        default=0,
    )


def wait_delivered(
    receipts: list[Receipts], expected: set[int], idle: float = 10.0, limit: float = 900.0
) -> set[int]:
    """Poll until every sequence in `expected` arrived (or nothing new came for
    `idle` seconds); the ones still missing."""
    missing = set(expected)
    for r in receipts:
        r.poll()
        missing.difference_update(r.seq)
    last_new = time.monotonic()
    start = last_new
    while missing and time.monotonic() - last_new < idle and time.monotonic() - start < limit:
        for r in receipts:
            before = len(r.seq)
            if r.poll():
                last_new = time.monotonic()
                missing.difference_update(r.seq[before:])
        time.sleep(0.05)
    return missing


# --- throughput -----------------------------------------------------------------------


@dataclasses.dataclass
class Flow:
    """One measured delivery of messages [first, first + count)."""

    label: str
    broker: str
    sharers: int
    count: int
    acked: int = 0
    delivered: int = 0
    duplicates: int = 0
    seconds: float = float("nan")
    publish_rate: float = float("nan")
    cpu_us: float = float("nan")
    note: str = ""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else float("nan")

    @property
    def lost(self) -> int:
        return self.acked - self.delivered

    def line(self) -> str:
        text = (
            f"{self.label:<8} {self.broker:<9} x{self.sharers}: {self.rate:>8,.0f} msg/s"
            f" ({self.seconds:6.2f} s), received {self.delivered}/{self.acked} acknowledged,"
            f" lost {self.lost}, duplicates {self.duplicates}"
        )
        if self.publish_rate == self.publish_rate:
            text += f"; publishers {self.publish_rate:,.0f}/s"
        if self.cpu_us == self.cpu_us:
            text += f"; broker {self.cpu_us:.0f} µs CPU/msg"
        return text + (f"; {self.note}" if self.note else "")


class Throughput:
    """Phase 1 on one broker with `sharers` members, on a fresh store."""

    def __init__(self, kind: type[Broker], sharers: int, args: argparse.Namespace) -> None:
        self.args = args
        self.sharers = sharers
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-shared-{kind.name}-{sharers}-"))
        self.broker = kind(self.workdir)
        self.next_seq = 0
        self.n = 0

    def publish(self, count: int) -> tuple[int, list[dict[str, Any]]]:
        """`count` messages from --publishers processes at full speed; (first, results)."""
        first = self.next_seq
        self.next_seq += count
        pubs = []
        size = -(-count // self.args.publishers)
        for lo in range(first, first + count, size):
            self.n += 1
            out = self.workdir / f"pub{self.n}.json"
            n = min(size, first + count - lo)
            cmd = ["--role", "pub", "--port", str(self.broker.port), "--out", str(out)]
            cmd += ["--first", str(lo), "--count", str(n), "--rate", "0", "--timeout", "120"]
            cmd += client_options(self.args)
            pubs.append((Child(cmd, f"publisher {lo}"), out))
        for child, _ in pubs:
            child.expect("ready")
        for child, _ in pubs:
            child.send("go")
        results = []
        for child, out in pubs:
            child.expect("done", timeout=900)
            child.stop()
            results.append(json.loads(out.read_text()))
        return first, results

    def start_sharers(self, tag: str) -> tuple[list[Child], list[Receipts]]:
        children, receipts = [], []
        for i in range(self.sharers):
            name = f"{tag}-{chr(65 + i)}"
            out = self.workdir / f"{name}.bin"
            receipts.append(Receipts(name, out))
            cmd = ["--role", "sharer", "--port", str(self.broker.port), "--out", str(out)]
            cmd += client_options(self.args)
            children.append(Child([*cmd, "--client-id", f"sharer-{name}"], name))
        for child in children:
            child.expect("connected")
        return children, receipts

    @staticmethod
    def subscribe(child: Child) -> None:
        words = child.expect("suback")
        if any(int(r) >= 0x80 for r in words[2].split(",")):
            raise RuntimeError(f"{child.name}: SUBSCRIBE refused ({words[2]})")

    def flow(
        self, label: str, receipts: list[Receipts], first: int, pubs: list[dict[str, Any]]
    ) -> Flow:
        count = sum(p["sent"] for p in pubs)
        unacked = {s for p in pubs for s in p["unacked"]}
        acked = set(range(first, first + count)) - unacked
        wait_delivered(receipts, acked)
        counts = tally(receipts, first, first + count)
        f = Flow(label, self.broker.name, self.sharers, count, acked=len(acked))
        f.delivered = len(acked & counts.keys())
        f.duplicates = sum(counts.values()) - len(counts)
        last = last_arrival(receipts, first, first + count)
        start = min(p["start_ns"] for p in pubs)
        end = max(p["end_ns"] for p in pubs)
        f.publish_rate = count / ((end - start) / 1e9)
        f.seconds = (last - start) / 1e9
        split = []
        for r in receipts:
            mine = [i for i, s in enumerate(r.seq) if first <= s < first + count]
            parts = {r.part[i] for i in mine if r.part[i] >= 0}
            where = f" ({len(parts)} partitions)" if parts else ""
            split.append(f"{r.name.rsplit('-', 1)[1]} {len(mine)}{where}")
        f.note = "per sharer: " + ", ".join(split)
        return f

    def live(self) -> Flow:
        b = self.broker
        children, receipts = self.start_sharers("live")
        for child in children:
            child.send("subscribe")
            self.subscribe(child)
        if isinstance(b, Riverbed):
            b.wait_balanced(self.sharers)
        # warm-up (not measured): every sharer connected and receiving
        first, pubs = self.publish(min(1000, self.args.messages))
        self.flow("warm-up", receipts, first, pubs)
        c0 = b.cpu()
        first, pubs = self.publish(self.args.messages)
        f = self.flow("live", receipts, first, pubs)
        f.cpu_us = (b.cpu() - c0) / self.args.messages * 1e6
        for child in children:
            child.stop()
        return f

    def backlog(self) -> Flow:
        b = self.broker
        assert isinstance(b, Riverbed)
        b.group("create", GROUP, FILTER, "--start", "earliest")
        first, pubs = self.publish(self.args.messages)
        children, receipts = self.start_sharers("backlog")
        start = now_ns()
        for child in children:
            child.send("subscribe")
        for child in children:
            self.subscribe(child)
        f = self.flow("backlog", receipts, first, pubs)
        f.seconds = (last_arrival(receipts, first, first + f.count) - start) / 1e9
        f.publish_rate = float("nan")  # the publishers' rate is not part of this one
        for child in children:
            child.stop()
        return f

    def go(self) -> list[Flow]:
        flows = []
        BROKERS.append(self.broker)
        self.broker.start()
        try:
            flows.append(self.live())
            if isinstance(self.broker, Riverbed):
                self.broker.stop()  # a fresh store for the backlog run
                shutil.rmtree(self.workdir / "data", ignore_errors=True)
                self.broker.start()
                flows.append(self.backlog())
        finally:
            self.broker.stop()
            self.broker.kill()
            BROKERS.remove(self.broker)
        return flows


# --- rebalance ------------------------------------------------------------------------


@dataclasses.dataclass
class Change:
    """One membership change and how long the group took to be even again."""

    label: str
    at: int  # ns
    members: list[str]  # after the change
    took: float | None = None  # s, even and stable; None: never within the limit
    first_even: float | None = None  # s, first instant even
    handover: float = float("nan")  # s, last moved partition's first message at its new holder
    moved: int = 0  # partitions whose holder changed
    flips: int = 0  # holder changes beyond one per partition (back and forth)
    duplicates: int = 0  # deliveries of already delivered messages, until the next change
    unsteady: str = ""  # when and why the group was last uneven after being even
    detail: str = ""


class Rebalance:
    """Phase 2 on one Riverbed broker with a steady publisher."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.window = int(args.window * 1e9)
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-shared-rebalance-"))
        self.broker = Riverbed(self.workdir)
        self.members: list[str] = []  # in join order
        self.children: dict[str, Child] = {}
        self.receipts: dict[str, Receipts] = {}
        self.changes: list[Change] = []
        self.pub: Child | None = None
        self.pub_result: dict[str, Any] = {}
        self.failed = ""
        # over the whole experiment (loss())
        self.sent = self.acked = self.duplicates = self.dup_flags = 0
        self.rate = float("nan")
        self.missing: list[int] = []
        self.pauses: list[tuple[int, int]] = []  # (ns without any delivery, from when)
        self.redelivered: list[str] = []  # the first duplicates, where they came from

    # sharers

    def spawn(self) -> str:
        name = chr(65 + len(self.receipts))
        out = self.workdir / f"sharer-{name}.bin"
        self.receipts[name] = Receipts(name, out)
        cmd = ["--role", "sharer", "--port", str(self.broker.port), "--out", str(out)]
        child = Child([*cmd, "--client-id", f"sharer-{name}"], f"sharer {name}")
        child.expect("connected")
        self.children[name] = child
        return name

    def join(self) -> None:
        name = self.spawn()
        child = self.children[name]
        time.sleep(SETTLE)  # its start-up and CONNECT out of the way of the measurement
        child.send("subscribe")
        sent, at, reasons = child.expect("suback")
        if any(int(r) >= 0x80 for r in reasons.split(",")):
            raise RuntimeError(f"sharer {name}: SUBSCRIBE refused ({reasons})")
        before = len(self.members)
        self.members.append(name)
        rtt = (int(at) - int(sent)) / 1e6
        self.measure(f"join {before}->{before + 1}", int(at), f"{name} joins, SUBACK {rtt:.0f} ms")

    def leave(self, name: str, how: str) -> None:
        child = self.children[name]
        before = len(self.members)
        self.members.remove(name)
        label = {"unsubscribe": "UNSUBSCRIBE", "disconnect": "DISCONNECT", "kill": "SIGKILL"}
        title = f"{'killed' if how == 'kill' else 'leave ' + label[how]} {before}->{before - 1}"
        if how == "unsubscribe":
            child.send("unsubscribe")
            sent, at, _ = child.expect("unsuback")
            rtt = (int(at) - int(sent)) / 1e6
            self.measure(title, int(at), f"{name} leaves, UNSUBACK {rtt:.0f} ms")
            child.send("disconnect")  # no member any more: its DISCONNECT changes nothing
            child.expect("disconnected")
            child.stop()
        elif how == "disconnect":
            child.send("disconnect")
            (sent,) = child.expect("disconnected")
            child.stop()
            self.measure(title, int(sent), f"{name} sends DISCONNECT")
        else:
            killed = now_ns()
            child.kill()
            self.measure(title, killed, f"{name} SIGKILLed")

    # evenness

    def poll(self) -> None:
        for r in self.receipts.values():
            r.poll()

    def uneven(self, t: int, members: list[str]) -> str:
        """Why the group is not even at `t` ("": it is)."""
        count = dict.fromkeys(members, 0)
        everyone = list(self.receipts.values())
        for part in range(PARTITIONS):
            holders = [r.name for r in everyone if r.holds(part, t, self.window)]
            if len(holders) != 1:
                return f"partition {part} held by {''.join(holders) or 'nobody'}"
            if holders[0] not in count:
                return f"partition {part} held by {holders[0]}, no member"
            count[holders[0]] += 1
        low = PARTITIONS // len(members)
        if all(low <= n <= low + 1 for n in count.values()):
            return ""
        return "holding " + "/".join(f"{name} {n}" for name, n in count.items())

    def measure(self, label: str, at: int, detail: str) -> None:
        """Follow the receipts from `at` until the group is even for STABLE_NS."""
        change = Change(label, at, list(self.members), detail=detail)
        self.changes.append(change)
        limit = self.args.limit
        t = at
        since: int | None = None
        while True:
            self.poll()
            horizon = now_ns() - 30_000_000  # every record before this is in its file
            while t <= horizon:
                why = self.uneven(t, change.members)
                if not why:
                    if since is None:
                        since = t
                        if change.first_even is None:
                            change.first_even = (t - at) / 1e9
                    if t - since >= STABLE_NS:
                        change.took = (since - at) / 1e9
                        break
                else:
                    if since is not None:  # even for a while, and not any more
                        change.unsteady = f"{(t - at) / 1e9:+.2f} s {why}"
                    since = None
                t += STEP_NS
            if change.took is not None:
                break
            if (now_ns() - at) / 1e9 > limit:
                print(f"  ! {label}: not even within {limit:.0f} s", flush=True)
                print(self.timeline(at, now_ns()), flush=True)
                print("  broker log tail:\n" + self.broker.tail(40), flush=True)
                self.failed = f"{label}: not even within {limit:.0f} s"
                raise RuntimeError(self.failed)
            time.sleep(0.05)
        end = at + int(change.took * 1e9) + STABLE_NS
        change.moved, change.flips, last = self.moves(at - STABLE_NS, end)
        change.handover = (last - at) / 1e9 if last else float("nan")
        print(f"  {self.describe(change)}", flush=True)
        if self.args.timeline:
            print(self.timeline(at - 400_000_000, end), flush=True)

    def moves(self, lo: int, hi: int) -> tuple[int, int, int]:
        """Partitions whose holder changed in [lo, hi), changes beyond one each,
        and when the last change was (the first message at the new holder; 0: none)."""
        moved = flips = last = 0
        for part in range(PARTITIONS):
            events = []
            for r in self.receipts.values():
                times = r.by_part[part]
                between = times[bisect.bisect_left(times, lo) : bisect.bisect_left(times, hi)]
                events += [(at, r.name) for at in between]
            events.sort()
            switched = [b[0] for a, b in itertools.pairwise(events) if a[1] != b[1]]
            switches = len(switched)
            if switched:
                last = max(last, switched[-1])
            moved += switches > 0
            flips += max(0, switches - 1)
        return moved, flips, last

    def timeline(self, lo: int, hi: int, bucket: int = 200_000_000) -> str:
        """Who received which partition, per `bucket` ns: a letter per sharer, '.' none."""
        self.poll()
        width = 3
        lines = ["    time  " + " ".join(f"{p:>{width}}" for p in range(PARTITIONS))]
        for t in range(lo, hi, bucket):
            cells = []
            for part in range(PARTITIONS):
                who = "".join(
                    r.name
                    for r in self.receipts.values()
                    if bisect.bisect_left(r.by_part[part], t)
                    < bisect.bisect_left(r.by_part[part], t + bucket)
                )
                cells.append(f"{who or '.':>{width}}")
            lines.append(f"  {(t - self.changes[-1].at) / 1e9:+6.2f}s " + " ".join(cells))
        return "\n".join(lines)

    def describe(self, c: Change) -> str:
        took = "never" if c.took is None else f"{c.took:5.2f} s"
        first = "-" if c.first_even is None else f"{c.first_even:.2f} s"
        hand = "" if c.handover != c.handover else f" handover {c.handover:.3f} s;"
        return (
            f"{c.label:<24} {took} (first even {first};{hand} moved {c.moved}"
            + (f", back-and-forth {c.flips}" if c.flips else "")
            + (f"; uneven again at {c.unsteady}" if c.unsteady else "")
            + f"); {c.detail}; members {''.join(c.members)}"
        )

    # the experiment

    def schedule(self) -> Iterator[tuple[str, str | None]]:
        """(how, whom) in order; `whom` None for a join."""
        for repeat in range(self.args.repeats):
            if repeat:
                yield "disconnect", "oldest"
            yield "join", None
            yield "join", None
            yield "unsubscribe", "newest"
            yield "join", None
            yield "disconnect", "oldest"
            yield "join", None
            yield "kill", "second"

    def go(self) -> None:
        b = self.broker
        BROKERS.append(b)
        b.start()
        try:
            self.spawn()  # A: creates the group (from now), then the publisher starts
            child = self.children["A"]
            child.send("subscribe")
            child.expect("suback")
            self.members.append("A")
            out = self.workdir / "pub.json"
            cmd = ["--role", "pub", "--port", str(b.port), "--out", str(out)]
            cmd += ["--rate", str(self.args.rate), "--timeout", "60"]
            self.pub = Child(cmd, "publisher")
            self.pub.expect("ready")
            self.pub.send("go")
            self.measure("first sharer (info)", now_ns(), "A alone, publisher starts")
            try:
                for how, whom in self.schedule():
                    if how == "join":
                        self.join()
                    else:
                        pick = {"oldest": 0, "newest": -1, "second": 1}[whom or "oldest"]
                        self.leave(self.members[pick], how)
            except RuntimeError as exc:
                self.failed = self.failed or str(exc)
                print(f"  ! rebalance stopped: {exc}", flush=True)
            self.pub.send("stop")
            self.pub.expect("done", timeout=120)
            self.pub.stop()
            self.pub_result = json.loads(out.read_text())
            self.loss()
        finally:
            for child in self.children.values():
                child.stop()
            for r in self.receipts.values():
                r.close()
            b.stop()
            b.kill()
            BROKERS.remove(b)

    def loss(self) -> None:
        p = self.pub_result
        first, sent = p["first"], p["sent"]
        acked = set(range(first, first + sent)) - set(p["unacked"])
        everyone = list(self.receipts.values())
        self.missing = sorted(wait_delivered(everyone, acked))
        self.sent, self.acked = sent, len(acked)
        counts = tally(everyone, first, first + sent)
        self.duplicates = sum(counts.values()) - len(counts)
        self.dup_flags = sum(r.dup_flags for r in everyone)
        # attribute each extra delivery to the change before it
        seen: dict[int, tuple[int, str]] = {}
        times = [c.at for c in self.changes]
        deliveries = sorted(
            (at, s, r.name) for r in everyone for s, at in zip(r.seq, r.at, strict=True)
        )
        for at, seq, name in deliveries:
            if seq in seen:
                i = bisect.bisect_right(times, at) - 1
                if i >= 0:
                    c = self.changes[i]
                    c.duplicates += 1
                    before, who = seen[seq]
                    if len(self.redelivered) < 10:
                        self.redelivered.append(
                            f"seq {seq} (partition {partition_of(bench_keys()[seq % KEYS])}):"
                            f" {who} at {(before - c.at) / 1e6:+.0f} ms, again to {name} at"
                            f" {(at - c.at) / 1e6:+.0f} ms after {c.label}"
                        )
            else:
                seen[seq] = (at, name)
        self.rate = sent / ((p["last_publish_ns"] - p["start_ns"]) / 1e9)
        arrivals = sorted(at for r in everyone for at in r.at)
        self.pauses = sorted(
            ((b - a, a) for a, b in itertools.pairwise(arrivals) if b - a > self.window),
            reverse=True,
        )
        if self.missing:
            print(f"  ! {len(self.missing)} acknowledged messages never delivered", flush=True)
            interval = (p["last_publish_ns"] - p["start_ns"]) / max(1, sent)
            keys = bench_keys()
            for seq in self.missing[:20]:
                at = p["start_ns"] + (seq - first) * interval
                i = max(0, bisect.bisect_right(times, at) - 1)
                after = f"{(at - times[i]) / 1e9:+.2f} s after {self.changes[i].label}"
                print(f"    seq {seq} partition {partition_of(keys[seq % KEYS])}, ~{after}")
            print("  broker log tail:\n" + self.broker.tail(40), flush=True)


# --- report ---------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "src"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    mosquitto = "not installed"
    with contextlib.suppress(OSError):
        mosquitto = subprocess.run(
            ["/usr/sbin/mosquitto", "-h"], capture_output=True, text=True
        ).stdout.splitlines()[0]
    import riverbed

    return (
        f"{model}, {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()},"
        f" load {os.getloadavg()[0]:.2f}\n"
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version},"
        f" paho-mqtt {importlib.metadata.version('paho-mqtt')}, {mosquitto},"
        f" Riverbed {riverbed.__version__} at {git}"
        + (" + uncommitted changes in src/" if dirty else "")
    )


def src_changed() -> tuple[str, float]:
    """The newest file under src/ and its modification time (edits during a run
    reach every broker started after them)."""
    newest = max((ROOT / "src").rglob("*.py"), key=lambda f: f.stat().st_mtime)
    return str(newest.relative_to(ROOT)), newest.stat().st_mtime


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(
    flows: list[Flow], reb: Rebalance | None, config: SharedSubConfig, args: argparse.Namespace
) -> None:
    print("\n== summary")
    if flows:
        sizes = sorted({f.sharers for f in flows})
        print(f"  {'throughput, msg/s':<28}" + "".join(f"{f'x{n}':>12}" for n in sizes))
        by = {(f.label, f.broker, f.sharers): f for f in flows}
        rows = [("live", "riverbed"), ("live", "mosquitto"), ("backlog", "riverbed")]
        for label, broker in rows:
            if any((label, broker, n) in by for n in sizes):
                line = f"  {label + ' ' + broker:<28}"
                for n in sizes:
                    f = by.get((label, broker, n))
                    line += f"{f.rate if f else float('nan'):>12,.0f}"
                print(line)
        if any(f.broker == "mosquitto" for f in flows):
            line = f"  {'live riverbed / mosquitto':<28}"
            for n in sizes:
                r, m = by.get(("live", "riverbed", n)), by.get(("live", "mosquitto", n))
                line += f"{r.rate / m.rate if r and m else float('nan'):>12.2f}"
            print(line + "  (reference, no target)")
        lost = sum(f.lost for f in flows if f.broker == "riverbed")
        dups = sum(f.duplicates for f in flows if f.broker == "riverbed")
        verdict = "PASS" if lost == 0 else "FAIL"
        print(f"  throughput runs, Riverbed: lost {lost}, duplicates {dups}: zero loss {verdict}")
        mlost = sum(f.lost for f in flows if f.broker == "mosquitto")
        if any(f.broker == "mosquitto" for f in flows):
            print(f"  throughput runs, mosquitto: lost {mlost} (non-durable, no target)")
    if reb is None:
        return
    kill_target = config.ping_timeout + 1.0
    print(
        f"\n  {'rebalance, s':<24} {'n':>2} {'median':>6} {'target':>6}  {'verdict':<13}"
        f" {'handover':>8}  each (even and stable)"
    )
    kinds: dict[str, list[Change]] = {}
    for c in reb.changes:
        if "(info)" not in c.label:
            kinds.setdefault(c.label, []).append(c)
    for label, changes in kinds.items():
        target = kill_target if label.startswith("killed") else 1.0
        took = [c.took for c in changes if c.took is not None]
        each = ", ".join("never" if c.took is None else f"{c.took:.2f}" for c in changes)
        never = len(took) < len(changes)
        ok = not never and all(t <= target for t in took)
        verdict = "PASS" if ok else f"FAIL ({sum(t > target for t in took) + never} over)"
        hand = [c.handover for c in changes if c.handover == c.handover]
        print(
            f"  {label:<24} {len(changes):>2} {median(took):>6.2f} {target:>6.1f}  {verdict:<13}"
            f" {median(hand):>8.3f}  {each}"
        )
    if reb.failed:
        print(f"  rebalance experiment stopped early: {reb.failed}")
    if reb.pub_result:
        lost = len(reb.missing)
        print(
            f"  rebalance experiment: published {reb.sent} at {reb.rate:,.0f}/s, acknowledged"
            f" {reb.acked}, lost {lost} ({'PASS' if lost == 0 else 'FAIL'}: zero loss),"
            f" duplicates {reb.duplicates} (DUP flag on {reb.dup_flags} deliveries)"
        )
        per = ", ".join(f"{c.label} {c.duplicates}" for c in reb.changes if c.duplicates)
        if per:
            print(f"  duplicates by change: {per}")
        for text in reb.redelivered:
            print(f"    {text}")
        times = [c.at for c in reb.changes]
        where = []
        for gap, at in reb.pauses[:5]:
            c = reb.changes[max(0, bisect.bisect_right(times, at) - 1)]
            where.append(f"{gap / 1e6:.0f} ms at {(at - c.at) / 1e9:+.2f} s after {c.label}")
        print(
            f"  pauses longer than W with no delivery to any sharer: {len(reb.pauses)}"
            + (f"; largest {', '.join(where)}" if where else "")
        )
    print(
        f"  W = {args.window * 1000:.0f} ms (holding window, included in the times),"
        f" stable {STABLE_NS / 1e9:.0f} s, sampled every {STEP_NS / 1e6:.0f} ms; handover"
        " (median): from the change to the first message of the last partition that moved,"
        " at its new holder"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=50_000, help="messages per throughput run")
    p.add_argument("--repeats", type=int, default=3, help="rounds of rebalance changes")
    p.add_argument("--brokers", default="riverbed,mosquitto", help="throughput: which brokers")
    p.add_argument("--sharers", default="1,2,4", help="throughput: sharer counts")
    p.add_argument("--publishers", type=int, default=2, help="throughput: publisher processes")
    p.add_argument("--rate", type=float, default=2000.0, help="rebalance: publisher msg/s")
    p.add_argument("--window", type=float, default=0.1, help="rebalance: holding window W, s")
    p.add_argument("--limit", type=float, default=30.0, help="rebalance: give up after, s")
    p.add_argument("--phases", default="throughput,rebalance")
    p.add_argument("--timeline", action="store_true", help="print every change's timeline")
    p.add_argument(
        "--shared",
        action="append",
        default=[],
        metavar="KEY=SECONDS",
        help="a [shared_subscriptions] timer other than its default",
    )
    p.add_argument(
        "--key-mode",
        metavar="MODE",
        help="throughput only: publish to a topic `bench` bound to b/# with this key mode"
        " (client-topic, client-id, topic, property:NAME, none), without the user property"
        " `key` (property:NAME: the bench key in that property); default: the builtin topic,"
        " keys in `key`",
    )
    p.add_argument(
        "--topics", type=int, default=1, help="publish to b/t (1) or round robin to b/t/0..N-1"
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores)")
    # client roles
    p.add_argument("--role", choices=["pub", "sharer"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--client-id", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=120, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "pub":
        return run_pub(args)
    if args.role == "sharer":
        return run_sharer(args)

    overrides = {}
    for item in args.shared:
        key, _, value = item.partition("=")
        overrides[key.strip()] = float(value)
    config = dataclasses.replace(SharedSubConfig(), **overrides)
    Riverbed.shared = dataclasses.asdict(config)
    Riverbed.key_mode = args.key_mode
    if args.key_mode and "rebalance" in args.phases.split(","):
        p.error("--key-mode is for the throughput phase: add --phases throughput")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"command: {shlex.join(sys.orig_argv)}")
    print(f"machine: {machine()}")
    print(
        "[shared_subscriptions] "
        + ", ".join(f"{k} = {v:g}" for k, v in Riverbed.shared.items())
        + ("" if overrides else " (the defaults)")
    )
    print(
        f"{PARTITIONS} partitions, {KEYS} keys, {PAYLOAD}-byte QoS 1 MQTT 5 messages,"
        f" in flight {RECEIVE_MAXIMUM}; throughput: {args.messages} messages,"
        f" {args.publishers} publishers, {args.topics} topic(s),"
        f" key {args.key_mode or 'user property key (builtin topic mqtt)'};"
        f" rebalance: {args.rate:,.0f} msg/s,"
        f" {args.repeats} repeats",
        flush=True,
    )
    phases = args.phases.split(",")
    kinds: dict[str, type[Broker]] = {"riverbed": Riverbed, "mosquitto": Mosquitto}
    flows: list[Flow] = []
    reb: Rebalance | None = None
    workdirs: list[Path] = []
    started = time.monotonic()
    source = src_changed()
    mosquitto_shown = False
    try:
        if "throughput" in phases:
            print("\n== throughput", flush=True)
            for n in [int(s) for s in args.sharers.split(",")]:
                for name in args.brokers.split(","):
                    run = Throughput(kinds[name], n, args)
                    workdirs.append(run.workdir)
                    t = time.monotonic()
                    try:
                        for f in run.go():
                            flows.append(f)
                            print(f"  {f.line()}", flush=True)
                    except Exception as exc:  # report what we have, go on
                        print(f"  ! {name} x{n} failed: {exc}", flush=True)
                        print("  broker log tail:\n" + run.broker.tail(30), flush=True)
                    print(f"    ({time.monotonic() - t:.0f} s)", flush=True)
                    if isinstance(run.broker, Mosquitto) and not mosquitto_shown:
                        mosquitto_shown = True
                        settings = run.broker.settings().replace("\n", "; ")
                        print(f"    mosquitto settings: {settings}")
        if "rebalance" in phases:
            print(f"\n== rebalance (Riverbed, SQLite; W = {args.window * 1000:.0f} ms)", flush=True)
            reb = Rebalance(args)
            workdirs.append(reb.workdir)
            t = time.monotonic()
            try:
                reb.go()
            except Exception as exc:
                print(f"  ! rebalance failed: {exc}", flush=True)
                print("  broker log tail:\n" + reb.broker.tail(30), flush=True)
            print(f"    ({time.monotonic() - t:.0f} s)", flush=True)
        summary(flows, reb, config, args)
        print(f"\n(total {time.monotonic() - started:.0f} s)")
        name, mtime = src_changed()
        if (name, mtime) != source:
            when = time.strftime("%H:%M:%S", time.localtime(mtime))
            print(f"! src/ changed during this run ({name} at {when}): later brokers ran it")
    finally:
        cleanup()
        for d in workdirs:
            if args.keep:
                print(f"kept {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
