"""Loopback ports for the servers tests and benchmarks start."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    kill()
    raise RuntimeError(f"{name} did not listen within {timeout}s:\n{tail()}")
