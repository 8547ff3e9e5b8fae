"""`riverbed serve` and `riverbed admin` take the admin HTTP API's listener
options (`--http`, `--token-file`) alike; only `admin` needs `--http`."""

from __future__ import annotations

import click
from click.testing import CliRunner

from harness.cli import subcommands
from riverbed.cli import cli

LISTENER = ("http", "token_file")


def listener_options(name: str) -> list[tuple[object, ...]]:
    command = subcommands(cli)[name]
    return [
        (p.opts, p.metavar, p.help)
        for p in command.params
        if isinstance(p, click.Option) and p.name in LISTENER
    ]


def test_serve_and_admin_describe_the_listener_alike() -> None:
    assert len(listener_options("serve")) == len(LISTENER)
    assert listener_options("serve") == listener_options("admin")


def test_admin_needs_an_http_address() -> None:
    result = CliRunner().invoke(cli, ["admin", "--token-file", "tokens"])
    assert result.exit_code == 2
    assert "Missing option '--http'" in result.output
