"""The Shared Subscription Handler: what a session calls (seed 001).

The session knows MQTT and its client; the Handler knows which streams the
session may fetch for its shared subscriptions and how far each is consumed;
the Agent and its Borrowers (behind it) know how streams are obtained. All of it
is sans-I/O: the session calls in with `now` and executes what comes back.

What the session calls:

- `subscribe(text, now)` / `unsubscribe(text, now)` with `$share/GROUP/FILTER`
  or `$queue/FILTER`;
- `receive(message, now)` with a message the bus delivered to this session's
  Borrowers;
- `fetched(grant, upto, in_flight)` after taking the grant's stream in up to
  offset `upto` (exclusive), with the offsets it sent to the client and expects
  to be acknowledged (QoS 1/2; QoS 0 deliveries and messages that did not match
  the filter are simply not listed);
- `acked(grant, offset, now)` when the client acknowledged one of them;
- `report(grant, taken, sent, acked, now)`: both at once, for what a session
  did in one step (one progress report, not one per message);
- `disconnect(now)` when the session goes offline; `tick(now)` at
  `next_deadline()`.

What comes back (`SessionEffect`): `Send` (put on the bus), `StartFetching`
(a new grant: fetch its stream from an offset), `StopFetching` (fetch no more,
keep acknowledging), `Forget` (drop the grant and its in-flight messages).

The Handler keeps, per grant, the fetched position and the in-flight offsets;
the progress it reports is the first offset not yet done (the lowest in flight,
else the fetched position), so the Leader only ever saves a contiguous
acknowledged prefix and a new Borrower redelivers at most the in-flight window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import assert_never

from riverbed.model import StreamId
from riverbed.sharedsub.agent import Agent
from riverbed.sharedsub.borrower import (
    Effect,
    Forget,
    Invalidated,
    Send,
    StartFetching,
    StopFetching,
    Terminated,
)
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import BorrowerId, GroupId, ToBorrower

SessionEffect = Send | StartFetching | StopFetching | Forget


@dataclass(frozen=True, slots=True)
class Grant:
    """A stream lent to one Borrower of this session."""

    borrower: BorrowerId
    stream: StreamId


@dataclass(slots=True)
class _Window:
    fetched: int
    """The first offset not yet taken in."""
    in_flight: set[int] = field(default_factory=set)
    stopping: bool = False

    @property
    def progress(self) -> int:
        return min(self.in_flight) if self.in_flight else self.fetched


class SharedSubscriptionHandler:
    """The session-side facade of durable shared subscriptions."""

    def __init__(
        self, session_id: str, config: SharedSubConfig, *, nonce: str | None = None
    ) -> None:
        self.agent = Agent(session_id, config, nonce=nonce)
        self._windows: dict[Grant, _Window] = {}

    # ----------------------------------------------------------------- queries

    @property
    def grants(self) -> dict[Grant, int]:
        """Grants the session may fetch now, with the offset to fetch from."""
        return {k: w.fetched for k, w in self._windows.items() if not w.stopping}

    def in_flight(self, grant: Grant) -> frozenset[int]:
        window = self._windows.get(grant)
        return frozenset() if window is None else frozenset(window.in_flight)

    def group_of(self, grant: Grant) -> GroupId | None:
        borrower = self.agent.borrowers.get(grant.borrower)
        return None if borrower is None else borrower.group

    def next_deadline(self) -> float | None:
        return self.agent.next_deadline()

    # ----------------------------------------------------------------- session calls

    def subscribe(self, text: str, now: float) -> list[SessionEffect]:
        """Raises `InvalidTopicFilter` for text that is no shared subscription."""
        return self._run(self.agent.subscribe(GroupId.parse(text), now), now)

    def unsubscribe(self, text: str, now: float) -> list[SessionEffect]:
        return self._run(self.agent.unsubscribe(GroupId.parse(text), now), now)

    def receive(self, message: ToBorrower, now: float) -> list[SessionEffect]:
        return self._run(self.agent.receive(message, now), now)

    def fetched(
        self, grant: Grant, upto: int, in_flight: Iterable[int], now: float
    ) -> list[SessionEffect]:
        """The session took in `grant`'s stream up to `upto`, sending `in_flight`.

        Ignored for a grant that is stopping or gone: the session must not deliver
        anything of such a grant (it got `StopFetching` / `Forget` first)."""
        window = self._windows.get(grant)
        if window is None or window.stopping or upto < window.fetched:
            return []
        before = window.progress
        window.in_flight.update(o for o in in_flight if window.fetched <= o < upto)
        window.fetched = upto
        return self._moved(grant, window, before, now)

    def acked(self, grant: Grant, offset: int, now: float) -> list[SessionEffect]:
        """The client acknowledged `offset` of the grant (ignored if unknown)."""
        window = self._windows.get(grant)
        if window is None or offset not in window.in_flight:
            return []
        before = window.progress
        window.in_flight.discard(offset)
        return self._moved(grant, window, before, now)

    def report(
        self, grant: Grant, taken: int, sent: Iterable[int], acked: Iterable[int], now: float
    ) -> list[SessionEffect]:
        """`fetched(grant, taken, sent)` then `acked` for each of `acked`, with one
        progress report at most."""
        window = self._windows.get(grant)
        if window is None:
            return []
        before = window.progress
        if not window.stopping and taken >= window.fetched:
            window.in_flight.update(o for o in sent if window.fetched <= o < taken)
            window.fetched = taken
        window.in_flight.difference_update(acked)
        return self._moved(grant, window, before, now)

    def disconnect(self, now: float) -> list[SessionEffect]:
        return self._run(self.agent.disconnect(now), now)

    def tick(self, now: float) -> list[SessionEffect]:
        return self._run(self.agent.tick(now), now)

    # ----------------------------------------------------------------- internals

    def _moved(self, grant: Grant, window: _Window, before: int, now: float) -> list[SessionEffect]:
        effects: list[Effect] = []
        if window.progress > before:
            effects += self.agent.progress(grant.borrower, grant.stream, window.progress, now)
        if window.stopping and not window.in_flight:
            del self._windows[grant]
            effects += self.agent.drained(grant.borrower, grant.stream, window.progress, now)
        return self._run(effects, now)

    def _run(self, effects: list[Effect], now: float) -> list[SessionEffect]:
        """Apply the Agent's effects on the windows; return the session's share.

        A stop of a grant with nothing in flight drains at once, which goes back
        into the Agent: hence the work list."""
        out: list[SessionEffect] = []
        work = list(effects)
        while work:
            effect = work.pop(0)
            match effect:
                case StartFetching(borrower, stream, offset):
                    self._windows[Grant(borrower, stream)] = _Window(offset)
                    out.append(effect)
                case StopFetching(borrower, stream):
                    grant = Grant(borrower, stream)
                    window = self._windows.get(grant)
                    out.append(effect)
                    if window is None:
                        continue
                    window.stopping = True
                    if not window.in_flight:
                        del self._windows[grant]
                        work.extend(self.agent.drained(borrower, stream, window.progress, now))
                case Forget(borrower, stream):
                    # Also when its window is gone (drained at the stop): the
                    # session still has the stream until it hears this.
                    self._windows.pop(Grant(borrower, stream), None)
                    out.append(effect)
                case Send():
                    out.append(effect)
                case Invalidated() | Terminated():
                    pass
                case _:
                    assert_never(effect)
        return out
