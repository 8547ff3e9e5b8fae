"""What the broker does at the end of a turn of the event loop: the end of turn.

Two things wait for it, for every connection at once:

- **offers**: messages the fan-out hands a session (`Connection.offer`). They
  are never handled where they are made (a fetch answered from memory must not
  re-enter the session while it carries out its effects), but at the end of
  the turn: after the callback that made them, or at the end of a commit;
- **writes**: a connection's packets of the turn, written together in one
  `transport.write` (`Connection.flush_writes`).

A commit of the pacer ends with `finish` (`CommitPacer(after=...)`): its
PUBLISHes' deliveries and PUBACKs go out in the commit's own callback, not one
and two turns of the loop later, behind whatever the next poll of the sockets
brought in (docs/broker.md, "The end of a turn").

Offers made while `finish` runs (a session's next fetch answered from memory)
wait for the next turn, as a callback of their own: one commit never hands out
more than one round of a session's window, and the loop reads its sockets
between rounds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Writer(Protocol):
    """A connection with packets to write this turn."""

    def flush_writes(self) -> None: ...


class EndOfTurn:
    """The offers and writes of all connections, done together."""

    __slots__ = ("_offers", "_scheduled", "_written")

    def __init__(self) -> None:
        self._offers: list[tuple[Callable[[Any], None], object]] = []
        """`handle(event)` calls, in the order they were offered."""
        self._written: list[Writer] = []
        self._scheduled = False
        """A call of `finish` is on the loop's ready queue, or running."""

    def offer(self, handle: Callable[[Any], None], event: object) -> None:
        """Call `handle(event)` at the end of this turn (never now)."""
        self._offers.append((handle, event))
        if not self._scheduled:
            self._schedule()

    def written(self, writer: Writer) -> None:
        """`writer` has its first packet of the turn: flush it at the end."""
        self._written.append(writer)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self.finish)

    def finish(self) -> None:
        """Handle the offers made so far, then flush every connection written to."""
        self._scheduled = True  # what is added meanwhile: this call or the next
        try:
            offers = self._offers
            if offers:
                self._offers = []
                for handle, event in offers:
                    try:
                        handle(event)
                    except Exception:
                        # One session's failure must not leave the others'
                        # answers unhandled (their fetches would wait forever).
                        log.exception("handling an answer of the fan-out failed")
            written = self._written
            if written:
                self._written = []
                for writer in written:
                    try:
                        writer.flush_writes()
                    except Exception:
                        log.exception("writing to a connection failed")
        finally:
            if self._offers or self._written:
                self._schedule()
            else:
                self._scheduled = False
