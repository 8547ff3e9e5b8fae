"""`riverbed ...`: the command line over topics, producing and named subscriptions.

Output is for people (rich tables) unless `--json` asks for machine-readable
JSON; `produce` and `consume` speak JSON lines. Every `RiverbedError` ends the
command with `error: <message>` on stderr and no traceback: exit code 2 for a bad
value (`InvalidInput`, like click's own usage errors), 1 for everything else
(not found, exists already, storage unreachable).

The database is `--db URL` on the command, else `--db URL` on `riverbed`, else
`$RIVERBED_DB`, else the embedded default (`riverbed.storage.default_url`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, BinaryIO, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from riverbed.errors import AlreadyExists, InvalidInput, RiverbedError
from riverbed.log.appender import Position, Positions
from riverbed.log.jsonlines import EPOCH, format_time, message_from_json, message_to_json
from riverbed.log.log import Log
from riverbed.log.topics import DEFAULT_RETENTION_US
from riverbed.model import Message, StreamId, format_duration, parse_duration
from riverbed.storage import DEFAULT_URL, ENV_VAR, default_url, redact_url
from riverbed.storage.base import RetentionPolicy, StartKind, StreamHead, SubscriptionRecord
from riverbed.subscriptions.cursors import Start, StreamLag, Subscriptions
from riverbed.tuning import tune_process

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

PRODUCE_BATCH = 1000
"""Messages per `Log.produce_async` call."""
PRODUCE_IN_FLIGHT = 8
"""Batches queued at once: enough for the appender to group-commit several."""
FOLLOW_WAIT = 0.5
"""Seconds one `poll` waits in `consume --follow`: how soon a signal is noticed."""

# --------------------------------------------------------------------- plumbing

_DB_KEY = "riverbed.db"


def _remember_db(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    # ctx.meta is shared by a command and its parents; the root group's --db is
    # processed first, so a leaf's --db overwrites it.
    if value is not None:
        ctx.meta[_DB_KEY] = value


def db_option(command: F) -> F:
    """Give a command `--db URL` (a leaf's wins over the root group's)."""
    return click.option(
        "--db",
        metavar="URL",
        expose_value=False,
        callback=_remember_db,
        help=f"Database: sqlite:///PATH or postgresql://USER@HOST/DB. Default: ${ENV_VAR},"
        f" else {DEFAULT_URL}.",
    )(command)


def json_option(command: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        command
    )


def open_log() -> Log:
    """The log of the database this command names."""
    return Log.open(click.get_current_context().meta.get(_DB_KEY) or default_url())


class RiverbedGroup(click.Group):
    """The root group: turns a `RiverbedError` into `error: ...` and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RiverbedError as exc:
            click.echo(f"error: {exc}", err=True)
            raise click.exceptions.Exit(2 if isinstance(exc, InvalidInput) else 1) from None


def parse_time(text: str) -> int:
    """An ISO 8601 time as µs since the epoch; a time without a zone is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"time {text!r} is not an ISO 8601 time such as 2024-05-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    micros = (moment - EPOCH) // timedelta(microseconds=1)
    if micros < 0:
        raise InvalidInput(f"time {text!r} is before 1970-01-01T00:00:00Z")
    return micros


def parse_offsets(text: str) -> dict[StreamId, int]:
    """`orders/0/1=42,orders/0/2=7` as {stream: offset}."""
    offsets: dict[StreamId, int] = {}
    for item in text.split(","):
        name, sep, number = item.strip().rpartition("=")
        if not sep:
            raise InvalidInput(f"{item!r} is not STREAM=OFFSET, e.g. orders/0/1=42")
        stream = StreamId.parse(name)
        if not number.isdigit():
            raise InvalidInput(f"offset {number!r} for {stream} is not an integer >= 0")
        if stream in offsets:
            raise InvalidInput(f"stream {stream} is given twice")
        offsets[stream] = int(number)
    return offsets


def parse_start(text: str) -> Start:
    if text.lower() in ("earliest", "latest"):
        return StartKind(text.lower())
    return parse_time(text)


class _Parsed(click.ParamType[T]):
    """A click type over one of our parsers: its `InvalidInput` is a usage error."""

    def __init__(self, name: str, parse: Callable[[str], T]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> T:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]  # a default, already converted
        try:
            return self._parse(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


def _retention(text: str) -> int | None:
    return None if text.lower() == "none" else parse_duration(text)


def _reset_target(text: str) -> Start | dict[StreamId, int]:
    return parse_offsets(text) if "=" in text else parse_start(text)


RETENTION = _Parsed("DURATION|none", _retention)
START = _Parsed("earliest|latest|ISO-TIME", parse_start)
RESET_TARGET = _Parsed("earliest|latest|ISO-TIME|OFFSETS", _reset_target)


def _console() -> Console:
    # Piped output is never cut to 80 columns; a terminal gets its own width.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 250)


def _table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    footer: Sequence[object] | None = None,
) -> Table:
    """A table; columns whose cells are all numbers are right-aligned."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE, show_footer=footer is not None)
    for index, column in enumerate(columns):
        cells = [row[index] for row in rows if row[index] is not None]
        numeric = bool(cells) and all(_is_number(cell) for cell in cells)
        table.add_column(
            column,
            "" if footer is None else _cell(footer[index]),
            justify="right" if numeric else "left",
        )
    for row in rows:
        # Text, not markup: names and filters may contain "[".
        table.add_row(*(Text(_cell(cell)) for cell in row))
    return table


def _is_number(cell: object) -> bool:
    return isinstance(cell, int) and not isinstance(cell, bool)


def _cell(cell: object) -> str:
    if isinstance(cell, bool):
        return "yes" if cell else "no"
    return "-" if cell is None else str(cell)


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


# --------------------------------------------------------------------- root


@click.group(cls=RiverbedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@db_option
@click.version_option(package_name="riverbed")
def cli() -> None:
    """Riverbed: a durable message bus over a partitioned, replayable log.

    Every command takes --db URL (here or after the command; the command's wins).
    `riverbed demo` shows the basics.
    """


def main() -> None:
    """The `riverbed` console script."""
    tune_process()
    cli.main(prog_name="riverbed")


# --------------------------------------------------------------------- topics


@cli.group()
def topic() -> None:
    """Create, inspect, scale and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("--partitions", type=int, required=True, help="1, 2, 3 or a multiple of 4 or 6.")
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
@db_option
def topic_create(
    name: str, partitions: int, binding: str | None, retention: int | None, retention_policy: str
) -> None:
    """Create topic NAME with one storage topic of --partitions streams."""
    with open_log() as log:
        log.topics.create(name, partitions, binding, retention, RetentionPolicy(retention_policy))
    click.echo(f"created topic {name!r} with {partitions} partitions")


def _topic_rows(log: Log) -> list[dict[str, Any]]:
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
                "partitions": produce.partitions,
                "generations": len(generations),
                "retention": None
                if record.retention_us is None
                else format_duration(record.retention_us),
                "retention_policy": record.retention_policy.value,
                "messages": messages[record.name],
                "subscriptions": subscriptions[record.name],
            }
        )
    return rows


def _topics_table(rows: list[dict[str, Any]]) -> Table:
    cells = [
        [
            r["name"],
            r["binding"],
            r["partitions"],
            r["generations"],
            f"{r['retention'] or 'none'} ({r['retention_policy']})",
            r["messages"],
            r["subscriptions"],
        ]
        for r in rows
    ]
    columns = ["topic", "binding", "partitions", "gens", "retention", "messages", "subs"]
    return _table("Topics", columns, cells)


@topic.command("list")
@json_option
@db_option
def topic_list(as_json: bool) -> None:
    """List topics with their current partition count, messages and subscriptions."""
    with open_log() as log:
        rows = _topic_rows(log)
    if as_json:
        _print_json(rows)
    else:
        _console().print(_topics_table(rows))


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
        _print_json(info)
        return
    record = description.topic
    produce = description.storage_topics[record.produce_pointer].generation
    console = _console()
    console.print(
        f"topic {name}: binding {record.binding or '-'}, retention {info['retention'] or 'none'}"
        f" ({record.retention_policy.value}), produces to generation {produce}",
        markup=False,
    )
    console.print(f"subscriptions: {', '.join(subscriptions) or '-'}", markup=False)
    console.print(
        _table(
            "Storage topics",
            ["generation", "partitions", "K", "produce"],
            [
                [s.generation, s.partitions, s.k, "<- produce" if s.generation == produce else ""]
                for s in description.storage_topics
            ],
        )
    )
    console.print(_streams_table(description.streams))


def _streams_table(heads: Sequence[StreamHead]) -> Table:
    return _table(
        "Streams",
        ["stream", "start", "next", "messages", "sealed"],
        [
            [h.stream, h.start_offset, h.next_offset, h.next_offset - h.start_offset, h.sealed]
            for h in heads
        ],
    )


@topic.command("add-storage-topic")
@click.argument("name")
@click.option("--partitions", type=int, required=True, help="1, 2, 3 or a multiple of 4 or 6.")
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
        record = log.topics.switch_produce(name)
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


# --------------------------------------------------------------------- produce


def _read_messages(log: Log, topic: str, stdin: BinaryIO) -> list[Message]:
    """Parse and check every line before anything is written."""
    messages: list[Message] = []
    for number, raw in enumerate(stdin, start=1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            message = message_from_json(line)
            log.check(topic, message)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"line {number}: not valid UTF-8 at byte {exc.start}") from None
        except InvalidInput as exc:
            raise InvalidInput(f"line {number}: {exc}") from None
        messages.append(message)
    return messages


@cli.command(short_help="Produce JSON lines from stdin to a topic.")
@click.argument("topic")
@click.option(
    "--print-positions", is_flag=True, help='Print {"stream", "offset"} per message on stdout.'
)
@db_option
def produce(topic: str, print_positions: bool) -> None:
    """Produce JSON lines from stdin to TOPIC, one message per line.

    \b
    {"key": "k1", "payload": "text", "mqtt_topic": "orders/eu"}
    {"payload_b64": "AAEC", "properties": [["content-type", "x"]], "qos": 1, "retain": false}

    payload is UTF-8 text, payload_b64 is base64 bytes: exactly one of them.
    key (null: spread over partitions), mqtt_topic (must match the topic's
    binding), properties ([[name, value], ...] or {name: value}; a value is a
    string, an integer or {"b64": ...}), qos and retain are optional. Blank
    lines are skipped. Every line is checked before any is written: one bad line
    writes nothing (exit 2).
    """
    stdout = sys.stdout.buffer
    with open_log() as log:
        log.topics.get(topic)  # an unknown topic fails before reading stdin
        messages = _read_messages(log, topic, sys.stdin.buffer)
        per_stream: Counter[StreamId] = Counter()

        def done(positions: Sequence[Position]) -> None:
            per_stream.update(stream for stream, _ in positions)
            if print_positions:
                stdout.write(
                    "".join(
                        json.dumps({"stream": str(stream), "offset": offset}) + "\n"
                        for stream, offset in positions
                    ).encode()
                )

        pending: deque[Future[Positions]] = deque()
        try:
            for start in range(0, len(messages), PRODUCE_BATCH):
                pending.append(log.produce_async(topic, messages[start : start + PRODUCE_BATCH]))
                if len(pending) >= PRODUCE_IN_FLIGHT:
                    done(pending.popleft().result())
            while pending:
                done(pending.popleft().result())
        except RiverbedError:
            committed = per_stream.total() + sum(
                len(f.result()) for f in pending if f.exception() is None
            )
            click.echo(f"{committed} of {len(messages)} messages were committed", err=True)
            raise
        stdout.flush()
    click.echo(f"produced {len(messages)} messages to topic {topic!r}", err=True)
    for stream, count in sorted(per_stream.items(), key=lambda item: str(item[0])):
        click.echo(f"  {stream}  {count}", err=True)


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
        _print_json(rows)
        return
    columns = ["name", "topic", "filter", "start", "start_time", "created"]
    _console().print(
        _table(
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


def _lag_table(name: str, lags: Sequence[StreamLag]) -> Table:
    return _table(
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
        _print_json(_lag_json(name, lags))
    else:
        _console().print(_lag_table(name, lags))


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
        _print_json({"subscription": name, "offsets": {str(k): v for k, v in after.items()}})
        return
    _console().print(
        _table(
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


# --------------------------------------------------------------------- consume


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs."""
    stop = threading.Event()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@cli.command(short_help="Print a subscription's messages as JSON lines.")
@click.argument("name")
@click.option("--max", "limit", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--follow", "-f", is_flag=True, help="Wait for new messages until --max or Ctrl-C.")
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Messages per read and commit.",
)
@db_option
def consume(name: str, limit: int | None, follow: bool, batch: int) -> None:
    """Print subscription NAME's messages as JSON lines and commit them.

    Each line has stream, offset, id, timestamp (UTC), mqtt_topic, key, payload
    (text; null with payload_b64 when the bytes are not UTF-8), properties, qos
    and retain. Each batch is committed once it is written out: a message is
    committed only after it was printed. Stops when caught up, unless --follow.
    """
    stdout = sys.stdout.buffer
    printed = 0
    with open_log() as log, _stop_on_signals() as stop:
        consumer = Subscriptions(log.storage).consumer(name)
        while not stop.is_set() and (limit is None or printed < limit):
            room = batch if limit is None else min(batch, limit - printed)
            deliveries = consumer.poll(room, timeout=FOLLOW_WAIT if follow else 0.0)
            if deliveries:
                lines = "".join(
                    json.dumps(message_to_json(d.stream, d.message), ensure_ascii=False) + "\n"
                    for d in deliveries
                )
                try:
                    stdout.write(lines.encode())
                    stdout.flush()
                except BrokenPipeError:
                    _detach_stdout()
                    break  # the reader is gone: this batch was not printed, not committed
                printed += len(deliveries)
            # Commits what was printed, and moves past what the filter skipped.
            consumer.commit()
            if not deliveries and not follow:
                break
    click.echo(f"consumed {printed} messages from subscription {name!r}", err=True)


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that exiting does not fail flushing a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


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
    click.echo(f"deleted {total} messages from {len(results)} streams")


# --------------------------------------------------------------------- passwd


@cli.command(short_help="Add, change or delete a user of an MQTT password file.")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("username")
@click.option("--delete", is_flag=True, help="Delete USERNAME from FILE.")
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the password from stdin (one line) instead of asking twice.",
)
def passwd(file: str, username: str, delete: bool, from_stdin: bool) -> None:
    """Set USERNAME's password in the MQTT password FILE, or --delete USERNAME.

    FILE is created if missing (mode 0600) and rewritten atomically; it holds
    scrypt hashes, never passwords. The broker reads it as `auth.password_file`.
    """
    from riverbed.errors import NotFound
    from riverbed.mqtt.auth import (
        MAX_PASSWORD_BYTES,
        delete_user,
        load_password_file,
        set_password,
        validate_username,
    )

    if delete:
        if from_stdin:
            raise click.UsageError("--delete takes no password: leave out --stdin")
        delete_user(file, username)
        click.echo(f"deleted user {username!r} from {file}")
        return
    validate_username(username)
    with suppress(NotFound):
        load_password_file(file)  # a broken file is refused before asking for a password
    if from_stdin:
        raw = sys.stdin.buffer.read(MAX_PASSWORD_BYTES + 3)
        password = raw.removesuffix(b"\n").removesuffix(b"\r")
        if b"\n" in password:
            raise InvalidInput("the password on stdin must be one line; it has several")
    else:
        typed: str = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
        password = typed.encode("utf-8", "surrogateescape")
    if set_password(file, username, password):
        click.echo(f"added user {username!r} to {file}")
    else:
        click.echo(f"changed the password of user {username!r} in {file}")


# --------------------------------------------------------------------- serve


@cli.command(short_help="Run the MQTT broker.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="A TOML configuration file (riverbed.mqtt.config).",
)
@click.option(
    "--mqtt", metavar="HOST:PORT", help="Where to listen for MQTT (default 127.0.0.1:1883)."
)
@click.option(
    "--allow-anonymous",
    is_flag=True,
    default=None,
    help="Let clients connect without a user name.",
)
@db_option
def serve(config_file: str | None, mqtt: str | None, allow_anonymous: bool | None) -> None:
    """Run the MQTT 3.1.1 / 5 broker until SIGTERM or SIGINT.

    Every message published is committed to the log before it is acknowledged;
    sessions survive restarts. Stopping disconnects clients (MQTT 5: 0x8B Server
    shutting down) and saves their sessions.
    """
    import asyncio
    import logging

    from riverbed.mqtt.broker import serve as run_broker
    from riverbed.mqtt.config import load_config

    db = click.get_current_context().meta.get(_DB_KEY)
    config = load_config(
        config_file,
        {"listeners.mqtt": mqtt, "storage.url": db, "auth.allow_anonymous": allow_anonymous},
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = config.storage.url or default_url()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        with Log.open(url) as log:
            await run_broker(config, log, stop)

    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        asyncio.run(main())
    else:  # pragma: no cover - not installed here
        uvloop.run(main())


# --------------------------------------------------------------------- demo

DEMO_TOPIC = "demo"
DEMO_SUBSCRIPTION = "demo-reader"
DEMO_MESSAGES = 1000
DEMO_KEYS = 8


@cli.command(short_help="Try Riverbed out on topic `demo` (what `make run` runs).")
@db_option
def demo() -> None:
    """Create topic `demo`, produce to it, consume it, and show what happened.

    Safe to run again: the topic and subscription are reused.
    """
    db = click.get_current_context().meta.get(_DB_KEY)
    with open_log() as log:
        with suppress(AlreadyExists):
            log.topics.create(DEMO_TOPIC, 4, binding="demo/#")
        positions = log.produce(
            DEMO_TOPIC,
            [
                Message(
                    json.dumps({"seq": i, "celsius": 18 + (i * 7) % 10}).encode(),
                    key=f"sensor-{i % DEMO_KEYS}",
                    mqtt_topic=f"demo/sensor-{i % DEMO_KEYS}/temperature",
                )
                for i in range(DEMO_MESSAGES)
            ],
        )
        subscriptions = Subscriptions(log.storage)
        with suppress(AlreadyExists):
            subscriptions.create(DEMO_SUBSCRIPTION, DEMO_TOPIC)
        consumer = subscriptions.consumer(DEMO_SUBSCRIPTION)
        consumed = 0
        while deliveries := consumer.poll(1000):
            consumed += len(deliveries)
            consumer.commit()
        topics = _topic_rows(log)
        streams = log.storage.list_streams(DEMO_TOPIC)
        lags = subscriptions.lag(DEMO_SUBSCRIPTION)
    console = _console()
    console.print(f"database: {redact_url(log.storage.url)}", markup=False)
    console.print(
        f"produced {len(positions)} messages over {DEMO_KEYS} keys to topic '{DEMO_TOPIC}'"
        f" ({len({s for s, _ in positions})} streams); subscription '{DEMO_SUBSCRIPTION}'"
        f" consumed {consumed} and committed them\n",
        markup=False,
    )
    console.print(_topics_table(topics))
    console.print(_streams_table(streams))
    console.print(_lag_table(DEMO_SUBSCRIPTION, lags))
    prefix = "riverbed" + (f" --db {shlex.quote(redact_url(db))}" if db else "")
    tries = [
        f"{prefix} topic describe {DEMO_TOPIC}",
        f'echo \'{{"key": "k", "payload": "hello", "mqtt_topic": "demo/x"}}\''
        f" | {prefix} produce {DEMO_TOPIC}",
        f"{prefix} consume {DEMO_SUBSCRIPTION} --max 5",
        f"{prefix} subscription reset {DEMO_SUBSCRIPTION} --to earliest",
        f"{prefix} subscription lag {DEMO_SUBSCRIPTION}",
        f"{prefix} topic add-storage-topic {DEMO_TOPIC} --partitions 8",
        f"{prefix} --help",
    ]
    console.print("\ntry next:")
    for line in tries:
        console.print(f"  {line}", markup=False)


if __name__ == "__main__":
    main()
