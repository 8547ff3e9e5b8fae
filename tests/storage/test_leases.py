"""Leases over the KV namespace, on both backends."""

from __future__ import annotations

import threading

import pytest

from riverbed.errors import InvalidInput, LeaseHeld, PreconditionFailed
from riverbed.storage import Storage, open_storage
from riverbed.storage.leases import Lease, Leases

S = 1_000_000  # one second in µs


def test_acquire_renew_release(storage: Storage) -> None:
    leases = Leases(storage)
    assert leases.get("leader/g") is None
    lease = leases.acquire("leader/g", "node-a", 10 * S, now_us=0)
    assert (lease.owner, lease.expires_us) == ("node-a", 10 * S)
    assert leases.get("leader/g") == lease
    renewed = leases.renew(lease, 10 * S, now_us=5 * S)
    assert renewed.expires_us == 15 * S and renewed.version > lease.version
    leases.release(renewed)
    assert leases.get("leader/g") is None


def test_another_owner_waits_for_expiry(storage: Storage) -> None:
    leases = Leases(storage)
    first = leases.acquire("x", "a", 10 * S, now_us=0)
    with pytest.raises(LeaseHeld, match="held by 'a'"):
        leases.acquire("x", "b", 10 * S, now_us=9 * S)
    assert leases.get("x") == first  # the refusal changed nothing
    taken = leases.acquire("x", "b", 10 * S, now_us=10 * S)
    assert taken.owner == "b"


def test_the_holder_may_acquire_again(storage: Storage) -> None:
    leases = Leases(storage)
    first = leases.acquire("x", "a", 10 * S, now_us=0)
    again = leases.acquire("x", "a", 10 * S, now_us=1 * S)
    assert again.expires_us == 11 * S and again.version > first.version


def test_a_stale_holder_is_fenced_off(storage: Storage) -> None:
    leases = Leases(storage)
    stale = leases.acquire("x", "a", 10 * S, now_us=0)
    leases.acquire("x", "b", 10 * S, now_us=20 * S)  # a's lease expired; b took it
    # a's clock lags: it believes its lease still runs, but the version moved on.
    with pytest.raises(PreconditionFailed):
        leases.renew(stale, 10 * S, now_us=5 * S)
    with pytest.raises(PreconditionFailed):
        leases.release(stale)
    assert leases.get("x") is not None and leases.get("x").owner == "b"  # type: ignore[union-attr]


def test_renewing_an_expired_lease_is_refused(storage: Storage) -> None:
    leases = Leases(storage)
    lease = leases.acquire("x", "a", 10 * S, now_us=0)
    with pytest.raises(PreconditionFailed, match="expired"):
        leases.renew(lease, 10 * S, now_us=10 * S)


@pytest.mark.parametrize(("owner", "ttl"), [("", S), ("a", 0), ("a", -1), ("a", True)])
def test_bad_arguments_change_nothing(storage: Storage, owner: str, ttl: int) -> None:
    with pytest.raises(InvalidInput):
        Leases(storage).acquire("x", owner, ttl, now_us=0)
    assert Leases(storage).get("x") is None


def test_concurrent_candidates_elect_exactly_one(storage_url: str) -> None:
    """Eight candidates, each with its own connection, race for one lease."""
    winners: list[Lease] = []
    losers: list[str] = []
    start = threading.Barrier(8)

    def candidate(name: str) -> None:
        storage = open_storage(storage_url)
        try:
            start.wait()
            winners.append(Leases(storage).acquire("leader", name, 30 * S, now_us=0))
        except LeaseHeld:
            losers.append(name)
        finally:
            storage.close()

    threads = [threading.Thread(target=candidate, args=(f"c{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and len(losers) == 7


def test_renew_many_renews_each_lease_alone_in_one_go(storage: Storage) -> None:
    """Several leases renewed in one transaction: each succeeds or is refused
    as `renew` would (moved on, expired by our clock), the refused untouched."""
    leases = Leases(storage)
    ours = leases.acquire("a", "n1", 10 * S, now_us=0)
    stale = leases.acquire("b", "n1", 10 * S, now_us=0)
    taken = leases.acquire("b", "n2", 10 * S, now_us=20 * S)  # b expired; n2 took it
    late = leases.acquire("c", "n1", 10 * S, now_us=0)
    late = leases.renew(late, 1 * S, now_us=1 * S)  # expires at 2 s
    out = leases.renew_many([ours, stale, late], 10 * S, now_us=5 * S)
    renewed, refused, expired = out
    assert isinstance(renewed, Lease) and renewed.expires_us == 15 * S
    assert leases.get("a") == renewed and renewed.version > ours.version
    assert isinstance(refused, PreconditionFailed) and "not at version" in str(refused)
    assert leases.get("b") == taken
    assert isinstance(expired, PreconditionFailed) and "expired" in str(expired)
    assert leases.get("c") == late
    # The renewed record fences as one written by `renew` does.
    with pytest.raises(PreconditionFailed):
        leases.renew(ours, 10 * S, now_us=6 * S)
    assert leases.renew_many([], 10 * S, now_us=6 * S) == []


def test_renew_many_refuses_a_bad_ttl_before_writing(storage: Storage) -> None:
    leases = Leases(storage)
    lease = leases.acquire("a", "n1", 10 * S, now_us=0)
    with pytest.raises(InvalidInput, match="time-to-live"):
        leases.renew_many([lease], 0, now_us=1 * S)
    assert leases.get("a") == lease
