"""`riverbed topic ...` and `riverbed retention run`."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table

from riverbed.cli._app import (
    RETENTION,
    _Parsed,
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
from riverbed.errors import AlreadyExists, InvalidInput
from riverbed.log.log import Log
from riverbed.log.topics import DEFAULT_KEY_MODE, DEFAULT_RETENTION_US, KeyMode
from riverbed.model import format_duration
from riverbed.storage import size_in_bytes
from riverbed.storage.base import RetentionPolicy, StreamHead, TopicRecord
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.splitting import switch_produce

# --------------------------------------------------------------------- topics


@cli.group()
def topic() -> None:
    """Create, inspect, scale and delete topics."""


def _max_messages(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if not (text.isascii() and text.isdigit()):
        raise InvalidInput(f"maximum of messages {text!r} is not a whole number (or none)")
    return int(text)


MAX_MESSAGES = _Parsed("N|none", _max_messages)
KEY_MODE = _Parsed("client-topic|client-id|topic|property:NAME|none", KeyMode.parse)


def _max_bytes(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        size = size_in_bytes(text, "maximum size")
    except InvalidInput as exc:
        raise InvalidInput(f"{exc}, or none for no limit") from None
    if size < 1:
        raise InvalidInput(
            f"maximum size {text!r} must be at least 1 byte per stream (or none for no limit)"
        )
    return size


MAX_BYTES = _Parsed("SIZE|none", _max_bytes)

_SIZE_UNITS = (
    ("TiB", 1024**4),
    ("TB", 1000**4),
    ("GiB", 1024**3),
    ("GB", 1000**3),
    ("MiB", 1024**2),
    ("MB", 1000**2),
    ("KiB", 1024),
    ("kB", 1000),
)


def format_size(size: int) -> str:
    """`10MiB`, `1GB`, `500kB`, `1234`: the shortest exact form of a size."""
    exact = [(size // unit, name) for name, unit in _SIZE_UNITS if size % unit == 0]
    if not exact:
        return str(size)
    number, name = min(exact)
    return f"{number}{name}"


_MAX_AGE_HELP = (
    "Delete messages older than this even if a subscription has not consumed them"
    " (e.g. 30d); `none`: no limit."
)
_MAX_MESSAGES_HELP = "Keep at most N messages per stream, consumed or not; `none`: no limit."
_MAX_BYTES_HELP = (
    "Keep at most this many bytes of payload per stream, consumed or not, and always the"
    " newest message (e.g. 10MiB, 1GB, 500000); `none`: no limit."
)


@topic.command("create")
@click.argument("name")
@click.option(
    "--partitions", type=int, required=True, help="1, 2, 3 or a multiple of 4 or 6, at most 65,536."
)
@click.option("--binding", metavar="FILTER", help="MQTT topic filter this topic stores.")
@click.option(
    "--retention",
    type=RETENTION,
    default=format_duration(DEFAULT_RETENTION_US),
    show_default=True,
    help="How long messages are kept, e.g. 12h, 7d, 1h30m; `none` keeps them forever.",
)
@click.option(
    "--retention-policy",
    type=click.Choice([p.value for p in RetentionPolicy]),
    default=RetentionPolicy.CONSUMED_AND_EXPIRED.value,
    show_default=True,
    help="What retention may delete.",
)
@click.option("--max-age", type=RETENTION, default=None, help=_MAX_AGE_HELP)
@click.option("--max-messages", type=MAX_MESSAGES, default=None, help=_MAX_MESSAGES_HELP)
@click.option("--max-bytes", type=MAX_BYTES, default=None, help=_MAX_BYTES_HELP)
@if_not_exists_option
@click.option(
    "--key",
    "key_mode",
    type=KEY_MODE,
    default=None,
    help="The ordering key of MQTT publishes the binding brings (needs --binding):"
    " client-topic (the order MQTT promises), client-id, topic, property:NAME (a user"
    f" property, else the client id) or none (spread, unordered). [default: {DEFAULT_KEY_MODE}]",
)
@db_option
def topic_create(
    name: str,
    partitions: int,
    binding: str | None,
    retention: int | None,
    retention_policy: str,
    max_age: int | None,
    max_messages: int | None,
    max_bytes: int | None,
    if_not_exists: bool,
    key_mode: KeyMode | None,
) -> None:
    """Create topic NAME with one storage topic of --partitions streams."""

    def create(log: Log, exist_ok: bool) -> None:
        log.topics.create(
            name,
            partitions,
            binding,
            retention,
            RetentionPolicy(retention_policy),
            max_age_us=max_age,
            max_messages=max_messages,
            max_bytes=max_bytes,
            exist_ok=exist_ok,
            key_mode=key_mode,
        )

    with open_log(create=True) as log:
        try:
            create(log, exist_ok=False)
        except AlreadyExists:
            if not if_not_exists:
                raise
            create(log, exist_ok=True)  # AlreadyExists again if its settings differ
            reusing(f"topic {name!r}")
            return
    click.echo(f"created topic {name!r} with {plural(partitions, 'partition')}")


@topic.command("alter")
@click.argument("name")
@click.option(
    "--retention",
    type=RETENTION,
    help="How long messages are kept, e.g. 12h, 7d; `none` keeps them for ever.",
)
@click.option(
    "--retention-policy",
    type=click.Choice([p.value for p in RetentionPolicy]),
    help="What retention may delete.",
)
@click.option("--max-age", type=RETENTION, help=_MAX_AGE_HELP)
@click.option("--max-messages", type=MAX_MESSAGES, help=_MAX_MESSAGES_HELP)
@click.option("--max-bytes", type=MAX_BYTES, help=_MAX_BYTES_HELP)
@click.option(
    "--key",
    "key_mode",
    type=KEY_MODE,
    help="The ordering key of MQTT publishes the binding brings, from the next PUBLISH"
    " on: client-topic, client-id, topic, property:NAME or none.",
)
@db_option
def topic_alter(**options: Any) -> None:
    """Change topic NAME's retention and its limits.

    Only the options given change; `none` removes a limit (or, for --retention,
    keeps messages for ever). Unlike --retention-policy, the limits delete
    messages a subscription or an offline session has not read yet: they bound
    the log a subscription nobody reads can keep.
    """
    _alter(**options)


@topic.command("set-limits")
@click.argument("name")
@click.option("--max-age", type=RETENTION, help=_MAX_AGE_HELP)
@click.option("--max-messages", type=MAX_MESSAGES, help=_MAX_MESSAGES_HELP)
@click.option("--max-bytes", type=MAX_BYTES, help=_MAX_BYTES_HELP)
@db_option
def topic_set_limits(**options: Any) -> None:
    """Change topic NAME's limits: `topic alter` without --retention."""
    _alter(**options)


def _alter(name: str, **options: Any) -> None:
    ctx = click.get_current_context()
    given = {
        option: value
        for option, value in options.items()
        if ctx.get_parameter_source(option) is not ParameterSource.DEFAULT
    }
    if not given:
        names = ", ".join("--" + option.replace("_", "-") for option in options)
        raise click.UsageError(f"nothing to change: give one or more of {names}")
    changes: dict[str, Any] = {
        f"{o}_us" if o in ("retention", "max_age") else o: v for o, v in given.items()
    }
    if "retention_policy" in changes:
        changes["retention_policy"] = RetentionPolicy(changes["retention_policy"])
    with open_log() as log:
        record = log.topics.alter(name, **changes)
    click.echo(
        f"topic {name!r}: {_retention_text(record)}, {_limits_text(record)}, key {record.key_mode}"
    )


def _retention_text(record: TopicRecord) -> str:
    kept = "none" if record.retention_us is None else format_duration(record.retention_us)
    return f"retention {kept} ({record.retention_policy.value})"


def _limits_text(record: TopicRecord) -> str:
    age = "none" if record.max_age_us is None else format_duration(record.max_age_us)
    count = "none" if record.max_messages is None else f"{record.max_messages} per stream"
    size = "none" if record.max_bytes is None else f"{format_size(record.max_bytes)} per stream"
    return f"max age {age}, max messages {count}, max bytes {size}"


def topic_rows(log: Log) -> list[dict[str, Any]]:
    storage = log.storage
    messages: Counter[str] = Counter()
    for head in storage.list_streams():
        messages[head.stream.topic] += head.next_offset - head.start_offset
    subscriptions = Counter(s.topic for s in storage.list_subscriptions())
    rows: list[dict[str, Any]] = []
    for record in log.topics.list():
        generations = storage.list_storage_topics(record.name)
        produce = generations[record.produce_pointer]
        rows.append(
            {
                "name": record.name,
                "binding": record.binding,
                "key": record.key_mode,
                "partitions": produce.partitions,
                "generations": len(generations),
                "retention": None
                if record.retention_us is None
                else format_duration(record.retention_us),
                "retention_policy": record.retention_policy.value,
                "max_age": None
                if record.max_age_us is None
                else format_duration(record.max_age_us),
                "max_messages": record.max_messages,
                "max_bytes": record.max_bytes,
                "messages": messages[record.name],
                "subscriptions": subscriptions[record.name],
            }
        )
    return rows


def topics_table(rows: list[dict[str, Any]]) -> Table:
    cells = [
        [
            r["name"],
            r["binding"],
            r["key"],
            r["partitions"],
            r["generations"],
            f"{r['retention'] or 'none'} ({r['retention_policy']})",
            r["messages"],
            r["subscriptions"],
        ]
        for r in rows
    ]
    columns = ["topic", "binding", "key", "partitions", "gens", "retention", "messages", "subs"]
    return make_table("Topics", columns, cells)


@topic.command("list")
@json_option
@db_option
def topic_list(as_json: bool) -> None:
    """List topics with their current partition count, messages and subscriptions."""
    with open_log() as log:
        rows = topic_rows(log)
    if as_json:
        print_json(rows)
    else:
        make_console().print(topics_table(rows))


@topic.command("describe")
@click.argument("name")
@json_option
@db_option
def topic_describe(name: str, as_json: bool) -> None:
    """Show a topic's storage topics, produce pointer and streams."""
    with open_log() as log:
        description = log.topics.describe(name)
        subscriptions = [s.name for s in Subscriptions(log.storage).list(name)]
    info = description.as_dict() | {"subscriptions": subscriptions}
    if as_json:
        print_json(info)
        return
    record = description.topic
    produce = description.storage_topics[record.produce_pointer].generation
    console = make_console()
    console.print(
        f"topic {name}: binding {record.binding or '-'} (key {record.key_mode}),"
        f" retention {info['retention'] or 'none'}"
        f" ({record.retention_policy.value}),"
        f" {_limits_text(record)},"
        f" produces to generation {produce}",
        markup=False,
    )
    console.print(f"subscriptions: {', '.join(subscriptions) or '-'}", markup=False)
    console.print(
        make_table(
            "Storage topics",
            ["generation", "partitions", "K", "produce"],
            [
                [s.generation, s.partitions, s.k, "<- produce" if s.generation == produce else ""]
                for s in description.storage_topics
            ],
        )
    )
    console.print(streams_table(description.streams))


def streams_table(heads: Sequence[StreamHead]) -> Table:
    return make_table(
        "Streams",
        ["stream", "start", "next", "messages", "sealed"],
        [
            [h.stream, h.start_offset, h.next_offset, h.next_offset - h.start_offset, h.sealed]
            for h in heads
        ],
    )


@topic.command("add-storage-topic")
@click.argument("name")
@click.option(
    "--partitions", type=int, required=True, help="1, 2, 3 or a multiple of 4 or 6, at most 65,536."
)
@db_option
def topic_add_storage_topic(name: str, partitions: int) -> None:
    """Add a generation of --partitions streams (seed 003 AddStorageTopic).

    Producers keep writing to the current generation until `switch-produce`.
    """
    with open_log() as log:
        added = log.topics.add_storage_topic(name, partitions)
    click.echo(
        f"added generation {added.generation} to topic {name!r}: {added.partitions} partitions,"
        f" K={added.k}; run `riverbed topic switch-produce {name}` to produce to it"
    )


@topic.command("switch-produce")
@click.argument("name")
@db_option
def topic_switch_produce(name: str) -> None:
    """Produce to the next generation and seal the earlier ones (seed 003 SwitchProduce)."""
    with open_log() as log:
        before = log.topics.get(name).produce_pointer
        record = switch_produce(log.topics, name)
        generation = log.storage.list_storage_topics(name)[record.produce_pointer]
    where = f"generation {generation.generation} ({generation.partitions} partitions)"
    if record.produce_pointer == before:
        click.echo(f"topic {name!r} already produces to its newest {where}")
    else:
        click.echo(f"topic {name!r} now produces to {where}; earlier generations are sealed")


@topic.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@db_option
def topic_delete(name: str, yes: bool) -> None:
    """Delete a topic with all its messages and subscriptions."""
    with open_log() as log:
        description = log.topics.describe(name)
        messages = sum(h.next_offset - h.start_offset for h in description.streams)
        subscriptions = len(Subscriptions(log.storage).list(name))
        what = f"topic {name!r} (messages: {messages}, subscriptions: {subscriptions})"
        if not yes:
            if not _interactive():
                raise click.UsageError(f"not deleting {what}: pass --yes to confirm")
            click.confirm(f"Delete {what}?", abort=True, err=True)
        log.topics.delete(name)
    click.echo(f"deleted {what}")


def _interactive() -> bool:
    return sys.stdin.isatty()


# --------------------------------------------------------------------- retention


@cli.group()
def retention() -> None:
    """Delete what topics' retention allows."""


@retention.command("run")
@click.argument("topic", required=False)
@db_option
def retention_run(topic: str | None) -> None:
    """Apply retention to TOPIC (or every topic) now."""
    from riverbed.log.retention import run_retention

    with open_log() as log:
        results = run_retention(log.storage, topic=topic)
    for r in results:
        click.echo(f"{r.stream}: deleted {r.deleted}, first retained offset now {r.start_offset}")
    total = sum(r.deleted for r in results)
    click.echo(f"deleted {plural(total, 'message')} from {plural(len(results), 'stream')}")
