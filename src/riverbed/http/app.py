"""The admin HTTP API as a FastAPI app: `make_app(context)`.

    app = make_app(HttpContext(log, node="n1", settings=config_view(config)))

Routes (docs/http.md):

- `GET /healthz`: 200 while the process answers; `GET /readyz`: 200 once the
  listeners are bound and the store answers within `READY_DEADLINE`, else 503
  with the reason. Neither needs a token.
- `GET /metrics`: the broker's Prometheus text (`riverbed.metrics`), for a read token.
- `/api/v1/...`: the node, topics (list, describe, create, delete, produce) and
  named subscriptions with their lag; connected MQTT clients when a broker runs
  beside. The OpenAPI document is `/api/v1/openapi.json`.

Handlers call what the command line calls (`Log.topics`, `Subscriptions`,
`message_from_json`, `Log.produce`), never their own copy. Handlers that touch
the store are plain functions, which FastAPI runs on its worker threads: the
event loop they share with the MQTT broker never waits for the database.

Every error is a JSON object `{"error": "..."}`: 400-range for the caller's
mistake (401 no or wrong token, 403 a read token writing, 404 not found, 409
exists already, 422 bad input naming the field and the rule, with nothing
changed), 503 when the store is unreachable or full.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from riverbed.errors import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    RiverbedError,
    StorageError,
)
from riverbed.http.auth import Role, TokenFile
from riverbed.log.jsonlines import FIELDS, format_time, message_from_json
from riverbed.log.log import Log
from riverbed.log.topics import DEFAULT_RETENTION_US, KeyMode
from riverbed.metrics import CONTENT_TYPE
from riverbed.model import format_duration, parse_duration
from riverbed.mqtt.config import Address
from riverbed.storage import size_in_bytes
from riverbed.storage.base import RetentionPolicy, SubscriptionRecord
from riverbed.storage.urls import redact_url
from riverbed.subscriptions.cursors import Subscriptions
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.pipeline import queue_depths

if TYPE_CHECKING:
    from riverbed.mqtt.broker import Broker
    from riverbed.mqtt.connection import Connection

MQTT5 = 5

API = "/api/v1"
READY_DEADLINE = 2.0
"""Seconds the store has to answer for `/readyz` to say ready."""
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_MESSAGE_BODY = 8 * 1024 * 1024
"""Bytes a produce request's body may have: a message is held whole in memory
until it is committed. The default largest MQTT packet (1 MiB) in base64 is
1.4 MB; this leaves room for larger configured ones."""


@dataclass(frozen=True, slots=True)
class HttpContext:
    """What the app serves: the log, this node, the settings in force, and the
    broker beside it (None under `riverbed admin`)."""

    log: Log
    node: str
    settings: dict[str, Any]
    """The configuration in force, secrets hidden (`config_view`)."""
    tokens: TokenFile | None = None
    """None: no token file, every request is an admin's (loopback only)."""
    broker: Broker | None = None
    listening: Callable[[], bool] = lambda: True
    """Whether every listener of the process is bound (for `/readyz`)."""
    started: float = field(default_factory=time.time)


def config_view(config: object) -> Any:
    """A configuration dataclass as JSON-ready values: addresses and paths as
    text, the database URL without its password."""
    if isinstance(config, Address | Path):
        return str(config)
    if is_dataclass(config) and not isinstance(config, type):
        view = {f.name: config_view(getattr(config, f.name)) for f in fields(config)}
        url = view.get("url")
        if isinstance(url, str):
            view["url"] = redact_url(url)
        return view
    return config


# --------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _status_of(exc: RiverbedError) -> int:
    if isinstance(exc, InvalidInput):
        return 422
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, AlreadyExists):
        return 409
    if isinstance(exc, StorageError):
        return 503
    return 500


def _error(code: int, message: str, **extra: object) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse({"error": message, **extra}, status_code=code, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append({"field": where or "body", "rule": str(error.get("msg", ""))})
    text = "; ".join(f"{p['field']}: {p['rule']}" for p in problems)
    return text or "the request is not valid", problems


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(RiverbedError)
    async def riverbed_error(request: Request, exc: RiverbedError) -> JSONResponse:
        return _error(_status_of(exc), str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        text, problems = _validation_message(exc)
        return _error(422, text, fields=problems)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))


# --------------------------------------------------------------------- auth


def _authorizer(context: HttpContext) -> Callable[[Request], Any]:
    async def authorize(request: Request) -> Role:
        tokens = context.tokens
        if tokens is None:
            return Role.ADMIN
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "no bearer token: send Authorization: Bearer TOKEN")
        # scrypt on a worker thread: the loop serves MQTT meanwhile.
        entry = await asyncio.to_thread(tokens.check, token.strip())
        if entry is None:
            raise ApiError(401, "the bearer token is not valid (unknown, revoked or mistyped)")
        if entry.role is Role.READ and request.method not in READ_METHODS:
            raise ApiError(
                403, f"token {entry.name!r} has the read role: {request.method} needs admin"
            )
        return entry.role

    return authorize


# --------------------------------------------------------------------- bodies


class TopicCreate(BaseModel):
    """A topic to create, as `riverbed topic create` takes it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    partitions: int = Field(description="1, 2, 3 or a multiple of 4 or 6")
    binding: str | None = Field(None, description="the MQTT topic filter the topic stores")
    retention: str | None = Field(
        format_duration(DEFAULT_RETENTION_US),
        description='how long messages are kept, e.g. "12h", "7d"; null or "none": for ever',
    )
    retention_policy: RetentionPolicy = RetentionPolicy.CONSUMED_AND_EXPIRED
    max_age: str | None = Field(None, description="delete messages older than this (e.g. 30d)")
    max_messages: int | None = Field(None, ge=0, description="messages kept per stream")
    max_bytes: int | str | None = Field(
        None, description="payload bytes kept per stream (e.g. 10MiB, 1GB, 500000)"
    )
    key: str | None = Field(
        None, description="key mode: client-topic, client-id, topic, property:NAME or none"
    )


def _in_field(name: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{name}: {exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"{name}: {exc}") from None


def _duration(value: str | None) -> int | None:
    if value is None or value.strip().lower() == "none":
        return None
    return parse_duration(value)


def _size(value: int | str | None) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    size = value if isinstance(value, int) else size_in_bytes(value, "maximum size")
    if size < 1:
        raise InvalidInput(f"{value!r} must be at least 1 byte per stream (or null for no limit)")
    return size


_MESSAGE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "key": {"type": ["string", "null"], "description": "ordering key; null: spread"},
        "payload": {"type": "string", "description": "UTF-8 text (or payload_b64)"},
        "payload_b64": {"type": "string", "description": "bytes in standard base64"},
        "mqtt_topic": {"type": "string", "description": "must match the topic's binding"},
        "properties": {
            "description": "[[name, value], ...] or {name: value}; a value is a string, an"
            ' integer or {"b64": ...}'
        },
        "qos": {"type": "integer", "minimum": 0, "maximum": 2},
        "retain": {"type": "boolean"},
    },
}
assert set(_MESSAGE_SCHEMA["properties"]) == set(FIELDS)  # type: ignore[call-overload]


# --------------------------------------------------------------------- views


def _topic_summary(log: Log, name: str) -> dict[str, Any]:
    described = log.topics.describe(name)
    summary = described.as_dict()
    del summary["streams"]
    produce = described.storage_topics[described.topic.produce_pointer]
    summary["partitions"] = produce.partitions
    summary["messages"] = sum(h.next_offset - h.start_offset for h in described.streams)
    return summary


def _subscription_view(log: Log, record: SubscriptionRecord) -> dict[str, Any]:
    delivery = Definitions(log.storage).get(record.name)
    lags = Subscriptions(log.storage).lag(record.name)
    view: dict[str, Any] = {
        "name": record.name,
        "topic": record.topic,
        "filter": record.filter,
        "start": record.start.value,
        "start_time": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "endpoint": None if delivery is None else delivery.target,
        "lag": sum(s.lag for s in lags),
        "streams": [s.as_json() for s in lags],
    }
    if delivery is not None:
        view["retry_queue"], view["dead_letter_queue"] = queue_depths(log.storage, record.name)
    return view


# --------------------------------------------------------------------- the app


def make_app(context: HttpContext) -> FastAPI:
    """The admin API over `context` (routes: the module docstring)."""
    app = FastAPI(
        title="Riverbed admin API",
        version=_version(),
        openapi_url=f"{API}/openapi.json",
        docs_url=f"{API}/docs",
        redoc_url=None,
    )
    _install_error_handlers(app)
    log = context.log
    authorized = [Depends(_authorizer(context))]

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """200 while the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """200 once the listeners are bound and the store answers in time."""
        if not context.listening():
            return _error(503, "not ready: the listeners are not bound yet", status="starting")
        try:
            await asyncio.wait_for(asyncio.to_thread(log.storage.list_topics), READY_DEADLINE)
        except TimeoutError:
            return _error(
                503,
                f"not ready: the store did not answer within {READY_DEADLINE:g} s",
                status="storage",
            )
        except RiverbedError as exc:
            return _error(503, f"not ready: the store fails: {exc}", status="storage")
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"], dependencies=authorized)
    def metrics() -> Response:
        """Prometheus text exposition of the node's metrics (`riverbed.metrics`)."""
        broker = context.broker
        counted = None if broker is None else broker.metrics
        if counted is None:
            return PlainTextResponse(
                "no metrics here: no broker in this process, or [metrics] enabled = false\n",
                status_code=404,
            )
        return Response(counted.render(), media_type=CONTENT_TYPE)

    api = APIRouter(prefix=API, dependencies=authorized)

    @api.get("/node", tags=["node"])
    def node() -> dict[str, Any]:
        """Version, node id, uptime and the configuration in force (no secrets)."""
        return {
            "version": _version(),
            "node": context.node,
            "started": format_time(int(context.started * 1_000_000)),
            "uptime_seconds": round(time.time() - context.started, 3),
            "config": context.settings,
        }

    @api.get("/topics", tags=["topics"])
    def list_topics() -> list[dict[str, Any]]:
        """Every topic with its settings, partitions and message count."""
        return [_topic_summary(log, record.name) for record in log.topics.list()]

    @api.get("/topics/{name}", tags=["topics"])
    def describe_topic(name: str) -> dict[str, Any]:
        """A topic's settings, storage topics, streams and subscriptions
        (`riverbed topic describe --json`)."""
        description = log.topics.describe(name)
        names = [s.name for s in Subscriptions(log.storage).list(name)]
        return description.as_dict() | {"subscriptions": names}

    @api.post("/topics", tags=["topics"], status_code=201)
    def create_topic(body: TopicCreate) -> dict[str, Any]:
        """Create a topic (`riverbed topic create`); 409 if the name is taken."""
        retention = _in_field("retention", _duration, body.retention)
        max_age = _in_field("max_age", _duration, body.max_age)
        max_bytes = _in_field("max_bytes", _size, body.max_bytes)
        key_mode = None if body.key is None else _in_field("key", KeyMode.parse, body.key)
        log.topics.create(
            body.name,
            body.partitions,
            body.binding,
            retention,
            body.retention_policy,
            max_age_us=max_age,
            max_messages=body.max_messages,
            max_bytes=max_bytes,
            key_mode=key_mode,
        )
        return log.topics.describe(body.name).as_dict() | {"subscriptions": []}

    @api.delete("/topics/{name}", tags=["topics"])
    def delete_topic(name: str) -> dict[str, Any]:
        """Delete a topic with its messages and subscriptions."""
        deleted = log.topics.delete(name)
        return {"topic": name, "messages_deleted": deleted}

    @api.post(
        "/topics/{name}/messages",
        tags=["topics"],
        status_code=201,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _MESSAGE_SCHEMA}},
            }
        },
    )
    async def produce(name: str, request: Request) -> JSONResponse:
        """Produce one message (the fields of `riverbed produce`'s JSON lines);
        answered once it is committed, as a PUBACK is."""
        raw = await _body(request, MAX_MESSAGE_BODY)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"the body is not UTF-8 at byte {exc.start}") from None
        message = message_from_json(text)
        # Checked and committed on a worker thread: the loop never waits for the store.
        positions = await asyncio.to_thread(log.produce, name, [message])
        stream, offset = positions[0]
        return JSONResponse(
            {"topic": name, "stream": str(stream), "offset": offset},
            status_code=201,
        )

    @api.get("/subscriptions", tags=["subscriptions"])
    def list_subscriptions(topic: str | None = None) -> list[dict[str, Any]]:
        """Named subscriptions (of `topic`, if given) with their lag."""
        if topic is not None:
            log.topics.get(topic)  # 404 rather than an empty list
        return [_subscription_view(log, r) for r in Subscriptions(log.storage).list(topic)]

    @api.get("/subscriptions/{name}", tags=["subscriptions"])
    def get_subscription(name: str) -> dict[str, Any]:
        """One subscription with its lag per stream (and its retry and
        dead-letter queues when it delivers to an endpoint)."""
        return _subscription_view(log, Subscriptions(log.storage).get(name))

    _add_client_routes(api, context)
    app.include_router(api)
    return app


async def _body(request: Request, limit: int) -> bytes:
    """The request's body; 413 once it is over `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body is {declared} bytes; at most {limit} are accepted")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over {limit} bytes, the most accepted")
        chunks.append(chunk)
    return b"".join(chunks)


def _add_client_routes(api: APIRouter, context: HttpContext) -> None:
    @api.get("/clients", tags=["clients"])
    async def list_clients() -> list[dict[str, Any]]:
        """The MQTT clients connected to this node (none under `riverbed admin`)."""
        broker = context.broker
        if broker is None:
            return []
        return [_client_view(client_id, conn) for client_id, conn in broker.connections.items()]

    @api.delete("/clients/{client_id}", tags=["clients"])
    async def disconnect_client(client_id: str) -> dict[str, Any]:
        """Disconnect one client (MQTT 5: DISCONNECT 0x98 Administrative action);
        its session stays."""
        from riverbed.mqtt.codec import DisconnectReason

        broker = context.broker
        connection = None if broker is None else broker.connections.get(client_id)
        if connection is None:
            raise ApiError(404, f"client {client_id!r} is not connected to this node")
        connection.close(DisconnectReason.ADMINISTRATIVE_ACTION)
        return {"client_id": client_id, "disconnected": True}


def _client_view(client_id: str, connection: Connection) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "peer": connection.peer,
        "username": connection.username,
        "protocol": "5" if connection.level == MQTT5 else "3.1.1",
        "keep_alive": connection.keep_alive,
        "session_expiry": connection.expiry,
    }


def _version() -> str:
    try:
        return importlib.metadata.version("riverbed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
