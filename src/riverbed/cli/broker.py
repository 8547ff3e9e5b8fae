"""`riverbed serve` and `riverbed passwd`."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from riverbed.cli._app import DB_KEY, cli, db_option
from riverbed.cli._reuse import http_listener_options
from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.mqtt.config import LOG_LEVELS, BrokerConfig, LogConfig
from riverbed.storage import StorageUrl, default_url

if TYPE_CHECKING:
    from riverbed.http.server import HttpServer
    from riverbed.mqtt.broker import Broker

# --------------------------------------------------------------------- passwd


def stdin_is_terminal() -> bool:
    """Whether a password can be asked for (a terminal on stdin)."""
    return sys.stdin.isatty()


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
    from riverbed.mqtt.passwords import (
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
        if not stdin_is_terminal():
            raise click.UsageError(
                "no terminal to read a password from: use --stdin (one line on stdin)"
            )
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
@click.option("--tls", metavar="HOST:PORT", help="Where to listen for MQTT over TLS.")
@click.option("--certfile", metavar="FILE", help="The TLS listener's PEM certificate chain.")
@click.option("--keyfile", metavar="FILE", help="The TLS listener's PEM private key.")
@click.option(
    "--cafile", metavar="FILE", help="Require TLS client certificates signed by a CA in FILE."
)
@click.option(
    "--ws",
    metavar="HOST:PORT",
    help="Where to listen for MQTT over WebSockets (path /mqtt; WSS from the config file).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    help="How much to log (default info; debug adds every client connecting and leaving).",
)
@http_listener_options(required=False)
@db_option
def serve(
    config_file: str | None,
    mqtt: str | None,
    allow_anonymous: bool | None,
    tls: str | None,
    certfile: str | None,
    keyfile: str | None,
    cafile: str | None,
    ws: str | None,
    log_level: str | None,
    http: str | None,
    token_file: str | None,
) -> None:
    """Run the MQTT 3.1.1 / 5 broker until SIGTERM or SIGINT.

    Every message published is committed to the log before it is acknowledged;
    sessions survive restarts. Stopping disconnects clients (MQTT 5: 0x8B Server
    shutting down) and saves their sessions.
    """
    import asyncio

    from riverbed.mqtt.broker import EXIT_MARGIN, ExitDeadline, check_listeners
    from riverbed.mqtt.broker import serve as run_broker
    from riverbed.mqtt.config import load_config
    from riverbed.mqtt.tls import server_context

    db = click.get_current_context().meta.get(DB_KEY)
    config = load_config(
        config_file,
        {
            "listeners.mqtt": mqtt,
            "listeners.tls.address": tls,
            "listeners.tls.certfile": certfile,
            "listeners.tls.keyfile": keyfile,
            "listeners.tls.cafile": cafile,
            "listeners.ws.address": ws,
            "storage.url": db,
            "auth.allow_anonymous": allow_anonymous,
            "log.level": log_level,
            "http.address": http,
            "http.token_file": token_file,
        },
    )
    # A bad certificate or key: refused before starting.
    if config.listeners.tls is not None:
        server_context(config.listeners.tls)
    if config.listeners.ws is not None and config.listeners.ws.secure:
        server_context(config.listeners.ws)
    check_listeners(config)  # an address in use: refused before the database is opened
    _raise_open_files_limit()
    _configure_logging(config.log)
    url = StorageUrl.parse(config.storage.url or default_url())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        with Log.open(url) as log:
            if getattr(log.storage, "created", False):
                logging.getLogger(__name__).info("created a new database at %s", url.shown)
            # Armed at the stop and never disarmed: closing the log is bounded too.
            deadline = ExitDeadline(config.limits.stop_grace + EXIT_MARGIN)
            await run_broker(config, log, stop, beside=http_beside(config, log), deadline=deadline)

    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency except on Windows
        asyncio.run(main())
    else:
        uvloop.run(main())


def http_beside(config: BrokerConfig, log: Log) -> Callable[[Broker], HttpServer] | None:
    """The admin HTTP API to run beside the broker, if `[http] address` is set.
    The token file is read now: a bad one is refused before anything listens.
    Without it the HTTP API's modules (FastAPI, pydantic: a third of a broker's
    start) are never imported."""
    settings = config.http
    if settings.address is None:
        return None
    from riverbed.http.auth import TokenFile
    from riverbed.http.context import HttpContext, config_view
    from riverbed.http.server import HttpServer

    tokens = None if settings.token_file is None else TokenFile(settings.token_file)

    def beside(broker: Broker) -> HttpServer:
        context = HttpContext(
            log,
            broker.node,
            config_view(config),
            tokens=tokens,
            broker=broker,
            listening=broker.serving,
        )
        return HttpServer(settings, context)

    return beside


def _configure_logging(settings: LogConfig) -> None:
    """The broker's log on stderr: `[log] level` and `format` (text or JSON lines)."""
    handler = logging.StreamHandler()
    if settings.format == "json":
        handler.setFormatter(_JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    level = logging.getLevelName(settings.level.upper())
    # Debug is for Riverbed's own loggers; libraries' debug output says little to an operator.
    root.setLevel(max(level, logging.INFO))
    logging.getLogger("riverbed").setLevel(level)


class _JsonLines(logging.Formatter):
    """One JSON object per record, on one line: for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _raise_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one: every connection is a
    file descriptor, and the usual soft limit (1024) would refuse clients long
    before memory runs short (10,000 idle connections)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
