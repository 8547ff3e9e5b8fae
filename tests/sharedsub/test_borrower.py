"""The Borrower alone: events in, effects out, time passed in."""

from __future__ import annotations

from riverbed.clock import Tick
from riverbed.model import StreamId
from riverbed.sharedsub.borrower import (
    Borrower,
    Effect,
    Forget,
    Invalidated,
    Send,
    SessionDisconnected,
    StartFetching,
    Status,
    StopFetching,
    StreamDrained,
    StreamProgress,
    StreamStatus,
    Terminated,
    Unsubscribed,
)
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import (
    REGISTRY,
    Disconnect,
    Grant,
    GroupId,
    Invalidate,
    LeaderConnectResponse,
    LeaderWanted,
    Ping,
    PingResponse,
    Revoke,
    Revoked,
    RevokeFinished,
    UpdateProgress,
)

G = GroupId("g", "t/#")
S = StreamId("t", 0, 0)
CONFIG = SharedSubConfig()


def sent(effects: list[Effect]) -> list[object]:
    return [e.message for e in effects if isinstance(e, Send)]


def connected(now: float = 0.0) -> Borrower:
    b = Borrower("b1", G, CONFIG, now)
    assert sent(b.handle(Tick(), now)) == [LeaderWanted(G, "b1", 1)]
    assert b.handle(LeaderConnectResponse(G, "b1", "L", 1), now) == []
    assert b.status is Status.CONNECTED
    return b


def test_find_leader_is_retried_every_second() -> None:
    b = Borrower("b1", G, CONFIG, 0.0)
    assert b.handle(Tick(), 0.0) == [Send(REGISTRY, LeaderWanted(G, "b1", 1))]
    assert b.next_deadline() == 1.0
    assert b.handle(Tick(), 0.5) == []
    assert sent(b.handle(Tick(), 1.0)) == [LeaderWanted(G, "b1", 2)]
    # Grants before the answer are ignored: the Leader resends them.
    assert b.handle(Grant(G, "b1", "L", S, 0), 1.1) == []
    b.handle(LeaderConnectResponse(G, "b1", "L", 1), 1.2)
    assert b.status is Status.CONNECTED and b.leader == "L"
    # Its first ping half a fence window after the answer: (5 - 0.5) / 2.
    assert b.next_deadline() == 1.2 + 2.25
    assert sent(b.handle(Tick(), 3.45)) == [Ping(G, "b1", "L", 3)]
    assert b.next_deadline() == 5.0 - 0.5  # fenced 4.5 s after request 1 was sent (at 0)


def test_ping_keeps_it_alive_and_an_unanswered_ping_invalidates() -> None:
    b = connected()
    # Pings twice per fence window (5 - 0.5 s): every 2.25 s, not every 4 s.
    assert b.handle(Tick(), 2.0) == []
    assert sent(b.handle(Tick(), 2.25)) == [Ping(G, "b1", "L", 2)]
    b.handle(PingResponse(G, "b1", "L", 2), 2.25)
    assert sent(b.handle(Tick(), 4.5)) == [Ping(G, "b1", "L", 3)]
    assert b.handle(Tick(), 6.7) == []  # unanswered, not fenced yet
    effects = b.handle(Tick(), 6.75)  # fence: 2.25 + 5 - 0.5
    assert isinstance(effects[-1], Invalidated) and b.status is Status.DONE


def test_slow_answers_do_not_trip_the_fence() -> None:
    """A busy Leader answering every ping 2 s late: the Borrower keeps its
    streams (with pings every `ping_interval` = 4 s, an answer had 0.5 s)."""
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.1)
    answers: list[tuple[float, int]] = []  # (when, seq) of the answers on their way
    seq = 1
    while True:
        deadline = b.next_deadline()
        assert deadline is not None
        if answers and answers[0][0] <= deadline:
            when, seq = answers.pop(0)
            assert b.handle(PingResponse(G, "b1", "L", seq), when) == []
            continue
        if deadline > 120:
            break
        for ping in [m for m in sent(b.handle(Tick(), deadline)) if isinstance(m, Ping)]:
            answers.append((deadline + 2.0, ping.seq))
        assert b.status is Status.CONNECTED, f"fenced at {deadline}: {b.invalid_reason}"
    assert seq > 120 / 4.5 and S in b.streams


def test_grant_progress_revoke_drain_revoked() -> None:
    b = connected()
    effects = b.handle(Grant(G, "b1", "L", S, 7), 0.1)
    assert effects == [StartFetching("b1", S, 7), Send("L", UpdateProgress(G, "b1", "L", S, 7))]
    assert sent(b.handle(StreamProgress(S, 9), 0.2)) == [UpdateProgress(G, "b1", "L", S, 9)]
    assert b.handle(StreamProgress(S, 8), 0.2) == []  # never backwards
    # a resent grant is answered with the progress
    assert sent(b.handle(Grant(G, "b1", "L", S, 7), 0.3)) == [UpdateProgress(G, "b1", "L", S, 9)]
    assert b.handle(Revoke(G, "b1", "L", S), 0.4) == [StopFetching("b1", S)]
    assert b.streams[S].status is StreamStatus.REVOKING
    assert sent(b.handle(StreamProgress(S, 10), 0.5)) == [UpdateProgress(G, "b1", "L", S, 10)]
    final = UpdateProgress(G, "b1", "L", S, 11, True)
    assert sent(b.handle(StreamDrained(S, 11), 0.6)) == [final]
    assert sent(b.handle(Revoke(G, "b1", "L", S), 0.7)) == [final]  # resent revoke
    effects = b.handle(Revoked(G, "b1", "L", S), 0.8)
    assert effects == [Forget("b1", S), Send("L", RevokeFinished(G, "b1", "L", S))]
    assert not b.streams
    # a resent revoked is answered again
    assert sent(b.handle(Revoked(G, "b1", "L", S), 0.9)) == [RevokeFinished(G, "b1", "L", S)]


def test_revoke_gives_up_waiting_after_the_unsubscribe_timeout() -> None:
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.0)
    b.handle(StreamProgress(S, 3), 0.1)
    b.handle(Revoke(G, "b1", "L", S), 1.0)
    assert b.handle(Tick(), 1.9) == []
    effects = b.handle(Tick(), 2.0)
    assert effects == [Forget("b1", S), Send("L", UpdateProgress(G, "b1", "L", S, 3, True))]
    assert b.handle(StreamDrained(S, 5), 2.1) == []  # too late: the window goes again


def test_inconsistencies_invalidate() -> None:
    b = connected()
    effects = b.handle(Revoke(G, "b1", "L", S), 0.1)  # never granted
    assert isinstance(effects[-1], Invalidated) and "not ours" in effects[-1].reason
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.1)
    b.handle(Revoke(G, "b1", "L", S), 0.2)
    effects = b.handle(Grant(G, "b1", "L", S, 0), 0.3)
    assert effects[0] == Forget("b1", S) and isinstance(effects[-1], Invalidated)
    assert Send("L", Disconnect(G, "b1", "L", ())) in effects
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.1)
    assert isinstance(b.handle(Revoked(G, "b1", "L", S), 0.2)[-1], Invalidated)
    b = connected()
    assert isinstance(b.handle(Grant(G, "b1", "OTHER", S, 0), 0.2)[-1], Invalidated)
    b = connected()
    assert b.handle(Invalidate(G, "b1", "OTHER"), 0.2) == []
    assert isinstance(b.handle(Invalidate(G, "b1", "L"), 0.2)[-1], Invalidated)
    assert b.handle(Tick(), 100.0) == [] and b.next_deadline() is None


def test_unsubscribe_drains_then_disconnects_with_progress() -> None:
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.0)
    s2 = StreamId("t", 0, 1)
    b.handle(Grant(G, "b1", "L", s2, 4), 0.0)
    effects = b.handle(Unsubscribed(), 1.0)
    assert effects == [StopFetching("b1", S), StopFetching("b1", s2)]
    assert b.handle(Grant(G, "b1", "L", StreamId("t", 0, 2), 0), 1.1) == []  # ignored
    assert b.handle(StreamDrained(S, 2), 1.2) == []
    effects = b.handle(StreamDrained(s2, 6), 1.3)
    assert effects == [
        Send("L", Disconnect(G, "b1", "L", ((S, 2), (s2, 6)))),
        Terminated("b1"),
    ]


def test_unsubscribe_timeout_reports_what_it_has() -> None:
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.0)
    b.handle(StreamProgress(S, 1), 0.5)
    b.handle(Unsubscribed(), 1.0)
    effects = b.handle(Tick(), 2.0)
    assert effects == [
        Forget("b1", S),
        Send("L", Disconnect(G, "b1", "L", ((S, 1),))),
        Terminated("b1"),
    ]


def test_unsubscribe_or_disconnect_while_connecting() -> None:
    b = Borrower("b1", G, CONFIG, 0.0)
    b.handle(Tick(), 0.0)
    assert b.handle(Unsubscribed(), 0.5) == [
        Send(REGISTRY, Disconnect(G, "b1", None, ())),
        Terminated("b1"),
    ]
    b = connected()
    b.handle(Grant(G, "b1", "L", S, 0), 0.0)
    effects = b.handle(SessionDisconnected(), 0.5)
    assert effects[0] == Forget("b1", S) and effects[-1] == Terminated("b1")
