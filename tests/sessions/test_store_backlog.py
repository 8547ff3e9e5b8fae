"""What the session store tells operators, on both backends: a session's
backlog (exact or an upper bound) and the broker nodes' liveness leases."""

from __future__ import annotations

from harness.storage import accept_any, create_topic, numbered_rows, topic_record
from riverbed.sessions.session import Subscription
from riverbed.sessions.store import SessionRecord, SessionStore, node_lease
from riverbed.storage import Storage
from riverbed.storage.leases import Leases


def session(*filters: str, topics: tuple[str, ...]) -> SessionRecord:
    return SessionRecord(
        "c",
        "s1",
        5,
        60,
        False,
        1_000_000,
        subscriptions=tuple(Subscription(f, 1) for f in filters),
        topics=topics,
    )


def test_backlog_counts_from_the_cursors_and_says_when_it_is_exact(storage: Storage) -> None:
    storage.create_topic(topic_record("bound", binding="dev/#"), 2, accept_any)
    a, b = (h.key for h in storage.list_streams("bound"))
    loose = create_topic(storage, "loose")[0].key  # no binding: it stores anything
    storage.append({a: numbered_rows(4), b: numbered_rows(2), loose: numbered_rows(3)})
    store = SessionStore(storage)
    store.ensure_cursors("s1", ["bound"], None, {a: 1, b: 2})

    backlog = store.backlog(session("dev/#", topics=("bound",)))
    assert (backlog.messages, backlog.exact) == (3, True)
    # A narrower filter: the topic holds messages it does not match.
    narrow = store.backlog(session("dev/kitchen/+", topics=("bound",)))
    assert (narrow.messages, narrow.exact) == (3, False)

    store.ensure_cursors("s1", ["loose"], None, {loose: 0})
    both = store.backlog(session("dev/#", "#", topics=("bound", "loose")))
    assert (both.messages, both.exact) == (6, False)
    # Nothing owed on the loose topic: what is owed is exact again.
    store.ensure_cursors("s2", ["bound", "loose"], None, {a: 1, b: 2})
    caught_up = SessionRecord(
        "d",
        "s2",
        5,
        60,
        False,
        1,
        subscriptions=(Subscription("dev/#", 1),),
        topics=("bound", "loose"),
    )
    assert store.backlog(caught_up).exact


def test_node_leases_and_who_is_online(storage: Storage) -> None:
    leases = Leases(storage)
    leases.acquire(node_lease("up"), "up", 60_000_000, 1_000_000)
    leases.acquire(node_lease("down"), "down", 1_000_000, 1_000_000)
    leases.acquire("not-a-node", "x", 60_000_000, 1_000_000)
    store = SessionStore(storage)
    found = store.node_leases()
    assert sorted(found) == ["down", "up"]
    live = {n for n, lease in found.items() if not lease.expired(10_000_000)}
    assert live == {"up"}
    on_up = SessionRecord("c", "s", 5, 60, True, 1, node="up")
    assert store.online(on_up, live)
    assert not store.online(SessionRecord("c", "s", 5, 60, True, 1, node="down"), live)
    assert not store.online(SessionRecord("c", "s", 5, 60, False, 1, node="up"), live)
