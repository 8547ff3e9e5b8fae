"""Grants in the session (shared subscriptions, issue 5): a stream lent by a
group's Leader, fetched and delivered like any stream but matched against its
one subscription, never checkpointed, reported with `GrantMoved`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.session_effects import fetches
from riverbed.clock import Tick
from riverbed.model import StoredMessage, StreamId
from riverbed.sessions.qos2 import Phase, WindowEntry
from riverbed.sessions.session import (
    RETAINED,
    Acked,
    Checkpoint,
    Deliver,
    Effect,
    Fetch,
    Follow,
    GrantMoved,
    Offered,
    Session,
    Subscription,
)
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.handler import Grant, SharedSubscriptionHandler, _Window


def msg(offset: int, topic: str = "w/x", qos: int = 1) -> StoredMessage:
    return StoredMessage(offset, b"", 0, topic, "k", b"%d" % offset, None, qos, 0)


def of(kind: type, effects: list[Effect]) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


SHARED = Subscription("w/#", 1, identifier=7)


def test_a_grant_fetches_and_delivers_only_what_its_filter_matches() -> None:
    s = Session("c", [Subscription("other/#", 1)], queue_limit=10)
    key = s.grant_key()
    assert key < RETAINED
    effects = s.grant(key, 5, SHARED, now=0.0)
    assert fetches(effects) == [Fetch(key, 5, 10)]
    effects = s.handle(Offered(key, [msg(5), msg(6, "z/y"), msg(7, qos=0)], 9), now=0.0)
    sent = of(Deliver, effects)
    assert [(d.message.offset, d.qos, d.subscription_identifiers) for d in sent] == [
        (5, 1, (7,)),
        (7, 0, (7,)),
    ]
    # Taken in up to 9; only the QoS 1 message waits for an acknowledgement.
    assert of(GrantMoved, effects) == [GrantMoved(key, 9, (5,), ())]
    moved = of(GrantMoved, s.handle(Acked(sent[0].packet_id), now=0.0))
    assert moved == [GrantMoved(key, 9, (), (5,))]


def test_grants_share_the_in_flight_window_with_private_streams() -> None:
    s = Session("c", [Subscription("w/#", 1)], window=3, queue_limit=100)
    s.handle(Follow(1, 0), now=0.0)
    key = s.grant_key()
    s.grant(key, 0, SHARED, now=0.0)
    s.handle(Offered(1, [msg(0), msg(1)], 2), now=0.0)
    effects = s.handle(Offered(key, [msg(0), msg(1)], 2), now=0.0)
    assert s.inflight == 3 and s.queued == 1
    # What waits is not reported as taken: the grant's progress stays below it.
    (moved,) = of(GrantMoved, effects)
    assert moved.taken == 1 and moved.sent == (0,)


def test_a_grant_is_never_checkpointed() -> None:
    s = Session("c", [Subscription("w/#", 1)], checkpoint_every=1)
    s.handle(Follow(1, 0), now=0.0)
    key = s.grant_key()
    s.grant(key, 0, SHARED, now=0.0)
    delivered = of(Deliver, s.handle(Offered(key, [msg(0)], 1), now=0.0))
    s.handle(Offered(1, [msg(0)], 1), now=0.0)
    effects = s.handle_all([Acked(d.packet_id) for d in delivered], now=5.0)
    for checkpoint in of(Checkpoint, effects):
        assert all(k >= 0 for k in checkpoint.cursors) and all(k >= 0 for k in checkpoint.sent)
    assert key not in s.cursors() and key not in s.sent()
    assert key not in s.checkpoint(now=6.0).cursors


def test_a_stopped_grant_sends_no_more_but_reports_its_acknowledgements() -> None:
    s = Session("c", [], window=2, queue_limit=100)
    key = s.grant_key()
    s.grant(key, 0, SHARED, now=0.0)
    effects = s.handle(Offered(key, [msg(0), msg(1), msg(2), msg(3)], 4), now=0.0)
    first, second = of(Deliver, effects)
    assert of(GrantMoved, effects) == [GrantMoved(key, 2, (0, 1), ())]
    assert s.stop_grant(key, now=0.0) == []  # nothing changed that the Handler must hear
    assert s.queued == 0  # 2 and 3 dropped: the next holder sends them
    effects = s.handle_all([Acked(first.packet_id), Acked(second.packet_id)], now=0.0)
    assert of(Deliver, effects) == [] and fetches(effects) == []
    assert of(GrantMoved, effects) == [GrantMoved(key, 2, (), (0, 1))]
    # A late answer to a fetch is ignored.
    assert of(Deliver, s.handle(Offered(key, [msg(4)], 5), now=0.0)) == []
    s.forget_grant(key)
    assert key not in s.grants and key not in s.streams


def test_a_forgotten_grants_messages_keep_their_packet_ids_until_answered() -> None:
    s = Session("c", [], window=1, queue_limit=100)
    key = s.grant_key()
    s.grant(key, 0, SHARED, now=0.0)
    (sent,) = of(Deliver, s.handle(Offered(key, [msg(0), msg(1)], 2), now=0.0))
    s.forget_grant(key)
    assert s.inflight == 1  # the client may still answer it
    effects = s.handle(Acked(sent.packet_id), now=0.0)
    assert s.inflight == 0 and of(GrantMoved, effects) == []


def test_grant_keys_are_new_also_after_a_restored_qos2_window() -> None:
    restored = [WindowEntry(-4, 3, 9, Phase.RELEASED)]
    s = Session("c", [], qos2_window=restored)
    keys = {s.grant_key() for _ in range(5)}
    assert len(keys) == 5 and max(keys) < -4


# --------------------------------------------------------------------- with the Handler

STREAM = StreamId("mqtt", 0, 0)
Op = tuple[str, int]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["offer", "ack", "tick"]),
            st.integers(min_value=0, max_value=5),
        ),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_the_handlers_progress_is_the_sessions_cursor_of_the_grant(
    ops: list[Op], window: int
) -> None:
    """Reports fed to a Handler window keep its progress (what the Leader would
    save) equal to the session's own cursor of the grant: the first message
    neither acknowledged nor skipped. So a crash redelivers at most what was
    sent or waiting, and skips nothing."""
    s = Session("c", [], window=window, queue_limit=6)
    handler = SharedSubscriptionHandler("c", SharedSubConfig())
    grant = Grant("b", STREAM)
    handler_window = handler._windows[grant] = _Window(0)  # as a grant from 0 leaves it
    key = s.grant_key()
    head = 0
    outstanding: list[int] = []

    def run(effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, GrantMoved):
                assert effect.stream == key
                handler.report(grant, effect.taken, effect.sent, effect.acked, now=0.0)
            elif isinstance(effect, Deliver) and effect.packet_id is not None:
                outstanding.append(effect.packet_id)

    run(s.grant(key, 0, SHARED, now=0.0))
    fetch_from = 0
    for op, n in ops:
        if op == "offer":
            # The next n messages of the stream (every third one elsewhere).
            rows = [msg(o, "w/x" if o % 3 else "z/y", qos=o % 2) for o in range(head, head + n)]
            head += n
            rows = [r for r in rows if r.offset >= fetch_from]
            run(s.handle(Offered(key, rows, head), now=0.0))
            fetch_from = head
        elif op == "ack" and outstanding:
            run(s.handle(Acked(outstanding.pop(n % len(outstanding))), now=0.0))
        else:
            run(s.handle(Tick(), now=1.0))
        assert handler_window.progress == s._streams[key].cursor()
