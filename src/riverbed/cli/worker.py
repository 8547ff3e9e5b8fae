"""`riverbed worker`: competing consumers of a named subscription (seed 004)."""

from __future__ import annotations

import logging
import os
import sys

import click

from riverbed.cli._app import cli, command_url, db_option, open_storage_of_command, plural
from riverbed.cli._metrics import METRICS_OPTION_HELP, metrics_address, serve_metrics
from riverbed.errors import InvalidInput, SubscriptionNotFound
from riverbed.metrics import outcomes_family
from riverbed.subscriptions.handling import Guarantee, OnError, load_handler
from riverbed.subscriptions.running import WorkerOptions, run_processes, tallies


@cli.command(short_help="Consume a subscription with a handler, in competing workers.")
@click.argument("subscription")
@click.option(
    "--handler",
    "handler_spec",
    required=True,
    metavar="MODULE:FUNCTION",
    help="The function to call with each batch, e.g. myapp.handlers:on_order"
    " (the current directory is importable).",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes; they share the streams by locking them.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Most messages per handler call (all of one stream).",
)
@click.option(
    "--exactly-once",
    is_flag=True,
    help="Run the handler inside the transaction that records the position (batch.tx).",
)
@click.option(
    "--on-error",
    type=click.Choice([a.value for a in OnError]),
    default=OnError.STOP.value,
    show_default=True,
    help="When the handler raises: stop the worker, retry with backoff, or skip the batch.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="With --on-error retry: attempts in all before stopping (default: no limit).",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Seconds between looks when no wake-up arrives.",
)
@click.option("--metrics", "metrics", metavar="[HOST:]PORT", help=METRICS_OPTION_HELP)
@db_option
def worker(
    subscription: str,
    handler_spec: str,
    processes: int,
    batch_size: int,
    exactly_once: bool,
    on_error: str,
    max_attempts: int | None,
    poll_interval: float,
    metrics: str | None,
) -> None:
    """Consume SUBSCRIPTION: call --handler with batches of messages until
    SIGTERM or SIGINT, which let each batch in hand finish first.

    At least once by default: a batch is handled, then its position recorded.
    With --exactly-once the handler writes through `batch.tx`, which commits with
    the position. Exit code 0 after a signal, 1 if the handler failed and
    --on-error said stop, 2 for a bad option, handler or subscription.

    With --metrics, riverbed_worker_messages_total{subscription,outcome} counts
    the messages of all its processes: delivered (the handler returned),
    retried, parked (given up on and skipped).
    """
    ctx = click.get_current_context()
    address = None if metrics is None else metrics_address(metrics)
    if max_attempts is not None and on_error != OnError.RETRY.value:
        raise click.BadParameter(
            f"{max_attempts} applies to --on-error retry only, not {on_error}",
            param_hint="'--max-attempts'",
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--handler myapp:fn` from the project directory
    try:
        load_handler(handler_spec)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="'--handler'") from None
    url = command_url()
    storage = open_storage_of_command()
    try:
        storage.get_subscription(subscription)
    except SubscriptionNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="'SUBSCRIPTION'") from None
    finally:
        storage.close()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(message)s")
    options = WorkerOptions(
        batch_size=batch_size,
        guarantee=Guarantee.EXACTLY_ONCE if exactly_once else Guarantee.AT_LEAST_ONCE,
        on_error=OnError(on_error),
        max_attempts=max_attempts,
        poll_interval=poll_interval,
    )
    click.echo(
        f"worker: consuming {subscription!r} with {handler_spec} in"
        f" {plural(processes, 'process', 'processes')};"
        " SIGTERM or Ctrl-C stops",
        err=True,
    )
    counted = tallies(processes)
    exposition = None
    if address is not None:
        exposition = serve_metrics(
            address,
            lambda: [
                outcomes_family(
                    "riverbed_worker_messages",
                    "Messages of a named subscription this worker's processes handled, by outcome.",
                    {subscription: [sum(t[i] for t in counted) for i in range(3)]},
                )
            ],
        )
    try:
        code = run_processes(url.text, subscription, handler_spec, processes, options, counted)
    finally:
        if exposition is not None:
            exposition.close()
    ctx.exit(code)
