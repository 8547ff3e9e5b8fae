"""Time for tests: a fake clock the test moves, and waiting for the real one.

    clock = FakeClock(us=1_700_000_000_000_000)
    host = LeaderHost(..., clock=clock, wall_us=clock.us)
    clock.advance(2.5)          # or advance(us=...), advance(ns=...)

`FakeClock` keeps whole nanoseconds, so every unit reads exactly: calling it
gives seconds (a float, what `time.monotonic` gives), `us()` and `ns()` whole
µs and ns (what `time.time_ns() // 1000` and `time.time_ns()` give). Time
moves only in `advance`, which may also step back (a wall clock may).

For tests about the real wall clock, `moment_between()` waits (a µs or two)
for a moment strictly between what was written before it and what is written
after: what sleeping a guessed amount was for.
"""

from __future__ import annotations

import time

from harness.waiting import eventually


def _ns(seconds: float, us: int, ns: int) -> int:
    return round(seconds * 1_000_000_000) + us * 1_000 + ns


class FakeClock:
    """A clock that stands still until the test moves it."""

    def __init__(self, seconds: float = 0.0, *, us: int = 0, ns: int = 0) -> None:
        self._ns = _ns(seconds, us, ns)

    def __call__(self) -> float:
        """The time in seconds."""
        return self._ns / 1_000_000_000

    def us(self) -> int:
        """The time in whole microseconds."""
        return self._ns // 1_000

    def ns(self) -> int:
        """The time in nanoseconds."""
        return self._ns

    def advance(self, seconds: float = 0.0, *, us: int = 0, ns: int = 0) -> None:
        """Move the time by the sum of the arguments (negative: back); never
        below 0."""
        self._ns = max(0, self._ns + _ns(seconds, us, ns))

    def __repr__(self) -> str:
        return f"FakeClock(ns={self._ns})"


def wall_us() -> int:
    """The real wall clock in µs, as message ids and CLI times read it."""
    return time.time_ns() // 1_000


def wall_us_after(us: int) -> int:
    """Wait (a µs or so) until the wall clock reads later than `us`; return
    what it reads then."""

    def later() -> int:
        now = wall_us()
        return now if now > us else 0

    return eventually(later, what=f"the wall clock past {us} µs", interval=0.0001)


def moment_between() -> int:
    """A µs strictly later than every timestamp written before the call and
    strictly earlier than every one written after it (message ids and rows are
    stamped from the wall clock, never ahead of it)."""
    moment = wall_us_after(wall_us())
    wall_us_after(moment)
    return moment
