"""Timers of the shared subscription protocol, in seconds (the defaults).

One object for both sides: the Borrower needs the Leader's borrower timeout to
fence itself off in time (see `Borrower`), and the rules below relate the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from riverbed.errors import InvalidConfig


@dataclass(frozen=True, slots=True)
class SharedSubConfig:
    find_leader_retry: float = 1.0
    """Borrower, connecting: resend `leader_wanted` this often."""
    ping_interval: float = 4.0
    """Borrower, connected: send `ping` this often."""
    ping_timeout: float = 4.0
    """Borrower: a `ping` unanswered this long invalidates the Borrower."""
    unsubscribe_timeout: float = 1.0
    """Borrower: how long a revoked stream or an unsubscribe waits for in-flight
    messages to be acknowledged before reporting the progress it has."""
    leader_borrower_timeout: float = 5.0
    """Leader: a Borrower silent this long (no ping, no message) is dropped and
    its streams move on."""
    fence_margin: float = 0.5
    """Borrower: let go of its streams this long before the Leader may drop it
    (covers message delay and clocks running at slightly different rates)."""
    leader_periodic: float = 1.0
    """Leader: period of its periodic actions (renew streams, rebalance, save)."""
    leader_resend: float = 1.0
    """Leader: resend an unanswered `grant` / `revoke` / `revoked` this long after
    the last send (not in the issue's list; one periodic step by default)."""
    leader_claim_lease: float = 30.0
    """Leader: time-to-live of the leader claim it renews."""
    leader_idle_stop: float = 30.0
    """Leader: stop after this long without any Borrower."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise InvalidConfig(
                    f"shared subscription setting {f.name} = {value!r}: must be a positive,"
                    " finite number of seconds"
                )
        if self.ping_interval + self.fence_margin >= self.leader_borrower_timeout:
            raise InvalidConfig(
                f"shared subscription setting ping_interval = {self.ping_interval!r}: with"
                f" fence_margin ({self.fence_margin!r}) it must stay below"
                f" leader_borrower_timeout ({self.leader_borrower_timeout!r}), or Borrowers let"
                " go of their streams between two pings"
            )
        if self.leader_claim_lease <= self.leader_borrower_timeout:
            raise InvalidConfig(
                f"shared subscription setting leader_claim_lease = {self.leader_claim_lease!r}:"
                f" must exceed leader_borrower_timeout ({self.leader_borrower_timeout!r}), so the"
                " Borrowers of a dead Leader have let go before another Leader takes over"
            )
