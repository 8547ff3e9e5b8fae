"""`riverbed group ...`: durable shared subscription groups (issue 5).

A group is a share name and the topic filter it shares (`$share/GROUP/FILTER`;
`$queue/FILTER` is the group `$queue`). A session's first subscription creates
its group starting then; `create` makes one that starts earlier (or later),
`list` and `describe` show its Leader, progress and lag, `delete` removes it
(a running Leader finds its next save refused and stops).
"""

from __future__ import annotations

import click

from riverbed.cli._app import (
    START,
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_log,
    plural,
    print_json,
)
from riverbed.errors import NotFound
from riverbed.log.jsonlines import format_time
from riverbed.sessions.store import now_us
from riverbed.sharedsub.claims import GroupRecord, GroupStore, StreamProgress, group_progress
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage.base import StartKind
from riverbed.subscriptions.cursors import Start


@cli.group()
def group() -> None:
    """Create, inspect and delete shared subscription groups ($share/GROUP/FILTER)."""


@group.command("create")
@click.argument("name")
@click.argument("topic_filter", metavar="FILTER")
@click.option(
    "--start",
    type=START,
    default="latest",
    show_default=True,
    help="Which messages belong to the group: earliest, latest (from now), or those"
    " since an ISO 8601 time (a time without zone is UTC).",
)
@db_option
def group_create(name: str, topic_filter: str, start: Start) -> None:
    """Create group NAME sharing FILTER."""
    group_id = GroupId(name, topic_filter)
    now = now_us()
    if isinstance(start, int):
        start_us: int | None = start  # a time
    elif start is StartKind.EARLIEST:
        start_us = None  # the earliest retained message
    else:
        start_us = now
    with open_log(create=True) as log:
        GroupStore(log.storage).create(group_id, start_us=start_us, now_us=now)
    where = "the earliest retained message" if start_us is None else format_time(start_us)
    click.echo(f"created group {name!r} sharing {topic_filter!r} from {where}")


def _summary(record: GroupRecord, leader: str | None, lag: int) -> dict[str, object]:
    return {
        "group": record.group.name,
        "filter": record.group.topic_filter,
        "start": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "leader": leader,
        "lag": lag,
    }


@group.command("list")
@json_option
@db_option
def group_list(as_json: bool) -> None:
    """List the groups, with their Leader and total lag."""
    now = now_us()
    rows = []
    with open_log() as log:
        store = GroupStore(log.storage)
        for record in sorted(store.list(), key=lambda r: r.group.key):
            lease = store.leader_of(record.group, now)
            lag = sum(p.lag for p in group_progress(log.storage, record))
            rows.append(_summary(record, None if lease is None else lease.owner, lag))
    if as_json:
        print_json(rows)
        return
    columns = ["group", "filter", "start", "created", "leader", "lag"]
    make_console().print(
        make_table(
            "Shared subscription groups",
            ["group", "filter", "start", "created", "leader", "lag"],
            [["-" if row[c] is None else row[c] for c in columns] for row in rows],
        )
    )


def _stream_json(p: StreamProgress) -> dict[str, object]:
    return {
        "stream": str(p.stream),
        "position": p.position,
        "head": p.head,
        "lag": p.lag,
        "consumed": p.consumed,
    }


@group.command("describe")
@click.argument("name")
@click.argument("topic_filter", metavar="FILTER")
@json_option
@db_option
def group_describe(name: str, topic_filter: str, as_json: bool) -> None:
    """Show group NAME/FILTER: its Leader and Borrowers, and per stream its
    position, head, lag and holder (as of the Leader's last save)."""
    group_id = GroupId(name, topic_filter)
    now = now_us()
    with open_log() as log:
        store = GroupStore(log.storage)
        record = store.get(group_id)
        if record is None:
            raise NotFound(f"shared subscription group {group_id} does not exist")
        lease = store.leader_of(group_id, now)
        progress = group_progress(log.storage, record)
    leader = None if lease is None else lease.owner
    summary = _summary(record, leader, sum(p.lag for p in progress))
    if lease is not None:
        summary["leader_claim_expires"] = format_time(lease.expires_us)
    holders = {str(s): b for b, held in record.holdings.items() for s in held}
    if as_json:
        streams = [{**_stream_json(p), "borrower": holders.get(str(p.stream))} for p in progress]
        borrowers = {b: [str(s) for s in held] for b, held in sorted(record.holdings.items())}
        print_json({**summary, "borrowers": borrowers, "streams": streams})
        return
    console = make_console()
    for key in ("group", "filter", "start", "created", "leader"):
        console.print(f"{key:>8}: {'-' if summary[key] is None else summary[key]}")
    for borrower, held in sorted(record.holdings.items()):
        console.print(f"borrower: {borrower} ({plural(len(held), 'stream')})")
    console.print(
        make_table(
            f"Streams of {group_id}",
            ["stream", "position", "head", "lag", "consumed", "borrower"],
            [
                [
                    p.stream,
                    p.position,
                    p.head,
                    p.lag,
                    "yes" if p.consumed else "",
                    holders.get(str(p.stream), ""),
                ]
                for p in progress
            ],
            footer=["total", "", "", summary["lag"], "", ""],
        )
    )


@group.command("delete")
@click.argument("name")
@click.argument("topic_filter", metavar="FILTER")
@db_option
def group_delete(name: str, topic_filter: str) -> None:
    """Delete group NAME/FILTER (its progress and Leader claim)."""
    group_id = GroupId(name, topic_filter)
    with open_log() as log:
        GroupStore(log.storage).delete(group_id)
    click.echo(f"deleted group {group_id}")
