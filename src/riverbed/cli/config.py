"""`riverbed config example`: the sample broker configuration, every key with its
default (`riverbed.mqtt.config_example`)."""

from __future__ import annotations

import click

from riverbed.cli._app import cli


@cli.group("config")
def config_group() -> None:
    """The broker's configuration file (`riverbed serve --config FILE`)."""


@config_group.command("example")
def config_example() -> None:
    """Print a configuration file with every key, its default and what it is for.

    The repository's riverbed.example.toml is this output; copy it and keep the
    keys you change.
    """
    from riverbed.mqtt.config_example import render_example

    click.echo(render_example(), nl=False)
