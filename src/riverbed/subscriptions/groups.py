"""GroupState and the grouped-order rules of one subscription shard (seed 003).

Seed 003's state, per group id and per queue (retry queue RQ, dead-letter
queue DLQ): `p`, the position of the group's last message written to the
queue, and `c`, the position the group's consumption of the queue is at; a
position (`MessageState`) is the message's main-topic position (storage topic
index, offset) and its queue position (storage topic index, offset). A group
is *pending* in a queue while `c != p`; when they meet, the group is released
and its entry dropped.

The rules (sans-I/O; the shard's runtime writes the queues and commits this
state with its progress in one transaction):

- A main-topic message of a group pending in the DLQ goes to the DLQ behind
  what is there; else, pending in the RQ, to the RQ; else it is delivered
  (`route_main`).
- A failed delivery goes to the RQ (with its next attempt time) or, when the
  policy says so or its attempts ran out, to the DLQ (`queued`).
- A message read from the RQ (`read`): below or at `c`'s queue position it
  was superseded (copied further on, below) and is skipped; of a group
  pending in the DLQ, it moves there, unless it was replayed from there
  (main position at or before the DLQ's `c`: a replay takes a prefix of the
  group's parked messages, so what is still parked comes after it);
  otherwise it is the group's next message: delivered, then `finished` makes
  `c` its position.
- When a group's head read from the RQ fails again with attempts left, it
  stays where it is: the shard's RQ reader reads ahead past it (other groups
  go on) and the group's `HeadRetry` says when its next attempt is due; its
  followers wait behind it. When its attempts run out, the head and its
  followers (the group's RQ messages up to `p`) are parked together in the
  DLQ (`parked`); `c` moves to `p`, so the originals are skipped when read.

So a group's messages are delivered in main-topic order, however often its
head fails, and nothing of a group passes a message parked in the DLQ
(DESIGN.md guarantee 2's one exception is the parked message itself).
Ungrouped subscriptions do not use this: their failures are retried alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

NO_POSITION = (-1, -1)
"""The main position of `c` before anything of the group was finished."""


class Queue(enum.Enum):
    RQ = "rq"
    DLQ = "dlq"


@dataclass(frozen=True, slots=True, order=True)
class MessageState:
    main_topic_idx: int
    main_topic_offset: int
    internal_topic_idx: int
    internal_topic_offset: int

    @property
    def main(self) -> tuple[int, int]:
        return (self.main_topic_idx, self.main_topic_offset)

    @property
    def internal(self) -> tuple[int, int]:
        return (self.internal_topic_idx, self.internal_topic_offset)


@dataclass(frozen=True, slots=True)
class HeadRetry:
    """A group's RQ head that failed again and stays in place: its next attempt."""

    internal: tuple[int, int]
    """The head's RQ position (storage topic index, offset)."""
    attempt: int
    due_us: int
    failed_us: int
    reason: str


@dataclass(frozen=True, slots=True)
class GroupState:
    p: MessageState
    """The group's last message written to the queue."""
    c: MessageState | None = None
    """Where the group's consumption of the queue is (None: nothing yet)."""

    @property
    def pending(self) -> bool:
        return self.c != self.p


class Action(enum.Enum):
    DELIVER = "deliver"
    SKIP = "skip"
    """Superseded: a copy of it further on in the RQ or in the DLQ counts."""
    TO_DLQ = "to-dlq"
    """Write it to the DLQ behind the group's parked messages."""


@dataclass(slots=True)
class GroupStates:
    """Seed 003's SubscriptionLevelGroupsState, for one shard."""

    rq: dict[str, GroupState] = field(default_factory=dict)
    dlq: dict[str, GroupState] = field(default_factory=dict)

    def _states(self, queue: Queue) -> dict[str, GroupState]:
        return self.rq if queue is Queue.RQ else self.dlq

    def pending(self, queue: Queue, group: str) -> bool:
        state = self._states(queue).get(group)
        return state is not None and state.pending

    def route_main(self, group: str) -> Queue | None:
        """Where a main-topic message of `group` goes: a queue, or None (deliver)."""
        if self.pending(Queue.DLQ, group):
            return Queue.DLQ
        if self.pending(Queue.RQ, group):
            return Queue.RQ
        return None

    def queued(self, queue: Queue, group: str, at: MessageState) -> None:
        """A message of `group` was written to `queue` at `at`."""
        states = self._states(queue)
        old = states.get(group)
        states[group] = GroupState(at, None if old is None else old.c)

    def read(self, group: str, at: MessageState) -> Action:
        """What to do with the RQ message of `group` read at `at`."""
        state = self.rq.get(group)
        if state is not None and state.c is not None and at.internal <= state.c.internal:
            return Action.SKIP
        if self.pending(Queue.DLQ, group):
            parked = self.dlq[group].c
            if parked is not None and at.main <= parked.main:
                return Action.DELIVER  # replayed from the DLQ: ahead of what is still there
            return Action.TO_DLQ
        return Action.DELIVER

    def finished(self, queue: Queue, group: str, at: MessageState) -> None:
        """The message of `group` read from `queue` at `at` was delivered or
        moved to the DLQ."""
        states = self._states(queue)
        state = states.get(group)
        if state is None:
            return
        if at == state.p:
            del states[group]  # released
        else:
            states[group] = GroupState(state.p, at)

    def parked(self, group: str, head: MessageState, written: list[MessageState]) -> None:
        """The head read at `head` whose attempts ran out and its followers
        were written to the DLQ at `written` (head first): the RQ lets go of
        the group."""
        state = self.rq.get(group)
        for at in written:
            self.queued(Queue.DLQ, group, at)
        if state is not None and state.p.internal > head.internal:
            # Not pending any more, but its followers' originals are to be skipped.
            self.rq[group] = GroupState(state.p, state.p)
        else:
            self.rq.pop(group, None)

    def skipped(self, group: str, at: MessageState) -> None:
        """A superseded original was read (`Action.SKIP`); the last one of a
        group that is no longer pending in the RQ releases it."""
        state = self.rq.get(group)
        if state is not None and not state.pending and at.internal >= state.p.internal:
            del self.rq[group]
