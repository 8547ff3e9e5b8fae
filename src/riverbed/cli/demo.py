"""`riverbed demo`: the log shown without the broker."""

from __future__ import annotations

import json
import shlex
from contextlib import suppress

import click

from riverbed.cli._app import DB_KEY, cli, db_option, make_console, open_log, plural
from riverbed.cli.subscriptions import lag_table
from riverbed.cli.topics import streams_table, topic_rows, topics_table
from riverbed.errors import AlreadyExists
from riverbed.model import Message
from riverbed.storage import redact_url
from riverbed.subscriptions.named import Subscriptions

# --------------------------------------------------------------------- demo

DEMO_TOPIC = "demo"
DEMO_SUBSCRIPTION = "demo-reader"
DEMO_MESSAGES = 1000
DEMO_KEYS = 8


@cli.command(short_help="Try the log out on topic `demo`, without the broker.")
@db_option
def demo() -> None:
    """Create topic `demo`, produce to it, consume it, and show what happened.

    Safe to run again: the topic and subscription are reused.
    """
    db = click.get_current_context().meta.get(DB_KEY)  # shown in the hints only if given
    with open_log(create=True) as log:
        with suppress(AlreadyExists):
            log.topics.create(DEMO_TOPIC, 4, binding="demo/#")
        positions = log.produce(
            DEMO_TOPIC,
            [
                Message(
                    json.dumps({"seq": i, "celsius": 18 + (i * 7) % 10}).encode(),
                    key=f"sensor-{i % DEMO_KEYS}",
                    mqtt_topic=f"demo/sensor-{i % DEMO_KEYS}/temperature",
                )
                for i in range(DEMO_MESSAGES)
            ],
        )
        subscriptions = Subscriptions(log.storage)
        with suppress(AlreadyExists):
            subscriptions.create(DEMO_SUBSCRIPTION, DEMO_TOPIC)
        consumer = subscriptions.consumer(DEMO_SUBSCRIPTION)
        consumed = 0
        while deliveries := consumer.poll(1000):
            consumed += len(deliveries)
            consumer.commit()
        topics = topic_rows(log)
        streams = log.storage.list_streams(DEMO_TOPIC)
        lags = subscriptions.lag(DEMO_SUBSCRIPTION)
    console = make_console()
    console.print(f"database: {redact_url(log.storage.url)}", markup=False)
    console.print(
        f"produced {plural(len(positions), 'message')} over {plural(DEMO_KEYS, 'key')} to topic"
        f" '{DEMO_TOPIC}' ({plural(len({s for s, _ in positions}), 'stream')}); subscription"
        f" '{DEMO_SUBSCRIPTION}'"
        f" consumed {consumed} and committed them\n",
        markup=False,
    )
    console.print(topics_table(topics))
    console.print(streams_table(streams))
    console.print(lag_table(DEMO_SUBSCRIPTION, lags))
    prefix = "riverbed" + (f" --db {shlex.quote(redact_url(db))}" if db else "")
    tries = [
        f"{prefix} topic describe {DEMO_TOPIC}",
        f'echo \'{{"key": "k", "payload": "hello", "mqtt_topic": "demo/x"}}\''
        f" | {prefix} produce {DEMO_TOPIC}",
        f"{prefix} consume {DEMO_SUBSCRIPTION} --max 5",
        f"{prefix} subscription reset {DEMO_SUBSCRIPTION} --to earliest",
        f"{prefix} subscription lag {DEMO_SUBSCRIPTION}",
        f"{prefix} topic add-storage-topic {DEMO_TOPIC} --partitions 8",
        f"{prefix} --help",
    ]
    console.print("\ntry next:")
    for line in tries:
        console.print(f"  {line}", markup=False)
