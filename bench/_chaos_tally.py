"""What a chaos run counts (bench/chaos.py), from what it recorded: pure functions.

A message's id is `pP.kK.S`: publisher P, its key `pPkK`, the key's sequence S
(publish order). The payload is that id, so every consumer reports which message
it got. Per consumer kind (private sessions one by one; a shared group, the
worker group and the HTTP endpoint each as one consumer, their members' records
merged by time) `tally` counts:

- lost: acknowledged to the publisher (PUBACK/PUBCOMP with a success code) and
  never delivered to that consumer, after the final drain;
- order violations: per key, a first delivery of sequence S after the first
  delivery of a later sequence of the same key;
- duplicates: deliveries of a message past its first. Each is one of
  - a *republished copy*: the log holds the message more than once, because the
    publisher sent it again after a lost connection (at-least-once publishing,
    QoS 1); where the consumer sees which copy it got (a worker: stream and
    offset; the endpoint: the Riverbed message id) this is exact, for MQTT
    consumers a repeat not explained by a disruption is charged to the log's
    extra copies first;
  - *in window*: the consumer acknowledged the message's previous delivery at
    most `window` seconds before (or `SLACK` after) a disruption on its path (a kill or restart of
    a broker node, a worker, the delivery job, or the PostgreSQL server; for
    the shared group also what the broker reports in its log: a Borrower
    replaced after a fence, a Leader change, `group_events`) that came before
    this delivery: the window the disruption cut off before its acknowledgement
    was committed (session checkpoints, a worker's position, a delivery batch's
    commit, a shared group's progress, saved in batches);
  - *stale*: neither: the message came again although its acknowledgement had
    had `window` seconds, with nothing on the path disrupted, to be committed.
- with the DUP flag (MQTT consumers): how many repeats, and how many first
  deliveries, carried DUP=1.
"""

from __future__ import annotations

import bisect
import itertools
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SLACK = 5.0
"""Seconds an acknowledgement may be recorded after the disruption that cut it
off: the endpoint's thread may answer (and record) a request the killed job
sent a moment before, later still when both cores are busy (1.07 s late in a
short run at load 20, where a 1 s slack called 53 such repeats stale)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a message to a consumer, acknowledged at `at`."""

    consumer: str
    message: str
    at: float
    """When the consumer acknowledged it (monotonic seconds; one clock for every process)."""
    order: int = 0
    """Tie-breaker for deliveries acknowledged together (the place in a worker's batch)."""
    dup: bool | None = None
    """The MQTT DUP flag (None: not MQTT)."""
    copy: str | None = None
    """Which log copy this is, where the consumer can tell (stream/offset, message id)."""


@dataclass(frozen=True, slots=True)
class Disruption:
    """A kill or restart of something on some consumers' path."""

    at: float
    target: str
    """`node0`, `node1`, `worker0`, `worker1`, `job` or `postgres`."""
    what: str
    """`kill`, `restart`, `exit` (it died by itself) or `pg-restart`; reported by
    a broker node about a shared group (`GroupEvent`): `fence`, `leading` or
    `leader-stops`."""


def parse_id(message: str) -> tuple[str, int]:
    """`pP.kK.S` -> (key `pPkK`, S)."""
    publisher, key, seq = message.split(".")
    return publisher + key, int(seq)


def message_id(key: str, seq: int) -> str:
    """(`pPkK`, S) -> `pP.kK.S`."""
    publisher, _, k = key.partition("k")
    return f"{publisher}.k{k}.{seq}"


@dataclass(slots=True)
class Counts:
    """What `tally` found for one consumer."""

    consumer: str
    expected: int = 0
    delivered: int = 0
    lost: list[str] = field(default_factory=list)
    order_violations: list[tuple[str, int, int]] = field(default_factory=list)
    """(key, the sequence that came late, the later sequence first delivered before it)."""
    republished: int = 0
    in_window: int = 0
    in_window_dup_flag: int = 0
    stale: list[tuple[str, float, float]] = field(default_factory=list)
    """(message, when its previous delivery was acknowledged, when it came again)."""
    first_with_dup_flag: int = 0
    largest_window: float = 0.0
    """The oldest acknowledgement a disruption cut off (seconds before it): how
    much of `window` the in-window repeats used."""

    @property
    def duplicates(self) -> int:
        return self.republished + self.in_window + len(self.stale)

    def summary(self) -> dict[str, object]:
        return {
            "consumer": self.consumer,
            "expected": self.expected,
            "delivered": self.delivered,
            "lost": len(self.lost),
            "order_violations": len(self.order_violations),
            "duplicates": self.duplicates,
            "republished_copies": self.republished,
            "in_window": self.in_window,
            "in_window_with_dup_flag": self.in_window_dup_flag,
            "stale": len(self.stale),
            "first_deliveries_with_dup_flag": self.first_with_dup_flag,
            "largest_window_used_s": round(self.largest_window, 2),
        }


def tally(
    consumer: str,
    deliveries: Iterable[Delivery],
    acknowledged: Iterable[str],
    log_copies: Counter[str],
    disruptions: Sequence[Disruption],
    window: float,
) -> Counts:
    """Count `consumer`'s losses, order violations and duplicates (module docstring).

    `acknowledged`: the messages publishers had acknowledged; `log_copies`: how
    many times the log holds each message; `disruptions`: those on this
    consumer's path, any order."""
    counts = Counts(consumer)
    acked = set(acknowledged)
    counts.expected = len(acked)
    times = sorted(d.at for d in disruptions)
    by_message: dict[str, list[Delivery]] = defaultdict(list)
    for d in sorted(deliveries, key=lambda d: (d.at, d.order)):
        by_message[d.message].append(d)
    counts.delivered = len(by_message)
    counts.lost = sorted(acked - by_message.keys())

    firsts = sorted((ds[0] for ds in by_message.values()), key=lambda d: (d.at, d.order))
    highest: dict[str, int] = {}
    for d in firsts:
        key, seq = parse_id(d.message)
        top = highest.get(key, -1)
        if seq < top:
            counts.order_violations.append((key, seq, top))
        highest[key] = max(seq, top)
        if d.dup:
            counts.first_with_dup_flag += 1

    for message, ds in by_message.items():
        spare = max(0, log_copies.get(message, 1) - 1)
        copies_seen = {ds[0].copy}
        for before, again in itertools.pairwise(ds):
            if again.copy is not None and again.copy not in copies_seen:
                copies_seen.add(again.copy)
                counts.republished += 1
                continue
            # The first disruption after the previous acknowledgement, if it came
            # before this delivery.
            # (From SLACK before it: an acknowledgement the consumer sent as
            # its process was being killed, such as an HTTP 200 to a job that
            # died waiting for it, is recorded a moment after the kill.)
            i = bisect.bisect_left(times, before.at - SLACK)
            if i < len(times) and times[i] <= again.at and times[i] - before.at <= window:
                counts.in_window += 1
                counts.largest_window = max(counts.largest_window, times[i] - before.at)
                if again.dup:
                    counts.in_window_dup_flag += 1
            elif again.copy is None and spare > 0:
                spare -= 1
                counts.republished += 1
            else:
                counts.stale.append((message, before.at, again.at))
    return counts


# ------------------------------------------------- what the broker logs about a group

GROUP_LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) \w+"
    r" riverbed\.sharedsub\.(?:agent|host): group (?P<group>\S+): (?P<message>.*)$"
)
"""A broker log line (`riverbed serve`: asctime, level, logger, message) of the
shared-subscription Agent or Leader host about a group."""

FENCE = re.compile(r"^borrower \S+ replaced by \S+: .*\(fence\)$")
LEADING = re.compile(r"^leading as \S+$")
LEADER_STOPS = re.compile(r"\bleader (?:\S+ )?stops\b")


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A shared group's disruption a broker node reported in its log: a
    Borrower replaced after a fence (its Leader ran late: the unsaved window is
    delivered again), a Leader starting (`leading`) or stopping."""

    wall: float
    """When (time.time() seconds, from the log line's local time, to the millisecond)."""
    node: str
    what: str
    """`fence`, `leading` or `leader-stops`."""


def parse_group_log(text: str, node: str, group: str) -> list[GroupEvent]:
    """The fences and Leader starts and stops broker `node` logged for `group`
    (e.g. `$share/g/chaos/#`); every other line is ignored."""
    out: list[GroupEvent] = []
    for line in text.splitlines():
        match = GROUP_LINE.match(line)
        if match is None or match["group"] != group:
            continue
        message = match["message"]
        if FENCE.match(message):
            what = "fence"
        elif LEADING.match(message):
            what = "leading"
        elif LEADER_STOPS.search(message):
            what = "leader-stops"
        else:
            continue
        out.append(GroupEvent(local_time(match["stamp"], int(match["ms"])), node, what))
    return out


def local_time(stamp: str, ms: int = 0) -> float:
    """`YYYY-MM-DD HH:MM:SS` in this machine's local time (logging's asctime) ->
    time.time() seconds."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + ms / 1000


@dataclass(frozen=True, slots=True)
class Clock:
    """One moment read on both clocks: converts the broker logs' wall-clock
    times to the run's time.monotonic() (one clock for every process)."""

    wall: float
    monotonic: float

    @classmethod
    def now(cls) -> Clock:
        return cls(time.time(), time.monotonic())

    def to_monotonic(self, wall: float) -> float:
        return wall - self.wall + self.monotonic


def group_disruptions(events: Iterable[GroupEvent], clock: Clock) -> list[Disruption]:
    """The group's disruptions on the run's clock: every fence and Leader stop,
    and every Leader start but the group's first (on any node), which changed
    nothing."""
    ordered = sorted(events, key=lambda e: e.wall)
    first = next((e for e in ordered if e.what == "leading"), None)
    return [
        Disruption(clock.to_monotonic(e.wall), e.node, e.what) for e in ordered if e is not first
    ]
