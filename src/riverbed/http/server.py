"""The admin HTTP listener: uvicorn on the caller's event loop, as a task.

    server = HttpServer(config.http, context)
    await server.start()       # bound and serving; CannotListen if not
    ...
    await server.stop()        # finishes the requests in progress

No thread of its own: the server runs as a task beside the MQTT listener, and
the app's handlers send their storage calls to worker threads. The socket is
bound before uvicorn starts, so an address in use is refused as the MQTT
listener's is. uvicorn's own signal handling is left out: the process's
SIGTERM/SIGINT belong to whoever runs the loop (`riverbed serve`, `riverbed
admin`), which stops this server with the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterator

import uvicorn

from riverbed.errors import CannotListen
from riverbed.http.app import make_app
from riverbed.http.context import HttpContext
from riverbed.mqtt.config import Address, HttpConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT = 5.0
"""Seconds `stop` lets requests in progress finish."""


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers (the loop's owner has its own)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The admin API on `config.address` (HTTPS with `certfile` and `keyfile`)."""

    def __init__(self, config: HttpConfig, context: HttpContext) -> None:
        assert config.address is not None, "the HTTP listener is off"
        self.config = config
        self.address: Address = config.address
        self.context = context
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    def bind(self) -> None:
        """Bind the listening socket (refused at once with `CannotListen`)."""
        address = self.address
        try:
            infos = socket.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
            family, _, _, _, where = infos[0]
            self._socket = socket.create_server(where[:2], family=family, backlog=128)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            hint = {
                errno.EADDRINUSE: "is something else listening there?",
                errno.EACCES: "ports below 1024 need privileges",
            }.get(exc.errno or 0, "choose another address")
            raise CannotListen(
                f"cannot listen for HTTP on {address}: {reason.lower()} ({hint}; choose"
                " another with --http HOST:PORT or http.address in the config file)"
            ) from None

    async def start(self) -> None:
        """Bind (unless `bind` did) and serve; returns once it takes requests."""
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        config = uvicorn.Config(
            make_app(self.context),
            lifespan="off",
            log_config=None,
            # Its own start and stop lines repeat ours; its warnings and errors stay.
            log_level="warning",
            access_log=False,
            ssl_certfile=None if self.config.certfile is None else str(self.config.certfile),
            ssl_keyfile=None if self.config.keyfile is None else str(self.config.keyfile),
        )
        self._server = server = _Uvicorn(config)
        self._task = asyncio.create_task(server.serve([self._socket]), name="riverbed-http")
        while not server.started:
            if self._task.done():
                self._task.result()  # its exception, if it failed
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        log.info("serving the admin HTTP API on %s", self.url)

    @property
    def url(self) -> str:
        """The base URL (with the port the system chose for port 0)."""
        scheme = "https" if self.config.certfile is not None else "http"
        host, port = self.address.host, self.port
        shown = f"[{host}]" if ":" in host else host
        return f"{scheme}://{shown}:{port}"

    @property
    def port(self) -> int:
        if self._socket is None:
            return self.address.port
        port: int = self._socket.getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stop taking requests; let those in progress finish (for a while)."""
        if self._server is None or self._task is None:
            if self._socket is not None:
                self._socket.close()
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
