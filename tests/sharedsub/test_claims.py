"""The leader claim and the persisted group state, on both backends."""

from __future__ import annotations

import threading

import pytest

from harness.storage import accept_any, create_topic, numbered_rows, raw_connection, topic_record
from harness.waiting import eventually
from riverbed.errors import AlreadyExists, InvalidInput, LeaseHeld, NotFound, PreconditionFailed
from riverbed.log.retention import apply_retention
from riverbed.model import StreamId
from riverbed.sharedsub.claims import (
    LENT_NAMESPACE,
    RELEASED_NAMESPACE,
    GroupStore,
    Save,
    lend,
    lent_key,
    released_key,
    released_offsets,
    start_offsets,
)
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import RetentionPolicy
from riverbed.storage.transactions import kv_hold_in, kv_write_in, transaction

S = 1_000_000
G = GroupId("g", "t/#")
S0 = StreamId("t", 0, 0)


def test_create_get_list_delete(storage: Storage) -> None:
    groups = GroupStore(storage)
    record = groups.create(G, start_us=5 * S, now_us=10 * S)
    assert (record.start_us, record.created_us, record.leader) == (5 * S, 10 * S, None)
    assert groups.get(G) == record
    with pytest.raises(AlreadyExists):
        groups.create(G, start_us=None, now_us=11 * S)
    assert [r.group for r in groups.list()] == [G]
    groups.delete(G)
    assert groups.get(G) is None
    with pytest.raises(NotFound):
        groups.delete(G)
    with pytest.raises(InvalidInput, match="group start"):
        groups.create(G, start_us=-1, now_us=0)


def test_claim_save_and_resume(storage: Storage) -> None:
    groups = GroupStore(storage)
    claim = groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)  # creates the group
    assert claim.record.leader == "leader-1" and claim.record.start_us == 0
    claim = groups.save(claim, {S0: 7}, [StreamId("t", 0, 1)], now_us=1 * S)
    claim = groups.renew(claim, ttl_us=30 * S, now_us=20 * S)
    claim = groups.save(claim, {S0: 9}, now_us=21 * S)
    groups.release(claim)
    resumed = groups.claim(G, "leader-2", ttl_us=30 * S, now_us=22 * S)
    assert resumed.record.progress == {S0: 9} and resumed.record.leader == "leader-2"


def release(storage: Storage, group: GroupId, stream_key: int, *offsets: int) -> None:
    """What a member's session writes once its client has these QoS 2 messages."""
    for offset in offsets:
        storage.kv_put(RELEASED_NAMESPACE, released_key(group, stream_key, offset), b"member")


def test_a_save_forgets_the_released_offsets_its_progress_passed(storage: Storage) -> None:
    heads = create_topic(storage, "t", partitions=2)
    s0, s1 = heads[0].stream, heads[1].stream
    other = GroupId("h", "t/#")
    groups = GroupStore(storage)
    claim = groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)
    release(storage, G, heads[0].key, 3, 4, 9, 10, 11)
    release(storage, G, heads[1].key, 2)
    release(storage, other, heads[0].key, 3)
    assert released_offsets(storage, G, heads[0].key, 4) == {4, 9, 10, 11}
    # Lent from 4 on: 3 is below where the stream starts, never read as released.
    claim = groups.save(claim, {s0: 10, s1: 0}, now_us=1 * S)
    assert released_offsets(storage, G, heads[0].key, 0) == {10, 11}
    assert released_offsets(storage, G, heads[1].key, 0) == {2}
    assert released_offsets(storage, other, heads[0].key, 0) == {3}  # another group's
    # A save of a new Leader (its claim's progress is the saved one) passes them too.
    claim = groups.claim(G, "leader-2", ttl_us=30 * S, now_us=31 * S)
    groups.save(claim, {s0: 12, s1: 3}, now_us=32 * S)
    assert released_offsets(storage, G, heads[0].key, 0) == set()
    assert released_offsets(storage, G, heads[1].key, 0) == set()
    # Deleting a group deletes what was released to it.
    release(storage, G, heads[0].key, 20)
    groups.delete(G)
    assert released_offsets(storage, G, heads[0].key, 0) == set()
    assert released_offsets(storage, other, heads[0].key, 0) == {3}


def test_each_grant_bumps_its_streams_lending_key_and_reads_what_was_released(
    storage: Storage,
) -> None:
    (head,) = create_topic(storage, "t")
    groups = GroupStore(storage)
    groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)
    release(storage, G, head.key, 2, 5)
    first = lend(storage, G, head.key, 3, b"x")
    assert first.skip == {5}
    second = lend(storage, G, head.key, 0, b"y")
    assert second.version == first.version + 1 and second.skip == {2, 5}
    lent = storage.kv_get(LENT_NAMESPACE, lent_key(G, head.key))
    assert lent is not None and (lent.value, lent.version) == (b"y", second.version)
    # A write holding the key at the first grant's version is refused now.
    with transaction(storage) as tx:
        assert not kv_hold_in(tx, LENT_NAMESPACE, lent_key(G, head.key), first.version)
        assert kv_hold_in(tx, LENT_NAMESPACE, lent_key(G, head.key), second.version)
    other = GroupId("h", "t/#")
    assert lend(storage, other, head.key, 0, b"z") == type(first)(1, frozenset())
    groups.delete(G)  # with its lending keys
    assert [e.key for e in storage.kv_list(LENT_NAMESPACE)] == [lent_key(other, head.key)]


def test_a_grant_waits_for_a_released_write_holding_its_stream_and_reads_it(
    postgres_url: str,
) -> None:
    """PostgreSQL, read committed: the write of a member lent the stream before
    holds the lending key (a share lock) while it writes its released entry;
    a grant's bump waits for it, then its read sees the entry. (SQLite's write
    transactions exclude each other anyway.)"""
    storage = open_storage(postgres_url)
    try:
        (head,) = create_topic(storage, "t")
        before = lend(storage, G, head.key, 0, b"x")
        holding = threading.Event()
        commit = threading.Event()

        def member_writes() -> None:
            with transaction(storage) as tx:
                assert kv_hold_in(tx, LENT_NAMESPACE, lent_key(G, head.key), before.version)
                kv_write_in(tx, RELEASED_NAMESPACE, released_key(G, head.key, 7), b"x", None)
                holding.set()
                assert commit.wait(60)

        member = threading.Thread(target=member_writes)
        member.start()
        assert holding.wait(60)
        lent: list[object] = []
        grant = threading.Thread(target=lambda: lent.append(lend(storage, G, head.key, 0, b"y")))
        grant.start()
        with raw_connection(postgres_url) as pg:
            eventually(
                lambda: pg.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0],
                what="the grant waiting for the member's write",
            )
        assert not lent
        commit.set()
        member.join()
        grant.join()
        (after,) = lent
        assert after == type(before)(before.version + 1, frozenset({7}))
    finally:
        storage.close()


def test_one_leader_at_a_time_and_a_stale_one_is_fenced_off(storage: Storage) -> None:
    groups = GroupStore(storage)
    old = groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)
    with pytest.raises(LeaseHeld):
        groups.claim(G, "leader-2", ttl_us=30 * S, now_us=29 * S)
    new = groups.claim(G, "leader-2", ttl_us=30 * S, now_us=30 * S)  # expired: taken over
    # The old Leader's clock lags: its claim looks alive, but its write is refused.
    with pytest.raises(PreconditionFailed):
        groups.save(old, {S0: 100}, now_us=10 * S)
    with pytest.raises(PreconditionFailed):
        groups.renew(old, ttl_us=30 * S, now_us=10 * S)
    groups.save(new, {S0: 3}, now_us=31 * S)
    record = groups.get(G)
    assert record is not None and record.progress == {S0: 3} and record.leader == "leader-2"
    assert groups.leader_of(G, now_us=31 * S) is not None
    assert groups.leader_of(G, now_us=61 * S) is None


def test_save_many_saves_each_group_or_refuses_it_alone(storage: Storage) -> None:
    """One transaction for several Leaders' saves; a fenced-off or expired one
    is refused (as `save` would) and the others are written."""
    groups = GroupStore(storage)
    h = GroupId("h", "t/#")
    e = GroupId("e", "t/#")
    old = groups.claim(G, "leader-1", ttl_us=60 * S, now_us=0)
    new = groups.save(old, {S0: 2}, now_us=1 * S)  # `old` is now a stale copy
    fine = groups.claim(h, "leader-3", ttl_us=30 * S, now_us=30 * S)
    expired = groups.claim(e, "leader-4", ttl_us=1 * S, now_us=30 * S)
    results = groups.save_many(
        [
            Save(old, {S0: 100}, []),
            Save(fine, {S0: 5}, [StreamId("t", 0, 1)], {"b1": [S0]}),
            Save(expired, {S0: 6}, []),
        ],
        now_us=40 * S,
    )
    assert isinstance(results[0], PreconditionFailed) and "version" in str(results[0])
    assert isinstance(results[2], PreconditionFailed) and "expired" in str(results[2])
    saved = results[1]
    assert not isinstance(saved, PreconditionFailed)
    assert groups.get(h) == saved.record  # what the claim holds is what was written
    assert saved.record.progress == {S0: 5} and saved.record.holdings == {"b1": (S0,)}
    record = groups.get(G)
    assert record is not None and record.progress == {S0: 2}
    record = groups.get(e)
    assert record is not None and record.progress == {}
    # The new claims are good for the next save (their versions moved).
    groups.save(saved, {S0: 7}, now_us=41 * S)
    (again,) = groups.save_many([Save(new, {S0: 3}, [])], now_us=41 * S)
    assert not isinstance(again, PreconditionFailed) and groups.get(G) == again.record


def test_a_leader_whose_claim_expired_does_not_save(storage: Storage) -> None:
    groups = GroupStore(storage)
    claim = groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)
    with pytest.raises(PreconditionFailed, match="expired"):
        groups.save(claim, {S0: 1}, now_us=30 * S)


def test_deleting_a_group_fences_its_leader(storage: Storage) -> None:
    groups = GroupStore(storage)
    claim = groups.claim(G, "leader-1", ttl_us=30 * S, now_us=0)
    groups.delete(G)
    with pytest.raises(PreconditionFailed):
        groups.save(claim, {S0: 1}, now_us=1 * S)
    assert groups.leader_of(G, now_us=1 * S) is None


def test_start_offsets_from_the_group_start(storage: Storage) -> None:
    heads = create_topic(storage, "t", 1)
    key = heads[0].key
    rows = numbered_rows(4)
    rows = [(r[0], ts, *r[2:]) for r, ts in zip(rows, [10, 20, 30, 40], strict=True)]
    storage.append({key: rows})
    heads = storage.list_streams("t")
    assert start_offsets(storage, heads, None) == {heads[0].stream: 0}
    assert start_offsets(storage, heads, 25) == {heads[0].stream: 2}


def test_ensure_creates_a_group_once_and_keeps_an_existing_start(storage: Storage) -> None:
    store = GroupStore(storage)
    fresh = GroupId("fresh", "w/#")
    store.ensure(fresh, now_us=100)
    record = store.get(fresh)
    assert record is not None and record.start_us == 100
    store.ensure(fresh, now_us=200)  # a second member: the group as it was
    again = store.get(fresh)
    assert again is not None and again.start_us == 100 and again.version == record.version
    past = GroupId("past", "w/#")
    store.create(past, start_us=None, now_us=50)  # `riverbed group create --start earliest`
    store.ensure(past, now_us=300)
    kept = store.get(past)
    assert kept is not None and kept.start_us is None


def test_retention_keeps_what_a_group_has_not_consumed(storage: Storage) -> None:
    """A group's progress lives in its record; its named subscription per topic
    pins retention at the group's position (it used to pin nothing: a group's
    unread messages went at once with the `consumed` policy)."""
    storage.create_topic(
        topic_record("t", binding="t/#", retention_policy=RetentionPolicy.CONSUMED),
        1,
        accept_any,
    )
    (head,) = storage.list_streams("t")
    groups = GroupStore(storage)
    groups.create(G, start_us=None, now_us=0)
    storage.append({head.key: numbered_rows(10)})
    apply_retention(storage, "t")
    assert [m.offset for m in storage.read(head.key, 0, 100)] == list(range(10))
    claim = groups.claim(G, "leader-1", ttl_us=60 * S, now_us=1 * S)
    claim = groups.save(claim, {head.stream: 4}, now_us=2 * S)
    apply_retention(storage, "t")
    assert [m.offset for m in storage.read(head.key, 0, 100)] == list(range(4, 10))
    # In one transaction for several groups too.
    (saved,) = groups.save_many([Save(claim, {head.stream: 7}, [])], now_us=3 * S)
    assert not isinstance(saved, PreconditionFailed)
    apply_retention(storage, "t")
    assert [m.offset for m in storage.read(head.key, 0, 100)] == [7, 8, 9]
    # A refused save moves nothing.
    (refused,) = groups.save_many([Save(claim, {head.stream: 9}, [])], now_us=4 * S)
    assert isinstance(refused, PreconditionFailed)
    apply_retention(storage, "t")
    assert [m.offset for m in storage.read(head.key, 0, 100)] == [7, 8, 9]
    # Deleting the group lets go of its topics.
    groups.delete(G)
    apply_retention(storage, "t")
    assert storage.read(head.key, 0, 100) == []


def test_a_group_deleted_elsewhere_and_created_again_pins_retention_again(
    storage: Storage,
) -> None:
    storage.create_topic(
        topic_record("t", binding="t/#", retention_policy=RetentionPolicy.CONSUMED),
        1,
        accept_any,
    )
    (head,) = storage.list_streams("t")
    broker, cli = GroupStore(storage), GroupStore(storage)
    broker.create(G, start_us=None, now_us=0)
    cli.delete(G)  # `riverbed group delete`, another process
    broker.create(G, start_us=None, now_us=1)
    storage.append({head.key: numbered_rows(3)})
    apply_retention(storage, "t")
    assert [m.offset for m in storage.read(head.key, 0, 100)] == [0, 1, 2]
