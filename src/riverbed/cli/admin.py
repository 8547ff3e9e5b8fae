"""`riverbed admin` (the admin HTTP API without a broker) and `riverbed token ...`."""

from __future__ import annotations

import logging
import signal
import uuid

import click

from riverbed.cli._app import (
    cli,
    command_url,
    db_option,
    json_option,
    make_console,
    make_table,
    print_json,
)
from riverbed.cli._reuse import http_listener_options
from riverbed.cli.broker import _configure_logging
from riverbed.errors import InvalidConfig
from riverbed.mqtt.config import KEYS, LOG_LEVELS, HttpConfig, LogConfig

# --------------------------------------------------------------------- admin


def http_config(**given: str | None) -> HttpConfig:
    """`[http]` from command-line values (None: not given), checked like the file's."""
    values = {}
    for name, value in given.items():
        if value is None:
            continue
        key = f"http.{name}"
        try:
            values[name] = KEYS[key].convert(key, value)
        except InvalidConfig as exc:
            raise InvalidConfig(f"command line: {exc}") from None
    return HttpConfig(**values)


@cli.command(short_help="Serve the admin HTTP API over a database, without MQTT.")
@http_listener_options(required=True)
@click.option("--certfile", metavar="FILE", help="PEM certificate chain: serve HTTPS.")
@click.option("--keyfile", metavar="FILE", help="PEM private key of HTTPS.")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    help="How much to log.",
)
@db_option
def admin(
    http: str,
    token_file: str | None,
    certfile: str | None,
    keyfile: str | None,
    log_level: str,
) -> None:
    """Serve the admin HTTP API (docs/http.md) over the database until SIGTERM
    or SIGINT: topics, produce, subscriptions and their lag, without an MQTT
    listener (so no connected clients)."""
    import asyncio

    from riverbed.http.auth import TokenFile
    from riverbed.http.context import HttpContext, config_view
    from riverbed.http.server import HttpServer
    from riverbed.log.log import Log

    settings = http_config(address=http, token_file=token_file, certfile=certfile, keyfile=keyfile)
    tokens = None if settings.token_file is None else TokenFile(settings.token_file)
    url = command_url()
    _configure_logging(LogConfig(level=log_level.lower()))
    node = f"admin-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        with Log.open(url, create=False) as log:
            view = {"storage": {"url": url.shown}, "http": config_view(settings)}
            server = HttpServer(settings, HttpContext(log, node, view, tokens=tokens))
            await server.start()
            click.echo(f"admin API on {server.url}/api/v1 (Ctrl-C stops it)", err=True)
            try:
                await stop.wait()
            finally:
                await server.stop()
        logging.getLogger(__name__).info("stopped")

    asyncio.run(main())


# --------------------------------------------------------------------- tokens


@cli.group()
def token() -> None:
    """Bearer tokens of the admin HTTP API (a token file)."""


@token.command("add")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["read", "admin"]),
    required=True,
    help="read: GET requests only; admin: everything.",
)
def token_add(file: str, name: str, role: str) -> None:
    """Add token NAME to FILE (created if missing, mode 0600) and print it.

    The token is printed once, on stdout; FILE keeps only its scrypt hash.
    Give FILE to `riverbed serve --token-file` or `[http] token_file`."""
    from riverbed.http.auth import Role, add_token

    click.echo(add_token(file, name, Role(role)))
    click.echo(f"added token {name!r} ({role}) to {file}; it is shown only this once", err=True)


@token.command("list")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
def token_list(file: str, as_json: bool) -> None:
    """List the tokens of FILE: names and roles (the tokens themselves are not kept)."""
    from riverbed.http.auth import load_token_file

    rows = [{"name": t.name, "role": t.role.value} for t in load_token_file(file).values()]
    if as_json:
        print_json(rows)
    else:
        make_console().print(
            make_table("Tokens", ["name", "role"], [[r["name"], r["role"]] for r in rows])
        )


@token.command("revoke")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("name")
def token_revoke(file: str, name: str) -> None:
    """Remove token NAME from FILE; a running server refuses it from its next request."""
    from riverbed.http.auth import revoke_token

    revoke_token(file, name)
    click.echo(f"revoked token {name!r} in {file}")
