"""One rule for the shard count of a subscription that delivers, whichever
command changes shards or generations: it divides every generation the
subscription still reads, the one producers write to, and any added after
that one. `subscription create`, `reshard`, `reset --shards` and
`topic switch-produce` agree; what breaks the rule is refused naming the
generation, its partitions and the shard count, and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import rb
from riverbed.log.log import Log
from riverbed.model import Message


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/x.db"
    assert rb(url, "topic", "create", "orders", "--partitions", "4").exit_code == 0
    return url


def ok(db: str, *args: str) -> str:
    result = rb(db, *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def refused(db: str, *args: str) -> str:
    before = _state(db)
    result = rb(db, *args)
    assert result.exit_code == 2, result.output
    assert _state(db) == before
    return result.stderr


def _state(db: str) -> list[object]:
    return [
        json.loads(rb(db, *args, "--json").stdout)
        for args in (["topic", "list"], ["subscription", "list"], ["topic", "describe", "orders"])
    ]


def shards(db: str, name: str) -> int:
    (row,) = [s for s in json.loads(ok(db, "subscription", "list", "--json")) if s["name"] == name]
    count: int = row["shards"]
    return count


def produce(db: str, count: int) -> None:
    with Log.open(db) as log:
        log.produce("orders", [Message(b"x", key=f"k{i}") for i in range(count)])


PENDING = "generation 1, which producers will write to after `riverbed topic switch-produce`"


def test_a_pending_generation_counts_for_reshard_and_create(db: str) -> None:
    ok(db, "subscription", "create", "h", "--topic", "orders", "--endpoint", "m:f", "--shards", "2")
    ok(db, "topic", "add-storage-topic", "orders", "--partitions", "6")

    message = refused(db, "subscription", "reshard", "h", "--shards", "4")
    assert f"shard count 4 does not divide the 6 partitions of topic 'orders' {PENDING}" in message
    assert "choose one of [1, 2]" in message
    assert shards(db, "h") == 2

    message = refused(
        db,
        "subscription",
        "create",
        "h4",
        "--topic",
        "orders",
        "--endpoint",
        "m:f",
        "--shards",
        "4",
    )
    assert f"shard count 4 does not divide the 6 partitions of topic 'orders' {PENDING}" in message

    # What the rule allows works.
    ok(
        db,
        "subscription",
        "create",
        "h1",
        "--topic",
        "orders",
        "--endpoint",
        "m:f",
        "--shards",
        "1",
    )
    ok(db, "subscription", "reshard", "h", "--shards", "1")
    ok(db, "subscription", "reshard", "h", "--shards", "2")
    assert shards(db, "h") == 2


def test_switch_produce_is_refused_until_every_subscription_can_split_it(db: str) -> None:
    ok(db, "subscription", "create", "h", "--topic", "orders", "--endpoint", "m:f", "--shards", "4")
    ok(
        db, "topic", "add-storage-topic", "orders", "--partitions", "6"
    )  # allowed: nothing there yet

    message = refused(db, "topic", "switch-produce", "orders")
    assert message == (
        "error: not switching topic 'orders' to generation 1: subscription 'h' delivers with"
        " 4 shards, which do not divide its 6 partitions (every shard must own the same number"
        " of partitions of every generation it reads); first run `riverbed subscription"
        " reshard h --shards N` with N one of [1, 2]\n"
    )

    ok(db, "subscription", "reshard", "h", "--shards", "2")
    assert "now produces to generation 1" in ok(db, "topic", "switch-produce", "orders")


def test_a_generation_read_to_the_end_no_longer_counts(db: str) -> None:
    """seed 003's second case, for create as for reshard: a subscription that
    starts after generation 0 (4 partitions) need not split it."""
    produce(db, 8)
    ok(db, "topic", "add-storage-topic", "orders", "--partitions", "6")
    ok(db, "topic", "switch-produce", "orders")

    message = refused(
        db, "subscription", "create", "h", "--topic", "orders", "--endpoint", "m:f", "--shards", "3"
    )
    assert (
        "shard count 3 does not divide the 4 partitions of topic 'orders' generation 0,"
        " which subscription 'h' still reads" in message
    )
    assert "choose one of [1, 2]" in message
    latest = ["--start", "latest", "--endpoint", "m:f", "--shards", "3"]
    ok(db, "subscription", "create", "h", "--topic", "orders", *latest)
    assert shards(db, "h") == 3

    # Rewinding into generation 0 is the same rule again.
    message = refused(db, "subscription", "reset", "h", "--to", "earliest")
    assert "generation 0, which subscription 'h' still reads" in message
    ok(db, "subscription", "reset", "h", "--to", "earliest", "--shards", "2")
    assert shards(db, "h") == 2
