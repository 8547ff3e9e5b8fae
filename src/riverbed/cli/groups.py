"""`riverbed group ...`: durable shared subscription groups.

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
from riverbed.cli._reuse import if_not_exists_option, reusing
from riverbed.clock import now_us
from riverbed.errors import AlreadyExists
from riverbed.log.jsonlines import format_time
from riverbed.sharedsub.claims import GroupRecord, GroupStore, StreamProgress
from riverbed.sharedsub.overview import GroupOverview, describe_group, list_groups
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage.base import StartKind
from riverbed.subscriptions.named import Start


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
@if_not_exists_option
@db_option
def group_create(name: str, topic_filter: str, start: Start, if_not_exists: bool) -> None:
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
        store = GroupStore(log.storage)
        existing = store.get(group_id) if if_not_exists else None
        if existing is not None:
            _same_start(existing, start, start_us)
            reusing(f"shared subscription group {group_id}")
            return
        store.create(group_id, start_us=start_us, now_us=now)
    where = "the earliest retained message" if start_us is None else format_time(start_us)
    click.echo(f"created group {name!r} sharing {topic_filter!r} from {where}")


def _same_start(existing: GroupRecord, start: Start, start_us: int | None) -> None:
    """Refuse to reuse a group that starts elsewhere than asked. `latest` means
    from when the group was created: any time start agrees with it."""
    same = (
        existing.start_us is not None
        if start is StartKind.LATEST
        else existing.start_us == start_us
    )
    if not same:
        have = "earliest" if existing.start_us is None else format_time(existing.start_us)
        asked = start.value if isinstance(start, StartKind) else format_time(start)
        raise AlreadyExists(
            f"shared subscription group {existing.group} exists already with other settings:"
            f" start {have} (asked {asked}); not reusing it"
        )


def _lag_cell(summary: dict[str, object]) -> object:
    lag = summary["lag"]
    return lag if summary["lag_exact"] or lag == 0 else f"≤ {lag}"


UPPER_BOUND_NOTE = (
    "≤: an upper bound, counting every message of the group's topics, also those its"
    " filter does not match"
)


def _summary(overview: GroupOverview) -> dict[str, object]:
    record = overview.record
    return {
        "group": record.group.name,
        "filter": record.group.topic_filter,
        "start": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
        "leader": None if overview.leader is None else overview.leader.owner,
        "lag": overview.lag,
        "lag_exact": overview.lag_exact,
    }


@group.command("list")
@json_option
@db_option
def group_list(as_json: bool) -> None:
    """List the groups, with their Leader and total lag.

    A lag marked ≤ is an upper bound: it counts every message of the topics the
    group's filter reaches, also those the filter does not match (`lag_exact`
    false in JSON).
    """
    with open_log() as log:
        rows = [_summary(overview) for overview in list_groups(log.storage, now_us())]
    if as_json:
        print_json(rows)
        return
    columns = ["group", "filter", "start", "created", "leader"]
    console = make_console()
    console.print(
        make_table(
            "Shared subscription groups",
            [*columns, "lag"],
            [
                ["-" if row[c] is None else row[c] for c in columns] + [_lag_cell(row)]
                for row in rows
            ],
        )
    )
    if not all(row["lag_exact"] for row in rows):
        console.print(UPPER_BOUND_NOTE)


def _stream_json(p: StreamProgress, exact: bool) -> dict[str, object]:
    return {
        "stream": str(p.stream),
        "position": p.position,
        "head": p.head,
        "lag": p.lag,
        "lag_exact": exact,
        "consumed": p.consumed,
    }


@group.command("describe")
@click.argument("name")
@click.argument("topic_filter", metavar="FILTER")
@json_option
@db_option
def group_describe(name: str, topic_filter: str, as_json: bool) -> None:
    """Show group NAME/FILTER: its Leader and Borrowers, and per stream its
    position, head, lag and holder (as of the Leader's last save). A lag
    marked ≤ is an upper bound (see `group list`)."""
    group_id = GroupId(name, topic_filter)
    with open_log() as log:
        overview = describe_group(log.storage, group_id, now_us())
    record, lease, progress, exact = (
        overview.record,
        overview.leader,
        overview.progress,
        overview.exact,
    )
    summary = _summary(overview)
    if lease is not None:
        summary["leader_claim_expires"] = format_time(lease.expires_us)
    if as_json:
        streams = [
            {**_stream_json(p, exact[p.stream]), "borrower": overview.holder(p.stream)}
            for p in progress
        ]
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
                    p.lag if exact[p.stream] or not p.lag else f"≤ {p.lag}",
                    "yes" if p.consumed else "",
                    overview.holder(p.stream) or "",
                ]
                for p in progress
            ],
            footer=["total", "", "", _lag_cell(summary), "", ""],
        )
    )
    if not summary["lag_exact"]:
        console.print(UPPER_BOUND_NOTE)


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
