"""`riverbed subscription run NAME`: the delivery pipeline on Spark.

Checks the subscription before Spark starts (a name that does not deliver to
an endpoint fails at once), prints one line per micro-batch that did
something and the totals at the end. SIGINT or SIGTERM stops the query after
the batch in hand (waiting at most `--stop-grace` seconds: a batch cut short
commits nothing and runs again next time; delivery is at least once).

With `--metrics [HOST:]PORT` the driver serves
`riverbed_delivery_messages_total{subscription,outcome}` (delivered, retried,
parked: the run's totals, added up from each batch's result as it ends; the
Spark executors are other processes and count nothing themselves).
"""

from __future__ import annotations

import threading
import time

import click

from riverbed.cli._app import command_url, open_storage_of_command, plural
from riverbed.cli._metrics import serve_metrics
from riverbed.errors import InvalidInput
from riverbed.metrics import Exposition, outcomes_family
from riverbed.mqtt.config import Address
from riverbed.signals import stop_on_signals
from riverbed.spark.delivery_job import Totals
from riverbed.spark.options import check_shared_storage
from riverbed.subscriptions.pipeline import definition_of


def run_delivery(
    name: str,
    master: str | None,
    trigger_interval: float,
    max_per_trigger: int,
    until_idle: bool,
    lease_seconds: float = 10.0,
    stop_grace: float = 60.0,
    verbose: bool = False,
    metrics: Address | None = None,
    *,
    remote: str | None = None,
    spark_conf: tuple[str, ...] = (),
) -> None:
    url = command_url()
    settings = spark_settings(spark_conf)
    if master is not None and remote is not None:
        raise InvalidInput(
            f"--master {master} and --remote {remote}: give one (a Spark master or a Spark"
            " Connect server)"
        )
    if remote is not None and not remote.startswith("sc://"):
        raise InvalidInput(f"--remote {remote!r} must be a Spark Connect URL, sc://HOST:PORT")
    check_shared_storage(url, master)  # before Spark starts; a Connect server is asked later
    storage = open_storage_of_command()
    try:
        definition = definition_of(storage, name)  # NotFound: exit 1 before Spark starts
    finally:
        storage.close()
    counted = [0, 0, 0]
    """Delivered, retried, parked: the totals of the batches so far."""
    exposition: Exposition | None = None
    if metrics is not None:
        exposition = serve_metrics(
            metrics,
            lambda: [
                outcomes_family(
                    "riverbed_delivery_messages",
                    "Messages of a delivering subscription this job handled, by outcome.",
                    {name: list(counted)},
                )
            ],
        )
    from riverbed.spark import session
    from riverbed.spark.delivery_job import DeliveryJob

    started = time.monotonic()
    click.echo(
        f"subscription {name}: {plural(definition.shard_count, 'shard')}, delivering to"
        f" {definition.target}; starting Spark",
        err=True,
    )
    spark = session(
        master,
        app_name=f"riverbed-delivery-{name}",
        remote=remote,
        quiet=not verbose,
        config=settings,
    )
    stop = threading.Event()
    seen = Totals()

    def on_batch(batch_id: int, totals: Totals) -> None:
        counted[:] = [totals.delivered, totals.retried, totals.parked]
        moved = (
            totals.delivered - seen.delivered,
            totals.retried - seen.retried,
            totals.parked - seen.parked,
        )
        if any(moved):
            click.echo(
                f"batch {batch_id}: delivered {moved[0]}, to retry {moved[1]}, parked {moved[2]}",
                err=True,
            )
        seen.delivered, seen.retried, seen.parked = (
            totals.delivered,
            totals.retried,
            totals.parked,
        )

    try:
        with stop_on_signals(stop.set):
            job = DeliveryJob(
                spark,
                url.text,
                name,
                trigger_seconds=trigger_interval,
                max_per_trigger=max_per_trigger,
                on_batch=on_batch,
                lease_seconds=lease_seconds,
                stop_grace_seconds=stop_grace,
                stop=stop,
                on_wait=lambda held: click.echo(
                    f"waiting: another job delivers {name!r} ({held}); taking over when it stops",
                    err=True,
                ),
            )
            totals = job.run(until_idle=until_idle, stop=stop)
    finally:
        if exposition is not None:
            exposition.close()
    click.echo(
        f"subscription {name}: {plural(totals.batches, 'batch', 'batches')}, delivered"
        f" {totals.delivered},"
        f" retried {totals.retried}, parked {totals.parked}"
        f" in {time.monotonic() - started:.1f} s"
    )


def spark_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--conf NAME=VALUE` options as Spark settings."""
    out = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip().startswith("spark."):
            raise InvalidInput(
                f"--conf {pair!r} must be NAME=VALUE with a Spark setting's name (spark.*)"
            )
        out[name.strip()] = value
    return out
