"""The session state machine, sans-I/O: events in, effects out, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.session_effects import fetches
from riverbed.clock import Tick
from riverbed.model import StoredMessage
from riverbed.sessions.session import (
    REFILL_DELAY,
    Acked,
    Checkpoint,
    Deliver,
    Effect,
    Fetch,
    Follow,
    FollowAll,
    Offered,
    Session,
    Subscription,
)


def msg(offset: int, topic: str = "a/b", qos: int = 1, client: str | None = None) -> StoredMessage:
    return StoredMessage(offset, b"", 0, topic, "k", b"%d" % offset, None, qos, 0)


def of(kind: type, effects: list[Effect]) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


def session(**options: object) -> Session:
    return Session("c", [Subscription("a/#", 1)], **options)  # type: ignore[arg-type]


def test_follow_fetches_from_the_cursor() -> None:
    s = session(queue_limit=100)
    effects = s.handle(Follow(7, 40), now=0.0)
    assert fetches(effects) == [Fetch(7, 40, 100)]
    # One fetch per stream at a time.
    assert fetches(s.handle(Tick(), now=0.0)) == []


def test_delivers_in_order_within_the_window() -> None:
    s = session(window=2)
    s.handle(Follow(1, 0), now=0.0)
    effects = s.handle(Offered(1, [msg(0), msg(1), msg(2)], 3), now=0.0)
    sent = of(Deliver, effects)
    assert [(d.message.offset, d.packet_id, d.dup) for d in sent] == [(0, 1, False), (1, 2, False)]
    assert s.inflight == 2 and s.queued == 1
    sent = of(Deliver, s.handle(Acked(1), now=0.0))
    assert [(d.message.offset, d.packet_id) for d in sent] == [(2, 3)]


def test_a_full_window_is_refilled_in_batches() -> None:
    s = session(window=8, refill=4, queue_limit=100, checkpoint_interval=60)
    s.handle(Follow(1, 0), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(i) for i in range(20)], 20), now=0.0))
    assert [d.message.offset for d in sent] == list(range(8))
    # Slots free up one by one: held until four are free...
    for packet_id in (1, 2, 3):
        assert of(Deliver, s.handle(Acked(packet_id), now=0.001)) == []
    assert s.next_deadline() == 0.001 + REFILL_DELAY  # from the first freed slot
    sent = of(Deliver, s.handle(Acked(4), now=0.002))
    assert [d.message.offset for d in sent] == [8, 9, 10, 11]
    assert s.next_deadline() == 60.0  # only the checkpoint waits now
    # ... or until REFILL_DELAY after the first, for a client that waits.
    assert of(Deliver, s.handle(Acked(5), now=0.003)) == []
    assert of(Deliver, s.handle(Tick(), now=0.003 + REFILL_DELAY / 2)) == []
    sent = of(Deliver, s.handle(Tick(), now=0.003 + REFILL_DELAY))
    assert [d.message.offset for d in sent] == [12]


def test_refill_defaults_to_an_eighth_of_the_window_and_is_checked() -> None:
    assert session(window=100).refill == 12
    assert session(window=5).refill == 1  # a small window: no batching
    for bad in (0, 9):
        with pytest.raises(ValueError, match=rf"refill = {bad}: must be from 1 to the window"):
            session(window=8, refill=bad)


def test_cursor_is_the_contiguous_acknowledged_prefix() -> None:
    s = session(window=10, checkpoint_every=1000, checkpoint_interval=60)
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0), msg(1), msg(2)], 5), now=0.0)
    assert s.cursors() == {1: 0}
    s.handle(Acked(2), now=0.0)  # offset 1 acknowledged first
    assert s.cursors() == {1: 0}
    s.handle(Acked(1), now=0.0)
    assert s.cursors() == {1: 2}
    s.handle(Acked(3), now=0.0)
    assert s.cursors() == {1: 5}  # offsets 3 and 4 did not match or were not there


def test_non_matching_messages_move_the_cursor() -> None:
    s = session()
    s.handle(Follow(1, 0), now=0.0)
    effects = s.handle(Offered(1, [msg(0, "other"), msg(1, "x/y")], 2), now=0.0)
    assert of(Deliver, effects) == []
    assert s.cursors() == {1: 2}


def test_passed_moves_a_waiting_fetch_and_the_cursor_behind_it() -> None:
    """The router's messages passed the session by (none matched) while its
    fetch waited: what it took in moves there, the cursor with it where nothing
    is in flight or queued, and the next checkpoint carries it."""
    s = session(window=1, checkpoint_every=1000, checkpoint_interval=1.0)
    s.handle_all([Follow(1, 0), Follow(2, 0), Follow(3, 0)], now=0.0)
    s.handle(Offered(1, [msg(0), msg(1)], 2), now=0.0)  # 0 in flight, 1 queued
    assert s.next_deadline() == 1.0
    s.handle(Tick(), now=1.0)  # the checkpoint of what Offered moved
    assert s.next_deadline() is None

    s.passed({1: 9, 2: 7, 4: 5})  # 4: a stream it does not follow
    assert s.cursors() == {1: 0, 2: 7, 3: 0}  # 1: offset 0 still in flight
    assert s.next_deadline() == 2.0
    assert fetches(s.handle(Tick(), now=1.5)) == []  # the fetches still wait
    (checkpoint,) = of(Checkpoint, s.handle(Tick(), now=2.0))
    assert checkpoint.cursors == {2: 7}

    # The fetch of stream 1 waits from 9: its answer starts there.
    assert [d.message.offset for d in of(Deliver, s.handle(Acked(1), now=2.0))] == [1]
    s.handle(Acked(2), now=2.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(8), msg(9)], 10), now=2.0))
    assert [d.message.offset for d in sent] == [9]
    s.handle(Acked(3), now=2.0)
    # Behind what the stream took in already: nothing moves back.
    s.passed({1: 5})
    assert s.cursors()[1] == 10


def test_checkpoint_every_n_acks() -> None:
    s = session(window=10, checkpoint_every=2, checkpoint_interval=60)
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0), msg(1), msg(2)], 3), now=0.0)
    assert of(Checkpoint, s.handle(Acked(1), now=0.0)) == []
    checkpoints = of(Checkpoint, s.handle(Acked(2), now=0.0))
    assert [c.cursors for c in checkpoints] == [{1: 2}]
    assert checkpoints[0].sent == {1: 3}


def test_checkpoint_after_the_interval() -> None:
    s = session(window=10, checkpoint_every=100, checkpoint_interval=1.0)
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0)], 1), now=0.0)
    assert of(Checkpoint, s.handle(Acked(1), now=0.5)) == []
    assert s.next_deadline() == 1.0
    checkpoints = of(Checkpoint, s.handle(Tick(), now=1.0))
    assert [c.cursors for c in checkpoints] == [{1: 1}]
    assert s.next_deadline() is None  # nothing changed since


def test_dup_below_marks_possible_redeliveries() -> None:
    s = session()
    s.handle(Follow(1, 10, dup_below=12), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(10), msg(11), msg(12)], 13), now=0.0))
    assert [(d.message.offset, d.dup) for d in sent] == [(10, True), (11, True), (12, False)]


def test_qos_is_capped_by_message_and_overlaps_give_one_copy() -> None:
    s = Session(
        "c",
        [Subscription("a/#", 0, identifier=3), Subscription("a/+", 1, identifier=4)],
    )
    s.handle(Follow(1, 0), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(0, qos=1), msg(1, qos=0)], 2), now=0.0))
    assert [(d.qos, d.subscription_identifiers) for d in sent] == [(1, (3, 4)), (0, (3, 4))]
    assert sent[1].packet_id is None


def test_dollar_topics_and_no_local() -> None:
    s = Session(
        "me",
        [Subscription("#", 1), Subscription("$sys/+", 1, no_local=True)],
        publisher=lambda m: "me" if m.mqtt_topic == "$sys/mine" else "other",
    )
    s.handle(Follow(1, 0), now=0.0)
    sent = of(
        Deliver,
        s.handle(Offered(1, [msg(0, "$sys/mine"), msg(1, "$sys/theirs"), msg(2, "x")], 3), 0.0),
    )
    assert [d.message.mqtt_topic for d in sent] == ["$sys/theirs", "x"]


def test_queue_is_bounded_per_stream_share() -> None:
    s = session(window=1, queue_limit=10)
    assert fetches(s.handle(Follow(1, 0), now=0.0)) == [Fetch(1, 0, 10)]
    # A stream's share shrinks as streams are added (a fetch asked for before keeps
    # its limit: memory stays within a small multiple of the limit).
    assert fetches(s.handle(Follow(2, 0), now=0.0)) == [Fetch(2, 0, 5)]
    effects = s.handle(Offered(1, [msg(i) for i in range(5)], 5), now=0.0)
    assert fetches(effects) == []  # 4 queued, more than half the share
    assert s.queued == 4


def test_stale_offer_is_ignored() -> None:
    s = session()
    s.handle(Follow(1, 5), now=0.0)
    s.handle(Offered(1, [msg(5)], 6), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(5)], 6), now=0.0))
    assert sent == []


def test_unknown_ack_is_ignored_and_ids_wrap() -> None:
    s = session(window=1)
    s.handle(Follow(1, 0), now=0.0)
    assert s.handle(Acked(999), now=0.0) is not None
    s._next_packet_id = 65535
    sent = of(Deliver, s.handle(Offered(1, [msg(0), msg(1)], 2), now=0.0))
    assert sent[0].packet_id == 65535
    sent = of(Deliver, s.handle(Acked(65535), now=0.0))
    assert sent[0].packet_id == 1


def test_a_checkpoint_has_the_cursors_that_moved_or_are_not_stored() -> None:
    """Stream 1 moved, 2 did not (its cursor is stored as it is), 3 has no
    cursor stored yet: the checkpoint at disconnect writes 1 and 3 only. Streams
    2 and 3 never had an answer (dormant): nothing was sent on them, so `sent`
    has stream 1 only."""
    s = session(checkpoint_every=1000, checkpoint_interval=60)
    s.handle(Follow(1, 3), now=0.0)
    s.handle(Follow(2, 4), now=0.0)
    s.handle(Follow(3, 0, stored=False), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(3), msg(4)], 5), now=0.0))
    s.handle_all([Acked(d.packet_id) for d in sent], now=0.0)
    assert s.checkpoint(now=5.0) == Checkpoint({1: 5, 3: 0}, {1: 5})
    assert s.checkpoint(now=6.0).cursors == {}


def test_a_checkpoint_not_written_is_written_by_the_next() -> None:
    s = session(checkpoint_every=1000, checkpoint_interval=60)
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Follow(2, 0), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(0)], 1), now=0.0))
    s.handle(Acked(sent[0].packet_id), now=0.0)
    lost = s.checkpoint(now=1.0)
    assert lost.cursors == {1: 1}
    s.unsaved(lost.cursors)
    s.unsaved({9: 4})  # a stream no longer followed: nothing
    assert s.checkpoint(now=2.0).cursors == {1: 1}


def test_unfollow_completes_what_was_sent_and_drops_the_rest() -> None:
    # [MQTT-3.10.4-3]: sent QoS 1 messages are still completed; queued ones are
    # dropped; the stream leaves the cursors and is fetched no more.
    s = session(window=2, checkpoint_every=1000, checkpoint_interval=60)
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Follow(2, 0), now=0.0)
    sent = of(Deliver, s.handle(Offered(1, [msg(0), msg(1), msg(2)], 3), now=0.0))
    assert [d.packet_id for d in sent] == [1, 2]
    s.unfollow([1])
    assert s.cursors() == {2: 0} and s.queued == 0 and s.inflight == 2
    assert 1 in s.streams
    effects = s.handle(Acked(1), now=0.0)
    effects += s.handle(Acked(2), now=0.0)
    assert of(Deliver, effects) == [] and s.inflight == 0
    assert all(f.stream != 1 for f in fetches(effects))
    assert 1 not in s.streams  # forgotten once its last message was acknowledged
    assert s.cursors() == {2: 0}
    assert s.checkpoint(now=1.0).cursors == {}  # neither moved: stream 1 is not there
    # A late answer to a fetch of the dropped stream changes nothing.
    assert of(Deliver, s.handle(Offered(1, [msg(3)], 4), now=1.0)) == []


@given(
    st.dictionaries(st.integers(0, 20), st.integers(0, 9), max_size=6),
    st.dictionaries(st.integers(0, 20), st.integers(0, 12), max_size=6),
    st.frozensets(st.integers(0, 20), max_size=6),
    st.integers(0, 20),
)
def test_follow_all_is_a_follow_of_each(
    cursors: dict[int, int], dup_below: dict[int, int], unstored: frozenset[int], answered: int
) -> None:
    """One `FollowAll` leaves the session as the `Follow`s of its streams in one
    turn do: the same effects, cursors, answers and checkpoints, whether a
    stream is dormant (a stored cursor, nothing to send again) or not."""
    events = [Follow(k, c, dup_below.get(k, 0), k not in unstored) for k, c in cursors.items()]
    one, each = session(), session()
    assert one.handle(FollowAll(cursors, dup_below, unstored), 0.0) == each.handle_all(events, 0.0)
    assert one.cursors() == each.cursors() and one.streams == each.streams
    offered = Offered(answered, [msg(o) for o in range(10, 13)], 13)
    assert one.handle(offered, 0.0) == each.handle(offered, 0.0)
    assert one.checkpoint(1.0) == each.checkpoint(1.0)


_FILTERS = st.sampled_from(["a/#", "a/+", "a/b", "+/b", "#", "x", "$sys/+", "a/b/c"])
_SUBSCRIPTIONS = st.builds(
    Subscription,
    _FILTERS,
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.just(0),
    st.one_of(st.none(), st.integers(1, 9)),
)


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("subscribe"), _SUBSCRIPTIONS),
            st.tuples(st.just("unsubscribe"), _FILTERS),
            st.tuples(
                st.just("match"),
                st.tuples(
                    st.sampled_from(["a/b", "a/c", "x", "$sys/me", "a/b/c", "z/b"]),
                    st.integers(0, 2),
                    st.booleans(),
                    st.sampled_from(["me", "other"]),
                ),
            ),
        ),
        max_size=30,
    )
)
def test_a_topics_grant_is_remembered_until_the_subscriptions_change(
    steps: list[tuple[str, object]],
) -> None:
    """`_match` remembers per topic name what the subscriptions grant; whatever
    the subscribes and unsubscribes in between, it answers as matching each
    message against every subscription does (No Local per publisher too)."""
    publishers: dict[int, str] = {}
    s = Session("me", publisher=lambda m: publishers[m.offset])
    for offset, (kind, arg) in enumerate(steps):
        if kind == "subscribe":
            s.subscribe(arg)  # type: ignore[arg-type]
        elif kind == "unsubscribe":
            s.unsubscribe(arg)  # type: ignore[arg-type]
        else:
            topic, qos, retain, publisher = arg  # type: ignore[misc]
            publishers[offset] = publisher
            message = StoredMessage(offset, b"", 0, topic, None, b"", None, qos, int(retain))
            assert s._match(message) == s._match_each(message)
