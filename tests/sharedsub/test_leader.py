"""The Leader alone: allocation, the grant/revoke handshake, timeouts, resends."""

from __future__ import annotations

from riverbed.clock import Tick
from riverbed.model import StreamId
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.leader import (
    AssignmentStatus,
    Effect,
    Leader,
    RenewStreams,
    SaveProgress,
    Send,
    Stop,
    StreamsRenewed,
    TopicStreams,
)
from riverbed.sharedsub.protocol import (
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
from riverbed.storage.base import StorageTopicRecord, StreamHead

G = GroupId("g", "t/#")
CONFIG = SharedSubConfig()


def streams(n: int, sealed: bool = False, next_offset: int = 10) -> StreamsRenewed:
    record = StorageTopicRecord("t", 0, n, 1)
    heads = [StreamHead(p + 1, StreamId("t", 0, p), 0, next_offset, sealed) for p in range(n)]
    return StreamsRenewed((TopicStreams([record], heads),))


def grants(effects: list[Effect]) -> list[tuple[str, int]]:
    return [
        (e.message.borrower, e.message.stream.partition)
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, Grant)
    ]


def join(leader: Leader, borrower: str, now: float) -> list[Effect]:
    effects = leader.handle(LeaderWanted(G, borrower, 1), now)
    assert effects[0] == Send(borrower, LeaderConnectResponse(G, borrower, "L", 1))
    return effects


def confirm(leader: Leader, effects: list[Effect], now: float) -> None:
    """The Borrowers answer every grant with their progress."""
    for e in effects:
        if isinstance(e, Send) and isinstance(e.message, Grant):
            g = e.message
            leader.handle(UpdateProgress(G, g.borrower, "L", g.stream, g.offset), now)


def test_a_new_borrower_gets_free_streams_at_once_in_fair_shares() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(5), 0.0)
    effects = join(leader, "b1", 0.0)
    assert grants(effects) == [("b1", p) for p in range(5)]
    assert all(a.status is AssignmentStatus.GRANTING for a in leader.assignments.values())
    confirm(leader, effects, 0.0)
    effects = join(leader, "b2", 0.1)
    # N=5, B=2: b1 wants 3, b2 wants 2: b1 gives back its last 2 streams
    revokes = [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, Revoke)]
    assert [(r.borrower, r.stream.partition) for r in revokes] == [("b1", 4), ("b1", 3)]
    assert leader.quotas() == {"b1": 3, "b2": 2}


def test_the_revoke_handshake_saves_before_revoked_and_frees_on_revoke_finished() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(2), 0.0)
    confirm(leader, join(leader, "b1", 0.0), 0.0)
    s1 = StreamId("t", 0, 1)
    effects = join(leader, "b2", 1.0)
    assert effects[1:] == [Send("b1", Revoke(G, "b1", "L", s1))]
    # progress while draining counts, the final one is saved, then revoked is sent
    leader.handle(UpdateProgress(G, "b1", "L", s1, 3), 1.1)
    effects = leader.handle(UpdateProgress(G, "b1", "L", s1, 4, True), 1.2)
    assert isinstance(effects[0], SaveProgress) and effects[0].progress[s1] == 4
    assert effects[1] == Send("b1", Revoked(G, "b1", "L", s1))
    assert leader.assignments[s1].status is AssignmentStatus.REVOKED
    effects = leader.handle(RevokeFinished(G, "b1", "L", s1), 1.3)
    assert effects == [Send("b2", Grant(G, "b2", "L", s1, 4))]


def test_only_borrowers_without_transient_streams_take_part() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(4), 0.0)
    join(leader, "b1", 0.0)  # 4 grants, unconfirmed: b1 is busy
    effects = join(leader, "b2", 0.1)
    assert grants(effects) == [] and not any(
        isinstance(e, Send) and isinstance(e.message, Revoke) for e in effects
    )


def test_unanswered_messages_are_resent() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(1), 0.0)
    join(leader, "b1", 0.0)
    leader.handle(Ping(G, "b1", "L", 2), 0.9)
    effects = leader.handle(Tick(), 1.0)
    assert RenewStreams() in effects and ("b1", 0) in grants(effects)


def test_a_silent_borrower_is_dropped_and_its_streams_move() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(2), 0.0)
    confirm(leader, join(leader, "b1", 0.0), 0.0)
    leader.handle(UpdateProgress(G, "b1", "L", StreamId("t", 0, 0), 6), 0.5)
    join(leader, "b2", 0.6)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        leader.handle(Ping(G, "b2", "L", int(t)), t)
        leader.handle(Tick(), t)
    assert "b1" in leader.borrowers
    effects = leader.handle(Tick(), 5.5)  # b1 was last heard of at 0.5
    assert "b1" not in leader.borrowers
    assert ("b2", 0) in grants(effects)
    assert Send("b2", Grant(G, "b2", "L", StreamId("t", 0, 0), 6)) in effects
    # a late message from it is answered with invalidate
    assert leader.handle(Ping(G, "b1", "L", 9), 6.0) == [Send("b1", Invalidate(G, "b1", "L"))]
    assert leader.handle(Ping(G, "b2", "L", 9), 6.0)[0] == Send("b2", PingResponse(G, "b2", "L", 9))


def test_disconnect_frees_streams_with_the_final_progress() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(2), 0.0)
    confirm(leader, join(leader, "b1", 0.0), 0.0)
    s0 = StreamId("t", 0, 0)
    effects = leader.handle(Disconnect(G, "b1", "L", ((s0, 5),)), 1.0)
    assert effects == [SaveProgress({s0: 5, StreamId("t", 0, 1): 0}, frozenset())]
    assert not leader.assignments and not leader.borrowers


def test_fully_consumed_streams_are_taken_back_and_not_lent_again() -> None:
    leader = Leader("L", G, CONFIG, 0.0)
    leader.handle(streams(2, sealed=True, next_offset=3), 0.0)
    confirm(leader, join(leader, "b1", 0.0), 0.0)
    s0 = StreamId("t", 0, 0)
    effects = leader.handle(UpdateProgress(G, "b1", "L", s0, 3), 0.5)
    assert effects == [Send("b1", Revoke(G, "b1", "L", s0))]
    assert leader.consumed == {s0} and leader.lendable == [StreamId("t", 0, 1)]


def test_idle_leader_saves_and_stops() -> None:
    leader = Leader("L", G, SharedSubConfig(leader_idle_stop=10.0), 0.0)
    leader.handle(streams(1), 0.0)
    assert Stop() not in leader.handle(Tick(), 9.9)
    effects = leader.handle(Tick(), 10.0)
    assert effects[-1] == Stop() and leader.stopped and leader.next_deadline() is None
