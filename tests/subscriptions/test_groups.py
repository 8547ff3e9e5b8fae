"""GroupState and grouped order (issue 7, seed 003): a one-shard model with a
FIFO retry queue and a dead-letter queue, driven by hypothesis through main
messages, deliveries that fail or succeed, and retry-queue reads in any
interleaving. Whatever happens, every message ends delivered or parked, a
group's deliveries keep main-topic order, and nothing of a group passes a
message parked in the DLQ."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.subscriptions.groups import Action, GroupStates, MessageState, Queue

MAX_ATTEMPTS = 3


@dataclass
class Queued:
    group: str
    main: int
    attempt: int
    at: MessageState


@dataclass
class Shard:
    """The runtime around `GroupStates`: writes the queues, asks the oracle."""

    outcomes: list[str]
    states: GroupStates = field(default_factory=GroupStates)
    rq: list[Queued] = field(default_factory=list)
    rq_written: int = 0
    dlq: list[Queued] = field(default_factory=list)
    delivered: list[tuple[str, int]] = field(default_factory=list)

    def outcome(self) -> str:
        return self.outcomes.pop(0) if self.outcomes else "ok"

    def write(self, queue: Queue, group: str, main: int, attempt: int) -> MessageState:
        if queue is Queue.RQ:
            at = MessageState(0, main, 0, self.rq_written)
            self.rq_written += 1
            self.rq.append(Queued(group, main, attempt, at))
        else:
            at = MessageState(0, main, 0, len(self.dlq))
            self.dlq.append(Queued(group, main, attempt, at))
        return at

    def attempt(self, group: str, main: int, attempt: int) -> str:
        result = self.outcome()
        if result == "ok":
            self.delivered.append((group, main))
        return result

    def fail(self, group: str, main: int, attempt: int, result: str) -> tuple[Queue, MessageState]:
        queue = Queue.RQ if result == "retry" and attempt < MAX_ATTEMPTS else Queue.DLQ
        return queue, self.write(queue, group, main, attempt + 1)

    def main_message(self, group: str, main: int) -> None:
        queue = self.states.route_main(group)
        if queue is not None:
            self.states.queued(queue, group, self.write(queue, group, main, 1))
            return
        result = self.attempt(group, main, 1)
        if result != "ok":
            queue, at = self.fail(group, main, 1, result)
            self.states.queued(queue, group, at)

    def read_rq(self) -> None:
        m = self.rq.pop(0)
        states = self.states
        action = states.read(m.group, m.at)
        if action is Action.SKIP:
            states.skipped(m.group, m.at)
            return
        if action is Action.TO_DLQ:
            states.queued(Queue.DLQ, m.group, self.write(Queue.DLQ, m.group, m.main, m.attempt))
            states.finished(Queue.RQ, m.group, m.at)
            return
        result = self.attempt(m.group, m.main, m.attempt)
        if result == "ok":
            states.finished(Queue.RQ, m.group, m.at)
            return
        # The head failed again: it and its followers go again, together.
        span = states.followers(m.group, m.at)
        followers = [
            q
            for q in self.rq
            if q.group == m.group
            and span is not None
            and span[0] < q.at.internal_topic_offset <= span[1]
        ]
        queue = Queue.RQ if result == "retry" and m.attempt < MAX_ATTEMPTS else Queue.DLQ
        written = [self.write(queue, m.group, m.main, m.attempt + 1)]
        written += [self.write(queue, q.group, q.main, q.attempt) for q in followers]
        if queue is Queue.RQ:
            states.requeued(m.group, written)
        else:
            states.parked(m.group, m.at, written)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), min_size=1, max_size=30),
    st.lists(st.sampled_from(["ok", "ok", "retry", "fail"]), max_size=60),
)
def test_grouped_order_survives_any_failures(
    steps: list[tuple[str, bool]], outcomes: list[str]
) -> None:
    shard = Shard(list(outcomes))
    for main, (group, read_first) in enumerate(steps):
        if read_first and shard.rq:
            shard.read_rq()
        shard.main_message(group, main)
    for _ in range(10_000):
        if not shard.rq:
            break
        shard.read_rq()
    assert not shard.rq

    published = {(g, m) for m, (g, _) in enumerate(steps)}
    parked = [(q.group, q.main) for q in shard.dlq]
    # Everything ends delivered or parked, once.
    assert sorted(shard.delivered + parked) == sorted(published)
    for group in "abc":
        mine = [m for g, m in shard.delivered if g == group]
        assert mine == sorted(mine), f"{group}: delivered out of order: {mine}"
        dead = [m for g, m in parked if g == group]
        assert dead == sorted(dead), f"{group}: parked out of order: {dead}"
        if dead:
            # Nothing of the group after its first parked message was delivered.
            assert all(m < dead[0] for m in mine)
    # The retry queue let go of every group; the DLQ holds the parked ones.
    assert shard.states.rq == {}
    assert {g for g, _ in parked} == {g for g, s in shard.states.dlq.items() if s.pending}


def test_a_head_that_fails_again_is_written_again_with_its_followers() -> None:
    s = GroupStates()
    head = MessageState(0, 10, 0, 0)
    s.queued(Queue.RQ, "g", head)
    follower = MessageState(0, 11, 0, 1)
    assert s.route_main("g") is Queue.RQ
    s.queued(Queue.RQ, "g", follower)
    assert s.read("g", head) is Action.DELIVER
    assert s.followers("g", head) == (0, 1)
    copies = [MessageState(0, 10, 0, 2), MessageState(0, 11, 0, 3)]
    s.requeued("g", copies)  # failed again
    later = MessageState(0, 12, 0, 4)  # a main-topic message meanwhile: behind the copies
    assert s.route_main("g") is Queue.RQ
    s.queued(Queue.RQ, "g", later)
    assert s.read("g", follower) is Action.SKIP
    s.skipped("g", follower)
    for at in [*copies, later]:
        assert s.read("g", at) is Action.DELIVER
        s.finished(Queue.RQ, "g", at)
    assert s.rq == {} and s.route_main("g") is None
