"""`riverbed subscription reshard` (issue 7, seed 003 ChangeShardCount) on
both backends, against a real local HTTP server: shard count 2 -> 4 -> 1 with
traffic and failures in flight (retries pending, messages parked): every
message delivered or parked, none lost, none twice, order per group kept;
the main topic grown to a partition count the old count cannot split; bad
counts refused with nothing changed."""

from __future__ import annotations

import json
import threading

import pytest

from harness.cli import rb
from harness.delivery import by_group, driver, produce_groups, subscribe
from harness.endpoint import Endpoint
from harness.waiting import eventually
from riverbed.log.topics import Topics
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import Definitions
from riverbed.subscriptions.dlq import parked
from riverbed.subscriptions.shardstate import load_states

GROUPS = 12


def setup(storage: Storage, endpoint: Endpoint, shards: int) -> None:
    subscribe(storage, endpoint.url, shards=shards)


def produce(storage: Storage, first: int, count: int) -> None:
    produce_groups(storage, GROUPS, first, count)


def reshard(url: str, shards: int) -> dict[str, object]:
    result = rb(url, "subscription", "reshard", "billing", "--shards", str(shards), "--json")
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.output)
    return out


def test_two_to_four_to_one_shards_with_failures_in_flight(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint, shards=2)
    produce(storage, 0, 10)
    endpoint.fail(b"g1:3:", 503, times=2)  # pending in the RQ across the change
    endpoint.fail(b"g7:0:", 503, times=3)
    endpoint.fail(b"g5:2:", 400)  # parked, its group behind it
    with driver(storage, "billing") as d:
        d.batch()
        assert not d.idle()
        out = reshard(storage_url, 4)
        assert (out["shards_before"], out["shards"]) == (2, 4)
        assert out["fed_rq"] == 7 + 10 and out["fed_dlq"] == 8
        assert out["new_storage_topics"] == ["billing.rq", "billing.dlq"]  # 2 partitions
        assert len(load_states(storage, "billing")) == 4
        produce(storage, 10, 5)
        endpoint.fail(b"g2:12:", 503, times=1)
        d.batch()
        d.clock.advance(us=1_500_000)
        d.batch()
        out = reshard(storage_url, 1)
        assert out["new_storage_topics"] == []  # 4 partitions: 1 divides them
        produce(storage, 15, 5)
        d.until_idle()
        endpoint.heal()
        assert rb(storage_url, "dlq", "replay", "billing", "--all").exit_code == 0
        d.until_idle()
    delivered = endpoint.delivered()
    assert by_group(delivered) == {f"g{g}": list(range(20)) for g in range(GROUPS)}
    assert len(delivered) == 20 * GROUPS  # none twice
    assert parked(storage, "billing") == []
    definition = Definitions(storage).get("billing")
    assert definition is not None and definition.shard_count == 1


def test_a_main_topic_grown_past_the_old_count_takes_a_new_one(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    setup(storage, endpoint, shards=4)
    produce(storage, 0, 3)
    with driver(storage, "billing") as d:
        d.until_idle()
        topics = Topics(storage)
        topics.add_storage_topic("orders", 6)  # 4 does not divide 6
        topics.switch_produce("orders")
        produce(storage, 3, 3)
        refused = rb(storage_url, "subscription", "reshard", "billing", "--shards", "4")
        assert refused.exit_code == 2 and "choose one of [1, 2, 3, 6]" in refused.output
        reshard(storage_url, 3)  # generation 0 is consumed: only 6 partitions count
        d.until_idle()
    assert by_group(endpoint.delivered()) == {f"g{g}": list(range(6)) for g in range(GROUPS)}


@pytest.mark.parametrize("shards", ["3", "0", "-1", "two"])
def test_bad_shard_counts_are_refused_and_change_nothing(
    storage: Storage, storage_url: str, endpoint: Endpoint, shards: str
) -> None:
    setup(storage, endpoint, shards=2)
    produce(storage, 0, 2)
    endpoint.fail(b"g0:0:", 503, times=1)
    with driver(storage, "billing") as d:
        d.batch()
        before = (Definitions(storage).get("billing"), load_states(storage, "billing"))
        result = rb(storage_url, "subscription", "reshard", "billing", "--shards", shards)
        assert result.exit_code == 2, result.output
        assert (Definitions(storage).get("billing"), load_states(storage, "billing")) == before
        assert rb(storage_url, "subscription", "reshard", "nope", "--shards", "1").exit_code == 1
        d.clock.advance(us=2_000_000)
        d.until_idle()
    assert len(endpoint.delivered()) == 2 * GROUPS


def test_a_batch_of_the_old_shards_commits_nothing_after_the_change(
    storage: Storage, storage_url: str, endpoint: Endpoint
) -> None:
    """A batch planned and started for 2 shards that commits after a change to
    1: the new shard's state is fresh (version 1, like any new state), so only
    the definition check tells the batch it is stale. It writes nothing (no
    state for a shard that no longer exists, no cursor moved); the new shard
    delivers everything, in order."""
    from riverbed.errors import Superseded
    from riverbed.subscriptions.batch import batch_marker
    from riverbed.subscriptions.named import Subscriptions

    setup(storage, endpoint, shards=2)
    produce(storage, 0, 6)
    endpoint.fail(b"g5:2:", 400)
    with driver(storage, "billing") as d:
        stale = d._runner()  # the definition with 2 shards
        ranges = {shard: d.ranges(shard) for shard in (0, 1)}
        reshard(storage_url, 1)
        before = (
            load_states(storage, "billing"),
            Subscriptions(storage).get("billing"),
            storage.get_cursors("billing"),
        )
        for shard in (0, 1):
            with pytest.raises(Superseded, match="definition changed"):
                d.loop.run_until_complete(
                    stale.run_batch(shard, ranges[shard], batch_marker("billing", shard, "old", 0))
                )
        after = (
            load_states(storage, "billing"),
            Subscriptions(storage).get("billing"),
            storage.get_cursors("billing"),
        )
        assert after == before and set(after[0]) == {0}
        d.until_idle()
    first: dict[str, list[int]] = {}
    seen: set[bytes] = set()
    for r in endpoint.delivered():
        if r.payload not in seen:
            seen.add(r.payload)
            first.setdefault(r.key, []).append(int(r.payload.split(b":")[1]))
    assert first == {f"g{g}": list(range(6)) if g != 5 else [0, 1] for g in range(GROUPS)}
    assert [p.message.payload for p in parked(storage, "billing")] == [
        f"g5:{n}:".encode() for n in range(2, 6)
    ]


def test_a_reshard_waits_for_a_shard_commit_without_deadlock(
    postgres_url: str, endpoint: Endpoint
) -> None:
    """PostgreSQL: a shard's commit holds the definition (share lock), then
    writes its state; a reshard starting meanwhile waits for the definition
    before it touches any state row, so the commit finishes and the reshard
    follows (its compare-and-set sees the new state and starts again). In the
    opposite order each would wait for the other (a deadlock PostgreSQL breaks
    by failing one)."""
    import psycopg

    from riverbed.storage import open_storage
    from riverbed.storage.transactions import kv_hold_in, kv_put_in, transaction
    from riverbed.subscriptions.definition import NAMESPACE as DEFINITIONS
    from riverbed.subscriptions.reshard import Reshard, change_shard_count
    from riverbed.subscriptions.shardstate import NAMESPACE, load_state, state_key

    storage = open_storage(postgres_url)
    try:
        setup(storage, endpoint, shards=2)
        produce(storage, 0, 3)
        endpoint.fail(b"g1:0:", 400)
        with driver(storage, "billing") as d:
            d.batch()  # shard states exist, g1 parked (rows a reshard feeds)
        _, version = Definitions(storage).require_versioned("billing")
        state, state_version = load_state(storage, "billing", 0)
        done: list[Reshard] = []
        failed: list[BaseException] = []

        def reshard_now() -> None:
            try:
                done.append(change_shard_count(storage, "billing", 1))
            except BaseException as exc:  # reported below
                failed.append(exc)

        with transaction(storage) as tx:
            assert kv_hold_in(tx, DEFINITIONS, "billing", version)
            other = threading.Thread(target=reshard_now)
            other.start()
            with psycopg.connect(postgres_url, autocommit=True) as watch:

                def reshard_waits() -> bool:
                    assert other.is_alive(), failed
                    return bool(
                        watch.execute(
                            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE 'UPDATE kv%'"
                        ).fetchone()
                    )

                eventually(reshard_waits, what="the reshard to wait on the definition's lock")
            # The reshard waits on the definition: the commit writes its state.
            assert kv_put_in(tx, NAMESPACE, state_key("billing", 0), state.to_json(), state_version)
        other.join(timeout=60)
        assert not failed and [r.new_count for r in done] == [1]
        assert set(load_states(storage, "billing")) == {0}
    finally:
        storage.close()
