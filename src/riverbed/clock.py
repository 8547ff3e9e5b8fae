"""Time, one way for every layer.

`now_us` is the wall clock in microseconds since the epoch, as every stored
time is kept (message timestamps, leases, session records). `Tick` is the
event that tells a sans-I/O state machine (the session, the shared
subscription's Borrower and Leader) that time passed: each is handed the time
with every event and says by `next_deadline()` when it next wants a `Tick`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def now_us() -> int:
    """The wall clock, in whole microseconds since the epoch."""
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: the deadlines, timeouts and resends due now fire."""
