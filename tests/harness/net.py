"""Loopback ports for the servers tests and benchmarks start."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

from harness.waiting import eventually

_PORTS_LOW = 10_000
"""The lowest port handed out; the highest is just below the kernel's
ephemeral range (the ports outgoing connections take)."""


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _port_sequence() -> Iterator[int]:
    """This process's ports: a share of the range below the ephemeral ports,
    one share per xdist worker, in a random order that visits each port once
    before any comes again. A port asked of the kernel (bind to 0) comes from
    the ephemeral range, where a client socket or another worker can take it
    between the test's look and the server's bind ("address already in use");
    these cannot be taken that way, no two workers of a run hand out the same
    one, and two runs on one machine (each walking its own random order)
    rarely pick the same port at the same moment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    span = (_ephemeral_low() - _PORTS_LOW) // count
    start = _PORTS_LOW + (index % count) * span
    ports = list(range(start, start + span))
    while True:
        random.shuffle(ports)
        yield from ports


_ports = _port_sequence()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, not handed
    out before by this process (unless all of its share was)."""
    with _ports_lock:
        for _ in range(_ephemeral_low()):
            port = next(_ports)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # taken (another run on this machine)
                return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def wait_listening(
    process: subprocess.Popen[bytes],
    port: int,
    timeout: float,
    name: str,
    tail: Callable[[], str],
    kill: Callable[[], None],
) -> None:
    """Return once `process` accepts TCP connections on 127.0.0.1:`port`.

    Raises RuntimeError (with the tail of its log) if it exits first or is not
    listening within `timeout` seconds, after `kill()`ing it in the latter case.
    """

    def accepts() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        eventually(accepts, timeout, f"{name} to listen on 127.0.0.1:{port}", interval=0.05)
    except AssertionError:
        kill()
        raise RuntimeError(f"{name} did not listen within {timeout}s:\n{tail()}") from None
