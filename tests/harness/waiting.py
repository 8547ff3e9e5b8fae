"""Waiting for a condition, never for a time (STYLE.md).

    eventually(lambda: len(client.received) >= 100, what="100 messages")
    value = eventually(lambda: storage.head(stream) or None, what="a head")

`eventually` calls `check` until it returns something truthy and returns that,
or fails the test with `what` and the last value seen once `timeout` has
passed. Timeouts are for a machine with both cores busy (`make test` beside
other work): they bound how long a broken test hangs, not how fast a working
one must be, so give them room. `SLOW` scales every default for machines slower
still (`RIVERBED_TEST_SLOW=3`). A test running on an event loop awaits
`eventually_async` instead, which lets the loop run while it waits.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SLOW = float(os.environ.get("RIVERBED_TEST_SLOW", "1") or 1)
"""Multiplies every default timeout (set RIVERBED_TEST_SLOW on a slow machine)."""

DEFAULT_TIMEOUT = 30.0 * SLOW
"""Seconds a condition may take on a loaded machine before the test fails."""


def eventually(
    check: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "the condition",
    interval: float = 0.02,
    explain: Callable[[], object] | None = None,
    progress: Callable[[], object] | None = None,
) -> T:
    """Call `check` until it returns a truthy value and return it; fail the test
    naming `what` and the last value (or what `explain` says then) when
    `timeout` seconds pass first. With `progress` (e.g. how many messages
    arrived so far), the wait goes on as long as its answer keeps changing:
    `timeout` then bounds a stall, not the whole wait, for work whose total
    time a loaded machine can stretch without limit."""
    deadline = time.monotonic() + timeout
    seen = progress() if progress is not None else None
    pause = min(interval, 0.005)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            if progress is not None:
                now = progress()
                if now != seen:
                    seen = now
                    deadline = time.monotonic() + timeout
                    continue
            last = explain() if explain is not None else value
            stalled = " without progress" if progress is not None else ""
            raise AssertionError(
                f"timed out after {timeout:g} s{stalled} waiting for {what} (last: {last!r})"
            )
        time.sleep(pause)
        pause = min(pause * 2, interval)


async def eventually_async(
    check: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """`eventually` for a test on an event loop: the same, but the pauses are
    the loop's (`asyncio.sleep`), so the tasks that make `check` true run."""
    deadline = time.monotonic() + timeout
    pause = min(interval, 0.005)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what} (last: {value!r})"
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, interval)


def holds(check: Callable[[], object], seconds: float, interval: float = 0.02) -> bool:
    """True if `check` stays truthy for `seconds` (for "it stays connected"-style
    claims, where no marker can be sent after the fact). Returns at the first
    falsy value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return False
        time.sleep(interval)
    return bool(check())
