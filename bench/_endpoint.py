"""A local HTTP/1.1 endpoint for `bench/delivery.py`, in a process of its own.

It stands in for the service a delivering subscription (issue 7) sends its
messages to, and counts what arrives, so both sides of the benchmark (Riverbed's
Spark pipeline and the plain asyncio + httpx loop) are judged by one witness.
It must not be what limits either of them on a 2-core machine, so it is a bare
`asyncio.Protocol` (on uvloop where installed): keep-alive, `Content-Length`
bodies only, one request at a time per connection (requests that arrive
together are answered in order), no framework.

A request carrying `X-Riverbed-Message-Id` is a delivery (any method, any path);
`X-Riverbed-Key` names its group and `X-Riverbed-Attempt` its attempt number
(as `riverbed.subscriptions.endpoint` sends them). With `--fail-percent F`, a
fixed F% of message ids (by a hash of the id, so the same ids every run) are
answered 503 the first time the endpoint sees them, and 200 from then on: a
transient failure that one retry cures.

Counted, per reset: requests; 503s; requests with an attempt number above 1;
200s; distinct message ids answered 200 (delivered) and the rest of the 200s
(duplicates); deliveries out of order within their group: the payload starts
with `<key>:<seq>:`, and a newly delivered message whose `seq` is below the
highest already delivered for its key is out of order. Also the times
(`time.monotonic()`, CLOCK_MONOTONIC: one clock for every process on Linux) of
the first and of the latest new delivery, and this process's CPU seconds.

Control requests (no message id header):

- `GET /stats`: the counters as JSON;
- `POST /reset` with a JSON body `{"fail_percent": F}` (or none: keep F): zero
  every counter and forget every id; answers the fresh counters.

Run it alone (the first line on stdout is the port it listens on):

    .venv/bin/python bench/_endpoint.py [--host 127.0.0.1] [--port 0] [--fail-percent 10]

or start and drive it from Python with `Endpoint.start()`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

MAX_HEAD = 64 * 1024
"""A request head longer than this is refused (431) and the connection closed."""


def _response(status: str, body: bytes = b"", content_type: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
    if content_type:
        head += b"Content-Type: " + content_type + b"\r\n"
    return head + b"\r\n" + body


OK = _response("200 OK")
UNAVAILABLE = _response("503 Service Unavailable")
NOT_FOUND = _response("404 Not Found")
BAD_REQUEST = _response("400 Bad Request")
TOO_LARGE = _response("431 Request Header Fields Too Large")
NOT_IMPLEMENTED = _response("501 Not Implemented")


def fails_first_attempt(message_id: str, fail_percent: float) -> bool:
    """Whether `message_id` is one of the fixed `fail_percent`% answered 503 once."""
    if fail_percent <= 0:
        return False
    digest = hashlib.blake2b(message_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 < fail_percent * 100


@dataclass
class Counters:
    """What the endpoint has seen since its last reset."""

    fail_percent: float = 0.0
    requests: int = 0
    failures: int = 0
    """Answered 503 (an injected transient failure)."""
    retries: int = 0
    """Requests whose `X-Riverbed-Attempt` was above 1."""
    ok: int = 0
    """Answered 200."""
    out_of_order: int = 0
    first_delivery: float | None = None
    last_delivery: float | None = None
    delivered: set[bytes] = field(default_factory=set)
    failed_once: set[bytes] = field(default_factory=set)
    last_seq: dict[bytes, int] = field(default_factory=dict)

    def reset(self, fail_percent: float) -> None:
        """Zero every counter and forget every id (every connection shares this object)."""
        fresh = Counters(fail_percent=fail_percent)
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    def deliver(self, message_id: bytes, key: bytes, attempt: bytes, body: bytes) -> bytes:
        """Count one delivery attempt; the response to send."""
        self.requests += 1
        if attempt != b"1":
            self.retries += 1
        if (
            self.fail_percent > 0
            and message_id not in self.failed_once
            and message_id not in self.delivered
            and fails_first_attempt(message_id.decode("latin-1"), self.fail_percent)
        ):
            self.failed_once.add(message_id)
            self.failures += 1
            return UNAVAILABLE
        self.ok += 1
        if message_id in self.delivered:
            return OK  # a duplicate: ok - len(delivered)
        self.delivered.add(message_id)
        parts = body.split(b":", 2)
        if len(parts) == 3 and parts[1].isdigit():
            seq = int(parts[1])
            if seq < self.last_seq.get(key, -1):
                self.out_of_order += 1
            else:
                self.last_seq[key] = seq
        now = time.monotonic()
        if self.first_delivery is None:
            self.first_delivery = now
        self.last_delivery = now
        return OK

    def snapshot(self) -> dict[str, Any]:
        return {
            "fail_percent": self.fail_percent,
            "requests": self.requests,
            "failures": self.failures,
            "retries": self.retries,
            "ok": self.ok,
            "delivered": len(self.delivered),
            "duplicates": self.ok - len(self.delivered),
            "out_of_order": self.out_of_order,
            "groups": len(self.last_seq),
            "first_delivery": self.first_delivery,
            "last_delivery": self.last_delivery,
            "now": time.monotonic(),
            "cpu_seconds": time.process_time(),
        }


class EndpointProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: parse a request, answer it, keep the connection."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        # The request whose head is parsed and whose body is still arriving.
        self.head: tuple[bytes, bytes, dict[bytes, bytes], bool] | None = None
        self.length = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while self.transport is not None:
            if self.head is None:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        self._close_with(TOO_LARGE)
                    return
                if not self._parse_head(bytes(buffer[:end])):
                    return
                del buffer[: end + 4]
            if len(buffer) < self.length:
                return
            body = bytes(buffer[: self.length])
            del buffer[: self.length]
            assert self.head is not None
            method, target, headers, keep_alive = self.head
            self.head = None
            self.transport.write(self._answer(method, target, headers, body))
            if not keep_alive:
                self.transport.close()
                self.transport = None

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        try:
            method, target, version = lines[0].split(b" ", 2)
        except ValueError:
            self._close_with(BAD_REQUEST)
            return False
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"transfer-encoding" in headers:
            self._close_with(NOT_IMPLEMENTED)  # chunked bodies: not needed here
            return False
        try:
            self.length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            self._close_with(BAD_REQUEST)
            return False
        connection = headers.get(b"connection", b"").lower()
        keep_alive = (
            connection != b"close" if version == b"HTTP/1.1" else connection == b"keep-alive"
        )
        self.head = (method, target, headers, keep_alive)
        return True

    def _answer(
        self, method: bytes, target: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> bytes:
        message_id = headers.get(b"x-riverbed-message-id")
        if message_id is not None:
            return self.counters.deliver(
                message_id,
                headers.get(b"x-riverbed-key", b""),
                headers.get(b"x-riverbed-attempt", b"1"),
                body,
            )
        if method == b"GET" and target == b"/stats":
            return self._json(self.counters.snapshot())
        if method == b"POST" and target == b"/reset":
            try:
                options = json.loads(body) if body.strip() else {}
                fail_percent = float(options.get("fail_percent", self.counters.fail_percent))
            except (ValueError, AttributeError, TypeError):
                return BAD_REQUEST
            if not 0 <= fail_percent <= 100:
                return BAD_REQUEST
            self.counters.reset(fail_percent)
            return self._json(self.counters.snapshot())
        return NOT_FOUND

    @staticmethod
    def _json(value: dict[str, Any]) -> bytes:
        return _response("200 OK", json.dumps(value).encode(), b"application/json")

    def _close_with(self, response: bytes) -> None:
        if self.transport is not None:
            self.transport.write(response)
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, fail_percent: float) -> None:
    """Listen, print the port as the first line on stdout, serve until SIGTERM/SIGINT
    or until the parent process is gone."""
    loop = asyncio.get_running_loop()
    counters = Counters(fail_percent=fail_percent)
    server = await loop.create_server(
        lambda: EndpointProtocol(counters), host, port, backlog=1024, reuse_address=True
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent = os.getppid()
    async with server:
        while not stop.is_set():
            # An orphan would hold its port forever: leave with the parent.
            if os.getppid() != parent:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


# --------------------------------------------------------------------- client side


class Endpoint:
    """An endpoint process started by `start()`, and its control requests."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}/"
        self._connection: http.client.HTTPConnection | None = None

    @classmethod
    def start(
        cls, fail_percent: float = 0.0, host: str = "127.0.0.1", uvloop: bool = True
    ) -> Endpoint:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--host",
            host,
            "--port",
            "0",
            "--fail-percent",
            str(fail_percent),
        ]
        if not uvloop:
            command.append("--no-uvloop")
        process = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            process.kill()
            process.wait()
            raise RuntimeError(f"the endpoint did not start (it printed {line!r})")
        return cls(process, host, int(line))

    def _request(self, method: str, path: str, body: bytes = b"") -> dict[str, Any]:
        for retry in (False, True):
            if self._connection is None:
                self._connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                self._connection.request(method, path, body=body)
                response = self._connection.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                self._connection.close()
                self._connection = None
                if retry:
                    raise
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}")
        result: dict[str, Any] = json.loads(data)
        return result

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/stats")

    def reset(self, fail_percent: float) -> dict[str, Any]:
        return self._request("POST", "/reset", json.dumps({"fail_percent": fail_percent}).encode())

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--fail-percent", type=float, default=0.0)
    parser.add_argument("--no-uvloop", action="store_true", help="plain asyncio event loop")
    args = parser.parse_args()
    if not 0 <= args.fail_percent <= 100:
        parser.error("--fail-percent must be between 0 and 100")
    # The sets of ids grow by one object per message: keep the young-generation
    # collector from walking them over and over (as riverbed.tuning does).
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
    coroutine = serve(args.host, args.port, args.fail_percent)
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coroutine)
            return
    asyncio.run(coroutine)


if __name__ == "__main__":
    main()
