"""Leader, Borrowers and sessions together over the in-process bus, fake clock."""

from __future__ import annotations

from riverbed.model import StreamId
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.leader import AssignmentStatus
from riverbed.sharedsub.protocol import Grant, Ping, Revoke, Revoked, UpdateProgress
from sharedsub.world import TOPIC, World

S0 = StreamId(TOPIC, 0, 0)
S1 = StreamId(TOPIC, 0, 1)


def split(world: World) -> dict[str, int]:
    """How many streams each session's Borrowers hold."""
    out: dict[str, int] = {}
    for name, s in world.sessions.items():
        out[name] = sum(len(b.streams) for b in s.handler.agent.borrowers.values())
    return out


def assert_settled(world: World) -> None:
    holders = world.holders()
    assert all(len(h) == 1 for h in holders.values()), holders
    assert not any(
        a.status is not AssignmentStatus.GRANTED for a in world.leader.assignments.values()
    )
    quotas = world.leader.quotas()
    holdings = world.leader.holdings()
    assert {b: len(s) for b, s in holdings.items()} == quotas


def test_one_sharer_gets_everything_and_consumes_it() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 3)
    w.subscribe("a")
    assert split(w) == {"a": 2}
    w.consume_all()
    assert w.all_consumed()
    assert sorted(w.delivered[S0]) == list(range(10))  # no duplicate
    w.advance(1.0)
    assert w.saved[S0] == 10 and w.saved[S1] == 3  # the periodic save


def test_a_new_sharer_takes_streams_over_by_revoke_without_loss_or_duplicate() -> None:
    w = World()
    w.log.publish(0, 20)
    w.log.publish(1, 20)
    a = w.subscribe("a")
    a.fetch(5)
    a.ack_all()
    a.fetch(5)  # 5 in flight on each stream
    w.subscribe("b")
    # b gets nothing yet: a must hand a stream back first, and it has messages in flight.
    assert split(w) == {"a": 2, "b": 0}
    assert [x.status for x in w.leader.assignments.values()].count(AssignmentStatus.REVOKING) == 1
    a.ack_all()  # the revoked stream drains: final progress, revoked, revoke_finished
    w.drain()
    assert split(w) == {"a": 1, "b": 1}
    w.consume_all()
    assert w.all_consumed()
    for stream in (S0, S1):
        assert sorted(w.delivered[stream]) == list(range(20)), "loss or duplicate"
    assert_settled(w)


def test_revoke_waits_at_most_the_unsubscribe_timeout() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 10)
    a = w.subscribe("a")
    a.fetch(4)  # 0..3 in flight on both streams, never acknowledged
    w.subscribe("b")
    assert split(w) == {"a": 2, "b": 0}
    w.advance(0.9)
    assert split(w) == {"a": 2, "b": 0}
    w.advance(0.2)  # past the unsubscribe timeout: final progress 0, stream moves
    assert split(w) == {"a": 1, "b": 1}
    revoked = next(lease for lease, _, _ in w.grants if lease.borrower.startswith("b/"))
    # the new holder starts at the old one's acknowledged prefix: the window again
    assert [g for g in w.grants if g[0] == revoked] == [(revoked, 0, 0)]


def test_graceful_unsubscribe_hands_everything_back_at_once() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 10)
    a = w.subscribe("a")
    w.subscribe("b")
    a.fetch(3)
    a.ack_all()
    w.unsubscribe("a")
    assert split(w) == {"a": 0, "b": 2}  # nothing in flight: drained at once
    assert w.leader.progress[S0] == 3
    assert not w.sessions["a"].handler.agent.borrowers


def test_a_dead_sharers_streams_move_after_the_timeout() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 10)
    a = w.subscribe("a")
    w.subscribe("b")
    a.fetch(4)
    a.ack(next(iter(a.in_flight()))[0], 0)
    held_by_a = [s for s, h in w.holders().items() if h[0].startswith("a/")]
    w.crash("a")
    w.advance(4.9)
    assert split(w) == {"b": 1}
    w.advance(0.2)  # leader_borrower_timeout (5 s) after a was last heard of
    assert split(w) == {"b": 2}
    # b resumes from a's last reported progress: 1 (0 was acknowledged)
    assert [(g[1], g[2]) for g in w.grants if g[0].stream == held_by_a[0]][-1] == (1, 1)
    w.consume_all()
    assert w.all_consumed()


def test_leader_lookup_failing_then_recovering() -> None:
    w = World(leader_found=False)
    w.log.publish(0, 1)
    w.subscribe("a")
    w.advance(3.5)
    assert w.registry.unanswered == 4  # at 0, 1, 2 and 3 s
    assert split(w) == {"a": 0}
    w.lookup_fails = False
    w.advance(1.0)
    assert split(w) == {"a": 2}


def test_lost_grant_revoke_and_revoked_are_resent() -> None:
    w = World()
    w.log.publish(0, 5)
    w.log.publish(1, 5)
    w.drop_filter = lambda to, m: isinstance(m, Grant)
    a = w.subscribe("a")
    assert split(w) == {"a": 0}
    w.drop_filter = None
    w.advance(1.0)
    assert split(w) == {"a": 2}
    w.drop_filter = lambda to, m: isinstance(m, Revoke | Revoked)
    w.subscribe("b")
    assert w.leader.assignments[S1].status is AssignmentStatus.REVOKING
    w.drop_filter = lambda to, m: isinstance(m, Revoked)
    w.advance(1.0)  # revoke resent; a drains at once; revoked lost
    assert w.leader.assignments[S1].status is AssignmentStatus.REVOKED
    w.drop_filter = None
    w.advance(1.0)  # revoked resent; revoke_finished; b gets S1
    assert split(w) == {"a": 1, "b": 1}
    w.consume_all()
    assert w.all_consumed()
    assert sorted(w.delivered[S1]) == list(range(5))
    del a


def test_lost_ping_answers_invalidate_the_borrower_and_a_new_one_takes_over() -> None:
    w = World()
    w.log.publish(0, 5)
    a = w.subscribe("a")
    old = a.handler.agent.subscriptions[w.leader.group]
    w.drop_filter = lambda to, m: isinstance(m, Ping)
    w.advance(4.6)  # ping at 4 unanswered; the fence (5 - 0.5 after the last answer) hits
    new = a.handler.agent.subscriptions[w.leader.group]
    assert new != old
    assert a.handler.agent.replaced[0].old == old
    assert old not in w.leader.borrowers  # its disconnect freed its streams at once
    w.drop_filter = None
    w.advance(1.0)
    assert split(w) == {"a": 2}
    assert set(w.leader.borrowers) == {new}


def test_quick_unsubscribe_subscribe_runs_two_borrowers_side_by_side() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 10)
    a = w.subscribe("a")
    a.fetch(3)  # in flight: the old Borrower must drain
    w.unsubscribe("a")
    w.subscribe("a")
    borrowers = a.handler.agent.borrowers
    assert len(borrowers) == 2
    statuses = sorted(b.status.value for b in borrowers.values())
    assert statuses == ["connected", "unsubscribing"]
    a.ack_all()
    assert len(a.handler.agent.borrowers) == 1
    w.consume_all()
    assert w.all_consumed()
    for stream in (S0, S1):
        assert sorted(set(w.delivered[stream])) == list(range(10))


def test_next_generation_only_after_its_lineage_is_consumed() -> None:
    w = World()
    w.log.publish(0, 3)
    w.log.publish(1, 3)
    a = w.subscribe("a")
    w.log.add_generation(4, 2)  # K=2: partitions 0,1 refine 0; 2,3 refine 1
    w.log.publish(0, 2)
    w.log.publish(3, 2)
    w.advance(1.0)
    assert {s.generation for s in w.holders()} == {0}
    a.fetch(10)
    a.ack(next(lease for lease, _ in a.in_flight() if lease.stream == S0), 0)
    a.ack_all()
    w.advance(1.0)
    w.advance(1.0)
    assert {s.generation for s in w.holders()} == {1}
    assert w.leader.consumed == {S0, S1}
    w.consume_all()
    assert w.all_consumed() and not w.lineage_violations


def test_progress_messages_only_count_from_the_holder() -> None:
    w = World()
    w.log.publish(0, 10)
    w.subscribe("a")
    forged = UpdateProgress(w.leader.group, "zz/x/1", w.leader.id, S0, 9)
    w.bus.send(w.leader.id, forged)
    w.drain()
    assert w.leader.progress[S0] == 0


def test_idle_leader_stops() -> None:
    w = World(SharedSubConfig(leader_idle_stop=3.0))
    w.subscribe("a")
    w.disconnect("a")
    w.advance(2.9)
    assert not w.stopped
    w.advance(0.2)
    assert w.stopped and w.leader.next_deadline() is None
    # The next subscriber starts a new Leader, which resumes from the saved progress.
    w.log.publish(0, 3)
    a = w.subscribe("a2")
    assert w.leader.id == "leader-2"
    a.fetch(2)
    a.ack_all()
    w.disconnect("a2")
    w.advance(3.1)
    w.log.publish(0, 2)
    a = w.subscribe("a3")
    assert w.leader.id == "leader-3" and w.leader.progress[S0] == 2
    w.consume_all()
    assert sorted(w.delivered[S0]) == list(range(5))


def test_a_cut_off_borrower_lets_go_before_the_leader_moves_its_streams() -> None:
    w = World()
    w.log.publish(0, 10)
    w.log.publish(1, 10)
    w.subscribe("a")
    w.subscribe("b")
    w.advance(1.0)
    w.drop_filter = lambda to, m: m.borrower.startswith("a/")
    for _ in range(100):
        w.advance(0.1)
        assert all(len(h) == 1 for h in w.holders().values()), w.holders()
    assert split(w) == {"a": 0, "b": 2}
