"""What the tests of `riverbed subscription run` share, wherever Spark runs
(this process, a cluster, Spark Connect): the workload (`setup`) and the check
of its outcome (`check_outcome`)."""

from __future__ import annotations

from collections import Counter

from harness.delivery import produce_groups, subscribe
from harness.endpoint import Endpoint, Request
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import ConsumptionPolicy, RetryPolicy
from riverbed.subscriptions.queues import QueuedMessage


def setup(
    url: str, endpoint: Endpoint, groups: int, per_group: int, shards: int = 2, inline: float = 0.5
) -> None:
    """`inline=0`: every retry through the retry queue."""
    storage = open_storage(url)
    try:
        subscribe(
            storage,
            endpoint.url,
            shards=shards,
            retry=RetryPolicy(
                retry_on_status=(503,),
                min_delay=0.2,
                max_delay=1,
                max_attempts=3,
                inline_max_delay=inline,
            ),
            consumption=ConsumptionPolicy(max_in_flight=16, max_parallel_groups=16),
        )
        produce_groups(storage, groups, 0, per_group)
    finally:
        storage.close()


def check_outcome(
    delivered: list[Request],
    rq: list[QueuedMessage],
    parked: list[QueuedMessage],
    groups: int,
    per_group: int,
    expected_parked: set[bytes],
    copies: int = 1,
) -> int:
    """Nothing lost, no queue entry twice, first deliveries in group order;
    returns how many deliveries were repeats."""
    payloads = Counter(r.payload for r in delivered)
    parked_payloads = Counter(q.payload for q in parked)
    everything = {f"g{g}:{n}:".encode() for g in range(groups) for n in range(per_group)}
    assert set(payloads) | set(parked_payloads) == everything
    assert set(parked_payloads) == expected_parked
    # One RQ entry per (message, attempt); a reshard copies what it feeds (`copies`).
    assert max(Counter((q.message_id, q.attempt) for q in rq).values(), default=1) <= copies
    assert max(parked_payloads.values(), default=1) == 1
    first: dict[str, list[int]] = {}
    seen: set[bytes] = set()
    for r in delivered:
        if r.payload not in seen:
            seen.add(r.payload)
            group, seq, _ = r.payload.split(b":")
            first.setdefault(group.decode(), []).append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in first.values())
    return sum(count - 1 for count in payloads.values())
