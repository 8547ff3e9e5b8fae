"""`riverbed dlq list|show` (issue 7): browse a subscription's dead-letter
queue by failure time, group and message id, a page at a time; on both
backends; bad input refused with exit 2, unknown names with exit 1."""

from __future__ import annotations

import json

import pytest

from harness.cli import rb
from riverbed.log.log import Log
from riverbed.log.topics import Topics
from riverbed.model import MessageId
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import CallableEndpoint, DeliveryDefinition
from riverbed.subscriptions.provisioning import create_delivering
from riverbed.subscriptions.queues import QueuedMessage

BASE = 1_700_000_000_000_000


@pytest.fixture
def parked(storage_url: str) -> list[QueuedMessage]:
    """Subscription `billing` with six messages parked: groups g0-g2, failed
    one second apart."""
    storage = open_storage(storage_url)
    try:
        Topics(storage).create("orders", 4)
        create_delivering(storage, DeliveryDefinition("billing", "orders", CallableEndpoint("m:f")))
    finally:
        storage.close()
    messages = [
        QueuedMessage(
            MessageId.compose(BASE + n, 1, n),
            0,
            n % 4,
            n,
            4,
            0,
            BASE + n * 1_000_000,
            "HTTP 500",
            f"g{n % 3}",
            f"payload {n}".encode(),
            "orders/new",
        )
        for n in range(6)
    ]
    with Log.open(storage_url) as log:
        log.produce("billing.dlq", [m.to_message() for m in messages])
    return messages


def listed(url: str, *args: str) -> list[dict[str, object]]:
    result = rb(url, "dlq", "list", "billing", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_list_by_failure_time_group_and_id_with_pages(
    storage_url: str, parked: list[QueuedMessage]
) -> None:
    everything = listed(storage_url)
    assert [r["message_id"] for r in everything] == [str(m.message_id) for m in parked]
    assert everything[0]["attempts"] == 3 and everything[0]["reason"] == "HTTP 500"
    assert [r["group"] for r in listed(storage_url, "--group", "g1")] == ["g1", "g1"]
    since = "2023-11-14T22:13:22Z"  # BASE + 2 s
    assert len(listed(storage_url, "--since", since)) == 4
    assert [r["message_id"] for r in listed(storage_url, "--limit", "4", "--page", "2")] == [
        str(m.message_id) for m in parked[4:]
    ]
    one = str(parked[3].message_id)
    assert [r["message_id"] for r in listed(storage_url, "--message-id", one)] == [one]
    shown = json.loads(rb(storage_url, "dlq", "show", "billing", one, "--json").stdout)
    assert shown["payload"] == "payload 3" and shown["group"] == "g0"
    table = rb(storage_url, "dlq", "list", "billing")
    assert table.exit_code == 0 and "HTTP 500" in table.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["list", "nobody"], 1, "subscription 'nobody' does not exist"),
        (["list", "billing", "--since", "yesterday"], 2, "not an ISO 8601 time"),
        (["list", "billing", "--message-id", "xyz"], 2, "not a Riverbed message id"),
        (["list", "billing", "--limit", "0"], 2, "not in the range"),
        (["show", "billing", "0" * 32], 1, "is not parked"),
    ],
)
def test_bad_input(
    storage_url: str, parked: list[QueuedMessage], args: list[str], code: int, message: str
) -> None:
    result = rb(storage_url, "dlq", *args)
    assert result.exit_code == code, result.output
    assert message in result.output
