"""`--if-not-exists` on the create commands and `exist_ok=True` in the library:
running a setup twice reuses what it made (exit 0); something of the same
name with other settings is an error naming them (exit 1) and is left as it
was."""

from __future__ import annotations

import json

import pytest

from harness.cli import rb
from riverbed.errors import AlreadyExists
from riverbed.log.log import Log
from riverbed.storage.base import RetentionPolicy
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition, parse_endpoint
from riverbed.subscriptions.named import Subscriptions
from riverbed.subscriptions.provisioning import create_delivering


def _state(db: str) -> list[object]:
    out: list[object] = [
        json.loads(rb(db, *args, "--json").stdout)
        for args in (["topic", "list"], ["subscription", "list"], ["group", "list"])
    ]
    with Log.open(db) as log:
        out.append(Definitions(log.storage).list())
    return out


TOPIC = ["topic", "create", "orders", "--partitions", "4", "--binding", "orders/#"]
PLAIN = ["subscription", "create", "s", "--topic", "orders", "--filter", "orders/eu/#"]
DELIVERING = [
    "subscription",
    "create",
    "h",
    "--topic",
    "orders",
    "--endpoint",
    "m:f",
    "--shards",
    "2",
]
GROUP = ["group", "create", "g", "orders/#", "--start", "earliest"]


@pytest.mark.parametrize(
    ("create", "what"),
    [
        (TOPIC, "topic 'orders'"),
        (PLAIN, "subscription 's'"),
        (DELIVERING, "subscription 'h'"),
        (GROUP, "shared subscription group $share/g/orders/#"),
    ],
    ids=["topic", "subscription", "delivering", "group"],
)
def test_creating_again_reuses_it(db: str, create: list[str], what: str) -> None:
    assert rb(db, *TOPIC, "--if-not-exists").exit_code == 0
    first = rb(db, *create, "--if-not-exists")
    assert first.exit_code == 0, first.output
    before = _state(db)
    again = rb(db, *create, "--if-not-exists")
    assert again.exit_code == 0, again.output
    assert again.stdout == f"{what} exists already with these settings, reusing it\n"
    assert _state(db) == before
    without = rb(db, *create)
    assert without.exit_code == 1 and "exists already" in without.stderr
    assert _state(db) == before


@pytest.mark.parametrize(
    ("create", "words"),
    [
        (
            ["topic", "create", "orders", "--partitions", "8", "--retention-policy", "expired"],
            [
                "topic 'orders' exists already with other settings",
                "partitions 4 (asked 8)",
                "binding 'orders/#' (asked None)",
                "retention policy consumed-and-expired (asked expired)",
            ],
        ),
        (
            ["subscription", "create", "s", "--topic", "orders", "--start", "latest"],
            [
                "subscription 's' exists already with other settings",
                "filter 'orders/eu/#' (asked None)",
                "start 'earliest' (asked 'latest')",
            ],
        ),
        (
            [*PLAIN[:2], "h", *PLAIN[3:]],
            ["subscription 'h' exists already and delivers to an endpoint"],
        ),
        (
            [*DELIVERING[:2], "s", *DELIVERING[3:]],
            ["subscription 's' exists already and does not deliver to an endpoint"],
        ),
        (
            [*DELIVERING[:-1], "4", "--max-attempts", "3"],
            ["shard_count 2 (asked 4)", "retry.max_attempts 5 (asked 3)"],
        ),
        (
            ["group", "create", "g", "orders/#", "--start", "2024-05-01T00:00:00Z"],
            ["group $share/g/orders/# exists already", "start earliest (asked 2024-05-01"],
        ),
    ],
    ids=[
        "topic",
        "subscription",
        "plain-vs-delivering",
        "delivering-vs-plain",
        "delivering",
        "group",
    ],
)
def test_other_settings_are_named_and_nothing_changes(
    db: str, create: list[str], words: list[str]
) -> None:
    for args in (TOPIC, PLAIN, DELIVERING, GROUP):
        assert rb(db, *args).exit_code == 0
    before = _state(db)
    result = rb(db, *create, "--if-not-exists")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and result.stderr.endswith("; not reusing it\n")
    assert all(w in result.stderr for w in words), result.stderr
    assert _state(db) == before


def test_a_group_from_latest_is_reused_whenever_it_started(db: str) -> None:
    assert rb(db, *TOPIC).exit_code == 0
    assert rb(db, "group", "create", "g", "orders/#").exit_code == 0
    before = _state(db)
    assert "reusing it" in rb(db, "group", "create", "g", "orders/#", "--if-not-exists").stdout
    assert _state(db) == before


def test_the_library_takes_exist_ok(db: str) -> None:
    definition = DeliveryDefinition("h", "orders", parse_endpoint("m:f"), shard_count=2)
    for _run in range(2):
        with Log.open(db) as log:
            topic = log.topics.create("orders", 4, "orders/#", exist_ok=True)
            record = Subscriptions(log.storage).create("s", "orders", "orders/#", exist_ok=True)
            stored = create_delivering(log.storage, definition, exist_ok=True)
    with Log.open(db) as log:
        assert log.topics.get("orders") == topic
        assert Subscriptions(log.storage).get("s") == record
        assert Definitions(log.storage).get("h") == stored
        with pytest.raises(AlreadyExists, match=r"retention policy consumed-and-expired \(asked"):
            log.topics.create(
                "orders", 4, "orders/#", retention_policy=RetentionPolicy.EXPIRED, exist_ok=True
            )
        with pytest.raises(AlreadyExists, match=r"filter 'orders/#' \(asked None\)"):
            Subscriptions(log.storage).create("s", "orders", exist_ok=True)
        with pytest.raises(AlreadyExists, match=r"grouped True \(asked False\)"):
            create_delivering(
                log.storage,
                DeliveryDefinition(
                    "h", "orders", parse_endpoint("m:f"), shard_count=2, grouped=False
                ),
                exist_ok=True,
            )
        with pytest.raises(AlreadyExists):
            log.topics.create("orders", 4, "orders/#")  # exist_ok defaults to False
