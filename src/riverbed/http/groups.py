"""Shared subscription group routes of the admin API.

    GET /api/v1/groups                    every group: Leader, member count, lag
    GET /api/v1/groups/{group}/{filter}   one: members, who holds which stream, lag per stream

What `riverbed group list` and `describe` show, read the same way
(`sharedsub.overview`). A group's `id` is `NAME/FILTER` (`$queue/FILTER` is
the group `$queue`); in a path its `#` is written `%23`. Who holds which stream
is as of the Leader's last save; a lag with `lag_exact` false is an upper bound
(it counts messages of the group's topics that its filter does not match).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from riverbed.clock import now_us
from riverbed.http.context import HttpContext
from riverbed.log.jsonlines import format_time
from riverbed.sharedsub.overview import GroupOverview, describe_group, list_groups
from riverbed.sharedsub.protocol import GroupId


def _leader(overview: GroupOverview) -> dict[str, Any] | None:
    lease = overview.leader
    if lease is None:
        return None
    since = overview.leader_since_us
    return {
        "node": overview.leader_node,
        "id": lease.owner,
        "since": None if since is None else format_time(since),
        "claim_expires": format_time(lease.expires_us),
    }


def _summary(overview: GroupOverview) -> dict[str, Any]:
    record = overview.record
    return {
        "id": record.group.key,
        "name": record.group.name,
        "filter": record.group.topic_filter,
        "start": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "leader": _leader(overview),
        "members": len(record.holdings),
        "lag": overview.lag,
        "lag_exact": overview.lag_exact,
    }


def routes(context: HttpContext) -> APIRouter:
    """The group routes over `context.log` (the module docstring)."""
    storage = context.log.storage
    api = APIRouter()

    @api.get("/groups", tags=["groups"])
    def groups() -> list[dict[str, Any]]:
        """Every shared subscription group with its Leader, members and lag
        (`riverbed group list`)."""
        return [_summary(o) for o in list_groups(storage, now_us())]

    @api.get(
        "/groups/{group}/{topic_filter:path}",
        tags=["groups"],
        responses={404: {"description": "no such group"}, 422: {"description": "bad name"}},
    )
    def group(group: str, topic_filter: str) -> dict[str, Any]:
        """One group: its Leader, its members and the streams each holds, and
        per stream its position, head, lag and holder (`riverbed group describe`)."""
        overview = describe_group(storage, GroupId(group, topic_filter), now_us())
        return _summary(overview) | {
            "members": [
                {
                    "member": m.borrower,
                    "client_id": m.client_id,
                    "node": m.node,
                    "streams": [str(s) for s in m.streams],
                }
                for m in overview.members
            ],
            "streams": [
                {
                    "stream": str(p.stream),
                    "holder": overview.holder(p.stream),
                    "position": p.position,
                    "head": p.head,
                    "lag": p.lag,
                    "lag_exact": overview.exact[p.stream],
                    "consumed": p.consumed,
                }
                for p in overview.progress
            ],
        }

    return api
