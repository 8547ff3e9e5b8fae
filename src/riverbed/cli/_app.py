"""The root command, its options and what every command shares: `--db`,
`--json`, error handling, the click types over the parsers of times and
offsets (`riverbed.subscriptions.positions`, shared with the HTTP API), tables.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from riverbed.errors import DatabaseNotFound, InvalidInput, RiverbedError
from riverbed.log.log import Log
from riverbed.model import parse_duration
from riverbed.storage import (
    DEFAULT_URL,
    ENV_VAR,
    Storage,
    StorageUrl,
    default_url,
    open_storage,
)
from riverbed.subscriptions.positions import parse_reset_target
from riverbed.subscriptions.positions import parse_start as parse_start
from riverbed.subscriptions.positions import parse_time as parse_time
from riverbed.tuning import tune_process

if TYPE_CHECKING:  # rich is imported by the commands that print tables, not by `serve`
    from rich.console import Console
    from rich.table import Table

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

PRODUCE_BATCH = 1000
"""Messages per `Log.produce_async` call."""
PRODUCE_IN_FLIGHT = 8
"""Batches queued at once: enough for the appender to group-commit several."""
FOLLOW_WAIT = 0.5
"""Seconds one `poll` waits in `consume --follow`: how soon a signal is noticed."""


# --------------------------------------------------------------------- plumbing

DB_KEY = "riverbed.db"


def _remember_db(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    # ctx.meta is shared by a command and its parents; the root group's --db is
    # processed first, so a leaf's --db overwrites it.
    if value is not None:
        ctx.meta[DB_KEY] = value


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


def command_url() -> StorageUrl:
    """The database URL this command names (`--db`, else `$RIVERBED_DB`, else the
    default), parsed (`InvalidConfig` for one Riverbed cannot use)."""
    return StorageUrl.parse(click.get_current_context().meta.get(DB_KEY) or default_url())


CREATE_HINT = "create one with riverbed serve or riverbed topic create"


def open_storage_of_command(*, create: bool = False) -> Storage:
    """The storage of the database this command names.

    Only a command that creates things passes `create=True`: it may create the
    database, and says so on stderr. Every other command refuses a database that
    does not exist (a mistyped `--db` must not quietly make an empty one)."""
    url = command_url()
    try:
        storage = open_storage(url, create=create)
    except DatabaseNotFound as exc:
        raise DatabaseNotFound(f"{exc} ({CREATE_HINT})") from None
    if getattr(storage, "created", False):
        click.echo(f"created a new database at {url.shown}", err=True)
    return storage


def open_log(*, create: bool = False) -> Log:
    """The log of the database this command names; see `open_storage_of_command`."""
    storage = open_storage_of_command(create=create)
    try:
        return Log(storage)
    except BaseException:
        storage.close()
        raise


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
"""Exit codes of every command (listed in `riverbed --help`)."""


SPARK_EXTRA_MODULES = (
    "pyspark",
    "py4j",
    "pyarrow",
    "adbc_driver_manager",
    "adbc_driver_sqlite",
    "adbc_driver_postgresql",
)
"""Top-level modules of the `spark` extra (pyproject.toml): `make run` installs
the core only, so a Spark command may find them missing."""


COMMAND_MODULES = {
    "admin": "admin",
    "cluster": "cluster",
    "config": "config",
    "consume": "messages",
    "demo": "demo",
    "dlq": "dlq",
    "group": "groups",
    "passwd": "broker",
    "produce": "messages",
    "retention": "topics",
    "serve": "broker",
    "status": "status",
    "subscription": "subscriptions",
    "token": "admin",
    "topic": "topics",
    "worker": "worker",
}
"""Each command of the root group, by the module of `riverbed.cli` that adds it
to `cli` when imported."""


class RiverbedGroup(click.Group):
    """The root group: turns a `RiverbedError` into `error: ...` and an exit code,
    and a missing `spark` extra into an error that says how to install it, and
    Ctrl-C into `interrupted`.

    Only errors Riverbed raises on purpose (and Ctrl-C) end without a traceback:
    anything else is a bug, and its traceback is what a report of it needs.

    A command's module is imported when the command is looked up
    (`COMMAND_MODULES`): `riverbed serve` imports the broker, not the delivery
    job's, the worker's and the admin API's modules too (every test's broker
    and every CLI call starts a process)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            importlib.import_module(f"riverbed.cli.{module}")
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RiverbedError as exc:
            click.echo(f"error: {exc}", err=True)
            code = EXIT_BAD_INPUT if isinstance(exc, InvalidInput) else EXIT_FAILED
            raise click.exceptions.Exit(code) from None
        except KeyboardInterrupt:
            # What was committed stays committed; what was in hand was not.
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in SPARK_EXTRA_MODULES:
                raise
            click.echo(
                f"error: this command needs {exc.name}, from Riverbed's `spark` extra, which"
                " is not installed: install it with `make venv` (or `pip install -e '.[spark]'`)"
                " in the repository; Spark also needs Java 17 or newer",
                err=True,
            )
            raise click.exceptions.Exit(EXIT_FAILED) from None


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


RETENTION = _Parsed("DURATION|none", _retention)
START = _Parsed("earliest|latest|ISO-TIME", parse_start)
RESET_TARGET = _Parsed("earliest|latest|ISO-TIME|OFFSETS", parse_reset_target)


def make_console() -> Console:
    from rich.console import Console

    # Piped output is never cut to 80 columns; a terminal gets its own width.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 250)


def make_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    footer: Sequence[object] | None = None,
) -> Table:
    """A table; columns whose cells are all numbers are right-aligned."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

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


def plural(number: int, noun: str, nouns: str | None = None) -> str:
    """`1 message`, `3 messages` (`nouns`: the plural, if more than an s)."""
    return f"{number} {noun if number == 1 else nouns or noun + 's'}"


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


# --------------------------------------------------------------------- root


@click.group(cls=RiverbedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@db_option
@click.version_option(package_name="riverbed")
def cli() -> None:
    """Riverbed: a durable message bus over a partitioned, replayable log.

    Every command takes --db URL (here or after the command; the command's wins).
    Only serve, demo, topic create and group create create a missing database;
    the other commands refuse one that does not exist.
    `riverbed demo` shows the basics.

    \b
    Exit codes:
      0    done
      1    failed (not found, exists already, database unreachable or full)
      2    bad input (an option, a value, a file)
      130  interrupted (Ctrl-C)
    """


def main() -> None:
    """The `riverbed` console script."""
    tune_process()
    cli.main(prog_name="riverbed")
