"""`riverbed dlq replay|purge` (issue 7): unsideline parked messages by each
selector (everything, since a time, group ids, message ids) back into the
flow with group order kept, and purge them; on both backends, against a real
local HTTP server; bad selections refused with nothing changed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from harness.cli import rb
from harness.delivery import Driver, driver, produce_groups, subscribe
from harness.endpoint import Endpoint, Request
from riverbed.cli import cli
from riverbed.log.jsonlines import format_time
from riverbed.log.topics import Topics
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import RetryPolicy
from riverbed.subscriptions.dlq import parked
from riverbed.subscriptions.shardstate import load_states


def setup(storage: Storage, endpoint: Endpoint, grouped: bool = True) -> None:
    subscribe(
        storage,
        endpoint.url,
        grouped=grouped,
        retry=RetryPolicy(retry_on_status=(503,), min_delay=1, max_attempts=2),
    )


def produce(storage: Storage, groups: int, first: int, count: int) -> None:
    produce_groups(storage, groups, first, count)


def seqs(requests: list[Request], group: str) -> list[int]:
    return [int(r.payload.split(b":")[1]) for r in requests if r.key == group]


def parked_payloads(storage: Storage) -> list[bytes]:
    return sorted(p.message.payload for p in parked(storage, "billing", limit=10_000))


@pytest.fixture
def stuck(storage: Storage, storage_url: str, endpoint: Endpoint) -> Iterator[Driver]:
    """g1 and g2 parked from their 2nd message on (HTTP 400), g0 and g3 delivered."""
    setup(storage, endpoint)
    produce(storage, groups=4, first=0, count=5)
    endpoint.fail(b"g1:1:", 400)
    endpoint.fail(b"g2:1:", 400)
    with driver(storage, "billing") as d:
        d.until_idle()
        assert parked_payloads(storage) == sorted(
            f"g{g}:{n}:".encode() for g in (1, 2) for n in range(1, 5)
        )
        endpoint.heal()
        yield d


def test_replay_everything_delivers_in_group_order(
    stuck: Driver, storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    result = rb(storage_url, "dlq", "replay", "billing", "--all", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["replayed"] == 8
    stuck.until_idle()
    delivered = endpoint.delivered()
    assert seqs(delivered, "g1") == [0, 1, 2, 3, 4] == seqs(delivered, "g2")
    assert parked_payloads(storage) == []
    replayed = [r for r in delivered if r.payload in (b"g1:1:", b"g2:1:")]
    assert all(r.attempt == 1 for r in replayed)


def test_replay_by_group_leaves_the_other_group_parked_and_joining(
    stuck: Driver, storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    result = rb(storage_url, "dlq", "replay", "billing", "--group", "g2")
    assert result.exit_code == 0, result.output
    assert "replayed 4 messages" in result.output
    produce(storage, groups=4, first=5, count=2)  # g1's new ones join its parked ones
    stuck.until_idle()
    delivered = endpoint.delivered()
    assert seqs(delivered, "g2") == list(range(7))
    assert seqs(delivered, "g1") == [0]
    assert parked_payloads(storage) == sorted(f"g1:{n}:".encode() for n in range(1, 7))
    rb(storage_url, "dlq", "replay", "billing", "--group", "g1")
    stuck.until_idle()
    assert seqs(endpoint.delivered(), "g1") == list(range(7))


def test_replay_by_message_id_takes_its_groups_earlier_messages_and_keeps_the_rest(
    stuck: Driver, storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    by_payload = {p.message.payload: p for p in parked(storage, "billing", limit=100)}
    third = str(by_payload[b"g1:3:"].message.message_id)
    result = rb(storage_url, "dlq", "replay", "billing", "--message-id", third, "--json")
    out = json.loads(result.output)
    assert (out["selected"], out["earlier_of_their_groups"]) == (1, 2)
    stuck.until_idle()
    assert seqs(endpoint.delivered(), "g1") == [0, 1, 2, 3]
    assert b"g1:4:" in parked_payloads(storage)  # after the selected one: still parked


def test_replay_since_a_time_selects_by_failure_time(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint, grouped=False)
    produce(storage, groups=2, first=0, count=3)
    endpoint.fail(b"g0:0:", 400)
    with driver(storage, "billing") as d:
        d.until_idle()
        d.clock.advance(us=3_600_000_000)  # an hour later
        endpoint.fail(b"g1:5:", 400)
        produce(storage, groups=2, first=5, count=1)
        d.until_idle()
        assert parked_payloads(storage) == [b"g0:0:", b"g1:5:"]
        endpoint.heal()
        since = format_time(d.now - 1_800_000_000)
        result = rb(storage_url, "dlq", "replay", "billing", "--since", since)
        assert result.exit_code == 0 and "replayed 1 message" in result.output
        d.until_idle()
    assert parked_payloads(storage) == [b"g0:0:"]
    assert [r.payload for r in endpoint.delivered()].count(b"g1:5:") == 1


def test_purge_drops_the_poison_message_then_replay_delivers_the_rest(
    stuck: Driver, storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    head = next(p for p in parked(storage, "billing", limit=100) if p.message.payload == b"g1:1:")
    result = rb(
        storage_url,
        "dlq",
        "purge",
        "billing",
        "--message-id",
        str(head.message.message_id),
        "--yes",
    )
    assert result.exit_code == 0 and "purged 1 message" in result.output
    assert b"g1:1:" not in parked_payloads(storage)
    rb(storage_url, "dlq", "replay", "billing", "--group", "g1")
    stuck.until_idle()
    assert seqs(endpoint.delivered(), "g1") == [0, 2, 3, 4]
    purged = rb(storage_url, "dlq", "purge", "billing", "--all", "--yes", "--json")
    assert json.loads(purged.output)["purged"] == 4  # g2's
    assert parked_payloads(storage) == []


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--all", "--group", "g1"],
        ["--since", "yesterday-ish"],
        ["--message-id", "not-an-id"],
    ],
)
def test_bad_selections_are_refused_and_change_nothing(
    stuck: Driver, storage: Storage, storage_url: str, args: list[str]
) -> None:
    before = parked_payloads(storage)
    result = rb(storage_url, "dlq", "replay", "billing", *args)
    assert result.exit_code == 2, result.output
    assert parked_payloads(storage) == before


def test_unknown_message_ids_and_subscriptions_change_nothing(
    stuck: Driver, storage: Storage, storage_url: str
) -> None:
    before = parked_payloads(storage)
    known = str(parked(storage, "billing", limit=1)[0].message.message_id)
    unknown = "0006612a0000000000000000000000ff"
    result = rb(
        storage_url, "dlq", "replay", "billing", "--message-id", known, "--message-id", unknown
    )
    assert result.exit_code == 1 and unknown in result.output
    assert rb(storage_url, "dlq", "purge", "nope", "--all", "--yes").exit_code == 1
    assert parked_payloads(storage) == before


def test_purge_asks_first(stuck: Driver, storage: Storage, storage_url: str) -> None:
    before = parked_payloads(storage)
    result = CliRunner().invoke(
        cli, ["dlq", "purge", "billing", "--all", "--db", storage_url], input="n\n"
    )
    assert result.exit_code == 1
    assert parked_payloads(storage) == before


def test_lag_counts_what_waits_and_what_is_parked(
    stuck: Driver, storage: Storage, storage_url: str
) -> None:
    out = json.loads(rb(storage_url, "subscription", "lag", "billing", "--json").output)
    assert (out["retry_queue"], out["dead_letter_queue"]) == (0, 8)
    assert sum(s["lag"] for s in out["streams"]) == 0
    text = rb(storage_url, "subscription", "lag", "billing").output
    assert "retry queue: 0 waiting; dead-letter queue: 8 parked" in text
    rb(storage_url, "dlq", "replay", "billing", "--group", "g1")
    out = json.loads(rb(storage_url, "subscription", "lag", "billing", "--json").output)
    assert (out["retry_queue"], out["dead_letter_queue"]) == (4, 4)


def test_delete_removes_the_shards_state_too(
    stuck: Driver, storage: Storage, storage_url: str
) -> None:
    assert load_states(storage, "billing")
    assert rb(storage_url, "subscription", "delete", "billing").exit_code == 0
    assert load_states(storage, "billing") == {}


def test_run_refuses_a_subscription_that_does_not_deliver_before_spark_starts(
    storage: Storage, storage_url: str
) -> None:
    Topics(storage).create("orders", 4)
    assert rb(storage_url, "subscription", "create", "plain", "--topic", "orders").exit_code == 0
    for name, why in (("plain", "does not deliver to an endpoint"), ("nope", "does not exist")):
        result = rb(storage_url, "subscription", "run", name)
        assert result.exit_code == 1
        assert result.output == f"error: subscription {name!r} {why}\n"


@pytest.mark.parametrize(
    ("option", "value"),
    [("--stop-grace", "-1"), ("--lease-seconds", "0.5"), ("--trigger-interval", "0")],
)
def test_run_refuses_bad_timings_before_spark_starts(
    storage: Storage, storage_url: str, endpoint: Endpoint, option: str, value: str
) -> None:
    setup(storage, endpoint)
    before = load_states(storage, "billing")
    result = rb(storage_url, "subscription", "run", "billing", option, value)
    assert result.exit_code == 2
    assert option in result.output and value in result.output
    assert load_states(storage, "billing") == before


def test_a_replay_refuses_shards_changed_under_it(
    stuck: Driver,
    storage: Storage,
    storage_url: str,
    endpoint: Endpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shard-count change committing after a replay read the definition:
    the replay writes nothing to shards it no longer knows (exit 1, says so);
    run again, it replays everything, in order."""
    import riverbed.subscriptions.dlq as dlq
    from riverbed.subscriptions.reshard import change_shard_count

    real = dlq.load_state
    changed: list[int] = []

    def load_state(*args: object) -> object:
        if not changed:
            changed.append(change_shard_count(storage, "billing", 1).new_count)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dlq, "load_state", load_state)
    before = parked_payloads(storage)
    result = rb(storage_url, "dlq", "replay", "billing", "--all")
    assert result.exit_code == 1
    assert "changed its shards while replaying its DLQ" in result.output
    assert changed == [1] and set(load_states(storage, "billing")) == {0}
    assert parked_payloads(storage) == before
    monkeypatch.undo()
    assert rb(storage_url, "dlq", "replay", "billing", "--all").exit_code == 0
    stuck.until_idle()
    delivered = endpoint.delivered()
    assert seqs(delivered, "g1") == [0, 1, 2, 3, 4] == seqs(delivered, "g2")
    assert parked_payloads(storage) == []
