"""The read check in the session, sans-I/O: a message of a topic the client may
not read is passed over on every path (its own streams, a grant, retained
messages) like one no subscription matches: no place in the window, no hold on
the cursor."""

from __future__ import annotations

from riverbed.model import StoredMessage
from riverbed.mqtt.acl import Authorizer
from riverbed.sessions.session import (
    Acked,
    Checkpoint,
    Deliver,
    Effect,
    Follow,
    GrantMoved,
    Offered,
    Session,
    Subscription,
)

ACL = Authorizer.parse("deny subscribe anyone secrets/#\ndefault allow\n")


def msg(offset: int, topic: str, qos: int = 1) -> StoredMessage:
    return StoredMessage(offset, b"", 0, topic, "k", b"%d" % offset, None, qos, 0)


def of(kind: type, effects: list[Effect]) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


def session(**options: object) -> Session:
    check = ACL.read_check(None, "c")
    assert check is not None
    return Session("c", [Subscription("#", 1)], readable=check, **options)  # type: ignore[arg-type]


def test_withheld_messages_take_no_place_in_the_window_nor_hold_the_cursor() -> None:
    s = session(window=2, checkpoint_every=1)
    s.handle(Follow(1, 0), now=0.0)
    offered = [msg(n, "secrets/x") for n in range(5)] + [msg(5, "public/x"), msg(6, "secrets/y")]
    effects = s.handle(Offered(1, offered, 7), now=0.0)
    sent = of(Deliver, effects)
    assert [(d.message.offset, d.message.mqtt_topic) for d in sent] == [(5, "public/x")]
    assert s.inflight == 1 and s.queued == 0
    assert s.cursors() == {1: 5}  # the first offset not done: the one in flight
    checkpoints = of(Checkpoint, s.handle(Acked(sent[0].packet_id), now=0.0))
    assert [c.cursors for c in checkpoints] == [{1: 7}]


def test_a_grant_reports_withheld_messages_as_taken() -> None:
    s = session()
    key = s.grant_key()
    s.grant(key, 0, Subscription("#", 1), now=0.0)
    effects = s.handle(Offered(key, [msg(0, "secrets/a"), msg(1, "b"), msg(2, "secrets/c")], 3), 0)
    assert [d.message.offset for d in of(Deliver, effects)] == [1]
    assert of(GrantMoved, effects) == [GrantMoved(key, 3, (1,), ())]


def test_retained_messages_obey_the_read_check() -> None:
    s = session()
    retained = [msg(0, "public/r"), msg(0, "secrets/r"), msg(0, "zz")]
    effects = s.retained(Subscription("#", 1), retained, now=0.0)
    assert [(d.message.mqtt_topic, d.retain) for d in of(Deliver, effects)] == [
        ("public/r", True),
        ("zz", True),
    ]


def test_without_a_check_every_topic_goes_out() -> None:
    s = Session("c", [Subscription("#", 1)])
    s.handle(Follow(1, 0), now=0.0)
    effects = s.handle(Offered(1, [msg(0, "secrets/x"), msg(1, "public/x")], 2), now=0.0)
    assert [d.message.offset for d in of(Deliver, effects)] == [0, 1]
