"""Outgoing QoS 2 in the session state machine: the window is persisted before a
PUBLISH or PUBREL goes out, and a restored window resumes exactly once."""

from __future__ import annotations

from riverbed.model import StoredMessage
from riverbed.sessions.qos2 import Phase, WindowEntry
from riverbed.sessions.session import (
    Acked,
    Completed,
    Deliver,
    Effect,
    Follow,
    Offered,
    Persist,
    Persisted,
    Received,
    Release,
    Session,
    Subscription,
)


def msg(offset: int, qos: int = 2) -> StoredMessage:
    return StoredMessage(offset, b"", 0, "a/b", "k", b"%d" % offset, None, qos, 0)


def of(kind: type, effects: list[Effect]) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


def session(window: tuple[WindowEntry, ...] = ()) -> Session:
    return Session(
        "c",
        [Subscription("a/#", 2)],
        window=10,
        checkpoint_every=1000,
        checkpoint_interval=60,
        qos2_window=window,
    )


def test_publish_waits_for_the_window_to_be_persisted() -> None:
    s = session()
    s.handle(Follow(1, 0), now=0.0)
    effects = s.handle(Offered(1, [msg(0), msg(1, qos=1)], 2), now=0.0)
    # QoS 2 goes only once its packet id is durable, and the QoS 1 message after
    # it waits behind it (log order across QoS levels).
    assert of(Deliver, effects) == []
    assert of(Persist, effects) == [Persist(1)]
    assert s.window_entries() == (WindowEntry(1, 0, 1, Phase.SENT),)
    sent = of(Deliver, s.handle(Persisted(1), now=0.0))
    assert [(d.message.offset, d.packet_id, d.qos, d.dup) for d in sent] == [
        (0, 1, 2, False),
        (1, 2, 1, False),
    ]


def test_pubrec_persists_released_before_pubrel_and_pubcomp_frees_the_cursor() -> None:
    s = session()
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0)], 1), now=0.0)
    s.handle(Persisted(1), now=0.0)
    effects = s.handle(Received(1), now=0.0)
    assert of(Release, effects) == [] and of(Persist, effects) == [Persist(2)]
    assert s.window_entries() == (WindowEntry(1, 0, 1, Phase.RELEASED),)
    assert of(Release, s.handle(Persisted(2), now=0.0)) == [Release(1)]
    assert s.cursors() == {1: 0} and s.inflight == 1
    s.handle(Completed(1), now=0.0)
    assert s.cursors() == {1: 1} and s.inflight == 0
    assert s.window_entries() == (WindowEntry(1, 0, 1, Phase.COMPLETE),)
    s.forget_completed({1: 1})
    assert s.window_entries() == ()


def test_a_rejecting_pubrec_ends_the_exchange() -> None:
    s = session()
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0)], 1), now=0.0)
    s.handle(Persisted(1), now=0.0)
    effects = s.handle(Received(1, accepted=False), now=0.0)
    assert of(Release, effects) == [] and s.inflight == 0 and s.cursors() == {1: 1}


def test_changes_during_a_persist_wait_for_the_next_one() -> None:
    s = session()
    s.handle(Follow(1, 0), now=0.0)
    s.handle(Offered(1, [msg(0)], 1), now=0.0)  # Persist(1) in flight
    effects = s.handle(Offered(1, [msg(1)], 2), now=0.0)
    assert of(Persist, effects) == []
    effects = s.handle(Persisted(1), now=0.0)
    assert [d.message.offset for d in of(Deliver, effects)] == [0]
    assert of(Persist, effects) == [Persist(2)]
    assert [d.message.offset for d in of(Deliver, s.handle(Persisted(2), now=0.0))] == [1]


def test_a_restored_window_resumes_exactly_once() -> None:
    window = (
        WindowEntry(1, 3, 40, Phase.COMPLETE),
        WindowEntry(1, 4, 41, Phase.RELEASED),
        WindowEntry(1, 5, 42, Phase.SENT),
    )
    s = session(window)
    effects = s.handle(Follow(1, 3), now=0.0)
    assert of(Release, effects) == [Release(41)]  # [MQTT-4.4.0-1]
    effects = s.handle(Offered(1, [msg(3), msg(4), msg(5), msg(6)], 7), now=0.0)
    sent = of(Deliver, effects)
    # 3 completed and 4 released are not sent again; 5 goes with its packet id.
    assert [(d.message.offset, d.packet_id, d.dup) for d in sent] == [(5, 42, True)]
    assert of(Persist, effects) == [Persist(1)]  # for offset 6, a new packet id
    sent = of(Deliver, s.handle(Persisted(1), now=0.0))
    assert [d.message.offset for d in sent] == [6]
    assert sent[0].packet_id not in (40, 41, 42)
    # The released message holds the cursor until its PUBCOMP.
    assert s.cursors() == {1: 4}
    s.handle(Completed(41), now=0.0)
    assert s.cursors() == {1: 5}


def test_retained_messages_go_through_the_window_and_never_checkpoint() -> None:
    from riverbed.sessions.session import RETAINED, Checkpoint

    s = session()
    s.handle(Follow(1, 0), now=0.0)
    effects = s.retained(Subscription("a/#", 1, identifier=9), [msg(0), msg(0, qos=0)], now=0.0)
    sent = of(Deliver, effects)
    assert [(d.stream, d.qos, d.retain, d.packet_id, d.subscription_identifiers) for d in sent] == [
        (RETAINED, 1, True, 1, (9,)),
        (RETAINED, 0, True, None, (9,)),
    ]
    s.handle(Acked(1), now=0.0)
    checkpoint = s.checkpoint(now=1.0)
    assert isinstance(checkpoint, Checkpoint) and RETAINED not in checkpoint.cursors
    assert RETAINED not in checkpoint.sent
    # A QoS 2 retained message's window entry is not replayed after a restart.
    restored = session((WindowEntry(RETAINED, 0, 5, Phase.SENT),))
    assert restored.window_entries() == ()
