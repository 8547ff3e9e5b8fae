"""MQTT broker benchmark (issue 3): Riverbed beside mosquitto and amqtt.

One persistent QoS 1 session (client id `bench-sub`, clean start 0 / clean
session 0), one topic, 100-byte payloads carrying a sequence number and the
publisher's `time.time_ns()`. Publisher and subscriber are paho-mqtt 2.x clients
in separate processes (this script run with `--role pub|sub`). Per broker, on a
fresh store, in this order:

  a. live: the subscriber online, N messages at full speed (the publisher keeps
     the broker's receive maximum in flight), then `--paced` messages at 2,000 msg/s;
     end-to-end msg/s and p50/p99 latency (receive time - timestamp in the payload);
  b. offline: N/2 published while the subscriber is away, then its drain rate
     when it reconnects (the session, not a new SUBSCRIBE, must bring them);
  c. broker CPU seconds per message for every phase (utime+stime of the broker's
     pid from /proc/PID/stat, before and after);
  d. crash: N/5 published while the subscriber is offline; it reconnects, acks the
     first half of them (manual acks), stops acking, disconnects; another N/5 is
     published while it is away; SIGKILL of the broker; restart on the same
     storage; the subscriber reconnects and reads until idle. lost = acknowledged
     to the publisher (PUBACK) but never delivered; duplicates = extra deliveries
     of a message; stale = delivered after the restart although the subscriber
     had acknowledged it before the kill.

Brokers: Riverbed (`riverbed serve`, SQLite in a temp dir), mosquitto (Debian
package, generated config: persistence on, max_queued_messages 0,
max_inflight_messages = Riverbed's receive maximum, autosave_interval default),
amqtt (separate venv `--amqtt-python`, made with pip if missing, MQTT 3.1.1
only, a user name so its sessions are kept, SessionDBPlugin for persistence).
Every broker listens on
127.0.0.1 only; everything started is stopped (SIGTERM, then SIGKILL by pid).

`floor` (`--brokers riverbed,mosquitto,floor`): `bench/_floor_broker.py`, a
minimal MQTT broker in Python on uvloop with Riverbed's codec, sessions in
memory and nothing durable (its SIGKILL phase loses everything). Its CPU per
message is the floor of a Python broker for this traffic, so its ratio to
mosquitto tells how much of Riverbed's is Python and the event loop, and how
much is Riverbed's own. `floor-durable` is the same broker with `--durable`,
doing the least durable work Riverbed's guarantees need (a SQLite log and
session rows, commits paced as Riverbed's, PUBACKs after them): the floor of a
durable Python broker. Beside the other reports, every broker's CPU per message
is printed with its ratio to mosquitto.

    .venv/bin/python bench/mqtt.py [--messages 100000] [--paced 20000]
        [--brokers riverbed,mosquitto,amqtt] [--riverbed-db sqlite|postgres]
        [--metrics on|off|both] [--acl FILE] [--rounds 1] [--transport tcp|ws|tcp,ws]

`--metrics`: Riverbed with its Prometheus metrics (`[metrics] enabled`, the
default) or without; `both` runs it with them, then without, and prints the
broker CPU per message of the two side by side (the target: on within 5% of off).
`--acl FILE`: Riverbed is also run with FILE as its ACL file (`[auth] acl_file`;
the clients are anonymous, so rules on `%u` do not apply to them, `%c` ones do)
beside the run without one, and the two broker CPUs per message are printed side
by side (the target: with the ACL within 5% of without). `bench/acl.txt` holds
rules of the kind a deployment has.
`--rounds N` repeats the runs in turn (on, off, then off, on, ...) and pools
them: on a busy machine one pair differs by more than 5% either way.

For profiling, three environment variables change how Riverbed runs (here and
in the benchmarks that start it through this file: `bench/sessions.py`,
`bench/idle_stored.py`): `BENCH_RIVERBED_EXTRA` is appended to its generated
configuration file (TOML; `\n` for a new line: `"[storage]\ncommit_interval_ms = 0"`),
`BENCH_RIVERBED_WRAP` names a Python script run in place of `-m riverbed.cli`
with the same arguments (`bench/_profiled_broker.py`: cProfile switched on and
off by signals), and `BENCH_SPLIT=1` prints the broker's user and system CPU
seconds, cumulated, at the end of every phase (to stderr).

`--transport ws`: MQTT over WebSockets (path /mqtt, subprotocol mqtt; paho's
`transport="websockets"`) to Riverbed's `--ws` listener and amqtt's `ws` one
(Debian's mosquitto has none). `tcp,ws` runs each broker over both, every
other round in the reverse order, and prints Riverbed's CPU per message over
WebSockets against its own over TCP (target <= 1.3) and amqtt's over
WebSockets (target <= 0.25), pooled over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness.net import free_port, wait_listening
from harness.postgres import PostgresServer

TOPIC = "bench/t"
SUB_ID = "bench-sub"
PAYLOAD = 100
# sequence and time.time_ns() at publish, as ASCII digits: amqtt's SessionDBPlugin
# stores queued messages as UTF-8 text and fails on binary payloads
HEADER_SIZE = 40


def pack(seq: int, ts: int) -> bytes:
    return b"%020d%020d" % (seq, ts)


def unpack(payload: bytes) -> tuple[int, int]:
    return int(payload[:20]), int(payload[20:40])


WS_PATH = "/mqtt"
RECEIVE_MAXIMUM = 100  # Riverbed's limits.receive_maximum and limits.max_inflight defaults
TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent


# --- clients (run as subprocesses: --role pub / --role sub) -------------------------


def _client(args: argparse.Namespace, client_id: str, clean: bool, manual_ack: bool = False) -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    # paho offers the WebSocket subprotocol "mqtt" for 3.1.1 and 5
    transport = "websockets" if args.transport == "ws" else "tcp"
    if args.v311:
        c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id,
            protocol=paho.MQTTv311,
            clean_session=clean,
            manual_ack=manual_ack,
            transport=transport,
        )
    else:
        c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id,
            protocol=paho.MQTTv5,
            manual_ack=manual_ack,
            transport=transport,
        )
    c.username_pw_set("bench", "bench")
    if args.transport == "ws":
        c.ws_set_options(path=WS_PATH)
    c.max_inflight_messages_set(RECEIVE_MAXIMUM)
    c.max_queued_messages_set(0)
    return c


def _connect(c: Any, args: argparse.Namespace, clean: bool) -> bool:
    """Connect and wait for CONNACK; return Session Present."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    done = threading.Event()
    state: dict[str, Any] = {}

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        state["present"] = bool(flags.session_present)
        state["rc"] = int(reason.value) if hasattr(reason, "value") else int(reason)
        done.set()

    c.on_connect = on_connect
    if args.v311:
        c.connect("127.0.0.1", args.port, 60)
    else:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 86400
        props.ReceiveMaximum = RECEIVE_MAXIMUM  # mosquitto honours the client's (65535)
        c.connect("127.0.0.1", args.port, 60, clean_start=clean, properties=props)
    c.loop_start()
    if not done.wait(20):
        raise SystemExit("no CONNACK")
    if state["rc"] != 0:
        raise SystemExit(f"CONNECT refused: {state['rc']}")
    return bool(state["present"])


def run_pub(args: argparse.Namespace) -> None:
    c = _client(args, f"bench-pub-{args.first}", clean=True)
    window = threading.Semaphore(RECEIVE_MAXIMUM)
    infos: list[tuple[int, Any]] = []
    counter = itertools.count(1)
    all_acked = threading.Event()
    count = args.count

    # paho calls on_publish holding its own lock: take no lock of ours here
    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        if next(counter) >= count:
            all_acked.set()
        window.release()

    c.on_publish = on_publish
    _connect(c, args, clean=True)
    pad = b"x" * (PAYLOAD - HEADER_SIZE)
    interval = 1.0 / args.rate if args.rate else 0.0
    start = time.monotonic()
    t0 = time.time_ns()
    for i in range(count):
        seq = args.first + i
        if interval:
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        window.acquire()
        infos.append((seq, c.publish(TOPIC, pack(seq, time.time_ns()) + pad, qos=1)))
    all_acked.wait(args.timeout)
    t1 = time.time_ns()
    acked = [seq for seq, info in infos if info.is_published()]
    c.disconnect()
    c.loop_stop()
    Path(args.out).write_text(
        json.dumps({"acked": acked, "start_ns": t0, "end_ns": t1, "sent": count})
    )


def run_sub(args: argparse.Namespace) -> None:
    c = _client(args, SUB_ID, clean=False, manual_ack=args.ack_limit >= 0)
    lock = threading.Lock()
    got = array("q")  # sequences, in delivery order
    lat = array("q")  # ns
    dups = array("b")
    acked: list[int] = []
    state = {"last": time.monotonic(), "first_ns": 0, "last_ns": 0}
    lo, hi = args.first, args.first + args.count
    want = set(range(lo, hi))
    done = threading.Event()

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        now = time.time_ns()
        seq, ts = unpack(msg.payload)
        with lock:
            if not got:
                state["first_ns"] = now
            state["last_ns"] = now
            state["last"] = time.monotonic()
            got.append(seq)
            lat.append(now - ts)
            dups.append(1 if msg.dup else 0)
            want.discard(seq)
            if args.ack_limit >= 0 and len(acked) < args.ack_limit:
                client.ack(msg.mid, msg.qos)
                acked.append(seq)
            if not want and args.count:
                done.set()

    c.on_message = on_message
    connect_ns = time.time_ns()
    present = _connect(c, args, clean=False)
    connack_ns = time.time_ns()
    if args.subscribe:
        sub_done = threading.Event()
        c.on_subscribe = lambda *a: sub_done.set()
        c.subscribe(TOPIC, qos=1)
        if not sub_done.wait(20):
            raise SystemExit("no SUBACK")
    state["last"] = time.monotonic()
    print("ready", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not done.is_set():
        if args.idle and time.monotonic() - state["last"] > args.idle:
            break
        done.wait(0.05)
    time.sleep(args.linger)  # let the last PUBACKs reach the broker
    c.disconnect()
    c.loop_stop()
    Path(args.out).write_text(
        json.dumps(
            {
                "present": present,
                "got": list(got),
                "lat": list(lat),
                "dup_flags": sum(dups),
                "acked": acked,
                "connect_ns": connect_ns,
                "connack_ns": connack_ns,
                "first_ns": state["first_ns"],
                "last_ns": state["last_ns"],
            }
        )
    )


# --- brokers -------------------------------------------------------------------------


class Broker:
    name = "?"
    v311 = False
    transports = ("tcp",)
    """What `--transport` this broker can be run with."""

    def __init__(self, workdir: Path, transport: str = "tcp") -> None:
        self.workdir = workdir
        self.transport = transport
        self.port = free_port()
        """The port the clients connect to (`transport`'s listener)."""
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    @property
    def label(self) -> str:
        """The name in the report: `riverbed`, `riverbed/ws`, `amqtt/ws`, ..."""
        return self.name if self.transport == "tcp" else f"{self.name}/{self.transport}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                cwd=self.workdir,
            )
        wait_listening(self.process, self.port, timeout, self.name, self.tail, self.kill)

    def cpu(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime

    def rss_mb(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, timeout: float = 20.0) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  ! {self.name} ignored SIGTERM for {timeout}s, SIGKILL", flush=True)
            p.kill()
            p.wait()

    def kill(self) -> None:
        p = self.process
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Riverbed(Broker):
    name = "riverbed"
    v311 = False
    transports = ("tcp", "ws")
    db_url: str | None = None
    """`--riverbed-db postgres`: a database on a throwaway PostgreSQL server."""
    metrics = True
    """`[metrics] enabled` (`--metrics`)."""
    acl: Path | None = None
    """`[auth] acl_file` (`--acl`, for `RiverbedAcl` only)."""

    def command(self) -> list[str]:
        db = self.workdir / "data" / "riverbed.db"
        db.parent.mkdir(exist_ok=True)
        url = self.db_url or f"sqlite:///{db}"
        conf = self.workdir / "riverbed.toml"
        text = f"[metrics]\nenabled = {'true' if self.metrics else 'false'}\n"
        if self.acl is not None:
            text += f"[auth]\nacl_file = {json.dumps(str(self.acl))}\n"
        text += os.environ.get("BENCH_RIVERBED_EXTRA", "").replace("\\n", "\n")
        conf.write_text(text)
        if self.transport == "ws":  # the TCP listener on a port nobody uses
            listeners = ["--mqtt", f"127.0.0.1:{free_port()}", "--ws", f"127.0.0.1:{self.port}"]
        else:
            listeners = ["--mqtt", f"127.0.0.1:{self.port}"]
        return [
            sys.executable,  # the venv running this script (.venv/bin/python)
            *(
                [os.environ["BENCH_RIVERBED_WRAP"]]
                if os.environ.get("BENCH_RIVERBED_WRAP")
                else ["-m", "riverbed.cli"]
            ),
            "serve",
            *listeners,
            "--db",
            url,
            "--allow-anonymous",
            "--config",
            str(conf),
        ]


class RiverbedMetricsOff(Riverbed):
    """Riverbed with `[metrics] enabled = false` (`--metrics both`)."""

    name = "riverbed-metrics-off"
    metrics = False


class RiverbedAcl(Riverbed):
    """Riverbed with `--acl FILE` as its ACL file."""

    name = "riverbed-acl"


class Floor(Broker):
    """A minimal in-memory MQTT broker in Python on uvloop (bench/_floor_broker.py):
    what any Python broker pays per message before it does anything durable."""

    name = "floor"
    v311 = False

    def command(self) -> list[str]:
        return [sys.executable, str(ROOT / "bench" / "_floor_broker.py"), "--port", str(self.port)]


class FloorDurable(Floor):
    """The floor broker with `--durable`: its log and sessions in SQLite, what
    a Python broker pays per message for the least durable work that Riverbed's
    guarantees need."""

    name = "floor-durable"
    db_url: str | None = None
    """A PostgreSQL database to be durable in (None: a SQLite file of its own)."""

    def command(self) -> list[str]:
        if self.db_url is not None:
            return [*super().command(), "--durable-url", self.db_url]
        data = self.workdir / "floor"
        data.mkdir(exist_ok=True)
        return [*super().command(), "--durable", str(data)]


class Mosquitto(Broker):
    name = "mosquitto"
    v311 = False

    def settings(self) -> str:
        return (
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.workdir / 'mosq'}/\n"
            "max_queued_messages 0\n"
            f"max_inflight_messages {RECEIVE_MAXIMUM}\n"
            f"log_dest file {self.workdir / 'mosq' / 'mosquitto.log'}\n"
        )

    def command(self) -> list[str]:
        data = self.workdir / "mosq"
        data.mkdir(exist_ok=True)
        os.chmod(self.workdir, 0o755)
        try:
            user = pwd.getpwnam("mosquitto")
            os.chown(data, user.pw_uid, user.pw_gid)
        except KeyError:
            pass
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(self.settings())
        return ["/usr/sbin/mosquitto", "-c", str(conf)]


AMQTT_WITHOUT_PINGS = """
import functools, sys, websockets
from amqtt.scripts.broker_script import main
websockets.serve = functools.partial(websockets.serve, ping_interval=None)
sys.exit(main())
"""
"""amqtt's broker with its WebSocket listener's keepalive pings off (Riverbed sends
none either). paho-mqtt writes its Pong straight to the socket, into the middle
of a frame it has only partly sent when the socket's buffer is full, and amqtt
then closes the connection (1002 "incorrect masking"), within 20 s under load."""


class Amqtt(Broker):
    name = "amqtt"
    v311 = True
    transports = ("tcp", "ws")
    python = "/tmp/amqtt-venv/bin/python"

    def settings(self) -> str:
        return (
            "listeners:\n"
            "  default:\n"
            f"    type: {self.transport}\n"
            f"    bind: 127.0.0.1:{self.port}\n"
            "plugins:\n"
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: false\n"  # a user name is required: sessions are kept
            "  amqtt.contrib.persistence.SessionDBPlugin:\n"
            f"    file: {self.workdir / 'amqtt.db'}\n"
            "    clear_on_shutdown: false\n"
        )

    def command(self) -> list[str]:
        conf = self.workdir / "amqtt.yaml"
        conf.write_text(self.settings())
        if self.transport == "ws":
            return [self.python, "-c", AMQTT_WITHOUT_PINGS, "-c", str(conf)]
        amqtt = Path(self.python).parent / "amqtt"
        return [str(amqtt), "-c", str(conf)]

    @classmethod
    def install(cls) -> None:
        """Make amqtt's venv (`--amqtt-python`) if it is missing: its own, so its
        pins never meet Riverbed's."""
        python = Path(cls.python)
        if (python.parent / "amqtt").exists():
            return
        venv = python.parent.parent
        print(f"-- amqtt: installing it into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        packages = ["amqtt", "aiosqlite", "sqlalchemy", "greenlet"]  # SessionDBPlugin's
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)


# --- orchestration -------------------------------------------------------------------


class Run:
    def __init__(self, broker: Broker, args: argparse.Namespace) -> None:
        self.b = broker
        self.args = args
        self.n = 0  # out-file counter
        self.next_seq = 0
        self.rows: list[tuple[str, str]] = []
        self.cpu: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, float] = {}
        """End-to-end msg/s by phase (live, offline drain)."""

    def _role(self, role: str, **kw: Any) -> tuple[subprocess.Popen[str], Path]:
        self.n += 1
        out = self.b.workdir / f"{role}{self.n}.json"
        cmd = [
            sys.executable,
            __file__,
            "--role",
            role,
            "--port",
            str(self.b.port),
            "--out",
            str(out),
            "--transport",
            self.b.transport,
        ]
        if self.b.v311:
            cmd.append("--v311")
        for key, value in kw.items():
            if value is True:
                cmd.append(f"--{key.replace('_', '-')}")
            elif value is not False:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        return proc, out

    def sub_start(self, first: int, count: int, **kw: Any) -> tuple[subprocess.Popen[str], Path]:
        proc, out = self._role("sub", first=first, count=count, **kw)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.wait()
            raise RuntimeError(f"subscriber failed on {self.b.name}:\n{self.b.tail()}")
        return proc, out

    def pub(self, count: int, rate: float = 0) -> tuple[int, dict[str, Any]]:
        first = self.next_seq
        self.next_seq += count
        proc, out = self._role("pub", first=first, count=count, rate=rate, timeout=600)
        proc.wait()
        return first, json.loads(out.read_text())

    @staticmethod
    def finish(proc: subprocess.Popen[str], out: Path) -> dict[str, Any]:
        proc.wait()
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    def measure(self, label: str, messages: int, before: float) -> float:
        used = self.b.cpu() - before
        if os.environ.get("BENCH_SPLIT"):
            assert self.b.process is not None
            f = Path(f"/proc/{self.b.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            print("SPLIT", label, int(f[11]) / TICKS, int(f[12]) / TICKS, file=sys.stderr)
        self.cpu[label] = (used, messages)
        return used

    def live(self, label: str, count: int, rate: float) -> None:
        first = self.next_seq
        sub, out = self.sub_start(first, count, subscribe=True, idle=30, timeout=900)
        c0 = self.b.cpu()
        _, pub = self.pub(count, rate)
        s = self.finish(sub, out)
        self.measure(label, count, c0)
        got = [g for g in s["got"] if first <= g < first + count]
        lat = sorted(s["lat"])
        span = (s["last_ns"] - pub["start_ns"]) / 1e9 if s["last_ns"] else float("nan")
        pub_rate = count / ((pub["end_ns"] - pub["start_ns"]) / 1e9)
        p50 = lat[len(lat) // 2] / 1e6 if lat else float("nan")
        p99 = lat[int(len(lat) * 0.99)] / 1e6 if lat else float("nan")
        missing = count - len(set(got))
        redelivered = len(got) - len(set(got))
        self.rates[label] = len(got) / span
        self.rows.append(
            (
                label,
                f"{len(got) / span:,.0f} msg/s end-to-end (publisher {pub_rate:,.0f}/s), "
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, received {len(set(got))}/{count}"
                + (f", MISSING {missing}" if missing else "")
                + (f", redelivered {len(got) - len(set(got))}" if redelivered else ""),
            )
        )

    def offline(self, count: int) -> None:
        c0 = self.b.cpu()
        first, pub = self.pub(count)
        self.measure("offline publish", count, c0)
        pub_rate = count / ((pub["end_ns"] - pub["start_ns"]) / 1e9)
        c1 = self.b.cpu()
        sub, out = self.sub_start(first, count, idle=15, timeout=900)
        s = self.finish(sub, out)
        got = [g for g in s["got"] if first <= g < first + count]
        self.measure("offline drain", len(got), c1)
        span = (s["last_ns"] - s["connect_ns"]) / 1e9 if s["last_ns"] else float("nan")
        self.rates["offline publish"] = pub_rate
        self.rates["offline drain"] = len(got) / span
        self.rows.append(("offline publish", f"{pub_rate:,.0f} msg/s acknowledged"))
        self.rows.append(
            (
                "offline drain",
                f"{len(got) / span:,.0f} msg/s (CONNECT to last message), session present "
                f"{int(s['present'])}, received {len(set(got))}/{count}",
            )
        )

    def crash(self, count: int) -> None:
        half = count // 2
        first, pub1 = self.pub(count)
        # reconnect, acknowledge the first half (manual acks), then go away
        sub, out = self.sub_start(first, count, idle=3, timeout=300, ack_limit=half, linger=1.0)
        s1 = self.finish(sub, out)
        _, pub2 = self.pub(count)
        self.b.kill()  # SIGKILL with the second batch queued for the offline subscriber
        t = time.monotonic()
        self.b.start()
        restart = time.monotonic() - t
        c0 = self.b.cpu()
        sub, out = self.sub_start(first, 2 * count, idle=10, timeout=600)
        s2 = self.finish(sub, out)
        self.measure("after restart", len(s2["got"]), c0)
        acked_pub = set(pub1["acked"]) | set(pub2["acked"])
        deliveries: dict[int, int] = {}
        for g in s1["got"] + s2["got"]:
            deliveries[g] = deliveries.get(g, 0) + 1
        lost = len(acked_pub - deliveries.keys())
        dups = sum(v - 1 for v in deliveries.values() if v > 1)
        stale = len(set(s1["acked"]) & set(s2["got"]))
        self.crash_result = {"lost": lost, "duplicates": dups, "stale": stale}
        self.rows.append(
            (
                "SIGKILL",
                f"published {2 * count} (acknowledged {len(acked_pub)}), subscriber acked "
                f"{len(s1['acked'])} of {len(s1['got'])} before; after restart ({restart:.1f} s) "
                f"session present {int(s2['present'])}, received {len(s2['got'])} "
                f"({s2['dup_flags']} with DUP): lost {lost}, duplicates {dups}, stale {stale}",
            )
        )

    def go(self) -> None:
        a = self.args
        self.b.start()
        try:
            # create the session, then a short warm-up (not measured)
            self.live("warm-up", min(1000, a.messages), 0)
            self.rows.clear()
            self.cpu.clear()
            self.rates.clear()
            self.live("live, full speed", a.messages, 0)
            self.live(f"live, paced {a.rate:,.0f}/s", a.paced, a.rate)
            # the subscriber is offline now (its session kept)
            self.offline(a.messages // 2)
            self.crash(max(2, a.messages // 5))
            self.rss = self.b.rss_mb()
        finally:
            self.b.stop()
            self.b.kill()

    def report(self) -> None:
        print(f"\n== {self.b.label} (port {self.b.port})")
        for label, text in self.rows:
            print(f"  {label:<22} {text}")
        print(f"  {'phase':<22} {'broker CPU s':>12} {'messages':>9} {'µs CPU/msg':>11}")
        for label, (cpu, msgs) in self.cpu.items():
            per = f"{cpu / msgs * 1e6:>11.1f}" if msgs else f"{'-':>11}"
            print(f"  {label:<22} {cpu:>12.2f} {msgs:>9} {per}")

    def per_msg(self, label: str) -> float:
        cpu, msgs = self.cpu.get(label, (float("nan"), 0))
        return cpu / msgs if msgs else float("nan")

    def total(self, labels: list[str]) -> float:
        """CPU per message over these phases together."""
        cpu = sum(self.cpu.get(label, (float("nan"), 0))[0] for label in labels)
        msgs = sum(self.cpu.get(label, (0.0, 0))[1] for label in labels)
        return cpu / msgs if msgs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--paced", type=int, default=20_000, help="messages in the paced run")
    p.add_argument("--rate", type=float, default=2000.0, help="paced rate, msg/s")
    p.add_argument("--brokers", default="riverbed,mosquitto,amqtt")
    p.add_argument("--amqtt-python", default=Amqtt.python)
    p.add_argument(
        "--riverbed-db",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="Riverbed's storage (postgres: a throwaway server from Debian's binaries)",
    )
    p.add_argument(
        "--metrics",
        choices=["on", "off", "both"],
        default="on",
        help="Riverbed's Prometheus metrics; both: a run with them, then one without",
    )
    p.add_argument(
        "--acl",
        metavar="FILE",
        type=Path,
        help="also run Riverbed with this ACL file, beside the run without (bench/acl.txt)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the brokers this many times in turn (--metrics both: on, off, off, on, ...)",
    )
    p.add_argument(
        "--transport",
        default="tcp",
        help="tcp, ws (MQTT over WebSockets, path /mqtt) or both, tcp,ws: each broker over"
        " each (mosquitto: tcp only); with --rounds, each round in the other order",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores)")
    # client roles
    p.add_argument("--role", choices=["pub", "sub"])
    p.add_argument("--port", type=int)
    p.add_argument("--out")
    p.add_argument("--v311", action="store_true")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--idle", type=float, default=0)
    p.add_argument("--linger", type=float, default=0.3)
    p.add_argument("--ack-limit", type=int, default=-1)
    p.add_argument("--subscribe", action="store_true")
    args = p.parse_args()
    if args.role == "pub":
        return run_pub(args)
    if args.role == "sub":
        return run_sub(args)

    transports = args.transport.split(",")
    for transport in transports:
        if transport not in ("tcp", "ws"):
            p.error(f"--transport {args.transport}: each must be tcp or ws, not {transport!r}")
    Amqtt.python = args.amqtt_python
    if "amqtt" in args.brokers.split(","):
        Amqtt.install()
    Riverbed.metrics = args.metrics != "off"
    if args.acl is not None:
        if not args.acl.is_file():
            p.error(f"--acl {str(args.acl)!r}: no such file")
        if args.metrics == "both":
            p.error("--acl and --metrics both: one comparison per run")
        RiverbedAcl.acl = args.acl.resolve()
    kinds = {
        "riverbed": Riverbed,
        "riverbed-metrics-off": RiverbedMetricsOff,
        "riverbed-acl": RiverbedAcl,
        "mosquitto": Mosquitto,
        "amqtt": Amqtt,
        "floor": Floor,
        "floor-durable": FloorDurable,
    }
    with contextlib.ExitStack() as stack:
        if args.riverbed_db == "postgres":
            server = PostgresServer()
            server.start()
            stack.callback(server.stop)
            Riverbed.db_url = server.new_database("bench_mqtt")
        compare(args, kinds)


def compare(args: argparse.Namespace, kinds: dict[str, type[Broker]]) -> None:
    """Run each broker of `--brokers` in turn, then print the ratios."""
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.2f}; {args.messages} messages of {PAYLOAD} bytes, QoS 1, "
        f"paced run {args.paced} at {args.rate:,.0f}/s, in flight {RECEIVE_MAXIMUM};"
        f" Riverbed on {args.riverbed_db}, metrics {args.metrics}"
        + ("" if args.acl is None else f", ACL {args.acl} and none"),
        flush=True,
    )
    names = args.brokers.split(",")
    variant = None
    if args.metrics == "both" and "riverbed" in names:
        variant = "riverbed-metrics-off"
    if args.acl is not None and "riverbed" in names:
        variant = "riverbed-acl"
    if variant is not None:
        names.insert(names.index("riverbed") + 1, variant)
    transports = args.transport.split(",")
    for name in names:
        for transport in transports:
            if transport not in kinds[name].transports:
                print(f"-- {name}: no {transport} listener, not run over {transport}")
    runs: dict[str, Run] = {}
    rounds: dict[str, list[Run]] = {}
    order: list[tuple[str, str]] = []
    for i in range(args.rounds):
        this = [(n, t) for n in names for t in transports if t in kinds[n].transports]
        if i % 2 and len(transports) > 1:
            this.reverse()  # tcp,ws: each round in the other order
        elif i % 2 and variant is not None and (variant, "tcp") in this:
            # Riverbed and its variant: A, B, then B, A, ... so neither always goes first.
            a, b = this.index(("riverbed", "tcp")), this.index((variant, "tcp"))
            this[a], this[b] = this[b], this[a]
        order += this
    for name, transport in order:
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-mqtt-{name}-{transport}-"))
        broker = kinds[name](workdir, transport)
        name = broker.label
        run = Run(broker, args)
        print(f"-- {name}: {workdir}, load {os.getloadavg()[0]:.2f}", flush=True)
        t = time.monotonic()
        try:
            run.go()
        except Exception as exc:  # report what we have, go on with the next broker
            print(f"  ! {name} failed: {exc}", flush=True)
        print(f"   ({time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.2f})", flush=True)
        runs[name] = run
        rounds.setdefault(name, []).append(run)
        run.report()
        if name == "mosquitto":
            print("  settings: " + broker.settings().replace("\n", "; "))  # type: ignore[attr-defined]
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"  log: {broker.log_path}")

    if "riverbed" in runs:
        r = runs["riverbed"]
        print("\n== broker CPU per message, Riverbed / peer")
        peers = [n for n in runs if not n.startswith("riverbed") and "/" not in n]
        print(f"  {'phase':<22}" + "".join(f" {'/' + n:>12}" for n in peers))
        for label in r.cpu:
            line = f"  {label:<22}"
            for n in peers:
                peer = runs[n].per_msg(label)
                line += f" {r.per_msg(label) / peer if peer else float('nan'):>12.2f}"
            print(line)
        crash = getattr(r, "crash_result", None)
        print("\n== targets (issue 3): broker CPU per message, per phase and all four together")
        phases = [label for label in r.cpu if label != "after restart"]
        for n, limit in (("mosquitto", 3.0), ("amqtt", 0.25)):
            if n not in runs:
                continue
            peer_run = runs[n]
            for label in [*phases, "all four"]:
                if label == "all four":
                    ours, theirs = r.total(phases), peer_run.total(phases)
                else:
                    ours, theirs = r.per_msg(label), peer_run.per_msg(label)
                ratio = ours / theirs if theirs else float("nan")
                ok = "met" if ratio <= limit else "NOT met"
                print(f"  {label:<22} vs {n:<9}: {ratio:5.2f} (target <= {limit}) {ok}")
        if crash:
            ok = "met" if crash["lost"] == 0 and crash["stale"] == 0 else "NOT met"
            print(f"  SIGKILL: lost {crash['lost']}, stale {crash['stale']} (target 0, 0) {ok}")
        if "riverbed-metrics-off" in runs:
            variant_ratio("metrics", rounds["riverbed"], rounds["riverbed-metrics-off"])
        if "riverbed-acl" in runs:
            variant_ratio("ACL file", rounds["riverbed-acl"], rounds["riverbed"])
    if "mosquitto" in rounds and len(rounds) > 1:
        mosquitto_ratios(rounds)
    if "riverbed/ws" in rounds:
        websocket_ratios(rounds)


def pooled(runs: list[Run], labels: list[str]) -> float:
    """Broker CPU seconds per message over these runs and phases together
    (those a failed run did not reach left out)."""
    measured = [r.cpu[label] for r in runs for label in labels if label in r.cpu]
    msgs = sum(m for _, m in measured)
    return sum(c for c, _ in measured) / msgs if msgs else float("nan")


def mosquitto_ratios(rounds: dict[str, list[Run]]) -> None:
    """Every broker's CPU per message beside mosquitto's, per phase and all four
    together, pooled over the rounds: the floor's ratio is what Python and the
    event loop cost by themselves, the rest of Riverbed's is its own."""
    base = rounds["mosquitto"]
    others = [(n, max(10, len(n))) for n in rounds if n != "mosquitto"]
    print("\n== broker CPU per message, µs, and each broker / mosquitto (pooled over rounds)")
    print(
        f"  {'phase':<22} {'mosquitto':>10}"
        + "".join(f" {n:>{width}} {'/mosquitto':>10}" for n, width in others)
    )
    phases = [label for label in base[0].cpu if label != "after restart"]
    for label in [*phases, "all four"]:
        labels = phases if label == "all four" else [label]
        theirs = pooled(base, labels)
        line = f"  {label:<22} {theirs * 1e6:>10.1f}"
        for n, width in others:
            ours = pooled(rounds[n], labels)
            ratio = ours / theirs if theirs else float("nan")
            line += f" {ours * 1e6:>{width}.1f} {ratio:>10.2f}"
        print(line)


def websocket_ratios(rounds: dict[str, list[Run]]) -> None:
    """Riverbed's broker CPU per message over WebSockets against its own over
    TCP and amqtt's over WebSockets, per phase: all rounds pooled, then each
    round's; and the end-to-end rates."""
    ws = rounds["riverbed/ws"]
    targets = (("riverbed", "tcp", 1.3), ("amqtt/ws", "amqtt", 0.25))
    peers = [(n, short, limit) for n, short, limit in targets if n in rounds]
    print("\n== MQTT over WebSockets: broker CPU per message (pooled over rounds)")
    print(
        f"  {'phase':<22} {'ws µs/msg':>10}"
        + "".join(f" {short + ' µs/msg':>14} {'ws/' + short:>9}" for _, short, _ in peers)
        + "   by round"
    )
    phases = [label for label in ws[0].cpu if label != "after restart"]
    for label in [*phases, "all four"]:
        labels = phases if label == "all four" else [label]
        ours = pooled(ws, labels)
        line = f"  {label:<22} {ours * 1e6:>10.1f}"
        each = []
        for n, _, _ in peers:
            theirs = pooled(rounds[n], labels)
            line += f" {theirs * 1e6:>14.1f} {ours / theirs if theirs else float('nan'):>9.2f}"
            pairs = zip(ws, rounds[n], strict=False)
            each.append(
                " ".join(f"{pooled([x], labels) / pooled([y], labels):.2f}" for x, y in pairs)
            )
        print(line + "   " + "; ".join(each))
    print("\n== targets: Riverbed over WebSockets, broker CPU per message, all four phases")
    for n, short, limit in peers:
        ratio = pooled(ws, phases) / pooled(rounds[n], phases)
        ok = "met" if ratio <= limit else "NOT met"
        print(f"  ws / {short:<6}: {ratio:5.2f} (target <= {limit}) {ok}")
    print("\n== end-to-end msg/s (mean over rounds)")
    names = ["riverbed", "riverbed/ws", "amqtt/ws"]
    print(f"  {'phase':<22}" + "".join(f" {n:>12}" for n in names if n in rounds))
    for label in ws[0].rates:
        line = f"  {label:<22}"
        for n in names:
            if n in rounds:
                rates = [r.rates[label] for r in rounds[n] if label in r.rates]
                line += f" {sum(rates) / len(rates) if rates else float('nan'):>12,.0f}"
        print(line)


def variant_ratio(what: str, on: list[Run], off: list[Run]) -> None:
    """Riverbed's broker CPU per message with `what` over without, per phase:
    each round's, then all rounds pooled (CPU seconds over messages)."""
    print(f"\n== Riverbed broker CPU per message, {what} on / off (target <= 1.05)")
    phases = [label for label in on[0].cpu if label != "after restart"]
    print(f"  {'phase':<22} {'on µs/msg':>10} {'off µs/msg':>11} {'on/off':>7}   by round")

    for label in [*phases, "all four"]:
        labels = phases if label == "all four" else [label]
        a, b = pooled(on, labels), pooled(off, labels)
        pairs = zip(on, off, strict=False)
        each = " ".join(f"{pooled([x], labels) / pooled([y], labels):.3f}" for x, y in pairs)
        ratio = a / b if b else float("nan")
        print(f"  {label:<22} {a * 1e6:>10.1f} {b * 1e6:>11.1f} {ratio:>7.3f}   {each}")


if __name__ == "__main__":
    main()
