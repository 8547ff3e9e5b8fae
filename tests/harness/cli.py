"""The command line in-process, against one database, and the small readings
the CLI's tests make of what it printed and stored."""

from __future__ import annotations

import json
from typing import Any

import click
from click.testing import CliRunner, Result

from riverbed.cli import cli
from riverbed.storage import open_storage


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """A group's commands by name, each looked up as a command line does (the
    root group imports a command's module when it is asked for)."""
    ctx = click.Context(group)
    found = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def rb(url: str, *args: str, input: str | bytes | None = None) -> Result:
    """`riverbed ARGS --db URL`; exceptions other than exits propagate."""
    return CliRunner().invoke(cli, [*args, "--db", url], input=input, catch_exceptions=False)


def ok(url: str, *args: str, input: str | bytes | None = None) -> Result:
    """`rb`, which must exit 0."""
    result = rb(url, *args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def jsonl(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def lines(*messages: dict[str, Any]) -> str:
    """JSON lines, as `riverbed produce` reads them."""
    return "".join(json.dumps(m) + "\n" for m in messages)


def heads(url: str, topic: str) -> dict[str, tuple[int, int]]:
    """stream -> (start offset, next offset)."""
    storage = open_storage(url)
    try:
        return {str(h.stream): (h.start_offset, h.next_offset) for h in storage.list_streams(topic)}
    finally:
        storage.close()


def total(url: str, topic: str) -> int:
    """Messages stored in `topic` (all streams)."""
    return sum(end - start for start, end in heads(url, topic).values())


def committed(url: str, name: str) -> dict[str, int]:
    """stream -> committed offset of subscription `name`."""
    return {
        s["stream"]: s["committed"]
        for s in as_json(ok(url, "subscription", "lag", name, "--json"))["streams"]
    }


def make_topic(url: str, name: str = "orders", partitions: str = "4", *extra: str) -> None:
    ok(url, "topic", "create", name, "--partitions", partitions, "--binding", f"{name}/#", *extra)


def produce_n(url: str, n: int, topic: str = "orders", keys: int = 5) -> None:
    """n messages over `keys` keys (0: no key, spread over the partitions)."""
    messages = [
        {"key": f"k{i % keys}" if keys else None, "payload": f"m{i}", "mqtt_topic": f"{topic}/x"}
        for i in range(n)
    ]
    ok(url, "produce", topic, input=lines(*messages))
