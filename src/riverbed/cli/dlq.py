"""`riverbed dlq ...`: a delivering subscription's dead-letter queue."""

from __future__ import annotations

from typing import Any

import click

from riverbed.cli._app import (
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_log,
    parse_time,
    plural,
    print_json,
)
from riverbed.errors import NotFound
from riverbed.log.jsonlines import format_time
from riverbed.subscriptions.dlq import (
    DlqChange,
    Parked,
    Selection,
    parked,
    parse_message_id,
    purge,
    replay,
)


@cli.group()
def dlq() -> None:
    """Browse, replay and purge the dead-letter queue of a subscription that delivers."""


def _row(p: Parked) -> dict[str, object]:
    m = p.message
    return {
        "stream": str(p.stream),
        "offset": p.offset,
        "message_id": str(m.message_id),
        "group": m.key,
        "mqtt_topic": m.mqtt_topic,
        "failed": format_time(m.failed_us),
        "attempts": m.attempt - 1,
        "reason": m.reason,
        "main": f"{m.main_topic_idx}:{m.main_partition}:{m.main_offset}",
    }


def _filters(command: Any) -> Any:
    """Which parked messages: by failure time, group ids, message ids."""
    for option in reversed(
        [
            click.option("--since", metavar="ISO-TIME", help="Failed at or after this time."),
            click.option("--until", metavar="ISO-TIME", help="Failed before this time."),
            click.option("--group", "groups", multiple=True, help="Of this group (repeatable)."),
            click.option(
                "--message-id", "message_ids", multiple=True, help="This message (repeatable)."
            ),
        ]
    ):
        command = option(command)
    return command


@dlq.command("list")
@click.argument("name")
@_filters
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@json_option
@db_option
def dlq_list(
    name: str,
    since: str | None,
    until: str | None,
    groups: tuple[str, ...],
    message_ids: tuple[str, ...],
    limit: int,
    page: int,
    as_json: bool,
) -> None:
    """The messages parked in subscription NAME's DLQ, oldest failure first."""
    ids = [parse_message_id(t) for t in message_ids]
    with open_log() as log:
        found = parked(
            log.storage,
            name,
            since_us=None if since is None else parse_time(since),
            until_us=None if until is None else parse_time(until),
            groups=groups,
            message_ids=ids,
            limit=limit,
            page=page,
        )
    rows = [_row(p) for p in found]
    if as_json:
        print_json(rows)
        return
    columns = ["failed", "group", "message_id", "attempts", "reason", "stream", "offset"]
    title = f"DLQ of {name!r}, page {page} ({plural(len(rows), 'message')})"
    make_console().print(make_table(title, columns, [[r[c] for c in columns] for r in rows]))


@dlq.command("show")
@click.argument("name")
@click.argument("message_id")
@json_option
@db_option
def dlq_show(name: str, message_id: str, as_json: bool) -> None:
    """One parked message of subscription NAME, with its payload."""
    wanted = parse_message_id(message_id)
    with open_log() as log:
        found = parked(log.storage, name, message_ids=[wanted], limit=1)
    if not found:
        raise NotFound(f"message {message_id} is not parked in the DLQ of {name!r}")
    row = _row(found[0]) | found[0].payload_fields()
    if as_json:
        print_json(row)
        return
    for key, value in row.items():
        click.echo(f"{key:>12}: {value}")


def _selection(
    everything: bool,
    since: str | None,
    until: str | None,
    groups: tuple[str, ...],
    message_ids: tuple[str, ...],
) -> Selection:
    return Selection(
        everything,
        None if since is None else parse_time(since),
        None if until is None else parse_time(until),
        frozenset(groups),
        frozenset(parse_message_id(t) for t in message_ids),
    )


def _selectors(command: Any) -> Any:
    """--all and the filters: what replay and purge act on."""
    command = _filters(command)
    return click.option("--all", "everything", is_flag=True, help="Every parked message.")(command)


def _report(verb: str, name: str, change: DlqChange, as_json: bool) -> None:
    if as_json:
        print_json(change.as_json(name, verb))
        return
    along = (
        f" ({plural(change.along, 'earlier message')} of their groups with them, to keep group"
        " order)"
        if change.along
        else ""
    )
    click.echo(f"{verb} {plural(change.selected, 'message')} of {name!r}{along}")


@dlq.command("replay")
@click.argument("name")
@_selectors
@json_option
@db_option
def dlq_replay(
    name: str,
    everything: bool,
    since: str | None,
    until: str | None,
    groups: tuple[str, ...],
    message_ids: tuple[str, ...],
    as_json: bool,
) -> None:
    """Unsideline parked messages of NAME: back into the flow (retry queue, due
    now, first attempt), in group order."""
    selection = _selection(everything, since, until, groups, message_ids)
    with open_log() as log:
        change = replay(log.storage, name, selection)
    _report("replayed", name, change, as_json)


@dlq.command("purge")
@click.argument("name")
@_selectors
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@db_option
def dlq_purge(
    name: str,
    everything: bool,
    since: str | None,
    until: str | None,
    groups: tuple[str, ...],
    message_ids: tuple[str, ...],
    yes: bool,
    as_json: bool,
) -> None:
    """Drop parked messages of NAME for good."""
    selection = _selection(everything, since, until, groups, message_ids)
    if not yes:
        click.confirm(f"Drop the selected parked messages of {name!r} for good?", abort=True)
    with open_log() as log:
        change = purge(log.storage, name, selection)
    _report("purged", name, change, as_json)
