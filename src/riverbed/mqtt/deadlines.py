"""Every connection's deadline (its CONNECT timeout, then its keep alive) on
one timer of the event loop.

A connection has at most one deadline at a time (`ConnectionCore.next_deadline`),
and it is almost never reached: a client that keeps its connection alive moves
it on with every packet, and the connection only looks again when the old one
comes (`ConnectionCore.timer`). A timer of the loop per connection costs about
half a KiB of memory each (a uvloop `TimerHandle` and its libuv timer) and
2-3 µs to set and cancel, once when a connection is accepted and again at its
CONNACK; a fleet of idle clients with a keep alive holds one each.

`Deadlines` keeps them in buckets of `resolution` seconds instead, each a dict
of its connections, and runs the loop's one timer at the earliest bucket that
has any. A bucket's time is its deadlines rounded up, so a connection is never
told before its deadline, and at most `resolution` (plus the loop's own delay)
after it. The tests drive it with a fake loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

RESOLUTION = 0.05
"""Seconds of a bucket: how late past its deadline a connection may hear of it."""


class Due(Protocol):
    """What `Deadlines` tells: a connection whose deadline has come."""

    def deadline_due(self) -> None: ...


class Handle(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What `Deadlines` needs of the event loop."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Handle: ...


class Deadlines:
    """The deadlines of many owners, on one timer of `loop`.

    An owner keeps the bucket it is in (what `arm` answers) and gives it back
    to `arm` or `disarm`: no per-owner entry here but in its bucket.
    """

    __slots__ = (
        "_buckets",
        "_handle",
        "_handle_tick",
        "_loop",
        "_resolution",
        "_running",
        "_ticks",
    )

    def __init__(self, loop: Loop | None = None, resolution: float = RESOLUTION) -> None:
        if not resolution > 0:
            raise ValueError(f"resolution {resolution!r} is not a positive number of seconds")
        self._loop = loop
        """None: the running loop of the first `arm` that needs the timer."""
        self._resolution = resolution
        self._buckets: dict[int, dict[Due, None]] = {}
        self._ticks: list[int] = []
        """The buckets' ticks, a heap. A bucket left empty stays until its tick
        comes (so a tick is in the heap once), or until it is at the head."""
        self._handle: Handle | None = None
        self._handle_tick = 0
        """The tick `_handle` runs at."""
        self._running = False
        """`_run` is telling owners (it sets the timer again when done)."""

    def __len__(self) -> int:
        """Owners with a deadline."""
        return sum(map(len, self._buckets.values()))

    def arm(self, owner: Due, tick: int | None, deadline: float | None) -> int | None:
        """`owner`, now in bucket `tick` (None: none), is told at `deadline`
        (None: never). Answers its bucket now, for the next call."""
        new = None if deadline is None else math.ceil(deadline / self._resolution)
        if new == tick:
            return tick
        if tick is not None:
            self._leave(owner, tick)
        if new is not None:
            bucket = self._buckets.get(new)
            if bucket is None:
                self._buckets[new] = {owner: None}
                heapq.heappush(self._ticks, new)
                if not self._running and (self._handle is None or new < self._handle_tick):
                    self._schedule(new)
            else:
                bucket[owner] = None
        return new

    def disarm(self, owner: Due, tick: int | None) -> None:
        """`owner` (in bucket `tick`) has no deadline any more."""
        if tick is not None:
            self._leave(owner, tick)

    def close(self) -> None:
        """Forget every deadline and stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._buckets.clear()
        self._ticks.clear()

    def _leave(self, owner: Due, tick: int) -> None:
        bucket = self._buckets.get(tick)
        if bucket is not None:
            bucket.pop(owner, None)

    def _schedule(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        loop = self._loop
        if loop is None:
            loop = asyncio.get_running_loop()
            self._loop = loop
        self._handle_tick = tick
        self._handle = loop.call_at(tick * self._resolution, self._run)

    def _run(self) -> None:
        """The timer: tell every owner whose bucket's time has come (each may
        arm again, in a later bucket), then wait for the next bucket. One
        owner that fails is logged; the others are still told."""
        self._handle = None
        assert self._loop is not None
        now = self._loop.time()
        ticks = self._ticks
        buckets = self._buckets
        self._running = True
        try:
            while ticks and ticks[0] * self._resolution <= now:
                bucket = buckets.pop(heapq.heappop(ticks), None)
                for owner in bucket or ():
                    try:
                        owner.deadline_due()
                    except Exception:
                        log.exception("the deadline of %r failed", owner)
        finally:
            self._running = False
            while ticks and not buckets[ticks[0]]:
                del buckets[heapq.heappop(ticks)]  # emptied before its time
            if ticks:
                self._schedule(ticks[0])
