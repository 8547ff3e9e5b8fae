"""Grouped order (issue 7, seed 003's GroupState), model-checked on the real
pipeline: hypothesis chooses how each attempt of each message ends (delivered,
a retryable failure, a permanent one), how many main-topic messages each batch
takes, and how far the clock moves between batches; the shards run batch by
batch on SQLite (`harness.delivery.Driver`) with an in-process endpoint.
Whatever happens:

- every message ends delivered or parked, exactly once (no crash here, so no
  repeat either);
- a group's deliveries keep main-topic order, and so do its parked messages;
- nothing of a group is delivered after its first parked message;
- the retry queue drains and the shards' GroupState for it empties.

And with DLQ replays and purges at any point: each message ends delivered
once or purged, a group's deliveries in main-topic order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.delivery import driver
from riverbed.log.log import Log
from riverbed.log.topics import Topics
from riverbed.model import Message, StoredMessage
from riverbed.storage import open_storage
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import (
    CallableEndpoint,
    ConsumptionPolicy,
    DeliveryDefinition,
    RetryPolicy,
)
from riverbed.subscriptions.dlq import Selection, parked, purge, replay
from riverbed.subscriptions.endpoint import Attempt, Outcome
from riverbed.subscriptions.provisioning import create_delivering
from riverbed.subscriptions.shardstate import load_states

MAX_ATTEMPTS = 3
OUTCOMES = {"ok": Outcome.DELIVERED, "retry": Outcome.RETRY, "fail": Outcome.FAILED}


class Scripted:
    """An endpoint that answers each (message, attempt) as the script says (ok
    when it says nothing) and records what it delivered."""

    def __init__(self, script: dict[tuple[int, int], str]) -> None:
        self.script = script
        self.delivered: list[int] = []

    async def deliver(self, message: StoredMessage, attempt: int) -> Attempt:
        n = int(message.payload)
        outcome = OUTCOMES[self.script.get((n, attempt), "ok")]
        if outcome is Outcome.DELIVERED:
            self.delivered.append(n)
        return Attempt(outcome, "" if outcome is Outcome.DELIVERED else "scripted")

    async def close(self) -> None:
        pass


@contextmanager
def subscription(groups: int, per_group: int, shards: int) -> Iterator[Storage]:
    with tempfile.TemporaryDirectory() as directory:
        storage = open_storage(f"sqlite:///{directory}/r.db")
        try:
            Topics(storage).create("orders", 4)
            create_delivering(
                storage,
                DeliveryDefinition(
                    "billing",
                    "orders",
                    CallableEndpoint("unused:endpoint"),
                    shard_count=shards,
                    retry=RetryPolicy(
                        retry_on_status=(), min_delay=1, max_delay=4, max_attempts=MAX_ATTEMPTS
                    ),
                    consumption=ConsumptionPolicy(max_in_flight=4, max_parallel_groups=3),
                ),
            )
            log = Log(storage)
            try:
                log.produce(
                    "orders",
                    [
                        Message(str(n).encode(), key=f"g{n % groups}")
                        for n in range(groups * per_group)
                    ],
                )
            finally:
                log.appender.close()
            yield storage
        finally:
            storage.close()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, int, dict[tuple[int, int], str], list[int]]:
    groups = draw(st.integers(1, 4))
    per_group = draw(st.integers(1, 6))
    shards = draw(st.sampled_from([1, 2]))
    count = groups * per_group
    script = draw(
        st.dictionaries(
            st.tuples(st.integers(0, count - 1), st.integers(1, MAX_ATTEMPTS)),
            st.sampled_from(["retry", "fail", "ok"]),
            max_size=count,
        )
    )
    steps = draw(st.lists(st.integers(0, 3_000_000), min_size=1, max_size=8))
    return groups, per_group, shards, script, steps


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(1, 4))
def test_grouped_order_holds_whatever_fails(
    scenario: tuple[int, int, int, dict[tuple[int, int], str], list[int]], limit: int
) -> None:
    groups, per_group, shards, script, steps = scenario
    endpoint = Scripted(script)
    with (
        subscription(groups, per_group, shards) as storage,
        driver(storage, "billing", endpoint) as d,
    ):
        for step in steps:  # batches of `limit` messages per stream, the clock moving
            d.batch(limit)
            d.clock.advance(us=step)
        d.until_idle(limit=limit)
        parked = [
            int(m.payload)
            for head in storage.list_streams("billing.dlq")
            for m in storage.read(head.key, head.start_offset, 1000)
        ]
        states = load_states(storage, "billing")
    delivered = endpoint.delivered
    assert sorted(delivered + parked) == list(range(groups * per_group))
    for g in range(groups):
        mine = [n for n in delivered if n % groups == g]
        mine_parked = [n for n in parked if n % groups == g]
        assert mine == sorted(mine)
        assert mine_parked == sorted(mine_parked)
        if mine_parked:
            assert all(n < mine_parked[0] for n in mine)
    for state in states.values():
        assert state.groups.rq == {} and state.retries == {}


Action = tuple[str, int, int]
"""("batch", messages per stream, clock step µs) | ("replay", group, 0) |
("replay-all", 0, 0) | ("purge-first", group, 0)."""


@st.composite
def with_operations(draw: st.DrawFn) -> tuple[int, int, dict[tuple[int, int], str], list[Action]]:
    groups = draw(st.integers(1, 4))
    per_group = draw(st.integers(1, 6))
    count = groups * per_group
    script = draw(
        st.dictionaries(
            st.tuples(st.integers(0, count - 1), st.integers(1, MAX_ATTEMPTS)),
            st.sampled_from(["retry", "fail", "ok"]),
            max_size=count,
        )
    )
    actions = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("batch"), st.integers(1, 3), st.integers(0, 3_000_000)),
                st.tuples(st.just("replay"), st.integers(0, groups - 1), st.just(0)),
                st.tuples(st.just("replay-all"), st.just(0), st.just(0)),
                st.tuples(st.just("purge-first"), st.integers(0, groups - 1), st.just(0)),
            ),
            min_size=1,
            max_size=12,
        )
    )
    return groups, per_group, script, actions


@settings(max_examples=150, deadline=None)
@given(with_operations())
def test_replays_and_purges_keep_group_order(
    scenario: tuple[int, int, dict[tuple[int, int], str], list[Action]],
) -> None:
    """DLQ replays (a group, everything) and purges (a group's first parked
    message) at any point: each message ends delivered once or purged, and a
    group's deliveries keep main-topic order."""
    groups, per_group, script, actions = scenario
    endpoint = Scripted(script)
    purged: set[int] = set()
    with subscription(groups, per_group, 2) as storage, driver(storage, "billing", endpoint) as d:
        for kind, value, step in actions:
            if kind == "batch":
                d.batch(value)
                d.clock.advance(us=step)
            elif kind == "replay":
                replay(storage, "billing", Selection(groups=frozenset({f"g{value}"})), d.now)
            elif kind == "replay-all":
                replay(storage, "billing", Selection(everything=True), d.now)
            else:
                mine = sorted(
                    (
                        p
                        for p in parked(storage, "billing", limit=1000)
                        if p.message.key == f"g{value}"
                    ),
                    key=lambda p: p.message.main_offset,
                )
                if mine:
                    first = mine[0].message
                    change = purge(
                        storage, "billing", Selection(message_ids=frozenset({first.message_id}))
                    )
                    assert change.selected == 1 and change.along == 0
                    purged.add(int(first.payload))
        d.until_idle(limit=3)
        endpoint.script = {}  # everything succeeds from now on
        while parked(storage, "billing", limit=1):
            replay(storage, "billing", Selection(everything=True), d.now)
            d.until_idle()
    delivered = endpoint.delivered
    assert sorted(delivered + sorted(purged)) == list(range(groups * per_group))
    for g in range(groups):
        mine = [n for n in delivered if n % groups == g]
        assert mine == sorted(mine)
