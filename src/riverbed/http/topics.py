"""Topic routes of the admin API: list, describe, create, delete, produce.

    GET    /api/v1/topics                   every topic, its partitions and message count
    GET    /api/v1/topics/{name}            `riverbed topic describe --json`, with subscriptions
    POST   /api/v1/topics                   `riverbed topic create` (201; 409 if taken)
    DELETE /api/v1/topics/{name}            with its messages and subscriptions
    POST   /api/v1/topics/{name}/messages   one message, answered once committed (201)
    POST   /api/v1/topics/{name}/storage-topics  `riverbed topic add-storage-topic` (201)
    POST   /api/v1/topics/{name}/switch-produce  `riverbed topic switch-produce`

Handlers call what the command line calls (`Log.topics`, `message_from_json`,
`Log.produce`, `splitting.switch_produce`). Those touching the store are plain
functions, which FastAPI runs on worker threads: the event loop shared with
the broker never waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from riverbed.errors import InvalidInput
from riverbed.http.context import HttpContext
from riverbed.http.fields import duration, in_field, read_body, size
from riverbed.log.jsonlines import FIELDS, message_from_json
from riverbed.log.log import Log
from riverbed.log.topics import DEFAULT_RETENTION_US, KeyMode
from riverbed.model import format_duration
from riverbed.storage.base import RetentionPolicy
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.splitting import switch_produce

MAX_MESSAGE_BODY = 8 * 1024 * 1024
"""Bytes a produce request's body may have: a message is held whole in memory
until it is committed. The default largest MQTT packet (1 MiB) in base64 is
1.4 MB; this leaves room for larger configured ones."""


class TopicCreate(BaseModel):
    """A topic to create, as `riverbed topic create` takes it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    partitions: int = Field(description="1, 2, 3 or a multiple of 4 or 6, at most 65,536")
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


class StorageTopicAdd(BaseModel):
    """A generation to add, as `riverbed topic add-storage-topic` takes it."""

    model_config = ConfigDict(extra="forbid")

    partitions: int = Field(description="1, 2, 3 or a multiple of 4 or 6, at most 65,536")


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


def _topic_summary(log: Log, name: str) -> dict[str, Any]:
    described = log.topics.describe(name)
    summary = described.as_dict()
    del summary["streams"]
    produce = described.storage_topics[described.topic.produce_pointer]
    summary["partitions"] = produce.partitions
    summary["messages"] = sum(h.next_offset - h.start_offset for h in described.streams)
    return summary


def _described(log: Log, name: str) -> dict[str, Any]:
    """`riverbed topic describe NAME --json`."""
    description = log.topics.describe(name)
    names = [s.name for s in Subscriptions(log.storage).list(name)]
    return description.as_dict() | {"subscriptions": names}


def routes(context: HttpContext) -> APIRouter:
    """The topic routes over `context.log` (the module docstring)."""
    log = context.log
    api = APIRouter()

    @api.get("/topics", tags=["topics"])
    def list_topics() -> list[dict[str, Any]]:
        """Every topic with its settings, partitions and message count."""
        return [_topic_summary(log, record.name) for record in log.topics.list()]

    @api.get("/topics/{name}", tags=["topics"])
    def describe_topic(name: str) -> dict[str, Any]:
        """A topic's settings, storage topics, streams and subscriptions
        (`riverbed topic describe --json`)."""
        return _described(log, name)

    @api.post("/topics", tags=["topics"], status_code=201)
    def create_topic(body: TopicCreate) -> dict[str, Any]:
        """Create a topic (`riverbed topic create`); 409 if the name is taken."""
        retention = in_field("retention", duration, body.retention)
        max_age = in_field("max_age", duration, body.max_age)
        max_bytes = in_field("max_bytes", size, body.max_bytes)
        key_mode = None if body.key is None else in_field("key", KeyMode.parse, body.key)
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

    @api.post(
        "/topics/{name}/storage-topics",
        tags=["topics"],
        status_code=201,
        responses={404: {}, 422: {}},
    )
    def add_storage_topic(name: str, body: StorageTopicAdd) -> dict[str, Any]:
        """Add a generation of `partitions` streams (`riverbed topic
        add-storage-topic`, seed 003 AddStorageTopic); producers keep writing
        to the current one until `switch-produce`."""
        log.topics.add_storage_topic(name, body.partitions)
        return _described(log, name)

    @api.post("/topics/{name}/switch-produce", tags=["topics"], responses={404: {}, 422: {}})
    def switch_produce_to_next(name: str) -> dict[str, Any]:
        """Produce to the next generation and seal the earlier ones (`riverbed
        topic switch-produce`, seed 003 SwitchProduce); refused while a
        delivering subscription's shard count does not divide it. On the
        newest generation already, nothing changes."""
        switch_produce(log.topics, name)
        return _described(log, name)

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
        raw = await read_body(request, MAX_MESSAGE_BODY)
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

    return api
