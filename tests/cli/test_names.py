"""Every command that takes the name of something (a topic, a subscription, a
group) says which one does not exist when it does not: exit 1 (2 for `worker`,
whose documented code for a bad subscription is a usage error), `error: ...`
naming the kind and the value, and the database left as it was.

The list of cases is checked against the command tree, so a new command that
takes a name fails here until it has a case.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from harness.cli import subcommands
from riverbed.cli import cli
from riverbed.model import MessageId

ANY_ID = str(MessageId.compose(1_700_000_000_000_000, 1, 1))

MISSING_TOPIC = "error: topic 'nope' does not exist\n"
MISSING_SUBSCRIPTION = "error: subscription 'nope' does not exist\n"
MISSING_GROUP = "error: shared subscription group $share/nope/x/# does not exist\n"

CASES: list[tuple[list[str], int, str]] = [
    (["topic", "describe", "nope"], 1, MISSING_TOPIC),
    (["topic", "set-limits", "nope", "--max-age", "1d"], 1, MISSING_TOPIC),
    (["topic", "alter", "nope", "--max-age", "1d"], 1, MISSING_TOPIC),
    (["topic", "add-storage-topic", "nope", "--partitions", "2"], 1, MISSING_TOPIC),
    (["topic", "switch-produce", "nope"], 1, MISSING_TOPIC),
    (["topic", "delete", "nope", "--yes"], 1, MISSING_TOPIC),
    (["retention", "run", "nope"], 1, MISSING_TOPIC),
    (["produce", "nope"], 1, MISSING_TOPIC),
    (["subscription", "create", "s", "--topic", "nope"], 1, MISSING_TOPIC),
    (["subscription", "create", "s", "--topic", "nope", "--endpoint", "m:f"], 1, MISSING_TOPIC),
    (["subscription", "list", "--topic", "nope"], 1, MISSING_TOPIC),
    (["subscription", "lag", "nope"], 1, MISSING_SUBSCRIPTION),
    (["subscription", "reset", "nope", "--to", "earliest"], 1, MISSING_SUBSCRIPTION),
    (["subscription", "reset", "nope", "--to", "latest", "--queue", "rq"], 1, MISSING_SUBSCRIPTION),
    (
        ["subscription", "reset", "nope", "--to", "earliest", "--shards", "2"],
        1,
        MISSING_SUBSCRIPTION,
    ),
    (["subscription", "delete", "nope"], 1, MISSING_SUBSCRIPTION),
    (["subscription", "run", "nope"], 1, MISSING_SUBSCRIPTION),
    (["subscription", "reshard", "nope", "--shards", "2"], 1, MISSING_SUBSCRIPTION),
    (["dlq", "list", "nope"], 1, MISSING_SUBSCRIPTION),
    (["dlq", "show", "nope", ANY_ID], 1, MISSING_SUBSCRIPTION),
    (["dlq", "replay", "nope", "--all"], 1, MISSING_SUBSCRIPTION),
    (["dlq", "purge", "nope", "--all", "--yes"], 1, MISSING_SUBSCRIPTION),
    (["consume", "nope"], 1, MISSING_SUBSCRIPTION),
    (["worker", "nope", "--handler", "json:dumps"], 2, "subscription 'nope' does not exist"),
    (["group", "describe", "nope", "x/#"], 1, MISSING_GROUP),
    (["group", "delete", "nope", "x/#"], 1, MISSING_GROUP),
    (
        ["cluster", "drain", "nope", "--timeout", "5"],
        1,
        "error: no broker node 'nope' holds a lease on this database (alive: none;"
        " see riverbed cluster status)\n",
    ),
]

NOT_LOOKUPS = {
    ("topic", "create"),  # creates NAME
    ("group", "create"),  # creates NAME
    ("passwd",),  # a file and a user name, no database
    ("token", "add"),  # a token file and a token's name, no database
    ("token", "list"),
    ("token", "revoke"),
}
"""Commands with a name argument that do not look an existing thing up by it."""


def _leaves(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in subcommands(command).items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, command


def _takes_a_name(command: click.Command) -> bool:
    return any(
        isinstance(p, click.Argument) or p.name in ("topic", "subscription") for p in command.params
    )


def test_every_command_taking_a_name_has_a_case() -> None:
    leaves = dict(_leaves(cli))
    covered = {path for path in leaves for args, _, _ in CASES if tuple(args[: len(path)]) == path}
    taking = {path for path, command in leaves.items() if _takes_a_name(command)}
    assert taking - NOT_LOOKUPS - covered == set()
    assert taking >= NOT_LOOKUPS


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with a topic, a plain and a delivering subscription and a group,
    made by creating commands."""
    path = tmp_path_factory.mktemp("names") / "x.db"
    url = f"sqlite:///{path}"
    for args in (
        ["topic", "create", "orders", "--partitions", "2", "--binding", "orders/#"],
        ["subscription", "create", "plain", "--topic", "orders"],
        ["subscription", "create", "hook", "--topic", "orders", "--endpoint", "m:f"],
        ["group", "create", "g", "orders/#"],
    ):
        result = CliRunner().invoke(cli, [*args, "--db", url])
        assert result.exit_code == 0, result.output
    return path


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def _run(path: Path, args: list[str]) -> Result:
    return CliRunner().invoke(cli, [*args, "--db", f"sqlite:///{path}"], input="")


@pytest.mark.parametrize(
    ("args", "code", "message"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_a_missing_name_is_named_and_changes_nothing(
    populated: Path, args: list[str], code: int, message: str
) -> None:
    before = _dump(populated)
    result = _run(populated, args)
    assert result.exit_code == code, result.output
    if code == 1:
        assert result.stderr == message
        assert result.stdout == ""
    else:
        assert message in result.stderr
    assert "Traceback" not in result.output
    assert _dump(populated) == before


@pytest.mark.parametrize(
    "args",
    [
        ["dlq", "list", "plain"],
        ["dlq", "replay", "plain", "--all"],
        ["subscription", "run", "plain"],
        ["subscription", "reshard", "plain", "--shards", "2"],
    ],
)
def test_a_subscription_that_does_not_deliver_is_told_apart(
    populated: Path, args: list[str]
) -> None:
    before = _dump(populated)
    result = _run(populated, args)
    assert result.exit_code == 1
    assert result.stderr == "error: subscription 'plain' does not deliver to an endpoint\n"
    assert _dump(populated) == before
