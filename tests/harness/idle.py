"""Many idle MQTT connections, opened fast from one thread (tests and benchmarks).

    sockets = open_idle(port, 10_000)     # each has sent CONNECT and read its CONNACK
    ...
    close_all(sockets)

Each connection is an MQTT 3.1.1 client with clean session 1 and keep alive 0
(the broker never times it out; `keep_alive` sets another, which an idle
client must then keep with PINGREQs), client id `{prefix}{n}`. Non-blocking sockets
and one selector; at most `window` connections are between connect() and their
CONNACK at a time, so the broker's listen backlog never overflows (a dropped SYN
costs a one-second retransmission).
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import time

from riverbed.mqtt.codec import Connect, encode

V311 = 4
CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
"""An MQTT 3.1.1 CONNACK: no session present, return code 0 Connection Accepted."""


def raise_open_files_limit(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit; return the new
    soft limit (compare it with `needed`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed and soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft if soft != resource.RLIM_INFINITY else needed


def open_idle(
    port: int,
    count: int,
    *,
    prefix: str = "idle-",
    window: int = 64,
    timeout: float = 120.0,
    host: str = "127.0.0.1",
    keep_alive: int = 0,
) -> list[socket.socket]:
    """`count` connections to `host:port`, each CONNECTed and CONNACKed."""
    selector = selectors.DefaultSelector()
    done: list[socket.socket] = []
    pending: dict[socket.socket, bytes] = {}  # socket -> CONNACK bytes read so far
    started = 0
    deadline = time.monotonic() + timeout
    try:
        while len(done) < count:
            while started < count and len(pending) < window:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                code = sock.connect_ex((host, port))
                if code not in (0, errno.EINPROGRESS):
                    sock.close()
                    raise OSError(code, f"connection {started}: {errno.errorcode.get(code)}")
                pending[sock] = b""
                selector.register(sock, selectors.EVENT_WRITE, f"{prefix}{started}")
                started += 1
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(done)} of {count} connections CONNACKed within {timeout}s"
                )
            for key, events in selector.select(1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if events & selectors.EVENT_WRITE:
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        raise OSError(code, f"{key.data}: {errno.errorcode.get(code)}")
                    # keep alive 0: the broker never closes an idle connection
                    sock.send(encode(Connect(key.data, True, keep_alive), V311))
                    selector.modify(sock, selectors.EVENT_READ, key.data)
                    continue
                data = pending[sock] + sock.recv(len(CONNACK_ACCEPTED))
                if not data or not CONNACK_ACCEPTED.startswith(data):
                    raise ConnectionError(f"{key.data}: expected a CONNACK, got {data!r}")
                pending[sock] = data
                if data == CONNACK_ACCEPTED:
                    selector.unregister(sock)
                    del pending[sock]
                    done.append(sock)
    except BaseException:
        close_all(done + list(pending))
        raise
    finally:
        selector.close()
    return done


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
    sockets.clear()
