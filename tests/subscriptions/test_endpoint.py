"""One delivery attempt (issue 7) against a real HTTP server on a loopback port,
which answers with the status codes a test asks for, and against callables."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from riverbed.model import MessageId, StoredMessage
from riverbed.subscriptions.definition import (
    CallableEndpoint,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.endpoint import Attempt, Outcome, deliverer


class Endpoint:
    """A local HTTP server: records requests, answers `statuses` in turn
    (then 200), sleeps `delay` seconds before answering."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.delay = 0.0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                endpoint.requests.append((self.command, self.path, dict(self.headers), body))
                time.sleep(endpoint.delay)  # the scenario: a slow endpoint's work
                status = endpoint.statuses.pop(0) if endpoint.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    running = Endpoint()
    yield running
    running.close()


MESSAGE = StoredMessage(
    7,
    MessageId.compose(1_700_000_000_000_000, 1, 1).to_bytes(),
    0,
    "sensors/é/1",
    "key é",
    b"payload",
    None,
    1,
    0,
)


def attempt(definition: DeliveryDefinition, n: int = 1) -> Attempt:
    async def run() -> Attempt:
        d = deliverer(definition)
        try:
            return await d.deliver(MESSAGE, n)
        finally:
            await d.close()

    return asyncio.run(run())


def http(url: str, **options: object) -> DeliveryDefinition:
    retry = RetryPolicy(retry_on_status=(503,), retry_on_exceptions=("TimeoutError",))
    return DeliveryDefinition("s", "t", HttpEndpoint(url, **options), retry=retry)  # type: ignore[arg-type]


def test_an_http_delivery_sends_the_payload_and_the_message_in_headers(endpoint: Endpoint) -> None:
    result = attempt(http(endpoint.url, method="PUT", headers={"Authorization": "Bearer t"}), 3)
    assert result == Attempt(Outcome.DELIVERED)
    ((method, path, headers, body),) = endpoint.requests
    assert (method, path, body) == ("PUT", "/hook", b"payload")
    assert headers["Authorization"] == "Bearer t"
    assert headers["X-Riverbed-Key"] == "key%20%C3%A9"
    assert headers["X-Riverbed-Topic"] == "sensors/%C3%A9/1"
    assert headers["X-Riverbed-Attempt"] == "3"
    assert headers["X-Riverbed-Message-Id"] == str(MESSAGE.message_id)


def test_http_status_codes_are_retried_or_failed_by_the_policy(endpoint: Endpoint) -> None:
    endpoint.statuses = [503, 400]
    assert attempt(http(endpoint.url)) == Attempt(Outcome.RETRY, "HTTP 503")
    assert attempt(http(endpoint.url)) == Attempt(Outcome.FAILED, "HTTP 400")
    assert attempt(http(endpoint.url)).outcome is Outcome.DELIVERED


def test_a_timeout_is_a_timeout_error(endpoint: Endpoint) -> None:
    endpoint.delay = 1.0
    result = attempt(http(endpoint.url, request_timeout=0.2))
    assert result.outcome is Outcome.RETRY and result.reason.startswith("TimeoutError")


def test_a_refused_connection_is_a_connection_error(endpoint: Endpoint) -> None:
    url = endpoint.url
    endpoint.close()
    result = attempt(http(url))  # ConnectionError is not in this policy
    assert result.outcome is Outcome.FAILED and result.reason.startswith("ConnectionError")


def test_callables_plain_and_async(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "targets_for_endpoint_test.py").write_text(
        "calls = []\n"
        "def ok(message, attempt):\n    calls.append((message.offset, attempt))\n"
        "async def slow(message, attempt):\n    raise TimeoutError('late')\n"
        "class Refused(ConnectionRefusedError):\n    pass\n"
        "def refused(message, attempt):\n    raise Refused()\n"
        "def broken(message, attempt):\n    raise KeyError('x')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    retry = RetryPolicy(retry_on_exceptions=("TimeoutError", "ConnectionError"))

    def call(name: str) -> Attempt:
        target = CallableEndpoint(f"targets_for_endpoint_test:{name}")
        return attempt(DeliveryDefinition("s", "t", target, retry=retry), 2)

    assert call("ok") == Attempt(Outcome.DELIVERED)
    import targets_for_endpoint_test  # type: ignore[import-not-found]

    assert targets_for_endpoint_test.calls == [(7, 2)]
    assert call("slow") == Attempt(Outcome.RETRY, "TimeoutError: late")
    assert call("refused").outcome is Outcome.RETRY  # a subclass of ConnectionError
    assert call("broken") == Attempt(Outcome.FAILED, "KeyError: 'x'")
