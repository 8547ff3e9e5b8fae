"""An ungrouped shard batch (issue 7) against a real local HTTP server that
fails on command: delivered, retried with the policy's backoff, parked; never
more than `max_in_flight` requests at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from riverbed.model import MessageId, StoredMessage
from riverbed.subscriptions.definition import (
    ConsumptionPolicy,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.endpoint import deliverer
from riverbed.subscriptions.shard import BatchResult, Item, deliver_batch

NOW = 1_700_000_000_000_000


class Server:
    """Answers by the payload: `fail-503`, `fail-400`, else 200; counts the
    requests running at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.running += 1
                    server.most = max(server.most, server.running)
                time.sleep(0.02)
                with server.lock:
                    server.running -= 1
                status = (
                    503
                    if body.startswith(b"fail-503")
                    else 400
                    if body.startswith(b"fail-400")
                    else 200
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def item(n: int, payload: bytes, attempt: int = 1) -> Item:
    message = StoredMessage(
        n,
        MessageId.compose(NOW, 1, n).to_bytes(),
        NOW,
        "orders/new",
        f"g{n % 7}",
        payload,
        None,
        1,
        0,
    )
    return Item(message, 0, n % 4, attempt)


def run(items: list[Item], definition: DeliveryDefinition) -> BatchResult:
    async def go() -> BatchResult:
        d = deliverer(definition)
        try:
            return await deliver_batch(items, d, definition, lambda: NOW)
        finally:
            await d.close()

    return asyncio.run(go())


def test_a_batch_is_delivered_retried_and_parked(server: Server) -> None:
    definition = DeliveryDefinition(
        "billing",
        "orders",
        HttpEndpoint(server.url),
        grouped=False,
        retry=RetryPolicy(retry_on_status=(503,), min_delay=2, max_delay=60, max_attempts=3),
        consumption=ConsumptionPolicy(max_in_flight=4),
    )
    payloads = [
        b"fail-503" if n % 5 == 0 else b"fail-400" if n % 7 == 0 else b"ok" for n in range(40)
    ]
    items = [item(n, p) for n, p in enumerate(payloads)]
    items.append(item(40, b"fail-503", attempt=3))  # its last attempt
    result = run(items, definition)
    assert 1 < server.most <= 4  # in parallel, bounded
    assert sorted(i.main_offset for i in result.delivered) == [
        n for n, p in enumerate(payloads) if p == b"ok"
    ]
    assert [q.main_offset for q in result.retry] == [
        n for n, p in enumerate(payloads) if p == b"fail-503"
    ]
    for q in result.retry:
        assert q.attempt == 2 and q.due_us == NOW + 2_000_000 and q.reason == "HTTP 503"
        assert q.key == f"g{q.main_offset % 7}" and q.failed_us == NOW
    parked = [q.main_offset for q in result.parked]
    assert parked == [n for n, p in enumerate(payloads) if p == b"fail-400"] + [40]
    assert all(q.reason in ("HTTP 400", "HTTP 503") for q in result.parked)
