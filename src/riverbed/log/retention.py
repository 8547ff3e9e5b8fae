"""Retention: delete the prefix of a stream that nobody needs any more.

Per topic, a retention time and a policy (`RetentionPolicy`) say what may go:
by default only what every subscription has committed *and* is older than the
retention time, so nothing a subscription has not consumed is ever deleted. A
stream with no subscription on its topic counts as consumed. Session cursors
are subscriptions (`sessions/store.py`), so an unexpired session's messages stay.

So a subscription nobody reads pins its topic's log. Three per-topic limits
apply regardless of subscriptions, to bound that (like Pulsar's message TTL and
backlog quota): `max_age_us` (older messages go), `max_messages` (a stream
keeps at most that many) and `max_bytes` (a stream keeps at most that many
bytes of payload, counted from its newest message down, and always keeps that
one). `apply_retention` reports who pins what (`Pin`).

Deletion goes in batches of at most `batch` messages, each its own short
transaction, with a rest as long as the batch took between two: the group
commit (`appender.py`) waits for one batch at most, never for a whole backlog
(docs/benchmarks.md has the commit latency it costs).

`Retainer` runs it on a schedule in its own thread (`riverbed serve`, the
`[retention]` section of the broker's configuration), keeps what it found for
an operator (`pinned_hours`, `pins`, `deleted`) and logs a warning once when a
subscription starts pinning messages more than `pin_warning_hours` past
retention, and once when it stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import assert_never

from riverbed.clock import now_us as clock_now_us
from riverbed.errors import RiverbedError
from riverbed.model import StreamId
from riverbed.storage.base import RetentionPolicy, Storage, StreamHead, TopicRecord

log = logging.getLogger(__name__)

DELETE_BATCH = 10_000
"""Messages deleted per transaction (docs/benchmarks.md: retention)."""

HOUR_US = 3_600_000_000


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What retention deleted from one stream."""

    stream: StreamId
    deleted: int
    start_offset: int
    """The stream's first retained offset afterwards."""


@dataclass(frozen=True, slots=True)
class Pin:
    """Messages retention keeps only because subscriptions have not consumed
    them (their topic's retention time has passed for them)."""

    stream: StreamId
    subscriptions: tuple[str, ...]
    """Who holds them: committed below the retention bound."""
    age_us: int
    """The age of the oldest message held."""


class Holds:
    """Where subscriptions being made will start, until their cursors exist.

    A SUBSCRIBE takes its start positions when it is read, and its cursors are
    committed a little later (`mqtt/following.py`). Until then retention does
    not see them: under the `consumed` policy a pass could delete messages
    committed after the SUBSCRIBE that every existing cursor had passed, and
    the new subscription would never get them. A hold (`hold`, until
    `release`) keeps everything at and after its positions.

    A pass reads the cursors, then the holds. A hold released after the
    cursors were read would be in neither, so a released hold stays visible
    to every pass that began before its release (`begin_pass`, `end_pass`).
    Thread-safe: holds come from the event loop, passes run in the retention
    thread. Only passes given these holds honour them (this process's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._active: dict[int, Mapping[int, int]] = {}
        """Token -> stream key -> the offset held from."""
        self._released: list[tuple[int, Mapping[int, int]]] = []
        """(when released, positions) of holds some running pass may still need."""
        self._passes: dict[int, int] = {}
        """Pass id -> when it began."""

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    def hold(self, positions: Mapping[int, int]) -> int:
        """Keep `positions` (stream key -> offset) and everything after them; a token."""
        with self._lock:
            token = self._tick()
            self._active[token] = positions
            return token

    def release(self, token: int) -> None:
        """The hold's cursors are committed (or will not be made). Idempotent."""
        with self._lock:
            positions = self._active.pop(token, None)
            if positions is not None and self._passes:
                self._released.append((self._tick(), positions))

    def begin_pass(self) -> int:
        with self._lock:
            started = self._tick()
            self._passes[started] = started
            return started

    def end_pass(self, pass_id: int) -> None:
        with self._lock:
            self._passes.pop(pass_id, None)
            oldest = min(self._passes.values(), default=None)
            self._released = (
                [] if oldest is None else [(at, p) for at, p in self._released if at > oldest]
            )

    def lowest(self) -> dict[int, int]:
        """Stream key -> the lowest offset held (held now, or released during a
        pass still running)."""
        out: dict[int, int] = {}
        with self._lock:
            held = [*self._active.values(), *(p for _, p in self._released)]
        for positions in held:
            for key, offset in positions.items():
                if offset < out.get(key, offset + 1):
                    out[key] = offset
        return out

    def __len__(self) -> int:
        """Holds not released yet."""
        return len(self._active)


@dataclass(slots=True)
class RetentionRun:
    """What one pass of retention did and found."""

    results: list[RetentionResult] = field(default_factory=list)
    pins: list[Pin] = field(default_factory=list)
    complete: bool = True
    """False if it was stopped before it went through every topic."""


def run_retention(
    storage: Storage,
    topic: str | None = None,
    now_us: int | None = None,
    *,
    batch: int = DELETE_BATCH,
) -> list[RetentionResult]:
    """Apply every topic's retention (or one topic's); report streams that lost messages."""
    return apply_retention(storage, topic, now_us, batch=batch).results


def apply_retention(
    storage: Storage,
    topic: str | None = None,
    now_us: int | None = None,
    *,
    batch: int = DELETE_BATCH,
    stop: threading.Event | None = None,
    pins: bool = False,
    holds: Holds | None = None,
) -> RetentionRun:
    """`run_retention`, deleting at most `batch` messages per transaction, and
    stopping between two transactions once `stop` is set. With `pins`, also
    report the streams whose subscriptions hold messages past retention.
    `holds`: the positions of subscriptions being made (kept as cursors are)."""
    if batch < 1:
        raise ValueError(f"batch {batch} must be at least 1")
    now_us = clock_now_us() if now_us is None else now_us
    topics = [storage.get_topic(topic)] if topic is not None else storage.list_topics()
    run = RetentionRun()
    pass_id = holds.begin_pass() if holds is not None else 0
    try:
        for record in topics:
            if stop is not None and stop.is_set():
                run.complete = False
                break
            _retain_topic(storage, record, now_us, batch, stop, pins, run, holds)
    finally:
        if holds is not None:
            holds.end_pass(pass_id)
    return run


def _retain_topic(
    storage: Storage,
    record: TopicRecord,
    now_us: int,
    batch: int,
    stop: threading.Event | None,
    want_pins: bool,
    run: RetentionRun,
    holds: Holds | None = None,
) -> None:
    policy = record.retention_policy
    subscriptions = [s.name for s in storage.list_subscriptions(record.name)]
    lowest = storage.min_cursors(record.name) if subscriptions else {}
    # After the cursors: a hold released since is still among these (`Holds`).
    held = holds.lowest() if holds is not None else {}
    deleted_from: list[tuple[StreamId, int]] = []
    cursors: dict[str, dict[int, int]] | None = None
    for head in storage.list_streams(record.name):
        if head.next_offset <= head.start_offset:
            continue
        if subscriptions:
            committed = lowest.get(head.key, -1)
            consumed = head.start_offset if committed < 0 else committed
        else:
            consumed = head.next_offset
        held_from_here = held.get(head.key)
        kept = consumed if held_from_here is None else min(consumed, held_from_here)
        if record.retention_us is None:
            expired = head.start_offset
        else:
            expired = storage.first_offset_at(head.key, now_us - record.retention_us)
        match policy:
            case RetentionPolicy.CONSUMED_AND_EXPIRED:
                bound, held_below = min(kept, expired), expired
            case RetentionPolicy.EXPIRED:
                bound, held_below = expired, head.start_offset
            case RetentionPolicy.CONSUMED:
                bound, held_below = kept, head.next_offset
            case _:
                assert_never(policy)
        forced = _forced_bound(storage, record, head, now_us)
        if forced >= bound:
            deleted = _delete_prefix(storage, head, forced, False, batch, stop)
        else:
            keep = policy is not RetentionPolicy.EXPIRED
            deleted = _delete_prefix(storage, head, bound, keep, batch, stop)
        if deleted:
            deleted_from.append((head.stream, deleted))
        held_from = max(consumed, forced, head.start_offset)
        if want_pins and subscriptions and held_from < held_below:
            if cursors is None:
                cursors = {name: storage.get_cursors(name) for name in subscriptions}
            pin = _pin(storage, head, held_from, held_below, cursors, now_us)
            if pin is not None:
                run.pins.append(pin)
        if stop is not None and stop.is_set():
            run.complete = False
            break
    if deleted_from:  # the storage may have stopped short of the bound (keep_uncommitted)
        starts = {h.stream: h.start_offset for h in storage.list_streams(record.name)}
        run.results.extend(RetentionResult(s, n, starts[s]) for s, n in deleted_from)


def _forced_bound(storage: Storage, record: TopicRecord, head: StreamHead, now_us: int) -> int:
    """Where the topic's limits cut the stream, consumed or not."""
    forced = head.start_offset
    if record.max_age_us is not None:
        forced = max(forced, storage.first_offset_at(head.key, now_us - record.max_age_us))
    if record.max_messages is not None:
        forced = max(forced, head.next_offset - record.max_messages)
    if record.max_bytes is not None:
        forced = max(forced, storage.first_offset_within_bytes(head.key, record.max_bytes))
    return forced


def _delete_prefix(
    storage: Storage,
    head: StreamHead,
    bound: int,
    keep_uncommitted: bool,
    batch: int,
    stop: threading.Event | None,
) -> int:
    """Delete the stream's messages below `bound`, `batch` per transaction."""
    deleted = 0
    at = head.start_offset
    while at < bound:
        began = time.monotonic()
        upto = min(bound, at + batch)
        count = storage.delete_before(head.key, upto, keep_uncommitted=keep_uncommitted)
        if count == 0 and keep_uncommitted:
            break  # a subscription (created meanwhile) holds the rest
        deleted += count
        at = upto
        if at < bound:
            # Rest as long as the batch took. A writer waiting for SQLite's lock
            # sleeps in its busy handler and looks again only after 1 to 100 ms:
            # a deletion that takes the lock back at once starves it for as long
            # as the deletion lasts (docs/benchmarks.md: retention).
            pause = time.monotonic() - began
            if stop is not None and stop.wait(pause):
                break
            if stop is None:
                time.sleep(pause)
    return deleted


def _pin(
    storage: Storage,
    head: StreamHead,
    held_from: int,
    held_below: int,
    cursors: dict[str, dict[int, int]],
    now_us: int,
) -> Pin | None:
    oldest = storage.read(head.key, held_from, 1)
    if not oldest or oldest[0].offset >= held_below:
        return None
    holders = tuple(
        name for name, committed in cursors.items() if committed.get(head.key, -1) < held_below
    )
    return Pin(head.stream, holders, now_us - oldest[0].timestamp_us)


class Retainer:
    """Applies retention every `interval` seconds in its own thread.

    `pin_warning_hours`: a subscription holding messages this long past their
    topic's retention is logged (once, until it lets go) and counted in
    `pinned_hours`. The figures are plain attributes, refreshed each pass.
    """

    def __init__(
        self,
        storage: Storage,
        interval: float,
        *,
        pin_warning_hours: float = 24,
        batch: int = DELETE_BATCH,
        clock: Callable[[], int] = clock_now_us,
        holds: Holds | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval {interval} must be positive")
        self.storage = storage
        self.holds = holds
        """Positions of subscriptions this process is making (`Holds`)."""
        self.interval = interval
        self.pin_warning_hours = pin_warning_hours
        self.batch = batch
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        """Passes completed."""
        self.deleted = 0
        """Messages deleted since the start."""
        self.pins: list[Pin] = []
        """Streams held past retention, as of the last pass."""
        self.pinned_hours = 0.0
        """The age, in hours, of the oldest message a subscription holds past its
        topic's retention, as of the last pass (the gauge to alert on; 0 when
        nobody holds any)."""
        self.failing: BaseException | None = None
        """The error of the last pass, if it failed."""
        self._warned: set[tuple[str, str]] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="riverbed-retention", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the transaction in progress (a batch) and wait up to `timeout`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except RiverbedError as exc:
                if self.failing is None:
                    log.error("retention failed: %s; trying again every %gs", exc, self.interval)
                self.failing = exc
                continue
            if self.failing is not None:
                log.warning("retention works again")
                self.failing = None

    def run_once(self) -> RetentionRun:
        """One pass over every topic."""
        run = apply_retention(
            self.storage,
            now_us=self._clock(),
            batch=self.batch,
            stop=self._stop,
            pins=True,
            holds=self.holds,
        )
        deleted = sum(r.deleted for r in run.results)
        self.deleted += deleted
        if deleted:
            log.info("retention deleted %d messages from %d streams", deleted, len(run.results))
        if run.complete:
            self.passes += 1
            self._report_pins(run.pins)
        return run

    def _report_pins(self, pins: list[Pin]) -> None:
        self.pins = pins
        self.pinned_hours = max((p.age_us / HOUR_US for p in pins), default=0.0)
        limit_us = self.pin_warning_hours * HOUR_US
        over: dict[tuple[str, str], float] = {}
        for pin in pins:
            if pin.age_us > limit_us:
                for name in pin.subscriptions:
                    key = (pin.stream.topic, name)
                    over[key] = max(over.get(key, 0.0), pin.age_us / HOUR_US)
        for (topic, name), hours in sorted(over.items()):
            if (topic, name) not in self._warned:
                log.warning(
                    "subscription %s holds messages of topic %s %.1f hours old that retention"
                    " would delete (warning at %g hours): %s, or set the topic's --max-age,"
                    " --max-messages or --max-bytes (riverbed topic alter)",
                    name,
                    topic,
                    hours,
                    self.pin_warning_hours,
                    _unpinning(name),
                )
        for topic, name in sorted(self._warned - over.keys()):
            log.info("subscription %s no longer holds topic %s past retention", name, topic)
        self._warned = set(over)


def _unpinning(name: str) -> str:
    """What lets go of what subscription `name` holds. The broker's own
    cursors are not deleted by name (`subscriptions.committed.refuse_broker_owned`):
    their owner goes instead."""
    if name.startswith("$session."):
        return (
            "it is an MQTT session's cursor: let its client read, or delete the session"
            " (DELETE /api/v1/sessions/{client id})"
        )
    if name.startswith("$share."):
        return (
            "it is a shared subscription group's cursor: let the group's members read,"
            " or delete the group (riverbed group delete)"
        )
    return "consume or delete it"
