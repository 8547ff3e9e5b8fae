"""Riding out a store that cannot be reached for a while (a PostgreSQL
restart, a failover): the Spark delivery job's planning, batches and commits
try again instead of failing the streaming query.

Only `StorageUnavailable` is waited out: nothing was written, or a commit's
outcome is unknown, and the callers here are idempotent (a batch commits once,
by its marker; planning only reads). Any other error goes up at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from riverbed.errors import StorageUnavailable

T = TypeVar("T")

PATIENCE = 600.0
"""Seconds an operation waits for an unreachable store before it fails."""
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 5.0

log = logging.getLogger(__name__)


def ride_out(
    call: Callable[[], T],
    what: str,
    patience: float = PATIENCE,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, tried again while it raises `StorageUnavailable`, pausing 0.5 s
    then twice as long each time (at most 5 s), for up to `patience` seconds;
    then the error goes up. One warning when the wait starts, one when it ends."""
    deadline = time.monotonic() + patience
    pause = FIRST_PAUSE
    waited_since: float | None = None
    while True:
        try:
            result = call()
        except StorageUnavailable as exc:
            now = time.monotonic()
            if now + pause > deadline:
                raise
            if waited_since is None:
                waited_since = now
                log.warning(
                    "%s: the store cannot be reached (%s); trying again for up to %.0f s",
                    what,
                    exc,
                    patience,
                )
            sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            continue
        if waited_since is not None:
            log.warning("%s: the store is back after %.1f s", what, time.monotonic() - waited_since)
        return result
