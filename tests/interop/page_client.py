"""MQTT.js in a browser page, as an `InteropClient` (`test_browser.py`).

    with PageServer() as server:                  # http://127.0.0.1:PORT/
        client = PageClient(browser, server.url, urls, "a", 5)
        client.connect()                          # a new page connects to urls.ws
        ...

`PageServer` serves, on loopback, the page `js/page.html`, which loads MQTT.js's
browser bundle (`js/node_modules/mqtt/dist/mqtt.min.js`, from `make
interop-deps`) and `js/page.js`, the driver in the page. A `PageClient` opens a
page of it in a browser context of its own for each connection, sends it the
commands of `remote.py` through `page.evaluate` and waits for their answers;
the messages the page collects are fetched (drained) whenever the test asks
for them, and once more before the page closes.

`crash()` closes the page's browser context with no DISCONNECT, as a tab closed
or a browser quit does: a browser has no process of the client to SIGKILL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from harness.browser import ConsoleErrors
from harness.waiting import DEFAULT_TIMEOUT
from interop.clients import Message, Refused

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

PAGE_FILES = Path(__file__).parent / "js"
MQTTJS_BUNDLE = PAGE_FILES / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"

ASK = """([command, ms]) => Promise.race([
    driver.handle(command),
    new Promise((resolve) => setTimeout(() => resolve({ event: "timeout" }), ms)),
])"""
"""The test's side of a command: the page's answer, or "timeout" after `ms`."""

PAGE_ROUTES = {
    "/": (PAGE_FILES / "page.html", "text/html; charset=utf-8"),
    "/driver.js": (PAGE_FILES / "driver.js", "text/javascript; charset=utf-8"),
    "/page.js": (PAGE_FILES / "page.js", "text/javascript; charset=utf-8"),
    "/mqtt.min.js": (MQTTJS_BUNDLE, "text/javascript; charset=utf-8"),
}
"""What `PageServer` serves: path -> (file, Content-Type)."""


class PageServer:
    """The driver page and MQTT.js's browser bundle over HTTP on 127.0.0.1."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = PAGE_ROUTES.get(self.path)
                if found is None:
                    self.send_error(404)
                    return
                body = found[0].read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", found[1])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the browser's requests are no news

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        """What a browser sends as the Origin of this server's pages."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.origin}/"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@dataclass(frozen=True, slots=True)
class WebSocketUrls:
    """Where a page connects: `ws` for MQTT over WebSockets, `wss` over TLS."""

    ws: str
    wss: str


class PageClient:
    """An `InteropClient`: MQTT.js in a page of `browser`, one page per connection."""

    def __init__(
        self, browser: Browser, page_url: str, urls: WebSocketUrls, client_id: str, version: int
    ) -> None:
        self.browser = browser
        self.page_url = page_url
        self.urls = urls
        self.client_id = client_id
        self.version = version
        self._context: BrowserContext | None = None
        self._page: Page | None = None
        self._consoles: list[ConsoleErrors] = []
        self._messages: list[Message] = []

    # --- the page -----------------------------------------------------------------------
    def _open(self) -> Page:
        if self._page is not None:
            return self._page
        self._context = self.browser.new_context()
        self._page = self._context.new_page()
        self._consoles.append(ConsoleErrors(self._page))
        answer = self._page.goto(self.page_url)
        assert answer is not None and answer.status == 200, f"{self.page_url}: {answer}"
        return self._page

    def _ask(self, command: dict[str, Any], *expected: str) -> dict[str, Any]:
        page = self._open()
        answer: dict[str, Any] = page.evaluate(ASK, [command, DEFAULT_TIMEOUT * 1000])
        if answer["event"] not in expected:
            raise AssertionError(
                f"{self.client_id}: {command['op']} answered {answer}{self._diagnostics()}"
            )
        return answer

    def _diagnostics(self) -> str:
        errors = self.console_errors()
        return "\nthe page's console errors:\n" + "\n".join(errors) if errors else ""

    def _drain(self) -> None:
        if self._page is not None:
            for m in self._page.evaluate("() => driver.drain()"):
                self._messages.append(Message(m["topic"], m["payload"], m["qos"], m["retain"]))

    # --- InteropClient ------------------------------------------------------------------
    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        will: tuple[str, str, int] | None = None,
        credentials: tuple[str, str] | None = None,
        tls: bool = False,
    ) -> bool | None:
        command = self._connect_command(
            self.urls.wss if tls else self.urls.ws, clean, expiry, will, credentials
        )
        answer = self._ask(command, "connack", "refused")
        if answer["event"] == "refused":
            self.close()
            raise Refused(answer["code"])
        return bool(answer["sessionPresent"])

    def connect_answer(self, url: str) -> dict[str, Any]:
        """Connect to `url` with a clean session, whatever comes of it: the
        page's answer (for tests of a connection that must fail)."""
        command = self._connect_command(url, True, None, None, None)
        return self._ask(command, "connack", "refused", "error")

    def _connect_command(
        self,
        url: str,
        clean: bool,
        expiry: int | None,
        will: tuple[str, str, int] | None,
        credentials: tuple[str, str] | None,
    ) -> dict[str, Any]:
        username, password = credentials or (None, None)
        topic, payload, qos = will or (None, None, None)
        return {
            "op": "connect",
            "url": url,
            "clientId": self.client_id,
            "version": self.version,
            "clean": clean,
            "expiry": expiry,
            "username": username,
            "password": password,
            "will": None if will is None else {"topic": topic, "payload": payload, "qos": qos},
        }

    def subscribe(self, topic_filter: str, qos: int) -> list[int]:
        answer = self._ask({"op": "subscribe", "filter": topic_filter, "qos": qos}, "suback")
        return [int(code) for code in answer["codes"]]

    def publish(self, topic: str, payload: str, qos: int, retain: bool = False) -> None:
        command = {"op": "publish", "topic": topic, "payload": payload, "qos": qos}
        self._ask({**command, "retain": retain}, "published")

    def messages(self) -> list[Message]:
        self._drain()
        return list(self._messages)

    def disconnect(self) -> None:
        self._ask({"op": "disconnect"}, "disconnected")
        self.close()

    def crash(self) -> None:
        """Close the browser context: the page goes, its WebSocket with it, and
        MQTT.js sends no DISCONNECT."""
        context, self._context, self._page = self._context, None, None
        if context is not None:
            context.close()

    def console_errors(self) -> list[str]:
        """What its pages logged as errors, and exceptions their scripts let escape."""
        return [error for console in self._consoles for error in console.errors]

    def close(self) -> None:
        """Fetch what arrived, then close the page's browser context."""
        self._drain()
        self.crash()
