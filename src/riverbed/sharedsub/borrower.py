"""One shared subscription of one session, talking to its group's Leader (seed 001).

A Borrower is a sans-I/O state machine: `handle(event, now)` returns effects,
`next_deadline()` says when it next wants a `Tick`. Its statuses never cycle:

    [new] -> connecting -> connected -> unsubscribing -> [done]
                 |             |              |
                 +-------------+--------------+--> [done] (invalidated)

- `connecting`: sends `leader_wanted` to the registry every find-leader retry
  period until a `leader_connect_response` names the Leader.
- `connected`: pings the Leader every ping period; takes `grant`, `revoke` and
  `revoked`; reports the session's progress with `update_progress`.
- `unsubscribing`: the session unsubscribed. Every stream stops fetching; once
  none has anything in flight (or the unsubscribe timeout passed) the Borrower
  sends `disconnect` with the final progress and is done. Messages from the
  Leader are ignored here (seed 001).

Each stream it holds is `granted`, then `revoking` once the Leader revokes it
(`[absent] -> granted -> revoking -> [absent]`). On `revoke` the session stops
fetching the stream (`StopFetching`) and keeps acknowledging what is in flight;
when nothing is (`StreamDrained`), or the unsubscribe timeout passed (`Forget`:
the session drops the stream, its in-flight messages go to the next Borrower),
the Borrower sends the final progress. On `revoked` it forgets the stream and
answers `revoke_finished`.

Invalidation: a message that cannot happen in a consistent exchange (a `grant`
of a stream being revoked, a `revoke` of a stream it never had, a message from
another Leader), an `invalidate` from the Leader, or a lost contact with the
Leader ends the Borrower: it drops its streams and emits `Invalidated`, and its
Agent creates a new Borrower with a new id that the Leader sees as a stranger.

Fence. The Leader drops a Borrower it has not heard from for
`leader_borrower_timeout` and lends its streams to others. So that no stream is
ever held twice, the Borrower lets go first: an answer to request `seq` proves
the Leader heard from it no earlier than when `seq` was sent, so the Borrower
invalidates itself at that send time + `leader_borrower_timeout` -
`fence_margin` unless a newer request was answered by then. Across nodes this
assumes clocks that run at nearly the same rate (not synchronised ones); the
margin also covers the time a message spends on the bus.

So that a slow answer does not trip the fence, a Borrower pings at least twice
per fence window: every `ping_interval`, or every (`leader_borrower_timeout` -
`fence_margin`) / 2 if that is shorter (2.25 s with the defaults), which gives
an answer half the window to come back. With the ping interval itself (4 s) it
had 0.5 s: on a busy machine (both cores taken, 1,000 Borrowers on one node)
answers took longer, and thousands of Borrowers fenced themselves off, their
in-flight windows delivered again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import assert_never

from riverbed.clock import Tick
from riverbed.model import StreamId
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import (
    REGISTRY,
    Address,
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
    ToBorrower,
    UpdateProgress,
    stream_order,
)

# --------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """The session's acknowledged prefix of a stream moved: `offset` is the first
    offset not yet consumed (seed 001 `on_stream_progress`)."""

    stream: StreamId
    offset: int


@dataclass(frozen=True, slots=True)
class StreamDrained:
    """A stream the session stopped fetching has nothing in flight any more;
    `offset` is its final progress."""

    stream: StreamId
    offset: int


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """The session unsubscribed (seed 001 `on_unsubscribe`)."""


@dataclass(frozen=True, slots=True)
class SessionDisconnected:
    """The session went offline (seed 001 `on_disconnect`): report and end."""


Event = Tick | StreamProgress | StreamDrained | Unsubscribed | SessionDisconnected | ToBorrower


# --------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    """Put `message` on the bus to `to`."""

    to: Address
    message: Message


@dataclass(frozen=True, slots=True)
class StartFetching:
    """The session starts delivering `stream` for this Borrower from `offset`."""

    borrower: BorrowerId
    stream: StreamId
    offset: int


@dataclass(frozen=True, slots=True)
class StopFetching:
    """The session fetches no more of `stream`, keeps acknowledging what is in
    flight, and reports `StreamDrained` when nothing is."""

    borrower: BorrowerId
    stream: StreamId


@dataclass(frozen=True, slots=True)
class Forget:
    """The session drops `stream` and whatever of it is in flight; later
    acknowledgements of it are not reported."""

    borrower: BorrowerId
    stream: StreamId


@dataclass(frozen=True, slots=True)
class Invalidated:
    """The Borrower ended inconsistently: recreate it (new id) if still wanted."""

    borrower: BorrowerId
    reason: str


@dataclass(frozen=True, slots=True)
class Terminated:
    """The Borrower ended as asked (unsubscribe or session disconnect)."""

    borrower: BorrowerId


Effect = Send | StartFetching | StopFetching | Forget | Invalidated | Terminated


# --------------------------------------------------------------------- state


class Status(Enum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    UNSUBSCRIBING = "unsubscribing"
    DONE = "done"


class StreamStatus(Enum):
    GRANTED = "granted"
    REVOKING = "revoking"


@dataclass(slots=True)
class BorrowedStream:
    status: StreamStatus
    progress: int
    final: bool = False
    """Final progress sent (revoking) or known (unsubscribing): nothing of it is
    in flight in the session any more."""
    deadline: float | None = None
    """Revoking: when to stop waiting for the session to drain it."""
    pinged: int = 0
    """The progress at the last ping (or the grant): one that moved since is sent again with
    the next ping (a lost `update_progress` is not asked for again)."""


@dataclass(slots=True)
class _Requests:
    """Send times of unanswered `leader_wanted` / `ping` requests by sequence."""

    next_seq: int = 1
    sent: dict[int, float] = field(default_factory=dict)


class Borrower:
    """One shared subscription's Borrower. Create it, then `handle(Tick(), now)`."""

    def __init__(
        self, borrower_id: BorrowerId, group: GroupId, config: SharedSubConfig, now: float
    ) -> None:
        self.id = borrower_id
        self.group = group
        self.config = config
        self.status = Status.CONNECTING
        self.leader: LeaderId | None = None
        self.streams: dict[StreamId, BorrowedStream] = {}
        self._requests = _Requests()
        self._find_leader_at: float | None = now
        self._ping_at: float | None = None
        self._ping_timeout_at: float | None = None
        self._fence_at: float | None = None
        self._unsubscribe_deadline: float | None = None
        self.invalid_reason: str | None = None
        self._deadline: float | None = None
        self._deadline_stale = True
        self._ping_period = min(
            config.ping_interval, (config.leader_borrower_timeout - config.fence_margin) / 2
        )
        """How often it pings: the ping interval, or more often if that leaves an
        answer less than half the fence's window to come back (see Fence)."""

    # ----------------------------------------------------------------- queries

    def next_deadline(self) -> float | None:
        """The earliest time a `Tick` has something to do (None: never)."""
        if self._deadline_stale:
            self._deadline = self._earliest()
            self._deadline_stale = False
        return self._deadline

    def _earliest(self) -> float | None:
        times = [
            t
            for t in (
                self._find_leader_at,
                self._ping_at,
                self._ping_timeout_at,
                self._fence_at,
                self._unsubscribe_deadline,
            )
            if t is not None
        ]
        times.extend(s.deadline for s in self.streams.values() if s.deadline is not None)
        return min(times) if times and self.status is not Status.DONE else None

    def progress(self) -> tuple[tuple[StreamId, int], ...]:
        return tuple(
            sorted(
                ((s, b.progress) for s, b in self.streams.items()), key=lambda p: stream_order(p[0])
            )
        )

    # ----------------------------------------------------------------- dispatch

    def handle(self, event: Event, now: float) -> list[Effect]:
        if self.status is Status.DONE:
            return []
        # Only `handle` changes the timers: the session asks for the deadline far
        # more often (after every delivery step) than events come.
        self._deadline_stale = True
        match event:
            case Tick():
                return self._tick(now)
            case StreamProgress(stream, offset):
                return self._on_progress(stream, offset)
            case StreamDrained(stream, offset):
                return self._on_drained(stream, offset)
            case Unsubscribed():
                return self._on_unsubscribe(now)
            case SessionDisconnected():
                return self._finish([Forget(self.id, s) for s in self.streams])
            case LeaderConnectResponse():
                return self._on_connect_response(event, now)
            case PingResponse():
                return self._on_ping_response(event, now)
            case Grant():
                return self._on_grant(event, now)
            case Revoke():
                return self._on_revoke(event, now)
            case Revoked():
                return self._on_revoked(event)
            case Invalidate():
                if self.leader is not None and event.leader != self.leader:
                    return []  # a stranger's opinion of us does not matter
                return self._invalidate("the Leader invalidated this Borrower", tell_leader=False)
            case _:
                assert_never(event)

    # ----------------------------------------------------------------- timers

    def _tick(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._fence_at is not None and now >= self._fence_at:
            return self._invalidate("the Leader may have dropped this Borrower (fence)")
        if self._ping_timeout_at is not None and now >= self._ping_timeout_at:
            return self._invalidate("the Leader did not answer a ping in time")
        if (
            self.status is Status.CONNECTING
            and self._find_leader_at is not None
            and now >= self._find_leader_at
        ):
            out.append(Send(REGISTRY, LeaderWanted(self.group, self.id, self._request(now))))
            self._find_leader_at = now + self.config.find_leader_retry
        if self._ping_at is not None and now >= self._ping_at and self.leader is not None:
            out.append(self._send(Ping(self.group, self.id, self.leader, self._request(now))))
            self._ping_at = now + self._ping_period
            for stream, held in self.streams.items():
                if held.pinged != held.progress and not held.final:
                    out.append(self._send(self._update(stream, held.progress, False)))
                    held.pinged = held.progress
            if self._ping_timeout_at is None:
                self._ping_timeout_at = now + self.config.ping_timeout
        for stream, held in list(self.streams.items()):
            if held.deadline is not None and now >= held.deadline and not held.final:
                # Unsubscribe timeout on a revoked stream: report what is
                # acknowledged; the rest goes to the next Borrower again.
                held.deadline = None
                out.append(Forget(self.id, stream))
                out.extend(self._final(stream, held))
        if self._unsubscribe_deadline is not None and now >= self._unsubscribe_deadline:
            forget = [Forget(self.id, s) for s, held in self.streams.items() if not held.final]
            out.extend(self._finish(forget))
        return out

    def _request(self, now: float) -> int:
        seq = self._requests.next_seq
        self._requests.next_seq += 1
        self._requests.sent[seq] = now
        return seq

    def _fence(self, sent: float) -> float:
        return sent + self.config.leader_borrower_timeout - self.config.fence_margin

    def _answered(self, seq: int) -> float | None:
        """The send time of request `seq`, forgetting it and every older one."""
        sent = self._requests.sent.get(seq)
        if sent is not None:
            for old in [s for s in self._requests.sent if s <= seq]:
                del self._requests.sent[old]
        return sent

    # ----------------------------------------------------------------- leader messages

    def _on_connect_response(self, msg: LeaderConnectResponse, now: float) -> list[Effect]:
        if self.status is Status.CONNECTING:
            sent = self._answered(msg.seq)
            if sent is None:
                return []  # an answer to a request we no longer know: wait for another
            self.status = Status.CONNECTED
            self.leader = msg.leader
            self._find_leader_at = None
            self._fence_at = self._fence(sent)
            self._ping_at = now + self._ping_period
            return []
        if msg.leader != self.leader:
            return self._invalidate(f"a second Leader {msg.leader!r} answered")
        return []  # a duplicate answer

    def _on_ping_response(self, msg: PingResponse, now: float) -> list[Effect]:
        if msg.leader != self.leader:
            return self._stranger(msg.leader)
        sent = self._answered(msg.seq)
        if sent is not None:
            self._fence_at = self._fence(sent)
            if not self._requests.sent:
                self._ping_timeout_at = None
            else:
                oldest = min(self._requests.sent.values())
                self._ping_timeout_at = oldest + self.config.ping_timeout
        return []

    def _on_grant(self, msg: Grant, now: float) -> list[Effect]:
        if self.status is not Status.CONNECTED:
            return []  # connecting: wait for the answer; unsubscribing: seed 001 ignores it
        if msg.leader != self.leader:
            return self._stranger(msg.leader)
        held = self.streams.get(msg.stream)
        if held is None:
            self.streams[msg.stream] = BorrowedStream(
                StreamStatus.GRANTED, msg.offset, pinged=msg.offset
            )
            return [
                StartFetching(self.id, msg.stream, msg.offset),
                self._send(self._update(msg.stream, msg.offset, False)),
            ]
        if held.status is StreamStatus.GRANTED:
            # A resent grant: our progress (which confirms it) was lost or is on its way.
            return [self._send(self._update(msg.stream, held.progress, False))]
        return self._invalidate(f"grant of stream {msg.stream} while it is being revoked")

    def _on_revoke(self, msg: Revoke, now: float) -> list[Effect]:
        if self.status is not Status.CONNECTED:
            return []
        if msg.leader != self.leader:
            return self._stranger(msg.leader)
        held = self.streams.get(msg.stream)
        if held is None:
            return self._invalidate(f"revoke of stream {msg.stream}, which is not ours")
        if held.status is StreamStatus.GRANTED:
            held.status = StreamStatus.REVOKING
            held.deadline = now + self.config.unsubscribe_timeout
            return [StopFetching(self.id, msg.stream)]
        if held.final:  # a resent revoke: our final progress was lost
            return [self._send(self._update(msg.stream, held.progress, True))]
        return []  # still draining

    def _on_revoked(self, msg: Revoked) -> list[Effect]:
        if self.status is not Status.CONNECTED:
            return []
        if msg.leader != self.leader:
            return self._stranger(msg.leader)
        held = self.streams.get(msg.stream)
        if held is not None and not (held.status is StreamStatus.REVOKING and held.final):
            return self._invalidate(f"revoked of stream {msg.stream} before its final progress")
        out: list[Effect] = []
        if held is not None:
            del self.streams[msg.stream]
            out.append(Forget(self.id, msg.stream))
        # Also for a stream already forgotten: the Leader resends `revoked` until it
        # hears this.
        out.append(self._send(RevokeFinished(self.group, self.id, self._leader(), msg.stream)))
        return out

    def _stranger(self, leader: LeaderId) -> list[Effect]:
        return self._invalidate(f"a message from Leader {leader!r}, not ours ({self.leader!r})")

    # ----------------------------------------------------------------- session events

    def _on_progress(self, stream: StreamId, offset: int) -> list[Effect]:
        held = self.streams.get(stream)
        if held is None or held.final or offset <= held.progress:
            return []
        held.progress = offset
        if self.status is Status.CONNECTED:
            return [self._send(self._update(stream, offset, False))]
        return []

    def _on_drained(self, stream: StreamId, offset: int) -> list[Effect]:
        held = self.streams.get(stream)
        if held is None or held.final:
            return []
        held.progress = max(held.progress, offset)
        if self.status is Status.UNSUBSCRIBING:
            held.final = True
            if all(h.final for h in self.streams.values()):
                return self._finish([])
            return []
        if held.status is StreamStatus.REVOKING:
            held.deadline = None
            return self._final(stream, held)
        return []  # a granted stream has nothing in flight: nothing to do

    def _on_unsubscribe(self, now: float) -> list[Effect]:
        if self.status is Status.CONNECTING:
            return self._finish([])
        if self.status is Status.UNSUBSCRIBING:
            return []
        self.status = Status.UNSUBSCRIBING
        out: list[Effect] = []
        for stream, held in self.streams.items():
            held.deadline = None
            if held.status is StreamStatus.GRANTED:
                out.append(StopFetching(self.id, stream))
        if all(h.final for h in self.streams.values()):
            return out + self._finish([])
        self._unsubscribe_deadline = now + self.config.unsubscribe_timeout
        return out

    # ----------------------------------------------------------------- endings

    def _final(self, stream: StreamId, held: BorrowedStream) -> list[Effect]:
        held.final = True
        return [self._send(self._update(stream, held.progress, True))]

    def _finish(self, forget: list[Forget]) -> list[Effect]:
        """Leave as asked: final progress to the Leader, then done."""
        message = Disconnect(self.group, self.id, self.leader, self.progress())
        to = REGISTRY if self.leader is None else self.leader
        self._done()
        return [*forget, Send(to, message), Terminated(self.id)]

    def _invalidate(self, reason: str, *, tell_leader: bool = True) -> list[Effect]:
        out: list[Effect] = [Forget(self.id, s) for s, h in self.streams.items() if not h.final]
        if tell_leader and self.leader is not None:
            # Best effort: lets a Leader that is alive move our streams at once.
            out.append(Send(self.leader, Disconnect(self.group, self.id, self.leader, ())))
        self.invalid_reason = reason
        self._done()
        return [*out, Invalidated(self.id, reason)]

    def _done(self) -> None:
        self.status = Status.DONE
        self.streams.clear()
        self._find_leader_at = self._ping_at = self._ping_timeout_at = None
        self._fence_at = self._unsubscribe_deadline = None

    # ----------------------------------------------------------------- helpers

    def _leader(self) -> LeaderId:
        assert self.leader is not None
        return self.leader

    def _send(self, message: Message) -> Send:
        return Send(self._leader(), message)

    def _update(self, stream: StreamId, offset: int, final: bool) -> UpdateProgress:
        return UpdateProgress(self.group, self.id, self._leader(), stream, offset, final)
