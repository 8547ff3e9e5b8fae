"""Offset reset of a delivering subscription (issue 7, seed 003) on both
backends, against a real local HTTP server: the main topic rewound (to the
earliest message, a time) and fast-forwarded; the retry and dead-letter
queues fast-forwarded only (their groups released); a rewind into
generations the shard count cannot split handled as a shard-count change;
what may not move is refused with nothing changed."""

from __future__ import annotations

import json

import pytest

from harness.cli import rb
from harness.clock import moment_between
from harness.delivery import by_group, driver, produce_groups, subscribe
from harness.endpoint import Endpoint
from riverbed.log.jsonlines import format_time
from riverbed.log.topics import Topics
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import Definitions, RetryPolicy
from riverbed.subscriptions.dlq import parked
from riverbed.subscriptions.shardstate import load_states

GROUPS = 6


def setup(storage: Storage, endpoint: Endpoint, shards: int = 2) -> None:
    subscribe(
        storage,
        endpoint.url,
        shards=shards,
        retry=RetryPolicy(retry_on_status=(503,), min_delay=5, max_attempts=3),
    )


def produce(storage: Storage, first: int, count: int) -> None:
    produce_groups(storage, GROUPS, first, count)


def test_rewind_to_the_earliest_delivers_again_in_order_in_bounded_batches(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint)
    produce(storage, 0, 10)
    with driver(storage, "billing") as d:
        d.until_idle()
        result = rb(storage_url, "subscription", "reset", "billing", "--to", "earliest")
        assert result.exit_code == 0, result.output
        d.main_batch = 7  # a rewind's backlog taken in steps
        batches = d.until_idle()
        assert batches >= 60 // (7 * 2)
    assert by_group(endpoint.delivered()) == {f"g{g}": list(range(10)) * 2 for g in range(GROUPS)}


def test_fast_forward_and_rewind_to_a_time(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint)
    produce(storage, 0, 3)
    with driver(storage, "billing") as d:
        assert rb(storage_url, "subscription", "reset", "billing", "--to", "latest").exit_code == 0
        d.until_idle()
        assert endpoint.delivered() == []
        produce(storage, 3, 2)
        middle = format_time(max(r.timestamp_us for r in _all(storage)) + 1)
        produce(storage, 5, 2)
        d.until_idle()
        assert by_group(endpoint.delivered())["g0"] == [3, 4, 5, 6]
        rb(storage_url, "subscription", "reset", "billing", "--to", middle)
        d.until_idle()
    assert by_group(endpoint.delivered())["g0"] == [3, 4, 5, 6, 5, 6]


def _all(storage: Storage) -> list:  # type: ignore[type-arg]
    return [m for h in storage.list_streams("orders") for m in storage.read(h.key, 0, 1000)]


def test_the_retry_queue_fast_forwarded_releases_its_groups(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint)
    produce(storage, 0, 4)
    endpoint.fail(b"g1:1:", 503)
    with driver(storage, "billing") as d:
        d.batch()
        assert by_group(endpoint.delivered())["g1"] == [0]  # g1:1..3 wait in the RQ
        result = rb(
            storage_url,
            "subscription",
            "reset",
            "billing",
            "--queue",
            "rq",
            "--to",
            "latest",
            "--json",
        )
        assert json.loads(result.output)["passed_over"] == 3
        assert all(
            not s.groups.rq and not s.retries for s in load_states(storage, "billing").values()
        )
        endpoint.heal()
        produce(storage, 4, 1)
        d.until_idle()
    assert by_group(endpoint.delivered())["g1"] == [0, 4]  # 1-3 dropped, 4 not held


def test_the_dlq_fast_forwarded_to_a_time_drops_what_was_parked_before(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint)
    produce(storage, 0, 2)
    endpoint.fail(b"g2:0:", 400)
    endpoint.fail(b"g3:1:", 400)
    with driver(storage, "billing") as d:
        d.until_idle()
        early = {p.message.payload for p in parked(storage, "billing")}
        assert early == {b"g2:0:", b"g2:1:", b"g3:1:"}
        cut = format_time(moment_between())  # the log's time: when rows were written
        endpoint.fail(b"g4:2:", 400)
        produce(storage, 2, 1)
        d.until_idle()
        result = rb(storage_url, "subscription", "reset", "billing", "--queue", "dlq", "--to", cut)
        assert result.exit_code == 0, result.output
        assert "past 3 messages" in result.output
        # g2:2 and g3:2 joined their groups' parked messages after the cut.
        assert {p.message.payload for p in parked(storage, "billing")} == {
            b"g2:2:",
            b"g3:2:",
            b"g4:2:",
        }
        endpoint.heal()
        produce(storage, 3, 1)  # g2-g4 still have parked messages: these join them
        d.until_idle()
        assert rb(storage_url, "dlq", "replay", "billing", "--all").exit_code == 0
        d.until_idle()
    got = by_group(endpoint.delivered())
    assert (got["g2"], got["g3"], got["g4"]) == ([2, 3], [0, 2, 3], [0, 1, 2, 3])
    assert got["g0"] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "args",
    [
        ["--queue", "rq", "--to", "earliest"],
        ["--queue", "dlq", "--to", "orders/0/1=0"],
        ["--queue", "sideways", "--to", "latest"],
    ],
)
def test_queues_do_not_rewind(
    storage: Storage, storage_url: str, endpoint: Endpoint, args: list[str]
) -> None:
    setup(storage, endpoint)
    produce(storage, 0, 1)
    result = rb(storage_url, "subscription", "reset", "billing", *args)
    assert result.exit_code == 2, result.output


def test_a_rewind_into_generations_the_shards_cannot_split_is_a_shard_count_change(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint, shards=4)
    produce(storage, 0, 2)
    with driver(storage, "billing") as d:
        d.until_idle()
        topics = Topics(storage)
        topics.add_storage_topic("orders", 6)
        topics.switch_produce("orders")
        assert rb(storage_url, "subscription", "reshard", "billing", "--shards", "3").exit_code == 0
        produce(storage, 2, 1)
        d.until_idle()
        refused = rb(storage_url, "subscription", "reset", "billing", "--to", "earliest")
        assert refused.exit_code == 2 and "choose one of [1, 2]" in refused.output  # of 4 and 6
        assert d.idle()  # nothing moved
        result = rb(
            storage_url, "subscription", "reset", "billing", "--to", "earliest", "--shards", "2"
        )
        assert result.exit_code == 0, result.output
        definition = Definitions(storage).get("billing")
        assert definition is not None and definition.shard_count == 2
        d.until_idle()
    assert by_group(endpoint.delivered()) == {f"g{g}": [0, 1, 2, 0, 1, 2] for g in range(GROUPS)}


@pytest.mark.parametrize("args", [["--queue", "rq"], ["--shards", "1"]])
def test_queue_and_shard_options_need_a_subscription_that_delivers(
    storage: Storage, storage_url: str, args: list[str]
) -> None:
    Topics(storage).create("orders", 4)
    assert rb(storage_url, "subscription", "create", "plain", "--topic", "orders").exit_code == 0
    before = storage.get_cursors("plain")
    result = rb(storage_url, "subscription", "reset", "plain", "--to", "latest", *args)
    assert result.exit_code == 2 and "for a subscription that delivers" in result.output
    assert storage.get_cursors("plain") == before
