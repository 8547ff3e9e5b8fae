"""`riverbed subscription ...`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.table import Table

from riverbed.cli._app import (
    RESET_TARGET,
    START,
    cli,
    db_option,
    json_option,
    make_console,
    make_table,
    open_log,
    plural,
    print_json,
)
from riverbed.cli._metrics import METRICS_OPTION_HELP, metrics_address
from riverbed.cli._reuse import if_not_exists_option, reusing
from riverbed.errors import InvalidInput
from riverbed.log.jsonlines import format_time
from riverbed.model import StreamId
from riverbed.storage.base import StartKind
from riverbed.subscriptions.definition import (
    Definitions,
    delivery_definition,
    subscription_json,
)
from riverbed.subscriptions.named import Start, StreamLag, Subscriptions
from riverbed.subscriptions.provisioning import (
    create_subscription,
    delete_subscription,
    queue_topics,
)

# --------------------------------------------------------------------- subscriptions


@cli.group()
def subscription() -> None:
    """Create, inspect, rewind and delete named subscriptions."""


@subscription.command("create")
@click.argument("name")
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--filter", "topic_filter", metavar="FILTER", help="Only MQTT topics it matches.")
@click.option(
    "--start",
    type=START,
    default="earliest",
    show_default=True,
    help="Where to start: earliest, latest, or an ISO 8601 time (a time without zone is UTC).",
)
@click.option(
    "--endpoint",
    metavar="URL|MODULE:FUNCTION",
    help="Deliver every message to this HTTP(S) URL or Python callable: the"
    " subscription gets a retry and a dead-letter queue (NAME.rq, NAME.dlq).",
)
@click.option("--shards", type=int, help="Shards that deliver it (divides the topic's partitions).")
@click.option(
    "--grouped/--ungrouped",
    default=None,
    help="Keep order per group (key) through retries (default) or deliver in parallel.",
)
@click.option("--method", help="HTTP method: POST (default), PUT or PATCH.")
@click.option("--header", "headers", multiple=True, metavar="NAME:VALUE", help="HTTP header.")
@click.option("--connect-timeout", type=float, metavar="SECONDS")
@click.option("--request-timeout", type=float, metavar="SECONDS")
@click.option(
    "--retry-on",
    metavar="CODES/TYPES",
    help="Comma-separated HTTP status codes and exception type names that are retried"
    " (default 408,429,500,502,503,504,TimeoutError,ConnectionError).",
)
@click.option("--backoff", type=click.Choice(["linear", "exponential"]))
@click.option("--min-delay", type=float, metavar="SECONDS")
@click.option("--max-delay", type=float, metavar="SECONDS")
@click.option("--multiplier", type=float)
@click.option("--max-attempts", type=int, help="Attempts before a message is parked in the DLQ.")
@click.option(
    "--inline-retry",
    type=float,
    metavar="SECONDS",
    help="Retries due within this many seconds wait inside the batch instead of going"
    " through the retry queue (default 0.5; 0: always through the queue).",
)
@click.option(
    "--max-in-flight", type=int, help="Delivery attempts at once, per shard (default 100)."
)
@click.option(
    "--max-parallel-groups", type=int, help="Groups delivering at once, per shard (default 100)."
)
@click.option("--error-rate", type=float, help="Failure share above which delivery slows down.")
@click.option("--rq-partitions", type=int)
@click.option("--dlq-partitions", type=int)
@if_not_exists_option
@db_option
def subscription_create(
    name: str,
    topic: str,
    topic_filter: str | None,
    start: Start,
    endpoint: str | None,
    if_not_exists: bool,
    **delivery: Any,
) -> None:
    """Create subscription NAME on --topic (with --endpoint: one that delivers)."""
    given = sorted(k for k, v in delivery.items() if v not in (None, ()))
    if endpoint is None and given:
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        raise InvalidInput(f"{names} only apply with --endpoint (a subscription that delivers)")
    definition = None
    if endpoint is not None:
        delivery["headers"] = _headers(delivery["headers"])
        delivery["retry_on"] = _retry_on(delivery["retry_on"])
        definition = delivery_definition(name, topic, endpoint, **delivery)
    with open_log() as log:
        created = create_subscription(
            log.storage,
            name,
            topic,
            topic_filter=topic_filter,
            start=start,
            delivery=definition,
            exist_ok=if_not_exists,
        )
    if created.existed:
        reusing(f"subscription {name!r}")
        return
    where = start.value if isinstance(start, StartKind) else format_time(start)
    click.echo(f"created subscription {name!r} on topic {topic!r} starting at {where}")
    stored = created.delivery
    if stored is not None:
        rq, dlq = queue_topics(name)
        click.echo(
            f"delivering to {endpoint} with {plural(stored.shard_count, 'shard')},"
            f" {'grouped' if stored.grouped else 'ungrouped'};"
            f" retry queue {rq!r} ({stored.rq_partitions} partitions),"
            f" dead-letter queue {dlq!r} ({stored.dlq_partitions} partitions)"
        )


def _headers(items: tuple[str, ...]) -> dict[str, str] | None:
    """`--header NAME:VALUE`s as a mapping (None: none given)."""
    if not items:
        return None
    headers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep:
            raise InvalidInput(f"--header {item!r} is not NAME:VALUE")
        headers[key.strip()] = value.strip()
    return headers


def _retry_on(text: str | None) -> list[str] | None:
    """`--retry-on 503,TimeoutError` as its items (None: not given)."""
    return None if text is None else [i.strip() for i in text.split(",") if i.strip()]


@subscription.command("list")
@click.option("--topic", help="Only subscriptions of this topic.")
@json_option
@db_option
def subscription_list(topic: str | None, as_json: bool) -> None:
    """List subscriptions."""
    with open_log() as log:
        if topic is not None:
            log.topics.get(topic)  # TopicNotFound rather than an empty list
        deliveries = {d.name: d for d in Definitions(log.storage).list()}
        rows = [
            subscription_json(r, deliveries.get(r.name))
            for r in Subscriptions(log.storage).list(topic)
        ]
    if as_json:
        print_json(rows)
        return
    columns = ["name", "topic", "filter", "start", "start_time", "created", "endpoint", "shards"]
    make_console().print(
        make_table(
            "Subscriptions",
            [
                "subscription",
                "topic",
                "filter",
                "start",
                "start time",
                "created",
                "delivers to",
                "shards",
            ],
            [[row[c] for c in columns] for row in rows],
        )
    )


def _lag_json(name: str, lags: Sequence[StreamLag]) -> dict[str, object]:
    return {
        "subscription": name,
        "streams": [s.as_json() for s in lags],
        "total": sum(s.lag for s in lags),
    }


def lag_table(name: str, lags: Sequence[StreamLag]) -> Table:
    return make_table(
        f"Lag of {name}",
        ["stream", "committed", "head", "lag", "readable"],
        [
            [s.stream, s.committed, s.head, s.lag, "yes" if s.readable else "after earlier gen."]
            for s in lags
        ],
        footer=["total", "", "", sum(s.lag for s in lags), ""],
    )


@subscription.command("lag")
@click.argument("name")
@json_option
@db_option
def subscription_lag(name: str, as_json: bool) -> None:
    """Show per stream how far NAME is behind the head."""
    from riverbed.subscriptions.pipeline import queue_depths

    with open_log() as log:
        lags = Subscriptions(log.storage).lag(name)
        delivering = Definitions(log.storage).get(name) is not None
        depths = queue_depths(log.storage, name) if delivering else None
    if as_json:
        out = _lag_json(name, lags)
        if depths is not None:
            out["retry_queue"], out["dead_letter_queue"] = depths
        print_json(out)
    else:
        make_console().print(lag_table(name, lags))
        if depths is not None:
            click.echo(f"retry queue: {depths[0]} waiting; dead-letter queue: {depths[1]} parked")


@subscription.command("reset")
@click.argument("name")
@click.option(
    "--to",
    "target",
    type=RESET_TARGET,
    required=True,
    help="earliest, latest, an ISO 8601 time (a time without zone is UTC), or offsets"
    " STREAM=OFFSET,... such as orders/0/1=42,orders/0/2=7 (other streams keep theirs).",
)
@click.option(
    "--queue",
    type=click.Choice(["main", "rq", "dlq"]),
    default="main",
    show_default=True,
    help="For a subscription that delivers: which to move. The retry (rq) and"
    " dead-letter (dlq) queues only move forward (--to latest or a time); what they"
    " pass over is dropped.",
)
@click.option(
    "--shards",
    type=int,
    help="For a subscription that delivers, a rewind into generations its shard count"
    " cannot split: change to this shard count as well.",
)
@json_option
@db_option
def subscription_reset(
    name: str,
    target: Start | dict[StreamId, int],
    queue: str,
    shards: int | None,
    as_json: bool,
) -> None:
    """Move NAME's committed offsets (or its retry or dead-letter queue's)."""
    from riverbed.subscriptions.groups import Queue
    from riverbed.subscriptions.reset import reset_subscription

    moved = None if queue == "main" else Queue(queue)
    with open_log() as log:
        before = {}
        if moved is None:  # SubscriptionNotFound here, as the reset would say
            before = {s.stream: s.committed for s in Subscriptions(log.storage).lag(name)}
        done = reset_subscription(log.storage, name, target, moved, shards)
    if as_json:
        print_json(done.as_json())
        return
    if moved is not None:
        click.echo(f"{name}: {queue} moved forward past {plural(done.passed_over, 'message')}")
        return
    make_console().print(
        make_table(
            f"Offsets of {name}",
            ["stream", "before", "after"],
            [[stream, before.get(stream), offset] for stream, offset in done.offsets.items()],
        )
    )


@subscription.command("delete")
@click.argument("name")
@db_option
def subscription_delete(name: str) -> None:
    """Delete subscription NAME and its offsets (and, for one that delivers, its
    retry and dead-letter queues with their messages)."""
    with open_log() as log:
        delete_subscription(log.storage, name)
    click.echo(f"deleted subscription {name!r}")


@subscription.command("run")
@click.argument("name")
@click.option(
    "--master",
    metavar="URL",
    help="Spark master (spark://HOST:7077, local[N]). Default: Spark in this process, every"
    " core. A master other than local[N] needs a PostgreSQL --db.",
)
@click.option(
    "--remote",
    metavar="URL",
    help="A Spark Connect server (sc://HOST:15002) to run the job on, instead of a master.",
)
@click.option(
    "--conf",
    "spark_conf",
    multiple=True,
    metavar="NAME=VALUE",
    help="A Spark setting (spark.executor.memory=512m, spark.driver.host=HOST); repeatable.",
)
@click.option(
    "--trigger-interval",
    type=click.FloatRange(min=0.01),
    default=0.5,
    show_default=True,
    help="Seconds between micro-batches.",
)
@click.option(
    "--max-per-trigger",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="At most this many main-topic messages per micro-batch.",
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Exit once the main topic has no lag and the retry queue is empty.",
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1),
    default=10.0,
    show_default=True,
    help="The job's lease on NAME: a second job waits as a standby until the first"
    " stops, or for this long after it died.",
)
@click.option(
    "--stop-grace",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="On SIGINT/SIGTERM, wait this long for the batch in hand to finish and commit;"
    " one cut short commits nothing and is delivered again by the next job.",
)
@click.option("--verbose", is_flag=True, help="Show Spark's own logging (warnings and up).")
@click.option("--metrics", "metrics", metavar="[HOST:]PORT", help=METRICS_OPTION_HELP)
@db_option
def subscription_run(
    name: str,
    master: str | None,
    remote: str | None,
    spark_conf: tuple[str, ...],
    trigger_interval: float,
    max_per_trigger: int,
    until_idle: bool,
    lease_seconds: float,
    stop_grace: float,
    verbose: bool,
    metrics: str | None,
) -> None:
    """Deliver NAME to its endpoint: a Spark Structured Streaming job, one task
    per shard, until SIGINT/SIGTERM (or --until-idle). One job at a time: a
    second one waits and takes over. With --metrics,
    riverbed_delivery_messages_total{subscription,outcome} counts what it
    delivered, retried and parked."""
    from riverbed.cli.subscription_run import run_delivery

    address = None if metrics is None else metrics_address(metrics)
    run_delivery(
        name,
        master,
        trigger_interval,
        max_per_trigger,
        until_idle,
        lease_seconds,
        stop_grace,
        verbose,
        address,
        remote=remote,
        spark_conf=spark_conf,
    )


@subscription.command("reshard")
@click.argument("name")
@click.option(
    "--shards",
    "shard_count",
    type=int,
    required=True,
    help="The new shard count: it must divide the partition count of every generation"
    " of the topic NAME still reads.",
)
@json_option
@db_option
def subscription_reshard(name: str, shard_count: int, as_json: bool) -> None:
    """Change how many shards deliver NAME (seed 003 ChangeShardCount): what the
    old shards hold in their retry and dead-letter queues is fed to the new ones."""
    from rich.progress import Progress

    from riverbed.subscriptions.reshard import change_shard_count, check_shard_change

    with open_log() as log:
        check_shard_change(log.storage, name, shard_count)  # refused before the bar shows
        with Progress(transient=True, disable=as_json) as bar:
            task = bar.add_task("re-sharding", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = change_shard_count(log.storage, name, shard_count, progress)
    if as_json:
        print_json(result.as_json(name))
        return
    grew = (
        f"; new storage topics for {', '.join(result.new_storage_topics)}"
        if result.new_storage_topics
        else ""
    )
    click.echo(
        f"{name}: {result.old_count} -> {plural(result.new_count, 'shard')}; fed"
        f" {result.fed_rq} retry and {result.fed_dlq} parked"
        f" {'message' if result.fed_rq + result.fed_dlq == 1 else 'messages'} to the new"
        f" shards{grew}"
    )
