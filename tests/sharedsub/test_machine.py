"""One Leader and several sessions under random joins, leaves, crashes, acks,
publishes, scale-ups, time and bus faults (hypothesis).

Invariants, checked after every step:

- at most one Borrower holds a stream (granted or revoking) at a time;
- a stream is granted from an offset no higher than its first unacknowledged
  message (nothing is skipped), and exactly from it while the bus has lost
  nothing: what a new holder redelivers is the old holder's in-flight window;
- a next-generation stream is granted only once its lineage is consumed.

At the end, with the faults off and the sessions consuming: every message is
acknowledged, the Leader's progress reaches every head, and the allocation is
the fair split with nothing in a transient state.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from riverbed.sharedsub.leader import AssignmentStatus
from sharedsub.world import World

NAMES = ["a", "b", "c"]


class SharedSubMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.generations_added = 0

    # ----------------------------------------------------------------- rules

    @rule(name=st.sampled_from(NAMES))
    def subscribe(self, name: str) -> None:
        self.world.subscribe(name)

    @precondition(lambda self: bool(self.world.sessions))
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        self.world.unsubscribe(data.draw(st.sampled_from(sorted(self.world.sessions))))

    @precondition(lambda self: bool(self.world.sessions))
    @rule(data=st.data())
    def resubscribe(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.world.sessions)))
        self.world.unsubscribe(name)
        self.world.subscribe(name)

    @precondition(lambda self: bool(self.world.sessions))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        self.world.disconnect(data.draw(st.sampled_from(sorted(self.world.sessions))))

    @precondition(lambda self: bool(self.world.sessions))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.world.crash(data.draw(st.sampled_from(sorted(self.world.sessions))))

    @rule(partition=st.integers(0, 3), count=st.integers(1, 4))
    def publish(self, partition: int, count: int) -> None:
        self.world.log.publish(partition, count)

    @precondition(lambda self: self.generations_added < 2)
    @rule()
    def scale_up(self) -> None:
        # 2 partitions (K=1) -> 4 (K=2) -> 4 (K=1, a reset of the base count).
        if self.generations_added == 0:
            self.world.log.add_generation(4, 2)
        else:
            self.world.log.add_generation(4, 1)
        self.generations_added += 1

    @precondition(lambda self: bool(self.world.sessions))
    @rule(data=st.data(), limit=st.integers(1, 4))
    def fetch(self, data: st.DataObject, limit: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.world.sessions)))
        self.world.sessions[name].fetch(limit)
        self.world.drain()

    @precondition(lambda self: any(s.in_flight() for s in self.world.sessions.values()))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        sessions = [s for _, s in sorted(self.world.sessions.items()) if s.in_flight()]
        session = data.draw(st.sampled_from(sessions))
        lease, offset = data.draw(st.sampled_from(session.in_flight()))
        session.ack(lease, offset)
        self.world.drain()

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.5, 6.0]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @rule(name=st.sampled_from(NAMES))
    def cut_off(self, name: str) -> None:
        """A network partition: every message to or from `name` is lost."""
        self.world.drop_filter = lambda to, m: m.borrower.startswith(f"{name}/")

    @rule()
    def heal(self) -> None:
        self.world.drop_filter = None

    @rule(count=st.integers(1, 3))
    def lose_messages(self, count: int) -> None:
        self.world.lose = count

    @rule(count=st.integers(1, 3))
    def duplicate_messages(self, count: int) -> None:
        self.world.duplicate = count

    # ----------------------------------------------------------------- invariants

    @invariant()
    def one_holder_per_stream(self) -> None:
        for stream, holders in self.world.holders().items():
            assert len(holders) <= 1, f"{stream} held by {holders}"

    @invariant()
    def grants_skip_nothing(self) -> None:
        for lease, offset, first_unacked in self.world.grants:
            assert offset <= first_unacked, f"{lease} granted from {offset} > {first_unacked}"
            if not self.world.lost_any:
                # Again only what was acknowledged above a hole of some window.
                again = set(range(offset, first_unacked))
                beyond = again - self.world.above_hole.get(lease.stream, set())
                assert not beyond, f"{lease}: redelivery beyond the window: {sorted(beyond)}"

    @invariant()
    def lineage_respected(self) -> None:
        assert not self.world.lineage_violations

    # ----------------------------------------------------------------- the end

    def teardown(self) -> None:
        w = self.world
        w.lose = w.duplicate = 0
        w.drop_filter = None
        for name in [*sorted(w.sessions), "z"]:
            w.subscribe(name)  # nothing for a session that shares already
        w.advance(10.0)  # timeouts of the crashed and the cut off
        w.consume_all()
        assert w.all_consumed(), {h.stream: w.first_unacked(h.stream) for h in w.log.heads()}
        w.advance(10.0)
        live = {b for s in w.sessions.values() for b in s.handler.agent.borrowers}
        assert set(w.leader.borrowers) == live
        assert all(a.status is AssignmentStatus.GRANTED for a in w.leader.assignments.values())
        holdings = w.leader.holdings()
        assert {b: len(s) for b, s in holdings.items()} == w.leader.quotas()
        for stream, holders in w.holders().items():
            assert len(holders) == 1 and stream in holdings[holders[0]]


SharedSubMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSharedSubMachine = SharedSubMachine.TestCase
