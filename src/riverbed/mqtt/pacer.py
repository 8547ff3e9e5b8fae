"""When the broker commits its QoS 0/1 PUBLISHes: the commit pacer.

A read's PUBLISHes wait in their connection's `Inbound`, one `TopicBatch` per log
topic, until the pacer commits them. It commits at the end of the loop turn,
together with what every other connection read in that turn, if the last
commit is at least `interval` ago; otherwise as soon as it is. So:

- a lone message after a quiet spell waits for nothing;
- a steady stream is committed at most once per interval, all connections'
  messages for one topic in one transaction: at 2,000 msg/s and 3 ms, one
  commit, one PUBACK write and one delivery write serve six messages instead
  of one each (docs/benchmarks.md has what that saves);
- a message waits at most `interval` longer than it would unpaced.

`interval` 0: every loop turn that read a PUBLISH commits (still one
transaction for all connections of that turn). A commit that fails as a whole
(`RiverbedError` before anything is written) is tried again batch by batch, so
one connection's bad input never refuses another's messages.

A commit that fails because the store refuses writes (full, read-only,
unreachable: `appender.store_refused`) refuses its PUBLISHes with
`refusal_reason`: MQTT 5 PUBACK/PUBREC 0x97 Quota exceeded; an MQTT 3.1.1
connection is closed without the PUBACK, so the client sends it again later.
Nothing is acknowledged that was not committed (docs/storage.md).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

from riverbed.errors import RiverbedError
from riverbed.log.appender import Positions, store_refused
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.mqtt.codec import PubackReason


def refusal_reason(exc: BaseException | None) -> PubackReason:
    """The reason code refusing a PUBLISH whose commit failed with `exc`: 0x97
    Quota exceeded when the store refuses writes for now (full, read-only,
    unreachable; MQTT 5.0 §3.4.2.1: "an implementation or administrative imposed
    limit has been exceeded"), else 0x80 Unspecified error. PUBREC has the same
    codes: `PubrecReason(refusal_reason(exc))`."""
    if store_refused(exc):
        return PubackReason.QUOTA_EXCEEDED
    return PubackReason.UNSPECIFIED_ERROR


class Inbound(Protocol):
    """What the pacer needs of a connection's PUBLISHes (`mqtt.inbound.Inbound`):
    its batches, and a call when one is done. The pacer answers; it holds no
    connection."""

    def take_batches(self) -> list[TopicBatch]: ...

    def committed(self, batch: TopicBatch) -> None: ...


class TopicBatch:
    """One connection's QoS 0/1 PUBLISHes bound for one topic, committed together.

    Pending until the pacer hands it to the log; then done (with `positions`
    from `start` on, or `error`) or waiting for the writer thread (`future`).
    """

    __slots__ = ("error", "future", "inbound", "messages", "positions", "start", "topic")

    def __init__(self, inbound: Inbound, topic: str) -> None:
        self.inbound = inbound
        self.topic = topic
        self.messages: list[Message] = []
        self.start = 0
        """Where this batch's messages begin in `positions` (a shared commit)."""
        self.positions: Positions | None = None
        self.error: BaseException | None = None
        self.future: Future[Positions] | None = None
        """The writer thread's commit, while it runs (the write lock was busy)."""

    def done(self) -> bool:
        return self.positions is not None or self.error is not None

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return self.error


def _nothing() -> None:
    pass


class CommitPacer:
    """Commits the connections' batches, at most once per `interval` seconds."""

    __slots__ = ("_after", "_handle", "_interval", "_last", "_log", "_timed", "_waiting")

    def __init__(self, log: Log, interval: float, after: Callable[[], None] = _nothing) -> None:
        self._log = log
        self._interval = interval
        self._after = after
        """Called after a commit made from the loop's own callback (`mqtt/turns.py`:
        its deliveries and acknowledgements out at once), never after one made
        inside another caller's work (`commit_now` called directly)."""
        self._last = -math.inf
        """The loop's time of the last commit."""
        self._waiting: dict[Inbound, None] = {}
        """Connections with batches to commit, in the order they asked."""
        self._handle: asyncio.Handle | None = None
        self._timed = False
        """`_handle` waits for the interval (asked for with `call_later`). Kept
        here: uvloop's timer handles are not `asyncio.TimerHandle`s."""

    def want(self, inbound: Inbound) -> bool:
        """`inbound` has batches: commit them at the end of this loop turn, or
        when the interval since the last commit has passed. True if they wait
        for that."""
        self._waiting[inbound] = None
        if self._handle is not None:
            return self._timed
        loop = asyncio.get_running_loop()
        wait = self._last + self._interval - loop.time()
        self._timed = wait > 0
        if self._timed:
            self._handle = loop.call_later(wait, self._fire)
        else:
            self._handle = loop.call_soon(self._fire)
        return self._timed

    def _fire(self) -> None:
        self._handle = None
        self.commit_now()
        self._after()

    def commit_now(self) -> None:
        """Commit everything waiting, now (also for a PUBLISH that must come
        after the ones before it, and at shutdown)."""
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
        waiting = self._waiting
        if not waiting:
            return
        self._waiting = {}
        self._last = asyncio.get_running_loop().time()
        by_topic: dict[str, list[TopicBatch]] = {}
        for inbound in waiting:
            for batch in inbound.take_batches():
                same = by_topic.get(batch.topic)
                if same is None:
                    by_topic[batch.topic] = [batch]
                else:
                    same.append(batch)
        for topic, batches in by_topic.items():
            self._commit(topic, batches)

    def _commit(self, topic: str, batches: Sequence[TopicBatch]) -> None:
        if len(batches) == 1:
            messages: list[Message] = batches[0].messages
        else:
            messages = []
            for batch in batches:
                batch.start = len(messages)
                messages.extend(batch.messages)
        try:
            # An embedded storage commits right here when nothing else is
            # committing; otherwise the writer thread does.
            produced = self._log.produce_soon(topic, messages)
        except RiverbedError as exc:
            if len(batches) > 1:
                for batch in batches:
                    batch.start = 0
                    self._commit(topic, [batch])
                return
            batches[0].error = exc
            batches[0].inbound.committed(batches[0])
            return
        if not isinstance(produced, Future):
            for batch in batches:
                batch.positions = produced
                batch.inbound.committed(batch)
            return
        loop = asyncio.get_running_loop()
        for batch in batches:
            batch.future = produced
        after = self._after

        def done(future: Future[Positions]) -> None:
            loop.call_soon_threadsafe(_resolved, future, batches, after)

        produced.add_done_callback(done)


def _resolved(
    future: Future[Positions], batches: Sequence[TopicBatch], after: Callable[[], None]
) -> None:
    """The writer thread committed (or failed) a shared commit: on the loop."""
    error = future.exception() if not future.cancelled() else RiverbedError("commit cancelled")
    for batch in batches:
        if error is None:
            batch.positions = future.result()
        else:
            batch.error = error
        batch.future = None
        batch.inbound.committed(batch)
    after()
