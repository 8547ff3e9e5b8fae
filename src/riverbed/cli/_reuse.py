"""Options that several commands take alike.

`--if-not-exists` on the commands that create something, so that a setup
script can run again: what exists already with the same settings is reused
(exit 0), what exists with other settings is an error naming them (exit 1).

`--http` and `--token-file`, the admin HTTP API's listener, on `riverbed serve`
(beside the MQTT listener) and `riverbed admin` (the API alone).
"""

from __future__ import annotations

from collections.abc import Callable

import click

from riverbed.cli._app import F


def if_not_exists_option(command: F) -> F:
    return click.option(
        "--if-not-exists",
        is_flag=True,
        help="If it exists already with the same settings, reuse it (exit 0); with other"
        " settings it is still an error.",
    )(command)


def reusing(what: str) -> None:
    click.echo(f"{what} exists already with these settings, reusing it")


def http_listener_options(*, required: bool) -> Callable[[F], F]:
    """Give a command `--http HOST:PORT` (where to serve the admin HTTP API, as
    `[http] address`) and `--token-file FILE` (`[http] token_file`); values the
    command checks as the configuration file's."""

    def decorate(command: F) -> F:
        command = click.option(
            "--token-file",
            metavar="FILE",
            help="Bearer tokens of the HTTP API (`riverbed token add`).",
        )(command)
        return click.option(
            "--http",
            metavar="HOST:PORT",
            required=required,
            help="Serve the admin HTTP API there (docs/http.md); without --token-file,"
            " a loopback address only.",
        )(command)

    return decorate
