"""Loopback ports for the servers tests and benchmarks start."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable

from harness.waiting import eventually


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
