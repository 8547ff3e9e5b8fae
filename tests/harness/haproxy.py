"""HAProxy in front of several broker nodes, as people deploy them
(docs/cluster.md, "Behind a load balancer").

    with HAProxy([a.port, b.port, c.port]) as lb:
        client = Client(lb.port, "c1")      # round robin over the nodes
        a.kill()
        lb.wait_state("node1", "DOWN")      # its health check took it out
        lb.config_text()                    # the configuration it runs

`start()` writes the configuration (`config()`: TCP mode, round robin, a TCP
health check every 500 ms that takes a node out after 2 failures and back after
2 successes, client and server timeouts well above the clients' keep alive) and
runs the Debian binary in the foreground (`haproxy -f CONFIG -db`) as a
subprocess, on a free loopback port, with its output in a log file; `stop()`
ends it by its pid. `states()` reads each node's state from HAProxy's own stats
socket. Nodes are named `node1` .. `nodeN` in the order of their ports.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from harness.net import free_port, wait_listening
from harness.waiting import SLOW, eventually

START_TIMEOUT = 30.0 * SLOW
STOP_TIMEOUT = 15.0 * SLOW

CHECK_INTERVAL_MS = 500
"""How often HAProxy connects to each node to see it listen."""
CHECK_FALL = 2
"""Failed checks in a row that take a node out (a killed node: ~1 s)."""
CHECK_RISE = 2
"""Passed checks in a row that put it back."""
CLIENT_TIMEOUT = "10m"
"""Inactivity HAProxy allows a connection, each way: well above 1.5 times the
longest MQTT keep alive (the tests' clients: 60 s), so HAProxy never closes
a connection the client's PINGREQs keep alive."""


def installed() -> str | None:
    """The path of the `haproxy` command (Debian: the haproxy package), if any."""
    return shutil.which("haproxy")


def config(port: int, nodes: list[int], stats_socket: Path | None = None) -> str:
    """The configuration: listen on 127.0.0.1:`port`, round robin over the MQTT
    listeners on 127.0.0.1:`nodes`."""
    lines = [
        "global",
        "    maxconn 4096",
    ]
    if stats_socket is not None:
        lines.append(f"    stats socket {stats_socket} mode 600 level admin")
    lines += [
        "",
        "defaults",
        "    mode tcp",
        "    timeout connect 5s",
        f"    timeout client {CLIENT_TIMEOUT}",
        f"    timeout server {CLIENT_TIMEOUT}",
        "    timeout check 2s",
        # A connection that reaches a node that just died (before its checks
        # failed) is tried again on another node instead of being refused.
        "    retries 3",
        "    option redispatch 1",
        "",
        "frontend mqtt",
        f"    bind 127.0.0.1:{port}",
        "    default_backend riverbed",
        "",
        "backend riverbed",
        "    balance roundrobin",
        f"    default-server check inter {CHECK_INTERVAL_MS}ms fall {CHECK_FALL} rise {CHECK_RISE}",
    ]
    lines += [f"    server node{i} 127.0.0.1:{node}" for i, node in enumerate(nodes, 1)]
    return "\n".join(lines) + "\n"


class HAProxy:
    """`haproxy` in a subprocess, in TCP mode in front of broker nodes."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="riverbed-haproxy-"))
        self.config_path = self._dir / "haproxy.cfg"
        self.socket_path = self._dir / "admin.sock"
        self.log_path = self._dir / "haproxy.log"

    def config_text(self) -> str:
        """The configuration as a user would write it (no stats socket)."""
        return config(self.port, self.nodes)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        command = installed()
        if command is None:
            raise RuntimeError("haproxy is not installed (Debian: apt-get install haproxy)")
        self.config_path.write_text(config(self.port, self.nodes, self.socket_path))
        checked = subprocess.run(
            [command, "-c", "-q", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration:\n{checked.stderr}")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [command, "-f", str(self.config_path), "-db"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.process, self.port, timeout, "haproxy", self.tail, self.kill)

    def states(self) -> dict[str, str]:
        """Each node's state as HAProxy sees it ("UP", "DOWN", "UP 1/2"...),
        from `show stat` on its stats socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        rows = b"".join(chunks).decode().splitlines()
        header = rows[0].lstrip("# ").split(",")
        proxy, name, status = (header.index(k) for k in ("pxname", "svname", "status"))
        states = {}
        for row in rows[1:]:
            fields = row.split(",")
            if len(fields) > status and fields[proxy] == "riverbed" and fields[name] != "BACKEND":
                states[fields[name]] = fields[status]
        return states

    def wait_state(self, node: str, state: str, timeout: float = 30.0 * SLOW) -> None:
        """Wait until HAProxy counts `node` ("node1"...) in `state` ("UP", "DOWN")."""
        eventually(
            lambda: self.states().get(node) == state,
            timeout,
            f"haproxy to count {node} {state}",
            interval=0.05,
            explain=self.states,
        )

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to its pid (HAProxy's hard stop: connections close), then wait."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"haproxy ignored SIGTERM for {timeout}s:\n{self.tail()}") from None

    def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> HAProxy:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self.kill()
            shutil.rmtree(self._dir, ignore_errors=True)
