"""`riverbed subscription create NAME --topic T --endpoint ...` (issue 7): the
subscription, its retry and dead-letter queues and its delivery definition are
made together, on both backends; bad input is refused (exit 2, or 1 for what
exists) and changes nothing; `delete` removes all four."""

from __future__ import annotations

import json

import pytest

from harness.cli import rb
from riverbed.errors import AlreadyExists
from riverbed.log.log import Log
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import (
    CallableEndpoint,
    Definitions,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.provisioning import create_delivering


@pytest.fixture
def orders(storage_url: str) -> str:
    with Log.open(storage_url) as log:
        log.topics.create("orders", 8)
    return storage_url


def state(url: str) -> tuple[set[str], set[str], list[DeliveryDefinition]]:
    storage = open_storage(url)
    try:
        return (
            {t.name for t in storage.list_topics()},
            {s.name for s in storage.list_subscriptions(None)},
            Definitions(storage).list(),
        )
    finally:
        storage.close()


def test_create_a_delivering_subscription(orders: str) -> None:
    result = rb(
        orders,
        "subscription",
        "create",
        "billing",
        "--topic",
        "orders",
        "--endpoint",
        "http://127.0.0.1:9000/hook",
        "--shards",
        "4",
        "--header",
        "Authorization: Bearer x",
        "--retry-on",
        "503,TimeoutError",
        "--backoff",
        "linear",
        "--max-attempts",
        "3",
        "--ungrouped",
    )
    assert result.exit_code == 0, result.output
    assert "retry queue 'billing.rq' (4 partitions)" in result.output
    topics, subscriptions, (definition,) = state(orders)
    assert {"billing.rq", "billing.dlq"} <= topics and "billing" in subscriptions
    assert definition == DeliveryDefinition(
        "billing",
        "orders",
        HttpEndpoint("http://127.0.0.1:9000/hook", headers={"Authorization": "Bearer x"}),
        shard_count=4,
        grouped=False,
        retry=RetryPolicy(
            retry_on_status=(503,),
            retry_on_exceptions=("TimeoutError",),
            backoff="linear",
            max_attempts=3,
        ),
        rq_partitions=4,
        dlq_partitions=4,
    )
    listed = json.loads(rb(orders, "subscription", "list", "--json").stdout)
    (row,) = [r for r in listed if r["name"] == "billing"]
    assert (row["endpoint"], row["shards"], row["grouped"]) == (
        "http://127.0.0.1:9000/hook",
        4,
        False,
    )
    assert "http://127.0.0.1:9000/hook" in rb(orders, "subscription", "list").stdout
    assert rb(orders, "subscription", "delete", "billing").exit_code == 0
    topics, subscriptions, definitions = state(orders)
    assert "billing.rq" not in topics and "billing" not in subscriptions and not definitions


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--endpoint", "ftp://x"], 2, "must be an http"),
        (["--endpoint", "m:f", "--shards", "3"], 2, "shard count 3 does not divide"),
        (["--endpoint", "m:f", "--method", "PUT"], 2, "only apply to an HTTP endpoint"),
        (["--shards", "2"], 2, "--shards only apply with --endpoint"),
        (["--endpoint", "http://h/", "--header", "nocolon"], 2, "is not NAME:VALUE"),
        (["--endpoint", "http://h/", "--retry-on", "500,no way"], 2, "exception type names"),
        (["--endpoint", "m:f", "--rq-partitions", "6", "--shards", "4"], 2, "multiple of"),
        (["--endpoint", "m:f", "--max-attempts", "0"], 2, "max_attempts = 0"),
        (["--endpoint", "m:f", "--inline-retry", "-1"], 2, "inline_max_delay = -1"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    orders: str, args: list[str], code: int, message: str
) -> None:
    before = state(orders)
    result = rb(orders, "subscription", "create", "billing", "--topic", "orders", *args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert state(orders) == before


def test_an_unknown_topic_is_refused(orders: str) -> None:
    before = state(orders)
    result = rb(orders, "subscription", "create", "billing", "--topic", "nope", "--endpoint", "m:f")
    assert result.exit_code == 1 and "nope" in result.output
    assert state(orders) == before


def test_a_clash_is_refused_before_anything_is_written(orders: str) -> None:
    with Log.open(orders) as log:
        log.topics.create("billing.dlq", 1)
    before = state(orders)
    result = rb(
        orders, "subscription", "create", "billing", "--topic", "orders", "--endpoint", "m:f"
    )
    assert result.exit_code == 1 and "topic 'billing.dlq' exists already" in result.output
    assert state(orders) == before


def test_a_failed_write_is_undone(orders: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process creates the definition between the checks and the writes."""
    before = state(orders)
    storage = open_storage(orders)
    try:
        real = Definitions.create

        def racing(self: Definitions, definition: DeliveryDefinition) -> None:
            real(self, definition)
            real(self, definition)  # the second write finds it: AlreadyExists

        monkeypatch.setattr(Definitions, "create", racing)
        with pytest.raises(AlreadyExists, match="already"):
            create_delivering(
                storage, DeliveryDefinition("billing", "orders", CallableEndpoint("m:f"))
            )
    finally:
        storage.close()
    topics, subscriptions, _ = state(orders)
    assert topics == before[0] and subscriptions == before[1]
