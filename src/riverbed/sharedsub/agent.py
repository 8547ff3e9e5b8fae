"""A session's Agent: its Borrowers, one per shared subscription (seed 001).

The Agent routes each event to the Borrower it concerns and keeps the set of
Borrowers alive:

- Borrowers are identified by their own id, not by group + filter: after a
  quick unsubscribe/subscribe the old Borrower is still `unsubscribing` (handing
  its streams back) while a new one is `connecting` to the same Leader.
- A Borrower that ends `Invalidated` is replaced by a new one with a new id if
  its subscription is still wanted; one that ends `Terminated` is dropped.

Ids are `SESSION/NONCE/N`: the nonce differs per Agent (per session
incarnation), so ids are never reused, even across a broker restart.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from dataclasses import dataclass

from riverbed.clock import Tick
from riverbed.model import StreamId
from riverbed.sharedsub.borrower import (
    Borrower,
    Effect,
    Event,
    Invalidated,
    SessionDisconnected,
    StreamDrained,
    StreamProgress,
    Terminated,
    Unsubscribed,
)
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import BorrowerId, GroupId, ToBorrower

REPLACED_KEPT = 64
"""How many of its latest replacements an Agent remembers."""
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replaced:
    """Observability: `old` was invalidated and `new` took over its subscription."""

    group: GroupId
    old: BorrowerId
    new: BorrowerId
    reason: str


class Agent:
    """The Borrowers of one session."""

    def __init__(
        self, session_id: str, config: SharedSubConfig, *, nonce: str | None = None
    ) -> None:
        self.session_id = session_id
        self.config = config
        self.nonce = secrets.token_hex(4) if nonce is None else nonce
        self.borrowers: dict[BorrowerId, Borrower] = {}
        self.subscriptions: dict[GroupId, BorrowerId] = {}
        """The current Borrower of each wanted subscription."""
        self.replaced: deque[Replaced] = deque(maxlen=REPLACED_KEPT)
        """The latest replacements (observability; bounded: a long-lived session
        under churn must not grow)."""
        self._count = 0
        self.generation = 0
        """Counts changes to `borrowers` (who is registered on the bus follows it)."""
        self._deadline: float | None = None
        self._deadline_stale = False

    def subscribe(self, group: GroupId, now: float) -> list[Effect]:
        """Start sharing `group` (nothing if this session shares it already)."""
        if group in self.subscriptions:
            return []
        return self._start(group, now)

    def unsubscribe(self, group: GroupId, now: float) -> list[Effect]:
        """Stop sharing `group`; its Borrower hands its streams back."""
        borrower_id = self.subscriptions.pop(group, None)
        if borrower_id is None:
            return []
        return self._handle(borrower_id, Unsubscribed(), now)

    def receive(self, message: ToBorrower, now: float) -> list[Effect]:
        """A message from a Leader; one for a Borrower that ended is dropped (the
        Leader drops that Borrower after its timeout)."""
        return self._handle(message.borrower, message, now)

    def progress(
        self, borrower: BorrowerId, stream: StreamId, offset: int, now: float
    ) -> list[Effect]:
        return self._handle(borrower, StreamProgress(stream, offset), now)

    def drained(
        self, borrower: BorrowerId, stream: StreamId, offset: int, now: float
    ) -> list[Effect]:
        return self._handle(borrower, StreamDrained(stream, offset), now)

    def disconnect(self, now: float) -> list[Effect]:
        """The session goes offline: every Borrower reports and ends."""
        out: list[Effect] = []
        self.subscriptions.clear()
        for borrower_id in list(self.borrowers):
            out.extend(self._handle(borrower_id, SessionDisconnected(), now))
        return out

    def tick(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        for borrower_id, borrower in list(self.borrowers.items()):
            deadline = borrower.next_deadline()
            if deadline is not None and deadline <= now:
                out.extend(self._handle(borrower_id, Tick(), now))
        return out

    def next_deadline(self) -> float | None:
        if self._deadline_stale:
            times = [d for b in self.borrowers.values() if (d := b.next_deadline()) is not None]
            self._deadline = min(times) if times else None
            self._deadline_stale = False
        return self._deadline

    # ----------------------------------------------------------------- internals

    def _start(self, group: GroupId, now: float) -> list[Effect]:
        self._count += 1
        borrower_id = f"{self.session_id}/{self.nonce}/{self._count}"
        borrower = Borrower(borrower_id, group, self.config, now)
        self.borrowers[borrower_id] = borrower
        self.generation += 1
        self.subscriptions[group] = borrower_id
        return self._handle(borrower_id, Tick(), now)

    def _handle(self, borrower_id: BorrowerId, event: Event, now: float) -> list[Effect]:
        borrower = self.borrowers.get(borrower_id)
        if borrower is None:
            return []
        self._deadline_stale = True
        effects = borrower.handle(event, now)
        out: list[Effect] = []
        for effect in effects:
            out.append(effect)
            if isinstance(effect, Terminated | Invalidated):
                del self.borrowers[borrower_id]
                self.generation += 1
            if isinstance(effect, Invalidated):
                group = borrower.group
                if self.subscriptions.get(group) == borrower_id:
                    del self.subscriptions[group]
                    out.extend(self._start(group, now))
                    replaced = Replaced(
                        group, borrower_id, self.subscriptions[group], effect.reason
                    )
                    self.replaced.append(replaced)
                    log.info(
                        "group %s: borrower %s replaced by %s: %s",
                        group,
                        borrower_id,
                        replaced.new,
                        effect.reason,
                    )
        return out
