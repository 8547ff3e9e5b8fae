"""The Leader of one shared subscription group (seed 001), sans-I/O.

The Leader lends the streams of its group's filter to the group's Borrowers and
is the only one that keeps (and, through its runtime, persists) their progress.
It knows

- the streams: the runtime reads the heads of the topics the filter may reach
  and hands them in (`StreamsRenewed`) whenever the Leader asks (`RenewStreams`,
  every periodic step). Lendable are the streams a reader may read now
  (`riverbed.log.lineage.readable_streams`: a next generation only once the
  streams of the same lineage before it are fully consumed) minus those fully
  consumed (sealed and read to their head);
- the Borrowers, in the order they joined (the stable order allocation uses),
  with when each was last heard from;
- an assignment per lent stream: `granting -> granted -> revoking -> revoked`,
  deleted on `revoke_finished`;
- the progress of every stream (the first offset not yet consumed).

Granting: the assignment starts `granting`, `grant` carries the progress; the
first `update_progress` for it from that Borrower makes it `granted`.
Revoking: `revoking` until the Borrower's final progress arrives, which is saved
(`SaveProgress`) and answered with `revoked`; `revoke_finished` deletes the
assignment and the stream is free. `grant`, `revoke` and `revoked` are resent
every `leader_resend` seconds until answered.

Allocation: with N lendable streams and B Borrowers in join order,
Borrower i wants N div B, plus one if i < N rem B. Borrowers above their share
have streams revoked, Borrowers below it are granted free streams; only
Borrowers with no stream in a transient state (granting, revoking, revoked)
take part in a round. It runs on every change, so a new Borrower gets free
streams at once and a Borrower that leaves frees its streams at once.

A Borrower not heard from for more than `leader_borrower_timeout` is dropped;
its streams are free again, from the progress it last reported. A message from
a Borrower the Leader does not know is answered with `invalidate`.

Effects run in order: the runtime must stop at a `SaveProgress` that fails (a
newer Leader fenced this one off) and send nothing after it. `Stop` means the
group had no Borrower for `leader_idle_stop` seconds: the runtime saves,
releases the claim and forgets this Leader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import assert_never

from riverbed.clock import Tick
from riverbed.log.lineage import readable_streams
from riverbed.model import StreamId
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import (
    BorrowerId,
    Disconnect,
    Grant,
    GroupId,
    Invalidate,
    LeaderConnectResponse,
    LeaderId,
    LeaderWanted,
    Message,
    Ping,
    PingResponse,
    Revoke,
    Revoked,
    RevokeFinished,
    ToLeader,
    UpdateProgress,
)
from riverbed.storage.base import StorageTopicRecord, StreamHead

# --------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class TopicStreams:
    """One topic's generations and stream heads, as the runtime read them.

    `initial` gives the first offset for a stream the group has no progress for
    yet (from the group's start time); missing means the stream's start."""

    storage_topics: Sequence[StorageTopicRecord]
    heads: Sequence[StreamHead]
    initial: Mapping[StreamId, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamsRenewed:
    """The answer to `RenewStreams`: every topic the group's filter may reach."""

    topics: Sequence[TopicStreams]


Event = Tick | StreamsRenewed | ToLeader


# --------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    to: BorrowerId
    message: Message


@dataclass(frozen=True, slots=True)
class SaveProgress:
    """Persist the group's progress (compare-and-set on the group record) and the
    streams known fully consumed."""

    progress: Mapping[StreamId, int]
    consumed: frozenset[StreamId] = frozenset()


@dataclass(frozen=True, slots=True)
class RenewStreams:
    """Read the heads of the filter's topics and answer `StreamsRenewed`."""


@dataclass(frozen=True, slots=True)
class Stop:
    """No Borrower for the idle time: save, release the claim, end."""


Effect = Send | SaveProgress | RenewStreams | Stop


# --------------------------------------------------------------------- state


class AssignmentStatus(Enum):
    GRANTING = "granting"
    GRANTED = "granted"
    REVOKING = "revoking"
    REVOKED = "revoked"


TRANSIENT = frozenset(
    {AssignmentStatus.GRANTING, AssignmentStatus.REVOKING, AssignmentStatus.REVOKED}
)


@dataclass(slots=True)
class Assignment:
    borrower: BorrowerId
    status: AssignmentStatus
    sent_at: float
    """When the message of the current status was last sent."""


@dataclass(slots=True)
class BorrowerInfo:
    last_seen: float


class Leader:
    """The Leader of one group: create it with the progress its claim loaded."""

    def __init__(
        self,
        leader_id: LeaderId,
        group: GroupId,
        config: SharedSubConfig,
        now: float,
        progress: Mapping[StreamId, int] | None = None,
    ) -> None:
        self.id = leader_id
        self.group = group
        self.config = config
        self.progress: dict[StreamId, int] = dict(progress or {})
        self.borrowers: dict[BorrowerId, BorrowerInfo] = {}
        self.assignments: dict[StreamId, Assignment] = {}
        self.lendable: list[StreamId] = []
        """Streams that may be lent now, in `lending_order`."""
        self._order: dict[StreamId, LendingKey] = {}
        """`lending_order` of the lendable streams."""
        self.consumed: set[StreamId] = set()
        self.stopped = False
        self._topics: Sequence[TopicStreams] = ()
        self._dirty = False
        self._periodic_at = now
        self._idle_since: float | None = now
        self.rebalances = 0
        """Allocation rounds that changed an assignment (granted or revoked a
        stream): what the node's metrics count (`riverbed_shared_rebalances`)."""

    # ----------------------------------------------------------------- queries

    def next_deadline(self) -> float | None:
        if self.stopped:
            return None
        times = [self._periodic_at]
        times.extend(
            b.last_seen + self.config.leader_borrower_timeout for b in self.borrowers.values()
        )
        times.extend(
            a.sent_at + self.config.leader_resend
            for a in self.assignments.values()
            if a.status in TRANSIENT
        )
        if self._idle_since is not None:
            times.append(self._idle_since + self.config.leader_idle_stop)
        return min(times)

    def holdings(self) -> dict[BorrowerId, list[StreamId]]:
        """Streams each Borrower holds or is being granted (not being revoked)."""
        out: dict[BorrowerId, list[StreamId]] = {b: [] for b in self.borrowers}
        for stream, a in sorted(self.assignments.items(), key=self._by_stream):
            if a.status in (AssignmentStatus.GRANTING, AssignmentStatus.GRANTED):
                out[a.borrower].append(stream)
        return out

    def quotas(self) -> dict[BorrowerId, int]:
        """The fair split: Borrower i (join order) wants N div B (+1 if i < N rem B)."""
        n, b = len(self.lendable), len(self.borrowers)
        if b == 0:
            return {}
        return {bid: n // b + (1 if i < n % b else 0) for i, bid in enumerate(self.borrowers)}

    # ----------------------------------------------------------------- dispatch

    def handle(self, event: Event, now: float) -> list[Effect]:
        if self.stopped:
            return []
        out: list[Effect] = []
        match event:
            case Tick():
                out += self._tick(now)
            case StreamsRenewed(topics):
                self._topics = topics
                self._refresh()
            case LeaderWanted():
                out += self._on_leader_wanted(event, now)
            case Ping():
                if not self._seen(event.borrower, now):
                    return [self._invalidate(event.borrower)]
                # Changes nothing the allocation depends on: no rebalance.
                return [
                    Send(
                        event.borrower, PingResponse(self.group, event.borrower, self.id, event.seq)
                    )
                ]
            case UpdateProgress():
                if not self._seen(event.borrower, now):
                    return [self._invalidate(event.borrower)]
                a = self.assignments.get(event.stream)
                steady = (
                    not event.final
                    and a is not None
                    and a.borrower == event.borrower
                    and a.status is AssignmentStatus.GRANTED
                )
                lendable = self.lendable
                out += self._on_progress(event, now)
                if steady and self.lendable is lendable:
                    # The most frequent message: a granted stream's progress.
                    # Unless it emptied a sealed stream (lendable renewed),
                    # the allocation is as it was.
                    return out
            case RevokeFinished():
                if not self._seen(event.borrower, now):
                    return [self._invalidate(event.borrower)]
                a = self.assignments.get(event.stream)
                if (
                    a is not None
                    and a.borrower == event.borrower
                    and a.status is AssignmentStatus.REVOKED
                ):
                    del self.assignments[event.stream]
            case Disconnect():
                out += self._on_disconnect(event, now)
            case _:
                assert_never(event)
        out += self._rebalance(now)
        return out

    # ----------------------------------------------------------------- borrower messages

    def _seen(self, borrower: BorrowerId, now: float) -> bool:
        info = self.borrowers.get(borrower)
        if info is None:
            return False
        info.last_seen = now
        return True

    def _invalidate(self, borrower: BorrowerId) -> Send:
        return Send(borrower, Invalidate(self.group, borrower, self.id))

    def _on_leader_wanted(self, msg: LeaderWanted, now: float) -> list[Effect]:
        if msg.borrower not in self.borrowers:
            self.borrowers[msg.borrower] = BorrowerInfo(now)
            self._idle_since = None
        else:
            self.borrowers[msg.borrower].last_seen = now
        reply = LeaderConnectResponse(self.group, msg.borrower, self.id, msg.seq)
        return [Send(msg.borrower, reply)]

    def _on_progress(self, msg: UpdateProgress, now: float) -> list[Effect]:
        a = self.assignments.get(msg.stream)
        if a is None or a.borrower != msg.borrower:
            return []  # a late report of a Borrower that no longer holds it
        if a.status is AssignmentStatus.REVOKED:
            if msg.final:  # our `revoked` was lost
                a.sent_at = now
                return [Send(a.borrower, self._revoked(a.borrower, msg.stream))]
            return []
        self._advance(msg.stream, msg.offset)
        if a.status is AssignmentStatus.GRANTING:
            a.status = AssignmentStatus.GRANTED
        if msg.final and a.status is AssignmentStatus.REVOKING:
            # Persist before confirming: after `revoked` nobody else will report
            # this stream's progress until its next grant (seed 001).
            a.status = AssignmentStatus.REVOKED
            a.sent_at = now
            self._dirty = False
            return [
                self._save(),
                Send(a.borrower, self._revoked(a.borrower, msg.stream)),
            ]
        return []

    def _on_disconnect(self, msg: Disconnect, now: float) -> list[Effect]:
        if msg.borrower not in self.borrowers:
            return []
        for stream, offset in msg.progress:
            a = self.assignments.get(stream)
            if a is not None and a.borrower == msg.borrower:
                self._advance(stream, offset)
        self._drop(msg.borrower, now)
        if not self._dirty:
            return []
        self._dirty = False
        return [self._save()]

    def _advance(self, stream: StreamId, offset: int) -> None:
        if offset > self.progress.get(stream, 0):
            self.progress[stream] = offset
            self._dirty = True
            head = self._head(stream)
            if head is not None and head.sealed and offset >= head.next_offset:
                self._refresh()  # fully consumed: it leaves, successors may come

    def _drop(self, borrower: BorrowerId, now: float) -> None:
        del self.borrowers[borrower]
        for stream in [s for s, a in self.assignments.items() if a.borrower == borrower]:
            del self.assignments[stream]
        if not self.borrowers:
            self._idle_since = now

    def _revoked(self, borrower: BorrowerId, stream: StreamId) -> Revoked:
        return Revoked(self.group, borrower, self.id, stream)

    # ----------------------------------------------------------------- timers

    def _tick(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        if now >= self._periodic_at:
            self._periodic_at = now + self.config.leader_periodic
            out.append(RenewStreams())
            if self._dirty:
                self._dirty = False
                out.append(self._save())
        for borrower, info in list(self.borrowers.items()):
            # The Borrower has let go by now (its fence, borrower.py).
            if now >= info.last_seen + self.config.leader_borrower_timeout:
                self._drop(borrower, now)
        for stream, a in sorted(self.assignments.items(), key=self._by_stream):
            if a.status in TRANSIENT and now >= a.sent_at + self.config.leader_resend:
                a.sent_at = now
                out.append(Send(a.borrower, self._message_for(stream, a)))
        if self._idle_since is not None and now >= self._idle_since + self.config.leader_idle_stop:
            self.stopped = True
            if self._dirty:
                out.append(self._save())
            out.append(Stop())
        return out

    def _message_for(self, stream: StreamId, a: Assignment) -> Message:
        match a.status:
            case AssignmentStatus.GRANTING:
                return Grant(self.group, a.borrower, self.id, stream, self._offset(stream))
            case AssignmentStatus.REVOKING:
                return Revoke(self.group, a.borrower, self.id, stream)
            case AssignmentStatus.REVOKED:
                return self._revoked(a.borrower, stream)
            case AssignmentStatus.GRANTED:
                raise AssertionError("nothing to resend for a granted stream")
            case _:
                assert_never(a.status)

    # ----------------------------------------------------------------- streams

    def _head(self, stream: StreamId) -> StreamHead | None:
        for topic in self._topics:
            for head in topic.heads:
                if head.stream == stream:
                    return head
        return None

    def _refresh(self) -> None:
        lendable: list[StreamId] = []
        consumed: set[StreamId] = set()
        order: dict[StreamId, LendingKey] = {}
        for topic in self._topics:
            sizes = {st.generation: st.partitions for st in topic.storage_topics}
            for head in topic.heads:
                if head.stream not in self.progress:
                    start = topic.initial.get(head.stream, head.start_offset)
                    self.progress[head.stream] = max(start, head.start_offset)
                    self._dirty = True
            committed = {h.key: self.progress[h.stream] for h in topic.heads}
            readable, done = readable_streams(topic.storage_topics, topic.heads, committed)
            for head in readable:
                if head.key in done:
                    consumed.add(head.stream)
                else:
                    lendable.append(head.stream)
                    size = sizes.get(head.stream.generation, head.stream.partition + 1)
                    order[head.stream] = lending_order(head.stream, size)
        self._order = order
        self.lendable = sorted(lendable, key=order.__getitem__)
        self.consumed = consumed

    def _save(self) -> SaveProgress:
        return SaveProgress(dict(self.progress), frozenset(self.consumed))

    def _offset(self, stream: StreamId) -> int:
        return self.progress.get(stream, 0)

    # ----------------------------------------------------------------- allocation

    def _rebalance(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        lendable = set(self.lendable)
        # Streams that left (fully consumed, deleted) are taken back first.
        for stream, a in sorted(self.assignments.items(), key=self._by_stream):
            if stream not in lendable and a.status is AssignmentStatus.GRANTED:
                out.append(self._revoke(stream, a, now))
        quotas = self.quotas()
        holdings = self.holdings()
        busy = {a.borrower for a in self.assignments.values() if a.status in TRANSIENT}
        free = [s for s in self.lendable if s not in self.assignments]
        for borrower, quota in quotas.items():
            if borrower in busy:
                continue
            held = holdings[borrower]
            for stream in held[quota:][::-1]:
                out.append(self._revoke(stream, self.assignments[stream], now))
        for borrower, quota in quotas.items():
            if borrower in busy:
                continue
            held = holdings[borrower]
            while len(held) < quota and free:
                stream = free.pop(0)
                held.append(stream)
                self.assignments[stream] = Assignment(borrower, AssignmentStatus.GRANTING, now)
                grant = Grant(self.group, borrower, self.id, stream, self._offset(stream))
                out.append(Send(borrower, grant))
        if out:
            self.rebalances += 1
        return out

    def _by_stream(self, item: tuple[StreamId, Assignment]) -> LendingKey:
        """`lending_order` of an assignment's stream (after the lendable ones if
        it is lendable no more)."""
        stream = item[0]
        found = self._order.get(stream)
        if found is None:
            return (Fraction(1), stream.topic, stream.generation, stream.partition)
        return found

    def _revoke(self, stream: StreamId, a: Assignment, now: float) -> Send:
        a.status = AssignmentStatus.REVOKING
        a.sent_at = now
        return Send(a.borrower, Revoke(self.group, a.borrower, self.id, stream))


LendingKey = tuple[Fraction, str, int, int]


def lending_order(stream: StreamId, partitions: int) -> LendingKey:
    """Where a stream of a generation of `partitions` comes in the order streams
    are lent and taken back in: by its place within its topic (partition /
    partitions), then topic. A group's filter reaches a bound topic and the
    built-in `mqtt` too; in topic order one member held all of one topic, and
    so did all of its work. This way each member's contiguous share of the
    order holds a like share of every topic, whatever their partition counts."""
    place = Fraction(stream.partition, partitions)
    return (place, stream.topic, stream.generation, stream.partition)
