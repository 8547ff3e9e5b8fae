"""What a named subscription that delivers to an endpoint is (seed 003).

A `DeliveryDefinition` is stored beside the subscription's cursors, in the KV
namespace `delivery` under the subscription's name, and says

- where messages go (`HttpEndpoint`: URL, method, headers, timeouts; or
  `CallableEndpoint`: `package.module:function`);
- how many shards run it (`subscriptions/shards.py`) and how many partitions
  its retry and dead-letter queues have;
- the retry policy: which failures are retried (HTTP status codes, exception
  type names), the backoff (linear or exponential, with a minimum, a maximum
  and a multiplier) and the most attempts before a message is parked in the
  dead-letter queue;
- the consumption policy: messages in flight at most, groups delivered in
  parallel at most, and the error rate above which delivery slows down;
- whether order holds per group (`grouped`: a group with messages waiting in
  the retry or dead-letter queue holds its later messages behind them) or
  messages are delivered in parallel regardless of their group.

Every value is checked when the definition is built (`InvalidDefinition` names
the field, the value and the rule), so a bad `riverbed subscription create`
changes nothing. `to_json` / `from_json` round-trip exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from riverbed.errors import AlreadyExists, InvalidInput, NotFound, PreconditionFailed, ShardsChanged
from riverbed.log.jsonlines import format_time
from riverbed.storage.base import Storage, SubscriptionRecord
from riverbed.storage.transactions import Transaction, kv_hold_in

NAMESPACE = "delivery"
METHODS = ("POST", "PUT", "PATCH")
"""HTTP methods a delivery may use: the payload is the request body."""
_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class InvalidDefinition(InvalidInput):
    """A subscription definition value that breaks a rule (named in the message)."""


def _fail(name: str, value: object, rule: str) -> InvalidDefinition:
    return InvalidDefinition(f"{name} = {value!r}: {rule}")


def _seconds(name: str, value: object, *, zero: bool = False) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        rule = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
        raise _fail(name, value, f"must be {rule}")
    return float(value)


def _count(name: str, value: object, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(name, value, f"must be an integer of at least {low}")
    return value


@dataclass(frozen=True, slots=True)
class HttpEndpoint:
    """Deliver with an HTTP request: the payload as the body; key, message id,
    MQTT topic and attempt number in headers (`X-Riverbed-*`)."""

    url: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    kind: Literal["http"] = "http"

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url) if isinstance(self.url, str) else None
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise _fail("endpoint", self.url, "must be an http:// or https:// URL with a host")
        if self.method not in METHODS:
            raise _fail("method", self.method, f"must be one of {', '.join(METHODS)}")
        if not isinstance(self.headers, Mapping):
            raise _fail("headers", self.headers, "must map header names to values")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not _HEADER.match(name):
                raise _fail("header name", name, "must be an HTTP token (letters, digits, -)")
            if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
                raise _fail(f"header {name}", value, "must be text without line breaks")
        _seconds("connect_timeout", self.connect_timeout)
        _seconds("request_timeout", self.request_timeout)


@dataclass(frozen=True, slots=True)
class CallableEndpoint:
    """Deliver by calling `package.module:function` with each message."""

    target: str
    kind: Literal["callable"] = "callable"

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not _TARGET.match(self.target):
            raise _fail("endpoint", self.target, "must be package.module:function")


Endpoint = HttpEndpoint | CallableEndpoint


def parse_endpoint(text: str, **http: Any) -> Endpoint:
    """A URL (`http(s)://...`; any `SCHEME://` is taken for a URL, and refused
    unless HTTP) → `HttpEndpoint(text, **http)`; `pkg.mod:fn` → `CallableEndpoint`."""
    if "://" in text:
        return HttpEndpoint(text, **http)
    if http:
        raise InvalidDefinition(
            f"endpoint = {text!r}: {', '.join(sorted(http))} only apply to an HTTP endpoint"
        )
    return CallableEndpoint(text)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which failures are retried, when, and how often."""

    retry_on_status: tuple[int, ...] = (408, 429, 500, 502, 503, 504)
    retry_on_exceptions: tuple[str, ...] = ("TimeoutError", "ConnectionError")
    backoff: Literal["linear", "exponential"] = "exponential"
    min_delay: float = 1.0
    max_delay: float = 300.0
    multiplier: float = 2.0
    max_attempts: int = 5
    inline_max_delay: float = 0.5
    """A retry due within this many seconds waits inside the batch, holding only
    its group, instead of going through the retry queue (at most four such
    waits per message in a row); 0: every retry goes through the queue."""

    def __post_init__(self) -> None:
        for code in self.retry_on_status:
            if not isinstance(code, int) or isinstance(code, bool) or not 100 <= code <= 599:
                raise _fail("retry_on_status", code, "must be HTTP status codes (100-599)")
        for name in self.retry_on_exceptions:
            if not isinstance(name, str) or not _EXCEPTION.match(name):
                raise _fail("retry_on_exceptions", name, "must be exception type names")
        if self.backoff not in ("linear", "exponential"):
            raise _fail("backoff", self.backoff, "must be linear or exponential")
        _seconds("min_delay", self.min_delay, zero=True)
        _seconds("max_delay", self.max_delay, zero=True)
        if self.max_delay < self.min_delay:
            raise _fail(
                "max_delay", self.max_delay, f"must be at least min_delay ({self.min_delay})"
            )
        if (
            not isinstance(self.multiplier, int | float)
            or isinstance(self.multiplier, bool)
            or not math.isfinite(self.multiplier)
            or self.multiplier < (1 if self.backoff == "exponential" else 0)
        ):
            low = "1 (exponential)" if self.backoff == "exponential" else "0 (linear)"
            raise _fail("multiplier", self.multiplier, f"must be a number of at least {low}")
        _count("max_attempts", self.max_attempts)
        _seconds("inline_max_delay", self.inline_max_delay, zero=True)

    def delay(self, attempt: int) -> float:
        """Seconds before attempt `attempt + 1`, after `attempt` failed ones (>= 1)."""
        n = max(1, attempt) - 1
        if self.backoff == "linear":
            wait = self.min_delay + self.multiplier * n
        else:
            try:
                wait = self.min_delay * float(self.multiplier) ** n
            except OverflowError:
                wait = self.max_delay
        return min(self.max_delay, wait)

    def retries(self, *, status: int | None = None, exception: str | None = None) -> bool:
        """Whether a failure with this status code or exception type is retried."""
        if status is not None:
            return status in self.retry_on_status
        return exception is not None and exception in self.retry_on_exceptions


@dataclass(frozen=True, slots=True)
class ConsumptionPolicy:
    """How hard a subscription may push its endpoint."""

    max_in_flight: int = 100
    max_parallel_groups: int = 100
    error_rate_threshold: float = 0.5
    """Above this share of failures (over the last `error_window` deliveries)
    delivery slows down to `throttled_rate` per second until it recovers."""
    error_window: int = 100
    throttled_rate: float = 10.0

    def __post_init__(self) -> None:
        _count("max_in_flight", self.max_in_flight)
        _count("max_parallel_groups", self.max_parallel_groups)
        if (
            not isinstance(self.error_rate_threshold, int | float)
            or isinstance(self.error_rate_threshold, bool)
            or not 0 < self.error_rate_threshold <= 1
        ):
            raise _fail(
                "error_rate_threshold", self.error_rate_threshold, "must be above 0 and at most 1"
            )
        _count("error_window", self.error_window)
        _seconds("throttled_rate", self.throttled_rate)


@dataclass(frozen=True, slots=True)
class DeliveryDefinition:
    """A named subscription's delivery: endpoint, shards, queues and policies."""

    name: str
    topic: str
    endpoint: Endpoint
    shard_count: int = 1
    grouped: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    consumption: ConsumptionPolicy = field(default_factory=ConsumptionPolicy)
    rq_partitions: int | None = None
    dlq_partitions: int | None = None
    """Partitions of the retry and dead-letter queues (None: chosen at creation,
    `shards.queue_partitions`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint, HttpEndpoint | CallableEndpoint):
            raise _fail("endpoint", self.endpoint, "must be an HTTP or a callable endpoint")
        _count("shard_count", self.shard_count)
        if not isinstance(self.grouped, bool):
            raise _fail("grouped", self.grouped, "must be true or false")
        for name in ("rq_partitions", "dlq_partitions"):
            value = getattr(self, name)
            if value is not None:
                _count(name, value)

    @property
    def target(self) -> str:
        """Where it delivers: the URL or `module:function`."""
        e = self.endpoint
        return e.url if isinstance(e, HttpEndpoint) else e.target

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DeliveryDefinition:
        try:
            raw = json.loads(data)
            endpoint_raw = dict(raw.pop("endpoint"))
            kind = endpoint_raw.pop("kind")
            endpoint: Endpoint
            if kind == "http":
                endpoint = HttpEndpoint(**endpoint_raw)
            elif kind == "callable":
                endpoint = CallableEndpoint(**endpoint_raw)
            else:
                raise InvalidDefinition(f"endpoint kind {kind!r} is neither http nor callable")
            retry = dict(raw.pop("retry"))
            retry["retry_on_status"] = tuple(retry["retry_on_status"])
            retry["retry_on_exceptions"] = tuple(retry["retry_on_exceptions"])
            return cls(
                endpoint=endpoint,
                retry=RetryPolicy(**retry),
                consumption=ConsumptionPolicy(**raw.pop("consumption")),
                **raw,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidDefinition(f"stored delivery definition is unreadable: {exc}") from None


def delivery_definition(
    name: str,
    topic: str,
    endpoint: str,
    *,
    shards: int | None = None,
    grouped: bool | None = None,
    method: str | None = None,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float | None = None,
    request_timeout: float | None = None,
    retry_on: Sequence[int | str] | None = None,
    backoff: str | None = None,
    min_delay: float | None = None,
    max_delay: float | None = None,
    multiplier: float | None = None,
    max_attempts: int | None = None,
    inline_retry: float | None = None,
    max_in_flight: int | None = None,
    max_parallel_groups: int | None = None,
    error_rate: float | None = None,
    rq_partitions: int | None = None,
    dlq_partitions: int | None = None,
) -> DeliveryDefinition:
    """The definition `subscription create --endpoint` describes, from its
    options (the command line's and the HTTP API's); None keeps a default.

    `retry_on` mixes HTTP status codes (numbers, or text of digits) and
    exception type names. Raises `InvalidDefinition` naming the value."""
    http: dict[str, Any] = {}
    if method is not None:
        http["method"] = method.upper()
    if headers is not None:
        http["headers"] = dict(headers)
    if connect_timeout is not None:
        http["connect_timeout"] = connect_timeout
    if request_timeout is not None:
        http["request_timeout"] = request_timeout
    retry = _given(
        backoff=backoff,
        min_delay=min_delay,
        max_delay=max_delay,
        multiplier=multiplier,
        max_attempts=max_attempts,
        inline_max_delay=inline_retry,
    )
    if retry_on is not None:
        codes = [i for i in retry_on if isinstance(i, int) or i.strip().isdigit()]
        retry["retry_on_status"] = tuple(int(i) for i in codes)
        retry["retry_on_exceptions"] = tuple(
            i.strip() for i in retry_on if isinstance(i, str) and i not in codes
        )
    consumption = _given(
        max_in_flight=max_in_flight,
        max_parallel_groups=max_parallel_groups,
        error_rate_threshold=error_rate,
    )
    return DeliveryDefinition(
        name,
        topic,
        parse_endpoint(endpoint, **http),
        retry=RetryPolicy(**retry),
        consumption=ConsumptionPolicy(**consumption),
        rq_partitions=rq_partitions,
        dlq_partitions=dlq_partitions,
        **_given(shard_count=shards, grouped=grouped),
    )


def _given(**values: Any) -> dict[str, Any]:
    """The values that are not None (the options given)."""
    return {k: v for k, v in values.items() if v is not None}


def not_delivering(storage: Storage, name: str) -> NotFound:
    """The error for subscription `name`, which has no delivery definition:
    `SubscriptionNotFound` (raised here) if there is no such subscription at
    all, else a `NotFound` saying it does not deliver (for the caller to raise)."""
    storage.get_subscription(name)
    return NotFound(f"subscription {name!r} does not deliver to an endpoint")


class Definitions:
    """Delivery definitions in the KV (namespace `delivery`, key = subscription)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def create(self, definition: DeliveryDefinition) -> None:
        """Raises `AlreadyExists` if the subscription has one already."""
        try:
            self.storage.kv_put_if_absent(NAMESPACE, definition.name, definition.to_json())
        except PreconditionFailed:
            raise AlreadyExists(
                f"subscription {definition.name!r} delivers to an endpoint already"
            ) from None

    def get(self, name: str) -> DeliveryDefinition | None:
        entry = self.storage.kv_get(NAMESPACE, name)
        return None if entry is None else DeliveryDefinition.from_json(entry.value)

    def require(self, name: str) -> DeliveryDefinition:
        """The definition; `NotFound` if subscription `name` does not deliver."""
        return self.require_versioned(name)[0]

    def require_versioned(self, name: str) -> tuple[DeliveryDefinition, int]:
        """The definition and its KV version (a shard-count change moves it);
        `NotFound` if subscription `name` does not deliver."""
        entry = self.storage.kv_get(NAMESPACE, name)
        if entry is None:
            raise not_delivering(self.storage, name)
        return DeliveryDefinition.from_json(entry.value), entry.version

    def list(self) -> list[DeliveryDefinition]:
        return [DeliveryDefinition.from_json(e.value) for e in self.storage.kv_list(NAMESPACE)]

    def delete(self, name: str) -> None:
        entry = self.storage.kv_get(NAMESPACE, name)
        if entry is None:
            raise NotFound(f"subscription {name!r} has no delivery definition")
        self.storage.kv_delete_if_version(NAMESPACE, name, entry.version)


def hold_definition(tx: Transaction, name: str, version: int, shard: int, doing: str) -> None:
    """Inside `tx`, before it writes shard `shard`'s rows and state: the
    definition must still be at `version` (it then stays there until `tx`
    ends). Raises `ShardsChanged`: with other shards now, this shard's rows
    and state are not what the operation read."""
    if not kv_hold_in(tx, NAMESPACE, name, version):
        raise ShardsChanged(
            f"subscription {name!r} changed its shards while {doing}: nothing done from"
            f" shard {shard} on (the shards before it are done); run it again"
        )


def subscription_json(
    record: SubscriptionRecord, delivery: DeliveryDefinition | None
) -> dict[str, Any]:
    """A named subscription as `subscription list --json` and the HTTP API show
    it: where it reads from, and where it delivers (null fields when it does not)."""
    return {
        "name": record.name,
        "topic": record.topic,
        "filter": record.filter,
        "start": record.start.value,
        "start_time": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "endpoint": None if delivery is None else delivery.target,
        "shards": None if delivery is None else delivery.shard_count,
        "grouped": None if delivery is None else delivery.grouped,
    }
