"""Dead-letter queue routes of the admin API: a delivering subscription's
parked messages (`riverbed dlq ...`).

    GET  /api/v1/subscriptions/{name}/dlq[?since&until&group&message_id&limit&page]
    GET  /api/v1/subscriptions/{name}/dlq/{message_id}   one, with its payload
    POST /api/v1/subscriptions/{name}/dlq/replay          a job (202): back into the flow
    POST /api/v1/subscriptions/{name}/dlq/purge           drop them for good

The selectors are the command line's: failed at or after `since` and before
`until` (ISO 8601), of the given groups (keys), with the given message ids;
replay and purge take `all` instead, or at least one selector. In a grouped
subscription a group leaves the DLQ in order: the earlier parked messages of
a selected one's group go with it (`earlier_of_their_groups`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from riverbed.errors import NotFound
from riverbed.http.context import HttpContext
from riverbed.http.fields import in_field
from riverbed.http.jobs import JOB_RESPONSES, Progress, accepted
from riverbed.log.jsonlines import format_time
from riverbed.subscriptions.dlq import (
    Parked,
    Selection,
    check_change,
    parked,
    parked_page,
    parse_message_id,
    purge,
    replay,
)
from riverbed.subscriptions.positions import parse_time


def _parked_view(p: Parked) -> dict[str, Any]:
    m = p.message
    return {
        "id": str(m.message_id),
        "key": m.key,
        "stream": str(p.stream),
        "offset": p.offset,
        "failed_at": format_time(m.failed_us),
        "attempts": m.attempt - 1,
        "error": m.reason,
        "size": len(m.payload),
        "mqtt_topic": m.mqtt_topic,
        "main": f"{m.main_topic_idx}:{m.main_partition}:{m.main_offset}",
    }


def _time(name: str, text: str | None) -> int | None:
    return None if text is None else in_field(name, parse_time, text)


class Selectors(BaseModel):
    """Which parked messages: `all`, or those matching every selector given."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    everything: bool = Field(False, alias="all", description="every parked message")
    since: str | None = Field(None, description="failed at or after this ISO 8601 time")
    until: str | None = Field(None, description="failed before this ISO 8601 time")
    groups: list[str] = Field([], description="of these groups (keys)")
    message_ids: list[str] = Field([], description="these messages")

    def selection(self) -> Selection:
        """The `Selection` the command line builds from the same selectors
        (`InvalidInput` for neither `all` nor a selector, or both)."""
        return Selection(
            self.everything,
            _time("since", self.since),
            _time("until", self.until),
            frozenset(self.groups),
            frozenset(in_field("message_ids", parse_message_id, t) for t in self.message_ids),
        )


def routes(context: HttpContext) -> APIRouter:
    """The DLQ routes over `context.log` (the module docstring)."""
    log = context.log
    jobs = context.jobs
    api = APIRouter()

    @api.get("/subscriptions/{name}/dlq", tags=["dlq"], responses={404: {}, 422: {}})
    def list_parked(
        name: str,
        since: str | None = None,
        until: str | None = None,
        group: Annotated[list[str] | None, Query()] = None,
        message_id: Annotated[list[str] | None, Query()] = None,
        limit: Annotated[int, Query(ge=1)] = 50,
        page: Annotated[int, Query(ge=1)] = 1,
    ) -> dict[str, Any]:
        """The messages parked in the subscription's DLQ, oldest failure first,
        a page at a time (`riverbed dlq list`); `total` counts every match."""
        found, total = parked_page(
            log.storage,
            name,
            since_us=_time("since", since),
            until_us=_time("until", until),
            groups=group or (),
            message_ids=[in_field("message_id", parse_message_id, t) for t in message_id or ()],
            limit=limit,
            page=page,
        )
        return {"subscription": name, "messages": [_parked_view(p) for p in found], "total": total}

    @api.get("/subscriptions/{name}/dlq/{message_id}", tags=["dlq"], responses={404: {}})
    def show_parked(name: str, message_id: str) -> dict[str, Any]:
        """One parked message with its payload (`payload` if UTF-8 text, else
        `payload_b64`) and properties (`riverbed dlq show`)."""
        wanted = in_field("message_id", parse_message_id, message_id)
        found = parked(log.storage, name, message_ids=[wanted], limit=1)
        if not found:
            raise NotFound(f"message {message_id} is not parked in the DLQ of {name!r}")
        return _parked_view(found[0]) | found[0].payload_fields()

    @api.post(
        "/subscriptions/{name}/dlq/replay",
        tags=["dlq"],
        status_code=202,
        responses={**JOB_RESPONSES, 404: {}, 422: {}},
    )
    def replay_parked(name: str, body: Selectors, request: Request) -> JSONResponse:
        """Put the selected parked messages back into the flow (the retry queue,
        due now, first attempt), in group order (`riverbed dlq replay`), as a
        job; its result counts them (`replayed`)."""
        selection = body.selection()
        check_change(log.storage, name, selection)

        def work(progress: Progress) -> dict[str, Any]:
            return replay(log.storage, name, selection, progress=progress).as_json(name, "replayed")

        return accepted(request, jobs.start("dlq-replay", name, work))

    @api.post("/subscriptions/{name}/dlq/purge", tags=["dlq"], responses={404: {}, 422: {}})
    def purge_parked(name: str, body: Selectors) -> dict[str, Any]:
        """Drop the selected parked messages for good (`riverbed dlq purge`)."""
        return purge(log.storage, name, body.selection()).as_json(name, "purged")

    return api
