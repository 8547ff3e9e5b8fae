"""A node's Leaders over a real storage: the Leader side of the runtime.

`LeaderHost` is what the node-local `Registry` asks when a `leader_wanted`
comes for a group it knows no Leader of (`find_leader`): if this node runs the
group's Leader, that one; else it tries to become the Leader — take the claim
(`claims.GroupStore.claim`, fencing off earlier Leaders) and start a `Leader`
from the progress the group record holds. It then carries out the Leaders'
effects:

- `Send`: onto the bus;
- `RenewStreams`: the heads and generations of every topic the group's filter
  may reach (`log.topics.reachable_topics`), with where the group's start puts
  streams it has no progress for (`claims.start_offsets`), answered at once;
- `SaveProgress`: a compare-and-set on the group record; refused
  (`PreconditionFailed`: a newer Leader claimed the group, or it was deleted),
  the Leader is dropped and nothing after the save is carried out;
- `Stop` (no Borrower for `leader_idle_stop`): the claim is released.

and renews each claim every third of `leader_claim_lease` (a renewal refused:
the Leader is dropped). Another node's claim is not taken over until it expires:
with a bus between nodes (`remote_leaders`, `cluster/bus.py`) the lookup answers with
that node's Leader; without one, a Borrower here gets no Leader and asks again
after `find_leader_retry`.

It counts what its Leaders did, for the node's metrics: claims won, lost
(fenced off or not renewed) and released (`claims`), and each group's
rebalances (`rebalances`), plain ints written by the leader thread.

Synchronous and sans-asyncio, with the clock injected (`now`: seconds for the
state machines, `wall_us`: µs since the epoch for the storage's leases), so
tests drive it step by step; a broker runs `tick` at `next_deadline` and calls
it from a worker thread (its storage calls block).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from riverbed.clock import Tick, now_us
from riverbed.errors import LeaseHeld, RiverbedError
from riverbed.model import StreamId
from riverbed.sharedsub.bus import Bus, Registry
from riverbed.sharedsub.claims import Claim, GroupStore, Save, TopicReads, reached_topics
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.leader import (
    Effect,
    Event,
    Leader,
    RenewStreams,
    SaveProgress,
    Send,
    Stop,
    StreamsRenewed,
    TopicStreams,
)
from riverbed.sharedsub.protocol import (
    Address,
    GroupId,
    LeaderConnectResponse,
    LeaderId,
    Message,
    Ping,
    PingResponse,
    ToLeader,
)
from riverbed.storage.base import Storage

log = logging.getLogger(__name__)

_STATELESS = (PingResponse, LeaderConnectResponse)
"""Answers that say nothing of progress: they need not wait for a save, and a
Borrower's fence moves only when they arrive (borrower.py), so they must not
wait behind the other Leaders' saves of a busy round."""


class RoutingBus(Bus, Protocol):
    """A bus that addresses can join and leave (`bus.InProcessBus`)."""

    def register(self, address: Address, deliver: Callable[[Message], None]) -> None: ...

    def unregister(self, address: Address) -> None: ...


@dataclass(slots=True)
class _Hosted:
    leader: Leader
    claim: Claim
    renew_at: float
    """When the Leader's periodic actions are due."""
    claim_renew_at: float
    """When its claim is renewed (a third of its lease after the last time)."""
    saved_holdings: dict[str, list[StreamId]] | None = None
    deadline: float | None = None
    """The Leader's `next_deadline()` after the last event it handled."""
    pending: SaveProgress | None = None
    """Batching: the save to make at the next `flush`, and what waits for it."""
    deferred: list[Send] = field(default_factory=list)
    saving: bool = False
    """Its save is being made (`take_flush` .. `end_flush`): what it sends meanwhile
    waits for the save too."""


@dataclass(slots=True)
class Flush:
    """The saves batching held back, taken from their Leaders (`take_flush`):
    made by `save_flush`, on any thread, then applied by `end_flush`."""

    waiting: list[_Hosted]
    holdings: list[dict[str, list[StreamId]]]
    saves: list[Save]


class LeaderHost:
    """Runs the Leaders of the groups this node leads."""

    def __init__(
        self,
        storage: Storage,
        bus: RoutingBus,
        registry: Registry,
        config: SharedSubConfig,
        node: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_us: Callable[[], int] = now_us,
    ) -> None:
        self.storage = storage
        self.store = GroupStore(storage)
        self.bus = bus
        self.registry = registry
        self.config = config
        self.node = node
        self.clock = clock
        self.wall_us = wall_us
        self.leaders: dict[GroupId, _Hosted] = {}
        self.batching = False
        """Make a Leader's saves at `flush()`, one per Leader however many it
        asked for since, holding back what it sent after the first (the
        runtime flushes after each burst of messages: one write per group per
        burst instead of one per revoked stream)."""
        self._reads: TopicReads | None = None
        """While `tick` runs: what its Leaders read of the topics (once for all)."""
        self.remote_leaders = False
        """Nodes share a bus (`cluster/bus.py`): another node's Leader is reachable, so
        a group led elsewhere answers with that Leader's id."""
        self._claims = {"won": 0, "lost": 0, "released": 0}
        """Leader claims taken (a Leader started here), lost (its renewal or a
        save refused: another Leader fenced it off, or the store failed) and
        given up (idle, or the node stopping)."""
        self._rebalanced: dict[GroupId, int] = {}
        """Group -> rebalances by this node's Leaders that no longer run."""
        self._count_lock = threading.Lock()

    # ----------------------------------------------------------------- the registry's lookup

    def find_leader(self, group: GroupId) -> LeaderId | None:
        """This node's Leader of `group`, started now if nobody holds the claim."""
        hosted = self.leaders.get(group)
        if hosted is not None:
            return hosted.leader.id
        leader_id = f"{self.node}/leader/{uuid.uuid4().hex[:12]}"
        try:
            claim = self.store.claim(group, leader_id, ttl_us=self._ttl_us(), now_us=self.wall_us())
        except LeaseHeld:
            # Another node leads it: reachable over a bus between nodes.
            if not self.remote_leaders:
                return None
            lease = self.store.leader_of(group, self.wall_us())
            return None if lease is None else lease.owner
        except RiverbedError:
            log.exception("group %s: taking the leader claim failed", group)
            return None
        now = self.clock()
        leader = Leader(leader_id, group, self.config, now, claim.record.progress)
        hosted = _Hosted(
            leader, claim, now + self.config.leader_periodic, now + self._renew_every()
        )
        self.leaders[group] = hosted
        self._claims["won"] += 1
        self.bus.register(leader_id, lambda message: self.receive(group, message))
        log.info("group %s: leading as %s", group, leader_id)
        self._handle(hosted, self._renewed(claim))
        return leader_id

    # ----------------------------------------------------------------- counts

    def claims(self) -> dict[tuple[str, ...], int]:
        """("won" | "lost" | "released",) -> Leader claims so far (any thread)."""
        return {(outcome,): n for outcome, n in list(self._claims.items())}

    def rebalances(self) -> dict[tuple[str, ...], int]:
        """(`GROUP/FILTER`,) -> assignment changes its Leaders on this node made
        (any thread)."""
        with self._count_lock:
            counts = dict(self._rebalanced)
            for hosted in list(self.leaders.values()):
                group = hosted.leader.group
                counts[group] = counts.get(group, 0) + hosted.leader.rebalances
        return {(group.key,): n for group, n in counts.items()}

    # ----------------------------------------------------------------- events

    def receive(self, group: GroupId, message: Message) -> None:
        """A message for the Leader of `group` (the bus delivers it)."""
        hosted = self.leaders.get(group)
        if hosted is not None and isinstance(message, ToLeader):
            self._handle(hosted, message)

    def tick(self) -> None:
        """Run what is due: claim renewals (and a save of who holds what, for
        `riverbed group describe`, if that changed), then the timers of the
        Leaders that have one due."""
        now = self.clock()
        self._reads = TopicReads(self.storage)
        try:
            self._tick_leaders(now)
        finally:
            self._reads = None

    def _tick_leaders(self, now: float) -> None:
        self._renew_claims(now)
        for hosted in list(self.leaders.values()):
            if self.leaders.get(hosted.leader.group) is not hosted:
                continue  # dropped meanwhile (its renewal refused)
            periodic = now >= hosted.renew_at
            if periodic:
                hosted.renew_at = now + self.config.leader_periodic
            if periodic or (hosted.deadline is not None and hosted.deadline <= now):
                self._handle(hosted, Tick())
            leader = hosted.leader
            if (
                periodic
                and self.leaders.get(leader.group) is hosted
                and leader.holdings() != hosted.saved_holdings
            ):
                if not self.batching:
                    self._save(hosted, leader.progress, leader.consumed)
                elif hosted.pending is None:
                    # Made by the runtime's `flush` after the tick: one
                    # transaction for all the Leaders whose holdings moved.
                    hosted.pending = SaveProgress(dict(leader.progress), frozenset(leader.consumed))

    def _renew_claims(self, now: float) -> None:
        """Renew the claims that are due, in one transaction: Leaders started
        together fall due together, and one commit per claim kept the leader
        thread from answering pings for as long as 50 of them took."""
        due = [h for h in self.leaders.values() if now >= h.claim_renew_at]
        if not due:
            return
        try:
            renewed: list[Claim | RiverbedError] = list(
                self.store.renew_many(
                    [h.claim for h in due], ttl_us=self._ttl_us(), now_us=self.wall_us()
                )
            )
        except RiverbedError as exc:  # the transaction failed: none of them is renewed
            renewed = [exc] * len(due)
        for hosted, claim in zip(due, renewed, strict=True):
            if isinstance(claim, RiverbedError):
                self._drop(hosted, f"renewing the claim failed: {claim}")
            else:
                hosted.claim = claim
                hosted.claim_renew_at = now + self._renew_every()

    def next_deadline(self) -> float | None:
        times: list[float] = []
        for hosted in self.leaders.values():
            times.append(min(hosted.renew_at, hosted.claim_renew_at))
            if hosted.deadline is not None:
                times.append(hosted.deadline)
        return min(times) if times else None

    def close(self) -> None:
        """Save and release every claim (a node stopping cleanly)."""
        self.flush()
        for hosted in list(self.leaders.values()):
            self._stop(hosted)

    # ----------------------------------------------------------------- effects

    def _handle(self, hosted: _Hosted, event: Event) -> None:
        leader = hosted.leader
        effects = leader.handle(event, self.clock())
        if not isinstance(event, Ping) or hosted.deadline is None:
            # A ping only moves its Borrower's timeout later: the deadline
            # known stays a safe one (at worst a tick that finds nothing due).
            hosted.deadline = leader.next_deadline()
        self._apply(hosted, effects)

    def _apply(self, hosted: _Hosted, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if self.leaders.get(hosted.leader.group) is not hosted:
                return  # dropped by an effect before this one
            match effect:
                case Send(to, message):
                    if (hosted.pending is not None or hosted.saving) and not isinstance(
                        message, _STATELESS
                    ):
                        hosted.deferred.append(effect)
                    else:
                        self.bus.send(to, message)
                case SaveProgress(progress, consumed):
                    if self.batching:
                        hosted.pending = effect
                    elif not self._save(hosted, progress, consumed):
                        return
                case RenewStreams():
                    self._handle(hosted, self._renewed(hosted.claim))
                case Stop():
                    if not self._flush(hosted):
                        return
                    log.info("group %s: no Borrower for a while; leader stops", hosted.leader.group)
                    self._stop(hosted)

    def flush(self) -> None:
        """Make the saves batching held back (one transaction for all the
        Leaders), then send what waited for them."""
        flush = self.take_flush()
        if flush is not None:
            self.end_flush(flush, self.save_flush(flush))

    def take_flush(self) -> Flush | None:
        """The first part of `flush`: the saves held back, taken from their
        Leaders (None: there are none). Until `end_flush`, what these Leaders
        send (but pings' answers) waits for the save."""
        waiting = [h for h in self.leaders.values() if h.pending is not None]
        if not waiting:
            return None
        saves: list[Save] = []
        holdings: list[dict[str, list[StreamId]]] = []
        for hosted in waiting:
            assert hosted.pending is not None
            holdings.append(hosted.leader.holdings())
            saves.append(
                Save(hosted.claim, hosted.pending.progress, hosted.pending.consumed, holdings[-1])
            )
            hosted.pending = None
            hosted.saving = True
        return Flush(waiting, holdings, saves)

    def save_flush(self, flush: Flush) -> list[Claim | RiverbedError]:
        """The second part: the saves, in one transaction. Touches no Leader, so
        it may run on another thread while the leader thread answers pings
        (`SharedRuntime`): with many groups on a busy machine a save took
        seconds, longer than a ping's answer may take."""
        try:
            return list(self.store.save_many(flush.saves, now_us=self.wall_us()))
        except RiverbedError as exc:  # the transaction failed: none of them is saved
            return [exc] * len(flush.saves)

    def end_flush(self, flush: Flush, results: Sequence[Claim | RiverbedError]) -> None:
        """The last part: each Leader's new claim, or its end (the save refused:
        fenced off), and what waited for the save sent."""
        for hosted, held, result in zip(flush.waiting, flush.holdings, results, strict=True):
            hosted.saving = False
            deferred, hosted.deferred = hosted.deferred, []
            if self.leaders.get(hosted.leader.group) is not hosted:
                continue  # dropped meanwhile
            if isinstance(result, RiverbedError):
                self._drop(hosted, f"saving progress failed: {result}")
                continue  # nothing that waited for the save goes out
            hosted.claim = result
            hosted.saved_holdings = held
            for send in deferred:
                self.bus.send(send.to, send.message)

    def _flush(self, hosted: _Hosted) -> bool:
        save = hosted.pending
        if save is None:
            return True
        hosted.pending = None
        deferred, hosted.deferred = hosted.deferred, []
        if not self._save(hosted, save.progress, save.consumed):
            return False  # dropped: nothing that waited for the save goes out
        for send in deferred:
            self.bus.send(send.to, send.message)
        return True

    def _stop(self, hosted: _Hosted) -> None:
        leader = hosted.leader
        if self._save(hosted, leader.progress, frozenset(leader.consumed), holdings={}):
            self._release(hosted)

    def _save(
        self,
        hosted: _Hosted,
        progress: Mapping[StreamId, int],
        consumed: Iterable[StreamId],
        holdings: dict[str, list[StreamId]] | None = None,
    ) -> bool:
        if holdings is None:
            holdings = hosted.leader.holdings()
        try:
            hosted.claim = self.store.save(
                hosted.claim, progress, consumed, now_us=self.wall_us(), holdings=holdings
            )
            hosted.saved_holdings = holdings
        except RiverbedError as exc:  # PreconditionFailed: fenced off
            self._drop(hosted, f"saving progress failed: {exc}")
            return False
        return True

    def _renewed(self, claim: Claim) -> StreamsRenewed:
        reads = TopicReads(self.storage) if self._reads is None else self._reads
        return StreamsRenewed(
            [
                TopicStreams(reads.storage_topics(t.name), t.heads, t.initial)
                for t in reached_topics(self.storage, claim.record, reads)
            ]
        )

    def _release(self, hosted: _Hosted) -> None:
        self._claims["released"] += 1
        self._forget(hosted)
        with contextlib.suppress(RiverbedError):  # no longer ours: nothing to give up
            self.store.release(hosted.claim)

    def _drop(self, hosted: _Hosted, why: str) -> None:
        log.warning("group %s: leader %s stops: %s", hosted.leader.group, hosted.leader.id, why)
        self._claims["lost"] += 1
        self._forget(hosted)

    def _forget(self, hosted: _Hosted) -> None:
        group = hosted.leader.group
        if self.leaders.get(group) is hosted:
            with self._count_lock:  # its count moves over in one step for `rebalances`
                del self.leaders[group]
                self._rebalanced[group] = self._rebalanced.get(group, 0) + hosted.leader.rebalances
        self.registry.set_leader(group, None)
        self.bus.unregister(hosted.leader.id)

    def _renew_every(self) -> float:
        """Seconds between renewals of a claim: a third of its lease, so two
        renewals may fail (or stall) before it lapses, but at most every
        `leader_periodic` (each is a write)."""
        return max(self.config.leader_periodic, self.config.leader_claim_lease / 3)

    def _ttl_us(self) -> int:
        return int(self.config.leader_claim_lease * 1_000_000)
