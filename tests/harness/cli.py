"""The command line in-process, against one database."""

from __future__ import annotations

from click.testing import CliRunner, Result

from riverbed.cli import cli


def rb(url: str, *args: str) -> Result:
    """`riverbed ARGS --db URL`; exceptions other than exits propagate."""
    return CliRunner().invoke(cli, [*args, "--db", url], catch_exceptions=False)
