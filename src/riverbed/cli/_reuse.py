"""`--if-not-exists` on the commands that create something, so that a setup
script can run again: what exists already with the same settings is reused
(exit 0), what exists with other settings is an error naming them (exit 1).
"""

from __future__ import annotations

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
