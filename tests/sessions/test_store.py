"""The session store on both backends: records fenced by version, cursors, expiry."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.storage import create_topic, numbered_rows
from riverbed.errors import PreconditionFailed
from riverbed.sessions.session import Subscription
from riverbed.sessions.store import (
    NEVER_EXPIRES,
    SessionRecord,
    SessionStore,
    Stored,
    cursor_name,
    node_lease,
    qos2_marker,
)
from riverbed.storage import Storage
from riverbed.storage.leases import Leases


def record(client_id: str = "c", session_id: str = "s1", **changes: object) -> SessionRecord:
    base = SessionRecord(client_id, session_id, 5, 60, True, 1_000_000)
    return SessionRecord(**{**{f: getattr(base, f) for f in base.__slots__}, **changes})  # type: ignore[arg-type]


def count_reads_of_all(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each `SessionStore.all` from now on."""
    reads: list[int] = []
    real = SessionStore.all

    def counting(self: SessionStore) -> list[Stored]:
        reads.append(1)
        return real(self)

    monkeypatch.setattr(SessionStore, "all", counting)
    return reads


def test_record_round_trips() -> None:
    r = record(
        subscriptions=(Subscription("a/#", 1, True, False, 2, 9),),
        topics=("mqtt",),
        sent={3: 7},
        disconnected_us=5,
    )
    assert SessionRecord.from_json(r.to_json()) == r


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)


@given(
    client_id=_text,
    topic_filter=_text,
    will=st.none() | _text,
    sent=st.dictionaries(st.integers(0, 2**40), st.integers(0, 2**62), max_size=4),
    seen_us=st.integers(0, 2**62),
)
def test_any_record_round_trips_and_reads_what_the_stdlib_wrote(
    client_id: str, topic_filter: str, will: str | None, sent: dict[int, int], seen_us: int
) -> None:
    """Whatever text a client sends (any UTF-8), and records written before
    records were written with orjson (the stdlib's `json`, non-ASCII escaped)."""
    r = record(
        client_id,
        subscriptions=(Subscription(topic_filter, 2, False, True, 1, None),),
        topics=(topic_filter,),
        sent=sent,
        will=will,
        seen_us=seen_us,
    )
    assert SessionRecord.from_json(r.to_json()) == r
    older = json.dumps(json.loads(r.to_json()), separators=(",", ":")).encode()
    assert SessionRecord.from_json(older) == r


def test_expiry() -> None:
    r = record(expiry_interval=10, disconnected_us=1_000_000)
    assert not r.expired(10_999_999)
    assert r.expired(11_000_000)
    assert not record(expiry_interval=NEVER_EXPIRES).expired(1 << 62)
    # A record left "connected" by a broker that died counts from when it was seen.
    assert record(expiry_interval=1, seen_us=0).expired(1_000_000)


def test_writes_are_fenced_by_version(storage: Storage) -> None:
    store = SessionStore(storage)
    first = store.write(record(), None)
    with pytest.raises(PreconditionFailed):
        store.write(record(), None)
    second = store.write(record(session_id="s2"), first.version)
    with pytest.raises(PreconditionFailed):  # the taken-over incarnation's late write
        store.write(record(session_id="late"), first.version)
    loaded = store.load("c")
    assert loaded == second


def test_cursors_start_at_the_head_and_commit(storage: Storage) -> None:
    heads = create_topic(storage, "t", partitions=2)
    storage.append({heads[0].key: numbered_rows(3)})
    store = SessionStore(storage)
    stored = store.write(record(topics=("t",)), None)
    store.ensure_cursors("s1", ["t"], None)
    heads = storage.list_streams("t")
    assert store.positions("s1", "t", heads) == {heads[0].key: 3, heads[1].key: 0}
    stored = store.commit(stored, {"t": {heads[0].key: 3}}, {heads[0].key: 3})
    storage.append({heads[0].key: numbered_rows(2)})
    store.commit(stored, {"t": {heads[0].key: 4}}, {})
    assert store.positions("s1", "t", storage.list_streams("t"))[heads[0].key] == 4
    with pytest.raises(PreconditionFailed):
        store.commit(stored, {"t": {heads[0].key: 5}}, {})  # stale version: nothing written
    assert store.positions("s1", "t", storage.list_streams("t"))[heads[0].key] == 4
    assert storage.get_subscription(cursor_name("s1", "t")).topic == "t"


def test_cursors_start_at_given_offsets_within_the_stream(storage: Storage) -> None:
    # A SUBSCRIBE's start positions, taken when it was read: streams it names
    # start there (never before the first retained offset or past the head),
    # the others as `start_us` says.
    heads = create_topic(storage, "t", partitions=3)
    a, b, c = (h.key for h in heads)
    storage.append({a: numbered_rows(5), b: numbered_rows(5), c: numbered_rows(5)})
    storage.delete_before(b, 2)
    store = SessionStore(storage)
    store.ensure_cursors("s1", ["t"], None, {a: 3, b: 1})
    assert store.positions("s1", "t", storage.list_streams("t")) == {a: 3, b: 2, c: 5}
    store.ensure_cursors("s2", ["t"], None, {a: 9})
    assert store.positions("s2", "t", storage.list_streams("t"))[a] == 5


def test_cursors_of_says_which_topics_lack_cursors_and_where_the_others_are(
    storage: Storage,
) -> None:
    """One call: the cursors on the topics asked for, and which of `ensure`
    have none, whether they are among those topics or not, in `ensure`'s order."""
    (t,) = create_topic(storage, "t", partitions=1)
    for name in ("u", "v", "w"):
        create_topic(storage, name, partitions=1)
    store = SessionStore(storage)
    store.ensure_cursors("s1", ["t", "v"], None, {t.key: 0})
    store.commit(store.write(record(topics=("t", "v")), None), {"t": {t.key: 2}}, {})

    missing, cursors = store.cursors_of("s1", ["t", "u"], ensure=iter(["w", "u", "t", "v"]))
    assert missing == ["w", "u"]
    assert cursors == {"t": {t.key: 2}, "u": {}}


def test_many_resumes_read_at_once_read_as_one_each(storage: Storage) -> None:
    """`load_resuming_many`: per client what `load_resuming` reads for it alone
    (no record; a record without cursors on a topic it names; cursors on
    two topics), and the same client asked twice is read once."""
    (t,) = create_topic(storage, "t", partitions=1)
    (v,) = create_topic(storage, "v", partitions=1)
    store = SessionStore(storage)
    store.ensure_cursors("s1", ["t", "v"], None, {t.key: 0, v.key: 0})
    store.commit(store.write(record("c1", "s1", topics=("t", "v")), None), {"t": {t.key: 2}}, {})
    store.write(record("c2", "s2", topics=("t",)), None)  # its cursors never made
    store.write(record("c3", "s3"), None)
    asked = ["c1", "nobody", "c2", "c3", "c1"]
    found = store.load_resuming_many(asked)
    assert found == {c: store.load_resuming(c) for c in asked}
    assert found["c1"][1] == {"t": {t.key: 2}, "v": {v.key: 0}}
    assert found["c2"][1] == {"t": None} and found["nobody"] == (None, {})
    assert store.load_resuming_many([]) == {}


def test_expire_discards_record_and_cursors(storage: Storage) -> None:
    create_topic(storage, "t")
    store = SessionStore(storage)
    store.write(record("old", "s-old", expiry_interval=1, seen_us=0, topics=("t",)), None)
    store.write(record("live", "s-live", expiry_interval=1, seen_us=0), None)
    store.write(record("fresh", "s-fresh", expiry_interval=100, seen_us=0), None)
    store.ensure_cursors("s-old", ["t"], None)
    assert store.expire(2_000_000, live={"live"}) == ["old"]
    assert store.load("old") is None
    assert store.load("live") is not None and store.load("fresh") is not None
    assert [s.name for s in storage.list_subscriptions("t")] == []


def test_a_sparse_sweep_reads_the_records_only_once_one_is_due(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One broker alone on its database writes every record through its
    store, which knows when the first session expires: its sweep reads them
    all only then (a Will's grace counted), after a write that makes one due
    sooner, or `FULL_SWEEP_EVERY` after the last read, never every sweep."""
    second = 1_000_000
    store = SessionStore(storage)
    off = {"connected": False, "seen_us": 0, "disconnected_us": 0}
    store.write(record("in-100", "s1", expiry_interval=100, **off), None)
    store.write(record("will-10", "s2", expiry_interval=10, will="{}", **off), None)
    store.write(record("live", "s3", expiry_interval=1, seen_us=0), None)
    store.write(record("never", "s4", expiry_interval=NEVER_EXPIRES, **off), None)
    reads = count_reads_of_all(monkeypatch)

    def sweep(at_s: float) -> list[str]:
        return store.expire(int(at_s * second), live={"live"}, sparse=True)

    assert sweep(5) == [] and len(reads) == 1  # the first sweep reads them all
    assert sweep(40) == [] and len(reads) == 1  # nothing due before 70 s (10 + the grace)
    assert sweep(70) == ["will-10"] and len(reads) == 2
    # Written since: a session due at 80 s.
    store.write(
        record("in-10", "s5", expiry_interval=10, **{**off, "disconnected_us": 70 * second}), None
    )
    assert sweep(75) == [] and len(reads) == 2
    assert sweep(80) == ["in-10"] and len(reads) == 3
    assert sweep(100) == ["in-100"] and len(reads) == 4
    # Nothing due any more (live is the broker's, never expires): a full read
    # a minute after the last one all the same.
    assert sweep(130) == [] and len(reads) == 4
    assert sweep(160) == [] and len(reads) == 5
    # Not sparse (other nodes write records too): every sweep reads.
    assert store.expire(161 * second, live={"live"}) == [] and len(reads) == 6


def test_cursors_left_by_a_discard_cut_short_are_dropped(storage: Storage) -> None:
    """A crash between deleting a session's record and its cursors left the
    cursors with nobody to delete them, pinning their topic's messages for
    good; `drop_orphans` finds them (and the session's QoS 2 markers) and keeps
    every cursor a record still names."""
    create_topic(storage, "t")
    create_topic(storage, "u")
    store = SessionStore(storage)
    gone = store.write(record("gone", "s-gone", topics=("t", "u")), None)
    store.write(record("kept", "s-kept", topics=("t",)), None)
    store.ensure_cursors("s-gone", ["t", "u"], None)
    store.ensure_cursors("s-kept", ["t"], None)
    storage.append_once(qos2_marker("s-gone", 7), {})
    storage.append_once(qos2_marker("s-kept", 7), {})
    # The discard's first step only, as if the broker died right after it.
    storage.kv_delete_if_version("sessions", "gone", gone.version)
    assert store.drop_orphans() == ["s-gone"]
    assert sorted(s.name for s in storage.list_subscriptions()) == [cursor_name("s-kept", "t")]
    assert storage.append_once(qos2_marker("s-gone", 7), {}) == {}  # the marker was gone
    assert storage.append_once(qos2_marker("s-kept", 7), {}) is None  # this one stays
    assert store.drop_orphans() == []


def test_a_session_held_by_another_running_node_does_not_expire(storage: Storage) -> None:
    # Several brokers on one database: node B's sweep must not discard a session
    # connected to node A, however long ago A last wrote its record, while A's
    # liveness lease runs; once it lapses (A crashed), the usual rule applies.
    store = SessionStore(storage)
    leases = Leases(storage)
    a = leases.acquire(node_lease("a"), "a", ttl_us=10_000_000, now_us=0)
    store.write(record("on-a", "s-a", expiry_interval=1, seen_us=0, node="a"), None)
    store.write(record("on-gone", "s-g", expiry_interval=1, seen_us=0, node="gone"), None)
    store.write(record("on-b", "s-b", expiry_interval=1, seen_us=0, node="b"), None)
    gone_off = record("left-a", "s-l", expiry_interval=1, seen_us=0, node="a")
    store.write(replace(gone_off, connected=False, disconnected_us=0), None)

    held = store.load("on-a")
    assert held is not None and store.held_elsewhere(held.record, "b", 5_000_000)
    assert not store.held_elsewhere(held.record, "a", 5_000_000)  # ours: `live` decides
    # At 5 s every interval has passed: A's connected session stays; the one of a
    # node without a lease, our own orphan and A's disconnected one go.
    assert sorted(store.expire(5_000_000, live=set(), here="b")) == ["left-a", "on-b", "on-gone"]
    assert store.load("on-a") is not None
    # A's lease lapses (no renewal): its session is an orphan like any other.
    assert leases.get(node_lease("a")) == a
    assert store.expire(10_000_000, live=set(), here="b") == ["on-a"]


def test_the_node_survives_the_record_round_trip() -> None:
    assert SessionRecord.from_json(record(node="host-1-abc").to_json()).node == "host-1-abc"
    legacy = json.loads(record().to_json())
    del legacy["node"]  # written before nodes were recorded
    assert SessionRecord.from_json(json.dumps(legacy).encode()).node is None


def test_sessions_taken_over_elsewhere(storage: Storage) -> None:
    store = SessionStore(storage)
    kept = store.write(record("kept", "s1", node="a"), None)
    moved = store.write(record("moved", "s2", node="a"), None)
    gone = store.write(record("gone", "s3", node="a"), None)
    ours_again = store.write(record("ours", "s4", node="a"), None)
    mine = {s.record.client_id: s.version for s in (kept, moved, gone, ours_again)}
    store.write(replace(moved.record, node="b"), moved.version)  # connected on b now
    store.discard(gone)
    store.write(ours_again.record, ours_again.version)  # our own later write (a race)
    assert sorted(store.taken_over(mine, here="a")) == ["gone", "moved"]


def test_a_session_not_written_yet_is_taken_over_once_another_node_writes_it(
    storage: Storage,
) -> None:
    """A record never written (`Stored.version` None: it ends with its
    connection) is not "gone"; one that another node wrote meanwhile is taken."""
    store = SessionStore(storage)
    store.write(record("elsewhere", "s9", node="b"), None)
    store.write(record("ours", "s8", node="a"), None)  # our own (a race with the sweep)
    mine: dict[str, int | None] = {"fresh": None, "elsewhere": None, "ours": None}
    assert store.taken_over(mine, here="a") == ["elsewhere"]


def test_discarding_a_session_never_written_touches_nothing(storage: Storage) -> None:
    store = SessionStore(storage)
    kept = store.write(record("c", "s1"), None)
    store.discard(Stored(record("c", "s2"), None))
    assert store.load("c") == kept


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The records `SessionRecord.from_json` decodes from now on."""
    seen: list[bytes] = []
    original = SessionRecord.from_json

    def counting(raw: bytes) -> SessionRecord:
        seen.append(raw)
        return original(raw)

    monkeypatch.setattr(SessionRecord, "from_json", staticmethod(counting))
    return seen


def test_all_hands_out_what_the_broker_holds_for_its_own_sessions(
    storage: Storage, decoded: list[bytes]
) -> None:
    """A session connected to this broker: its connection's record (no copy
    decoded, none kept) while the stored version is the one it wrote."""
    store = SessionStore(storage)
    mine = store.write(record("mine", "s-mine"), None)
    store.write(record("other", "s-other"), None)
    store.held_here = {"mine": mine}.get
    found = {s.record.client_id: s for s in store.all()}
    assert found["mine"] is mine and found["other"].record.session_id == "s-other"
    assert len(decoded) == 1  # "other" only
    # Written since by someone else (another node took it over): read as stored.
    taken = store.write(replace(mine.record, node="elsewhere"), mine.version)
    again = {s.record.client_id: s for s in store.all()}
    assert again["mine"].record.node == "elsewhere" and again["mine"].version == taken.version


def test_all_decodes_only_the_records_that_changed(storage: Storage, decoded: list[bytes]) -> None:
    store = SessionStore(storage)
    for i in range(3):
        store.write(record(f"c{i}", f"s{i}"), None)
    assert sorted(s.record.client_id for s in store.all()) == ["c0", "c1", "c2"]
    assert len(decoded) == 3
    decoded.clear()
    first = {s.record.client_id: s for s in store.all()}
    assert decoded == []  # nothing changed: nothing decoded again
    changed = replace(first["c1"].record, expiry_interval=77)
    store.write(changed, first["c1"].version)
    # Deleted and made again at the same version as before, with other contents:
    store.discard(first["c2"])
    store.write(replace(first["c2"].record, session_id="other"), None)
    again = {s.record.client_id: s for s in store.all()}
    assert len(decoded) == 2
    assert again["c1"].record.expiry_interval == 77
    assert again["c2"].record.session_id == "other"
    assert again["c0"].record == first["c0"].record


def test_census_counts_from_the_last_read_of_all_while_it_is_recent(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `$SYS` topics and the metrics count sessions from the expiry
    sweep's read of every record (`all`) if it is recent enough, else read."""
    store = SessionStore(storage)
    subs = (
        Subscription("a/#", 1, False, False, 0, None),
        Subscription("b", 0, False, False, 0, None),
    )
    store.write(record("on", "s-on", subscriptions=subs), None)
    store.write(record("off", "s-off", connected=False, subscriptions=subs[:1]), None)
    assert len(store.all()) == 2
    store.write(record("new", "s-new", connected=False), None)
    reads = count_reads_of_all(monkeypatch)
    recent = store.census(max_age=3600)
    assert (recent.sessions, recent.disconnected, recent.subscriptions) == (2, 1, 3)
    assert reads == []  # counted by the read above, not read again
    fresh = store.census(max_age=0)
    assert (fresh.sessions, fresh.disconnected, fresh.subscriptions) == (3, 2, 3)
    assert reads == [1]


def test_load_decodes_only_a_record_that_changed(storage: Storage, decoded: list[bytes]) -> None:
    """A fleet resuming at once loads the records it wrote at its disconnects:
    those are not decoded again; one written since by anyone else is."""
    store = SessionStore(storage)
    written = store.write(record(connected=False), None)
    loaded = store.load("c")
    assert loaded is not None and loaded.record is written.record
    assert loaded.version == written.version and decoded == []
    # Written since by another process (a store of its own).
    SessionStore(storage).write(record(connected=False, expiry_interval=77), written.version)
    changed = store.load("c")
    assert changed is not None and changed.record.expiry_interval == 77
    assert len(decoded) == 1
    # Made again here, then deleted and made again elsewhere at the same
    # version with other contents: the bytes tell.
    SessionStore(storage).discard(changed)
    mine = store.write(record(connected=False), None)
    elsewhere = SessionStore(storage)
    elsewhere.discard(mine)
    theirs = elsewhere.write(record(session_id="other", connected=False), None)
    again = store.load("c")
    assert again is not None and again.record.session_id == "other"
    assert again.version == theirs.version == mine.version
