"""The command line's shape: every command has help, takes --db, and resolves
the database leaf, root, environment, default; malformed and unreachable
URLs and click's usage errors exit as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from harness.cli import (
    as_json,
    ok,
    rb,
    subcommands,
)
from riverbed.cli import COMMAND_MODULES, cli

# --------------------------------------------------------------------- help and --db


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in subcommands(command).items():
            yield from _commands(sub, (*path, name))


ALL_COMMANDS = [path for path, _ in _commands(cli)]


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "riverbed")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0
    assert "Usage: " in result.stdout


def test_each_command_is_added_by_the_module_it_is_looked_up_in() -> None:
    """The root group imports a command's module when the command is asked for
    (`COMMAND_MODULES`): each command is there, and nothing else is."""
    for name, command in subcommands(cli).items():
        assert command.callback is not None, name
        assert command.callback.__module__ == f"riverbed.cli.{COMMAND_MODULES[name]}", name
    assert set(cli.commands) == set(COMMAND_MODULES)


def test_serve_imports_no_other_command_and_no_http_api_unless_asked() -> None:
    """`riverbed serve` (every test's broker) imports its own module and the
    broker's, not the other commands' nor, without `--http`, the HTTP API's
    (FastAPI), nor, without `--ws`, wsproto."""
    code = """
import json, sys
import click
from riverbed.cli import cli
import riverbed.mqtt.broker
from riverbed.cli.broker import http_beside
from riverbed.mqtt.config import load_config
assert cli.get_command(click.Context(cli), "serve") is not None
assert http_beside(load_config(None, {"auth.allow_anonymous": True}), None) is None
print(json.dumps(sorted(sys.modules)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    imported = set(json.loads(done.stdout))
    others = {f"riverbed.cli.{m}" for m in COMMAND_MODULES.values()} - {"riverbed.cli.broker"}
    assert "riverbed.cli.broker" in imported
    assert not imported & others, sorted(imported & others)
    assert not {"fastapi", "riverbed.http.context", "pydantic", "rich", "wsproto"} & imported


NO_DATABASE = {
    ("passwd",),
    ("config", "example"),
    ("token", "add"),
    ("token", "list"),
    ("token", "revoke"),
}
"""Commands that never open the log (they manage files of their own)."""


def test_every_leaf_and_the_root_take_db() -> None:
    for path, command in _commands(cli):
        if (isinstance(command, click.Group) and path) or path in NO_DATABASE:
            continue
        assert "--db" in [o for p in command.params for o in p.opts], path


def test_db_resolution_leaf_then_root_then_env_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaf, root, env = (f"sqlite:///{tmp_path}/{n}.db" for n in ("leaf", "root", "env"))
    monkeypatch.setenv("RIVERBED_DB", env)
    runner = CliRunner()
    create = ["topic", "create", "t1", "--partitions", "1"]
    assert runner.invoke(cli, ["--db", root, *create, "--db", leaf]).exit_code == 0
    assert (
        runner.invoke(cli, ["--db", root, "topic", "create", "t2", "--partitions", "1"]).exit_code
        == 0
    )
    assert runner.invoke(cli, ["topic", "create", "t3", "--partitions", "1"]).exit_code == 0
    monkeypatch.delenv("RIVERBED_DB")
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(cli, ["topic", "create", "t4", "--partitions", "1"]).exit_code == 0

    def names(url: str) -> set[str]:
        return {t["name"] for t in as_json(ok(url, "topic", "list", "--json"))} - {"mqtt"}

    assert names(leaf) == {"t1"}
    assert names(root) == {"t2"}
    assert names(env) == {"t3"}
    assert (tmp_path / "riverbed-data" / "riverbed.db").exists()
    assert names("sqlite:///./riverbed-data/riverbed.db") == {"t4"}


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite://somehost/x.db", ["sqlite://somehost/x.db", "no host"]),
        ("mysql://localhost/x", ["mysql", "unsupported scheme"]),
        ("sqlite:///", ["names no database file"]),
        ("sqlite:///x.db?synchronous=sometimes", ["synchronous", "normal or full"]),
    ],
)
def test_malformed_db_url_is_a_usage_error(url: str, words: list[str]) -> None:
    result = CliRunner().invoke(cli, ["topic", "list", "--db", url])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert all(w in result.stderr for w in words), result.stderr
    assert "Traceback" not in result.output


def test_unreachable_postgres_is_a_runtime_error() -> None:
    result = CliRunner().invoke(cli, ["topic", "list", "--db", "postgresql://nobody@127.0.0.1:1/x"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot connect to PostgreSQL")


def test_click_usage_errors_exit_2(db: str) -> None:
    assert rb(db, "topic", "create", "t").exit_code == 2  # --partitions missing
    assert rb(db, "topic", "create", "t", "--partitions", "four").exit_code == 2
    assert rb(db, "no-such-command").exit_code == 2
    assert rb(db, "consume", "s", "--max", "0").exit_code == 2
