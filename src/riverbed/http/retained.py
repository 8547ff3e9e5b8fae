"""Retained message routes of the admin API.

    GET    /api/v1/retained[?filter=F][&limit=N]  the retained messages `F` matches (default #)
    GET    /api/v1/retained/{topic}               one, with its payload
    DELETE /api/v1/retained/{topic}               forget it, as a retained empty PUBLISH does

Read and written through `mqtt.retained.RetainedStore`, the broker's own: the
retained messages live in the database only, so every node sharing it sees a
deletion at the next SUBSCRIBE, as after a zero-length retained PUBLISH
[MQTT-3.3.1-6] (nothing is delivered to subscribers). `filter` matches as a
subscription's would (`topics.filters`): `#` does not list `$` topics, `$SYS/#` does.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query

from riverbed.http.context import HttpContext
from riverbed.http.errors import ApiError
from riverbed.http.fields import in_field
from riverbed.log.jsonlines import format_time
from riverbed.model import StoredMessage
from riverbed.mqtt.retained import RetainedStore
from riverbed.topics.filters import validate_filter, validate_topic_name

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
"""Most retained messages one listing answers (each is read whole from the store)."""


def _summary(message: StoredMessage) -> dict[str, Any]:
    return {
        "topic": message.mqtt_topic,
        "size": len(message.payload),
        "qos": message.qos,
        "stored_at": format_time(message.timestamp_us),
    }


def _full(message: StoredMessage) -> dict[str, Any]:
    view = _summary(message) | {"key": message.key}
    try:
        view["payload"] = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        view["payload_b64"] = base64.b64encode(message.payload).decode("ascii")
    # The user properties as they came; the broker's own (names starting with
    # U+0000, mqtt/messages.py) are left out.
    view["user_properties"] = [
        [name, value] for name, value in message.properties if not name.startswith("\x00")
    ]
    return view


def routes(context: HttpContext) -> APIRouter:
    """The retained message routes over `context.log` (the module docstring)."""
    broker = context.broker
    retained = RetainedStore(context.log.storage) if broker is None else broker.retained
    api = APIRouter()

    @api.get("/retained", tags=["retained"], responses={422: {"description": "bad filter"}})
    def list_retained(
        topic_filter: Annotated[str, Query(alias="filter")] = "#",
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    ) -> list[dict[str, Any]]:
        """The retained messages `filter` matches, in topic order, the first `limit`."""
        in_field("filter", validate_filter, topic_filter)
        return [_summary(m) for m in retained.matching(topic_filter, limit)]

    @api.get(
        "/retained/{topic:path}",
        tags=["retained"],
        responses={404: {"description": "none"}, 422: {"description": "bad topic name"}},
    )
    def get_retained(topic: str) -> dict[str, Any]:
        """One topic's retained message with its payload (`payload` if UTF-8,
        else `payload_b64`)."""
        in_field("topic", validate_topic_name, topic)
        message = retained.get(topic)
        if message is None:
            raise ApiError(404, f"topic {topic!r} has no retained message")
        return _full(message)

    @api.delete(
        "/retained/{topic:path}",
        tags=["retained"],
        responses={404: {"description": "none"}, 422: {"description": "bad topic name"}},
    )
    def delete_retained(topic: str) -> dict[str, Any]:
        """Forget one topic's retained message (as a retained PUBLISH with an
        empty payload does; nothing is delivered)."""
        in_field("topic", validate_topic_name, topic)
        if not retained.delete(topic):
            raise ApiError(404, f"topic {topic!r} has no retained message")
        return {"topic": topic, "deleted": True}

    return api
