"""Named-subscription routes of the admin API.

    GET    /api/v1/subscriptions[?topic=T]         each with its lag
    GET    /api/v1/subscriptions/{name}            lag per stream, retry and DLQ depths
    POST   /api/v1/subscriptions                   `riverbed subscription create` (201)
    DELETE /api/v1/subscriptions/{name}            with its offsets (and queues)
    POST   /api/v1/subscriptions/{name}/reset      a job (202): `subscription reset`
    POST   /api/v1/subscriptions/{name}/reshard    a job (202): `subscription reshard`

Handlers call what `riverbed subscription ...` calls (`create_subscription`,
`delivery_definition`, `reset_subscription`, `change_shard_count`, ...), on
FastAPI's worker threads. A job's input is checked before it starts
(`check_reset`, `check_shard_change`): a refused request changes nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from riverbed.errors import InvalidInput
from riverbed.http.context import HttpContext
from riverbed.http.fields import in_field
from riverbed.http.jobs import JOB_RESPONSES, Progress, accepted
from riverbed.log.log import Log
from riverbed.model import StreamId
from riverbed.storage.base import StartKind, SubscriptionRecord
from riverbed.subscriptions.definition import Definitions, delivery_definition, subscription_json
from riverbed.subscriptions.groups import Queue
from riverbed.subscriptions.named import Start, Subscriptions
from riverbed.subscriptions.pipeline import queue_depths
from riverbed.subscriptions.positions import parse_start, parse_time
from riverbed.subscriptions.provisioning import create_subscription, delete_subscription
from riverbed.subscriptions.reset import check_reset, reset_subscription
from riverbed.subscriptions.reshard import change_shard_count, check_shard_change


def _subscription_view(log: Log, record: SubscriptionRecord) -> dict[str, Any]:
    delivery = Definitions(log.storage).get(record.name)
    lags = Subscriptions(log.storage).lag(record.name)
    view = subscription_json(record, delivery) | {
        "lag": sum(s.lag for s in lags),
        "streams": [s.as_json() for s in lags],
    }
    if delivery is not None:
        view["retry_queue"], view["dead_letter_queue"] = queue_depths(log.storage, record.name)
    return view


class EndpointOptions(BaseModel):
    """Where and how a subscription delivers: `subscription create --endpoint`
    and its options, under the same names; a field left out keeps the
    command line's default."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="an http(s):// URL, or package.module:function")
    shards: int | None = Field(None, description="shards that deliver it (default 1)")
    grouped: bool | None = Field(None, description="keep order per key (default true)")
    method: str | None = Field(None, description="POST (default), PUT or PATCH")
    headers: dict[str, str] | None = Field(None, description="HTTP headers, {name: value}")
    connect_timeout: float | None = Field(None, description="seconds (default 5)")
    request_timeout: float | None = Field(None, description="seconds (default 30)")
    retry_on: list[int | str] | None = Field(
        None,
        description="HTTP status codes and exception type names that are retried"
        " (default 408, 429, 500, 502, 503, 504, TimeoutError, ConnectionError)",
    )
    backoff: Literal["linear", "exponential"] | None = None
    min_delay: float | None = Field(None, description="seconds (default 1)")
    max_delay: float | None = Field(None, description="seconds (default 300)")
    multiplier: float | None = Field(None, description="default 2")
    max_attempts: int | None = Field(None, description="before a message is parked (default 5)")
    inline_retry: float | None = Field(
        None, description="retries due within this many seconds wait in the batch (default 0.5)"
    )
    max_in_flight: int | None = Field(None, description="attempts at once per shard (default 100)")
    max_parallel_groups: int | None = Field(None, description="per shard (default 100)")
    error_rate: float | None = Field(None, description="failure share that slows delivery (0.5)")
    rq_partitions: int | None = None
    dlq_partitions: int | None = None


class SubscriptionCreate(BaseModel):
    """A subscription to create, as `riverbed subscription create` takes it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    topic: str
    filter: str | None = Field(None, description="only MQTT topics it matches")
    start: str = Field("earliest", description="earliest, latest or an ISO 8601 time")
    endpoint: EndpointOptions | None = Field(None, description="deliver to an endpoint")
    if_not_exists: bool = Field(
        False, description="reuse one with these very settings (answered 200)"
    )


class ResetRequest(BaseModel):
    """Where to move a subscription, as `riverbed subscription reset` takes it."""

    model_config = ConfigDict(extra="forbid")

    to: Literal["earliest", "latest", "time", "offsets"]
    time: str | None = Field(None, description='with "to": "time": an ISO 8601 time')
    offsets: dict[str, int] | None = Field(
        None, description='with "to": "offsets": {stream: offset}; other streams keep theirs'
    )
    queue: Literal["main", "rq", "dlq"] = Field(
        "main", description="which to move; the rq and dlq only move forward (latest or a time)"
    )
    shards: int | None = Field(
        None, description="a rewind its shard count cannot split: change to this one too"
    )


class ReshardRequest(BaseModel):
    """The new shard count (`riverbed subscription reshard --shards`)."""

    model_config = ConfigDict(extra="forbid")

    shards: int = Field(description="divides the partitions of every generation it still reads")


def _reset_target(body: ResetRequest) -> Start | dict[StreamId, int]:
    if body.to != "time" and body.time is not None:
        raise InvalidInput(f'time: only with "to": "time" (not {body.to!r})')
    if body.to != "offsets" and body.offsets is not None:
        raise InvalidInput(f'offsets: only with "to": "offsets" (not {body.to!r})')
    if body.to == "time":
        if body.time is None:
            raise InvalidInput('time: needed with "to": "time"')
        return in_field("time", parse_time, body.time)  # type: ignore[no-any-return]
    if body.to == "offsets":
        if not body.offsets:
            raise InvalidInput('offsets: needed with "to": "offsets", {stream: offset, ...}')
        return {in_field("offsets", StreamId.parse, k): v for k, v in body.offsets.items()}
    return StartKind(body.to)


def routes(context: HttpContext) -> APIRouter:
    """The subscription routes over `context.log` (the module docstring)."""
    log = context.log
    jobs = context.jobs
    api = APIRouter()

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

    @api.post(
        "/subscriptions",
        tags=["subscriptions"],
        status_code=201,
        responses={200: {"description": "reused (if_not_exists)"}, 404: {}, 409: {}, 422: {}},
    )
    def create(body: SubscriptionCreate) -> JSONResponse:
        """Create a subscription (`riverbed subscription create`); with
        `endpoint`, one that delivers, with its retry and dead-letter queues.
        409 if the name is taken (unless `if_not_exists` and the settings match)."""
        start = in_field("start", parse_start, body.start)
        delivery = None
        if body.endpoint is not None:
            options = body.endpoint.model_dump(exclude={"url"})
            delivery = in_field(
                "endpoint",
                lambda url: delivery_definition(body.name, body.topic, url, **options),
                body.endpoint.url,
            )
        created = create_subscription(
            log.storage,
            body.name,
            body.topic,
            topic_filter=body.filter,
            start=start,
            delivery=delivery,
            exist_ok=body.if_not_exists,
        )
        view = _subscription_view(log, Subscriptions(log.storage).get(body.name))
        return JSONResponse(view, status_code=200 if created.existed else 201)

    @api.delete("/subscriptions/{name}", tags=["subscriptions"], responses={404: {}})
    def delete(name: str) -> dict[str, Any]:
        """Delete a subscription and its offsets (and, for one that delivers,
        its retry and dead-letter queues with their messages)."""
        delete_subscription(log.storage, name)
        return {"subscription": name, "deleted": True}

    @api.post(
        "/subscriptions/{name}/reset",
        tags=["subscriptions"],
        status_code=202,
        responses={**JOB_RESPONSES, 404: {}, 422: {}},
    )
    def reset(name: str, body: ResetRequest, request: Request) -> JSONResponse:
        """Move the subscription's committed offsets, or its retry or dead-letter
        queue forward (`riverbed subscription reset`), as a job."""
        target = _reset_target(body)
        queue = None if body.queue == "main" else Queue(body.queue)
        check_reset(log.storage, name, target, queue, body.shards)

        def work(progress: Progress) -> dict[str, Any]:
            done = reset_subscription(log.storage, name, target, queue, body.shards, progress)
            return done.as_json()

        return accepted(request, jobs.start("reset", name, work))

    @api.post(
        "/subscriptions/{name}/reshard",
        tags=["subscriptions"],
        status_code=202,
        responses={**JOB_RESPONSES, 404: {}, 422: {}},
    )
    def reshard(name: str, body: ReshardRequest, request: Request) -> JSONResponse:
        """Change how many shards deliver the subscription (`riverbed
        subscription reshard`, seed 003 ChangeShardCount), as a job."""
        check_shard_change(log.storage, name, body.shards)

        def work(progress: Progress) -> dict[str, Any]:
            return change_shard_count(log.storage, name, body.shards, progress).as_json(name)

        return accepted(request, jobs.start("reshard", name, work))

    return api
