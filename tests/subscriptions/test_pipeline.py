"""A delivering subscription's shards, batch by batch (issue 7), on both
backends, against a real local HTTP server that fails on command: retries
with the policy's backoff, parking after the last attempt, grouped order
(a failing message holds its group, other groups flow), and batches that run
twice or die before their commit. `delivery_driver.Driver` does what each
Spark task does, with a clock the test moves."""

from __future__ import annotations

import pytest

from harness.delivery import by_group, driver, produce_groups, queued
from harness.delivery import subscribe as harness_subscribe
from harness.endpoint import Endpoint
from riverbed.storage.base import Storage
from riverbed.subscriptions import batch as batch_module
from riverbed.subscriptions.definition import ConsumptionPolicy, Definitions, RetryPolicy
from riverbed.subscriptions.pipeline import retry_due
from riverbed.subscriptions.shardstate import load_state

SECOND = 1_000_000


RETRY = RetryPolicy(retry_on_status=(503,), min_delay=2, max_delay=60, multiplier=2, max_attempts=4)


def subscribe(
    storage: Storage,
    endpoint: Endpoint,
    *,
    grouped: bool = True,
    shards: int = 2,
    retry: RetryPolicy | None = None,
) -> None:
    harness_subscribe(
        storage,
        endpoint.url,
        shards=shards,
        grouped=grouped,
        retry=retry or RETRY,
        consumption=ConsumptionPolicy(max_in_flight=8, max_parallel_groups=4),
    )


def produce(storage: Storage, groups: int, per_group: int) -> None:
    produce_groups(storage, groups, 0, per_group)


def test_everything_is_delivered_once_in_group_order(storage: Storage, endpoint: Endpoint) -> None:
    subscribe(storage, endpoint)
    produce(storage, groups=10, per_group=20)
    with driver(storage, "billing") as d:
        d.batch()
        assert d.idle()
    delivered = endpoint.delivered()
    assert len(delivered) == 200 and len({r.payload for r in delivered}) == 200
    assert by_group(delivered) == {f"g{g}": list(range(20)) for g in range(10)}
    assert all(r.attempt == 1 and r.topic == "orders/new" for r in delivered)
    assert queued(storage, "billing.rq") == [] and queued(storage, "billing.dlq") == []


def test_transient_failures_are_retried_with_the_backoff_then_delivered(
    storage: Storage, endpoint: Endpoint
) -> None:
    subscribe(storage, endpoint, grouped=False)
    produce(storage, groups=4, per_group=5)
    endpoint.fail(b"g1:3:", 503, times=2)
    with driver(storage, "billing") as d:
        d.batch()
        (first,) = queued(storage, "billing.rq")
        assert (first.payload, first.attempt, first.due_us) == (b"g1:3:", 2, d.t0 + 2 * SECOND)
        assert first.reason == "HTTP 503" and first.key == "g1"
        assert len(endpoint.delivered()) == 19  # ungrouped: the rest of g1 went on
        d.clock.advance(us=2 * SECOND - 1)  # t0 + 2 s - 1 µs
        d.batch()  # not due yet
        assert [r.payload for r in endpoint.requests].count(b"g1:3:") == 1
        d.clock.advance(us=1)  # t0 + 2 s
        d.batch()  # attempt 2 fails: due 4 s later (multiplier 2)
        second = queued(storage, "billing.rq")[-1]
        assert (second.attempt, second.due_us) == (3, d.t0 + 6 * SECOND)
        d.clock.advance(us=4 * SECOND)  # t0 + 6 s
        d.batch()
        assert d.idle()
    attempts = [r.attempt for r in endpoint.requests if r.payload == b"g1:3:"]
    assert attempts == [1, 2, 3]
    assert len({r.payload for r in endpoint.delivered()}) == 20 == len(endpoint.delivered())


def test_permanent_failures_are_parked_after_the_last_attempt(
    storage: Storage, endpoint: Endpoint
) -> None:
    subscribe(
        storage,
        endpoint,
        grouped=False,
        retry=RetryPolicy(retry_on_status=(503,), min_delay=1, max_attempts=3),
    )
    produce(storage, groups=3, per_group=4)
    endpoint.fail(b"g0:1:", 503)  # always: parked after attempt 3
    endpoint.fail(b"g2:2:", 400)  # not retried: parked at once
    with driver(storage, "billing") as d:
        d.until_idle()
    parked = sorted(queued(storage, "billing.dlq"), key=lambda q: q.payload)
    assert [(q.payload, q.attempt, q.reason) for q in parked] == [
        (b"g0:1:", 4, "HTTP 503"),
        (b"g2:2:", 2, "HTTP 400"),
    ]
    assert [r.attempt for r in endpoint.requests if r.payload == b"g0:1:"] == [1, 2, 3]
    assert len(endpoint.delivered()) == 10


def test_a_failing_message_holds_its_group_while_other_groups_flow(
    storage: Storage, endpoint: Endpoint
) -> None:
    subscribe(storage, endpoint)
    produce(storage, groups=4, per_group=10)
    endpoint.fail(b"g1:2:", 503, times=2)
    with driver(storage, "billing") as d:
        d.batch()
        now = by_group(endpoint.delivered())
        assert now["g1"] == [0, 1]  # held from the failure on
        assert all(now[f"g{g}"] == list(range(10)) for g in (0, 2, 3))
        held = [q.payload for q in queued(storage, "billing.rq")]
        assert held == [f"g1:{n}:".encode() for n in range(2, 10)]  # behind it, in order
        d.until_idle()
    delivered = endpoint.delivered()
    assert by_group(delivered) == {f"g{g}": list(range(10)) for g in range(4)}
    assert len(delivered) == 40


def test_a_parked_message_holds_the_rest_of_its_group_in_the_dlq(
    storage: Storage, endpoint: Endpoint
) -> None:
    subscribe(storage, endpoint)
    produce(storage, groups=3, per_group=6)
    endpoint.fail(b"g2:1:", 400)
    with driver(storage, "billing") as d:
        d.until_idle()
        state, _ = load_state(storage, "billing", 0)
        other, _ = load_state(storage, "billing", 1)
    assert by_group(endpoint.delivered()) == {"g0": list(range(6)), "g1": list(range(6)), "g2": [0]}
    assert [q.payload for q in queued(storage, "billing.dlq")] == [
        f"g2:{n}:".encode() for n in range(1, 6)
    ]
    assert {**state.groups.dlq, **other.groups.dlq}.keys() == {"g2"}


def test_a_batch_run_again_after_its_commit_does_nothing(
    storage: Storage, endpoint: Endpoint
) -> None:
    subscribe(storage, endpoint)
    produce(storage, groups=4, per_group=5)
    endpoint.fail(b"g3:0:", 503, times=1)
    with driver(storage, "billing") as d:
        d.batch()
        rq = queued(storage, "billing.rq")
        ranges = {shard: d.ranges(shard) for shard in range(2)}
        d.batch_id -= 1  # the same batch (same marker) again
        assert d.batch() == [None, None]
        assert queued(storage, "billing.rq") == rq
        assert len(endpoint.requests) == 16  # g3's first failed, the rest followed it
        assert all(not r for r in ranges.values())  # the cursors are at the heads
        d.until_idle()
    assert len(endpoint.delivered()) == 20


def test_a_batch_that_dies_before_its_commit_leaves_nothing_and_runs_again(
    storage: Storage, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscribe(storage, endpoint)
    produce(storage, groups=4, per_group=5)
    endpoint.fail(b"g0:2:", 503, times=1)
    endpoint.fail(b"g1:4:", 400)
    real_commit = batch_module.commit

    def dies(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(batch_module, "commit", dies)
    with driver(storage, "billing") as d:
        with pytest.raises(RuntimeError):
            d.batch()
        assert queued(storage, "billing.rq") == [] and queued(storage, "billing.dlq") == []
        assert load_state(storage, "billing", 0) == load_state(storage, "billing", 1)
        monkeypatch.setattr(batch_module, "commit", real_commit)
        d.batch()
        assert [q.payload for q in queued(storage, "billing.dlq")] == [b"g1:4:"]
        assert [q.payload for q in queued(storage, "billing.rq")] == [
            b"g0:2:",
            b"g0:3:",
            b"g0:4:",
        ]
        d.until_idle()
    assert sorted({r.payload for r in endpoint.delivered()}) == sorted(
        f"g{g}:{n}:".encode() for g in range(4) for n in range(5) if (g, n) != (1, 4)
    )


def test_retry_due_and_idle_follow_the_queue(storage: Storage, endpoint: Endpoint) -> None:
    subscribe(storage, endpoint, grouped=False)
    produce(storage, groups=2, per_group=2)
    endpoint.fail(b"g0:0:", 503, times=1)
    definition = Definitions(storage).get("billing")
    assert definition is not None
    with driver(storage, "billing") as d:
        assert not d.idle()
        d.batch()
        assert not d.idle()
        assert not retry_due(storage, definition, now=d.t0 + 2 * SECOND - 1)
        assert retry_due(storage, definition, now=d.t0 + 2 * SECOND)
        d.clock.advance(us=2 * SECOND)  # t0 + 2 s
        d.batch()
        assert d.idle()
        assert not retry_due(storage, definition, now=d.t0 + 100 * SECOND)


@pytest.mark.parametrize("grouped", [False, True])
def test_attempts_in_flight_are_bounded_by_the_policy(storage: Storage, grouped: bool) -> None:
    """At most max_in_flight attempts at once (ungrouped), at most
    max_parallel_groups groups at once (grouped: one attempt per group)."""
    with Endpoint(delay=0.02) as slow:
        subscribe(storage, slow, grouped=grouped, shards=1)
        produce(storage, groups=12, per_group=3)
        with driver(storage, "billing") as d:
            d.batch()
        assert len(slow.delivered()) == 36
        assert 1 < slow.most <= (4 if grouped else 8)


def test_a_batch_after_one_that_did_not_commit_reads_what_that_one_left(
    storage: Storage, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark moves on after a batch whose shard was superseded (nothing
    committed): the next batch starts at the cursor, not at Spark's offsets."""
    subscribe(storage, endpoint, shards=1)
    produce(storage, groups=4, per_group=3)
    real_commit = batch_module.commit

    def superseded(*args: object, **kwargs: object) -> bool:
        raise batch_module.Superseded("another run committed first")

    with driver(storage, "billing") as d:
        first = d.ranges(0)
        monkeypatch.setattr(batch_module, "commit", superseded)
        with pytest.raises(batch_module.Superseded):
            d.batch()
        monkeypatch.setattr(batch_module, "commit", real_commit)
        later = [
            batch_module.MainRange(r.stream_key, r.generation, r.partition, r.end, r.end)
            for r in first
        ]
        runner = d._runner()
        stats = d.loop.run_until_complete(runner.run_batch(0, later, "m"))
        assert stats is not None and stats.delivered == 12
    assert len({r.payload for r in endpoint.delivered()}) == 12


@pytest.mark.parametrize("grouped", [False, True])
def test_short_retries_wait_inside_the_batch(
    storage: Storage, endpoint: Endpoint, grouped: bool
) -> None:
    """A retry due within inline_max_delay is made after its delay in the same
    batch: no trip through the retry queue, the group's order kept."""
    subscribe(
        storage,
        endpoint,
        grouped=grouped,
        retry=RetryPolicy(retry_on_status=(503,), min_delay=0.05, max_attempts=4),
    )
    produce(storage, groups=3, per_group=4)
    endpoint.fail(b"g1:1:", 503, times=2)
    endpoint.fail(b"g2:0:", 503, times=9)  # out of inline waits (and attempts): queue
    with driver(storage, "billing") as d:
        (first, second) = d.batch()
        stats = [s for s in (first, second) if s is not None]
        assert sum(s.retried_inline for s in stats) == 2 + 3
        assert [r.attempt for r in endpoint.requests if r.payload == b"g1:1:"] == [1, 2, 3]
        assert [q.payload for q in queued(storage, "billing.rq")] == []
        assert [q.payload for q in queued(storage, "billing.dlq")][:1] == [b"g2:0:"]
    got = {
        g: seqs if grouped else sorted(seqs) for g, seqs in by_group(endpoint.delivered()).items()
    }
    assert got["g1"] == [0, 1, 2, 3] and got["g0"] == [0, 1, 2, 3]  # grouped: in order
    assert got.get("g2", []) == ([] if grouped else [1, 2, 3])
