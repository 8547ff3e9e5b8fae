"""One delivery attempt of one message to a subscription's endpoint.

`deliverer(definition)` gives an object whose `deliver(message, attempt)`
makes the attempt and says what came of it (`Attempt`):

- `DELIVERED`: HTTP 2xx, or the callable returned;
- `RETRY`: a failure the retry policy names (an HTTP status code in
  `retry_on_status`; an exception whose type, or any of its base types, is
  named in `retry_on_exceptions`) — the message goes to the retry queue until
  its attempts run out;
- `FAILED`: any other failure — the message is parked in the dead-letter queue.

HTTP (httpx, one shared `AsyncClient`): the payload is the request body; the
key, the message id, the MQTT topic and the attempt number travel in the
headers `X-Riverbed-Key`, `X-Riverbed-Message-Id`, `X-Riverbed-Topic` and
`X-Riverbed-Attempt` (key and topic percent-encoded as UTF-8: header values
are ASCII). A timeout is a `TimeoutError`, a refused or broken connection a
`ConnectionError`, for the retry policy. A callable gets the `StoredMessage`
and the attempt number; a coroutine function is awaited, a plain one runs in
a worker thread.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from riverbed.model import StoredMessage
from riverbed.subscriptions.definition import (
    CallableEndpoint,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.handling import load_handler

if TYPE_CHECKING:
    # Imported where an HTTP endpoint is delivered to: importing httpx costs a
    # process a fifth of a second (its command line's rich and click with
    # it), and every broker and command imports this module.
    import httpx


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Attempt:
    outcome: Outcome
    reason: str = ""
    """Why it failed (`HTTP 503`, `TimeoutError: ...`), for the queues' records."""


class Deliverer(Protocol):
    """Makes delivery attempts to one subscription's endpoint."""

    async def deliver(self, message: StoredMessage, attempt: int) -> Attempt: ...

    async def close(self) -> None: ...


def _failure(retry: RetryPolicy, exc: BaseException, names: tuple[str, ...]) -> Attempt:
    reason = f"{names[0]}: {exc}" if str(exc) else names[0]
    if any(retry.retries(exception=name) for name in names):
        return Attempt(Outcome.RETRY, reason)
    return Attempt(Outcome.FAILED, reason)


def _type_names(exc: BaseException) -> tuple[str, ...]:
    """The exception's type name and its bases' (most specific first)."""
    return tuple(t.__name__ for t in type(exc).__mro__ if t not in (object, BaseException))


class HttpDeliverer:
    """Deliveries to an HTTP endpoint over one connection pool."""

    def __init__(
        self, endpoint: HttpEndpoint, retry: RetryPolicy, client: httpx.AsyncClient | None = None
    ) -> None:
        import httpx

        self.endpoint = endpoint
        self.retry = retry
        self.client = client or httpx.AsyncClient()
        self._timeout = httpx.Timeout(endpoint.request_timeout, connect=endpoint.connect_timeout)

    async def deliver(self, message: StoredMessage, attempt: int) -> Attempt:
        import httpx  # loaded by __init__: a look in sys.modules

        endpoint = self.endpoint
        headers = {
            **endpoint.headers,
            "X-Riverbed-Key": quote(message.key or "", safe=""),
            "X-Riverbed-Message-Id": str(message.message_id),
            "X-Riverbed-Topic": quote(message.mqtt_topic, safe="/+#$"),
            "X-Riverbed-Attempt": str(attempt),
        }
        try:
            response = await self.client.request(
                endpoint.method,
                endpoint.url,
                content=message.payload,
                headers=headers,
                timeout=self._timeout,
            )
        except httpx.TimeoutException as exc:
            return _failure(self.retry, exc, ("TimeoutError", *_type_names(exc)))
        except httpx.TransportError as exc:
            return _failure(self.retry, exc, ("ConnectionError", *_type_names(exc)))
        if 200 <= response.status_code < 300:
            return Attempt(Outcome.DELIVERED)
        reason = f"HTTP {response.status_code}"
        if self.retry.retries(status=response.status_code):
            return Attempt(Outcome.RETRY, reason)
        return Attempt(Outcome.FAILED, reason)

    async def close(self) -> None:
        await self.client.aclose()


class CallableDeliverer:
    """Deliveries to a Python callable `package.module:function`."""

    def __init__(self, endpoint: CallableEndpoint, retry: RetryPolicy) -> None:
        self.retry = retry
        self.function: Callable[..., Any] = load_handler(endpoint.target)

    async def deliver(self, message: StoredMessage, attempt: int) -> Attempt:
        try:
            if inspect.iscoroutinefunction(self.function):
                await self.function(message, attempt)
            else:
                await asyncio.to_thread(self.function, message, attempt)
        except Exception as exc:
            return _failure(self.retry, exc, _type_names(exc))
        return Attempt(Outcome.DELIVERED)

    async def close(self) -> None:
        pass


def deliverer(definition: DeliveryDefinition) -> Deliverer:
    endpoint = definition.endpoint
    if isinstance(endpoint, HttpEndpoint):
        import httpx

        # One connection per attempt in flight: no more (the pool's cost grows
        # with its size), no fewer (attempts would queue for a connection).
        size = definition.consumption.max_in_flight
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        return HttpDeliverer(endpoint, definition.retry, httpx.AsyncClient(limits=limits))
    return CallableDeliverer(endpoint, definition.retry)
