"""`riverbed subscription ...`."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.table import Table

from riverbed.cli._app import (
    RESET_TARGET,
    START,
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_log,
    print_json,
)
from riverbed.log.jsonlines import format_time
from riverbed.model import StreamId
from riverbed.storage.base import StartKind, SubscriptionRecord
from riverbed.subscriptions.cursors import Start, StreamLag, Subscriptions

# --------------------------------------------------------------------- subscriptions


@cli.group()
def subscription() -> None:
    """Create, inspect, rewind and delete named subscriptions."""


@subscription.command("create")
@click.argument("name")
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--filter", "topic_filter", metavar="FILTER", help="Only MQTT topics it matches.")
@click.option(
    "--start",
    type=START,
    default="earliest",
    show_default=True,
    help="Where to start: earliest, latest, or an ISO 8601 time (a time without zone is UTC).",
)
@db_option
def subscription_create(name: str, topic: str, topic_filter: str | None, start: Start) -> None:
    """Create subscription NAME on --topic."""
    with open_log() as log:
        Subscriptions(log.storage).create(name, topic, topic_filter, start)
    where = start.value if isinstance(start, StartKind) else format_time(start)
    click.echo(f"created subscription {name!r} on topic {topic!r} starting at {where}")


def _subscription_row(record: SubscriptionRecord) -> dict[str, object]:
    return {
        "name": record.name,
        "topic": record.topic,
        "filter": record.filter,
        "start": record.start.value,
        "start_time": None if record.start_us is None else format_time(record.start_us),
        "created": format_time(record.created_us),
    }


@subscription.command("list")
@click.option("--topic", help="Only subscriptions of this topic.")
@json_option
@db_option
def subscription_list(topic: str | None, as_json: bool) -> None:
    """List subscriptions."""
    with open_log() as log:
        rows = [_subscription_row(r) for r in Subscriptions(log.storage).list(topic)]
    if as_json:
        print_json(rows)
        return
    columns = ["name", "topic", "filter", "start", "start_time", "created"]
    make_console().print(
        make_table(
            "Subscriptions",
            ["subscription", "topic", "filter", "start", "start time", "created"],
            [[row[c] for c in columns] for row in rows],
        )
    )


def _lag_json(name: str, lags: Sequence[StreamLag]) -> dict[str, object]:
    return {
        "subscription": name,
        "streams": [
            {
                "stream": str(s.stream),
                "committed": s.committed,
                "head": s.head,
                "lag": s.lag,
                "readable": s.readable,
            }
            for s in lags
        ],
        "total": sum(s.lag for s in lags),
    }


def lag_table(name: str, lags: Sequence[StreamLag]) -> Table:
    return make_table(
        f"Lag of {name}",
        ["stream", "committed", "head", "lag", "readable"],
        [
            [s.stream, s.committed, s.head, s.lag, "yes" if s.readable else "after earlier gen."]
            for s in lags
        ],
        footer=["total", "", "", sum(s.lag for s in lags), ""],
    )


@subscription.command("lag")
@click.argument("name")
@json_option
@db_option
def subscription_lag(name: str, as_json: bool) -> None:
    """Show per stream how far NAME is behind the head."""
    with open_log() as log:
        lags = Subscriptions(log.storage).lag(name)
    if as_json:
        print_json(_lag_json(name, lags))
    else:
        make_console().print(lag_table(name, lags))


@subscription.command("reset")
@click.argument("name")
@click.option(
    "--to",
    "target",
    type=RESET_TARGET,
    required=True,
    help="earliest, latest, an ISO 8601 time (a time without zone is UTC), or offsets"
    " STREAM=OFFSET,... such as orders/0/1=42,orders/0/2=7 (other streams keep theirs).",
)
@json_option
@db_option
def subscription_reset(name: str, target: Start | dict[StreamId, int], as_json: bool) -> None:
    """Move NAME's committed offsets."""
    with open_log() as log:
        subscriptions = Subscriptions(log.storage)
        before = {s.stream: s.committed for s in subscriptions.lag(name)}
        after = subscriptions.reset(name, target)
    if as_json:
        print_json({"subscription": name, "offsets": {str(k): v for k, v in after.items()}})
        return
    make_console().print(
        make_table(
            f"Offsets of {name}",
            ["stream", "before", "after"],
            [[stream, before.get(stream), offset] for stream, offset in after.items()],
        )
    )


@subscription.command("delete")
@click.argument("name")
@db_option
def subscription_delete(name: str) -> None:
    """Delete subscription NAME and its offsets."""
    with open_log() as log:
        Subscriptions(log.storage).delete(name)
    click.echo(f"deleted subscription {name!r}")
