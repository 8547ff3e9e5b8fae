"""`riverbed produce` and `riverbed consume`: JSON lines in and out."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import BinaryIO

import click

from riverbed.cli._app import (
    FOLLOW_WAIT,
    PRODUCE_BATCH,
    PRODUCE_IN_FLIGHT,
    cli,
    db_option,
    open_log,
    plural,
)
from riverbed.errors import InvalidInput, RiverbedError
from riverbed.log.appender import Position, Positions
from riverbed.log.jsonlines import message_from_json, message_to_json
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.signals import stop_on_signals
from riverbed.subscriptions.named import Subscriptions

# --------------------------------------------------------------------- produce


def _read_messages(log: Log, topic: str, stdin: BinaryIO) -> list[Message]:
    """Parse and check every line before anything is written."""
    messages: list[Message] = []
    for number, raw in enumerate(stdin, start=1):
        try:
            # Without its line ending: an error at the end of the line is then at
            # its column on this line, not at column 1 of the next.
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.strip():
                continue
            message = message_from_json(line)
            log.check(topic, message)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"line {number}: not valid UTF-8 at byte {exc.start}") from None
        except InvalidInput as exc:
            raise InvalidInput(f"line {number}: {exc}") from None
        messages.append(message)
    return messages


@cli.command(short_help="Produce JSON lines from stdin to a topic.")
@click.argument("topic")
@click.option(
    "--print-positions", is_flag=True, help='Print {"stream", "offset"} per message on stdout.'
)
@db_option
def produce(topic: str, print_positions: bool) -> None:
    """Produce JSON lines from stdin to TOPIC, one message per line.

    \b
    {"key": "k1", "payload": "text", "mqtt_topic": "orders/eu"}
    {"payload_b64": "AAEC", "properties": [["content-type", "x"]], "qos": 1, "retain": false}

    payload is UTF-8 text, payload_b64 is base64 bytes: exactly one of them.
    key (null: spread over partitions), mqtt_topic (must match the topic's
    binding), properties ([[name, value], ...] or {name: value}; a value is a
    string, an integer or {"b64": ...}), qos and retain are optional. Blank
    lines are skipped. Every line is checked before any is written: one bad line
    writes nothing (exit 2).
    """
    stdout = sys.stdout.buffer
    with open_log() as log:
        log.topics.get(topic)  # an unknown topic fails before reading stdin
        messages = _read_messages(log, topic, sys.stdin.buffer)
        per_stream: Counter[StreamId] = Counter()

        def done(positions: Sequence[Position]) -> None:
            per_stream.update(stream for stream, _ in positions)
            if print_positions:
                stdout.write(
                    "".join(
                        json.dumps({"stream": str(stream), "offset": offset}) + "\n"
                        for stream, offset in positions
                    ).encode()
                )

        pending: deque[Future[Positions]] = deque()
        try:
            for start in range(0, len(messages), PRODUCE_BATCH):
                pending.append(log.produce_async(topic, messages[start : start + PRODUCE_BATCH]))
                if len(pending) >= PRODUCE_IN_FLIGHT:
                    done(pending.popleft().result())
            while pending:
                done(pending.popleft().result())
        except RiverbedError:
            committed = per_stream.total() + sum(
                len(f.result()) for f in pending if f.exception() is None
            )
            verb = "was" if len(messages) == 1 else "were"
            click.echo(
                f"{committed} of {plural(len(messages), 'message')} {verb} committed", err=True
            )
            raise
        stdout.flush()
    click.echo(f"produced {plural(len(messages), 'message')} to topic {topic!r}", err=True)
    for stream, count in sorted(per_stream.items(), key=lambda item: str(item[0])):
        click.echo(f"  {stream}  {count}", err=True)


# --------------------------------------------------------------------- consume


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs."""
    stop = threading.Event()
    with stop_on_signals(stop.set):
        yield stop


@cli.command(short_help="Print a subscription's messages as JSON lines.")
@click.argument("name")
@click.option("--max", "limit", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--follow", "-f", is_flag=True, help="Wait for new messages until --max or Ctrl-C.")
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Messages per read and commit.",
)
@db_option
def consume(name: str, limit: int | None, follow: bool, batch: int) -> None:
    """Print subscription NAME's messages as JSON lines and commit them.

    Each line has stream, offset, id, timestamp (UTC), mqtt_topic, key, payload
    (text; null with payload_b64 when the bytes are not UTF-8), properties, qos
    and retain. Each batch is committed once it is written out: a message is
    committed only after it was printed. Stops when caught up, unless --follow.
    """
    stdout = sys.stdout.buffer
    printed = 0
    with open_log() as log, _stop_on_signals() as stop:
        consumer = Subscriptions(log.storage).consumer(name)
        while not stop.is_set() and (limit is None or printed < limit):
            room = batch if limit is None else min(batch, limit - printed)
            deliveries = consumer.poll(room, timeout=FOLLOW_WAIT if follow else 0.0)
            if deliveries:
                lines = "".join(
                    json.dumps(message_to_json(d.stream, d.message), ensure_ascii=False) + "\n"
                    for d in deliveries
                )
                try:
                    stdout.write(lines.encode())
                    stdout.flush()
                except BrokenPipeError:
                    _detach_stdout()
                    break  # the reader is gone: this batch was not printed, not committed
                printed += len(deliveries)
            # Commits what was printed, and moves past what the filter skipped.
            consumer.commit()
            if not deliveries and not follow:
                break
    click.echo(f"consumed {plural(printed, 'message')} from subscription {name!r}", err=True)


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that exiting does not fail flushing a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
