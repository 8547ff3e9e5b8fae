"""A real local HTTP endpoint for delivery tests: records every request and
fails on command.

    with Endpoint() as endpoint:
        endpoint.fail(b"m3", 503, times=2)   # m3's first two attempts get 503
        endpoint.fail(b"m4", 400)            # m4 always gets 400
        ... deliver to endpoint.url ...
        endpoint.delivered()                 # payloads answered 2xx, in order

A rule matches a request whose body starts with its prefix. Requests run on
threads (`ThreadingHTTPServer`); `most` is the most that ran at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote

from harness.waiting import DEFAULT_TIMEOUT, eventually


@dataclass(frozen=True, slots=True)
class Request:
    key: str
    message_id: str
    topic: str
    attempt: int
    payload: bytes
    status: int
    at: float


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (a killed job) is no error of the endpoint's."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class Endpoint:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.requests: list[Request] = []
        self.running = 0
        self.most = 0
        self.connections = 0
        """Connections open now: a killed job's go once the endpoint has read
        what it had sent (`quiet`)."""
        self.lock = threading.Lock()
        self._rules: list[tuple[bytes, int, int | None]] = []
        self._failed: dict[tuple[bytes, str], int] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                with endpoint.lock:
                    endpoint.connections += 1
                super().setup()

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with endpoint.lock:
                        endpoint.connections -= 1

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if len(body) < length:  # the client went away mid-request
                    self.close_connection = True
                    return
                with endpoint.lock:
                    endpoint.running += 1
                    endpoint.most = max(endpoint.most, endpoint.running)
                if endpoint.delay:
                    time.sleep(endpoint.delay)  # the scenario: a slow endpoint's work
                status = endpoint._answer(body, self.headers.get("X-Riverbed-Message-Id", ""))
                with endpoint.lock:
                    endpoint.running -= 1
                    endpoint.requests.append(
                        Request(
                            unquote(self.headers.get("X-Riverbed-Key", "")),
                            self.headers.get("X-Riverbed-Message-Id", ""),
                            unquote(self.headers.get("X-Riverbed-Topic", "")),
                            int(self.headers.get("X-Riverbed-Attempt", "0")),
                            body,
                            status,
                            time.monotonic(),
                        )
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = do_POST

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/hook"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def quiet(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until no connection is open: the requests a killed client had
        sent are all recorded by then."""
        eventually(lambda: self.connections == 0, timeout, "the endpoint's connections closed")

    def fail(self, prefix: bytes, status: int, times: int | None = None) -> None:
        """Answer `status` to requests whose body starts with `prefix`: the
        first `times` attempts of each message (None: always)."""
        with self.lock:
            self._rules.append((prefix, status, times))

    def heal(self) -> None:
        """Forget every rule: everything gets 200 from now on."""
        with self.lock:
            self._rules.clear()

    def _answer(self, body: bytes, message_id: str) -> int:
        with self.lock:
            for prefix, status, times in self._rules:
                if not body.startswith(prefix):
                    continue
                if times is None:
                    return status
                seen = self._failed.get((prefix, message_id), 0)
                if seen < times:
                    self._failed[(prefix, message_id)] = seen + 1
                    return status
        return 200

    def delivered(self) -> list[Request]:
        """The requests answered 2xx, in the order they arrived."""
        with self.lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait_for(self, count: int, timeout: float = DEFAULT_TIMEOUT) -> list[Request]:
        """Wait until `count` requests were answered 2xx; return them."""

        def done() -> list[Request] | None:
            answered = self.delivered()
            return answered if len(answered) >= count else None

        return eventually(
            done, timeout, f"{count} deliveries", explain=lambda: len(self.delivered())
        )

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
