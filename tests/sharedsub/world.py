"""A small world for the shared subscription protocol: one Leader, sessions with
their Shared Subscription Handlers, a model of the log, the in-process bus and
a fake clock. Nothing sleeps: time moves only in `advance`.

Each session is a model client: `fetch` takes messages of its grants in (all in
flight), `ack` acknowledges one. The world records what it checks afterwards:
deliveries per stream, acknowledged offsets, the offsets streams were granted
from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from riverbed.clock import Tick
from riverbed.log.lineage import predecessors
from riverbed.model import StreamId
from riverbed.sharedsub.borrower import Forget, Send, StartFetching, StopFetching
from riverbed.sharedsub.bus import InProcessBus, Registry
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.handler import Grant, SessionEffect, SharedSubscriptionHandler
from riverbed.sharedsub.leader import Effect as LeaderEffect
from riverbed.sharedsub.leader import (
    Leader,
    RenewStreams,
    SaveProgress,
    Stop,
    StreamsRenewed,
    TopicStreams,
)
from riverbed.sharedsub.protocol import REGISTRY, Address, GroupId, Message, stream_order
from riverbed.storage.base import StorageTopicRecord, StreamHead

GROUP = GroupId("g", "t/#")
TOPIC = "t"


@dataclass
class Generation:
    record: StorageTopicRecord
    next_offsets: list[int]
    sealed: bool = False


@dataclass
class LogModel:
    """One topic's generations; publishing goes to the last one."""

    generations: list[Generation] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.generations:
            self.generations.append(Generation(StorageTopicRecord(TOPIC, 0, 2, 1), [0, 0]))

    def add_generation(self, partitions: int, k: int) -> None:
        for g in self.generations:
            g.sealed = True
        number = len(self.generations)
        record = StorageTopicRecord(TOPIC, number, partitions, k)
        self.generations.append(Generation(record, [0] * partitions))

    def publish(self, partition: int, count: int) -> StreamId:
        last = self.generations[-1]
        partition %= last.record.partitions
        last.next_offsets[partition] += count
        return StreamId(TOPIC, last.record.generation, partition)

    def heads(self) -> list[StreamHead]:
        out = []
        key = 0
        for g in self.generations:
            for p, next_offset in enumerate(g.next_offsets):
                key += 1
                stream = StreamId(TOPIC, g.record.generation, p)
                out.append(StreamHead(key, stream, 0, next_offset, g.sealed))
        return out

    def head(self, stream: StreamId) -> StreamHead:
        return next(h for h in self.heads() if h.stream == stream)

    def renewed(self) -> StreamsRenewed:
        records = [g.record for g in self.generations]
        return StreamsRenewed((TopicStreams(records, self.heads()),))


class Session:
    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        world.incarnations += 1
        nonce = f"i{world.incarnations}"  # unique per session incarnation, like the random default
        self.handler = SharedSubscriptionHandler(name, world.config, nonce=nonce)
        self.registered: set[str] = set()

    def apply(self, effects: list[SessionEffect]) -> None:
        for effect in effects:
            match effect:
                case Send(to, message):
                    self.world.bus.send(to, message)
                case StartFetching(borrower, stream, offset):
                    self.world.on_start(self, Grant(borrower, stream), offset)
                case StopFetching() | Forget():
                    pass
        for borrower in self.handler.agent.borrowers:
            if borrower not in self.registered:
                self.registered.add(borrower)
                self.world.bus.register(borrower, self.receive)

    def receive(self, message: Message) -> None:
        self.apply(self.handler.receive(message, self.world.now))

    def fetch(self, limit: int = 5) -> int:
        """Take in up to `limit` messages of each grant; all go in flight."""
        taken = 0
        for grant, position in sorted(
            self.handler.grants.items(), key=lambda kv: _grant_order(kv[0])
        ):
            head = self.world.log.head(grant.stream)
            upto = min(head.next_offset, position + limit)
            if upto <= position:
                continue
            offsets = range(position, upto)
            for offset in offsets:
                self.world.delivered.setdefault(grant.stream, []).append(offset)
            taken += len(offsets)
            self.apply(self.handler.fetched(grant, upto, offsets, self.world.now))
        return taken

    def in_flight(self) -> list[tuple[Grant, int]]:
        out = []
        for grant in sorted(self.handler._windows, key=_grant_order):
            out.extend((grant, o) for o in sorted(self.handler.in_flight(grant)))
        return out

    def ack(self, grant: Grant, offset: int) -> None:
        if offset in self.handler.in_flight(grant):
            if offset > self.world.first_unacked(grant.stream):
                # Above a hole: the group's progress cannot pass it yet, so a
                # next holder may get it again (from this in-flight window).
                self.world.above_hole.setdefault(grant.stream, set()).add(offset)
            self.world.acked.setdefault(grant.stream, set()).add(offset)
        self.apply(self.handler.acked(grant, offset, self.world.now))

    def ack_all(self) -> int:
        pairs = self.in_flight()
        for grant, offset in pairs:
            self.ack(grant, offset)
        return len(pairs)


class World:
    def __init__(self, config: SharedSubConfig | None = None, *, leader_found: bool = True) -> None:
        self.config = config or SharedSubConfig()
        self.now = 0.0
        self.log = LogModel()
        self.lose = 0
        """Lose the next this many messages sent."""
        self.duplicate = 0
        self.lost_any = False
        self.drop_filter: Callable[[Address, Message], bool] | None = None
        self.bus = InProcessBus(fault=self._fault)
        self.registry = Registry(self.bus, self._find_leader)
        self.bus.register(REGISTRY, self.registry.deliver)
        self.leaders_started = 1
        self.leader = Leader("leader-1", GROUP, self.config, self.now)
        self.bus.register(self.leader.id, self._leader_receive)
        self.lookup_fails = not leader_found
        self.saved: dict[StreamId, int] = {}
        self.saves = 0
        self.stopped = False
        self.sessions: dict[str, Session] = {}
        self.incarnations = 0
        self.delivered: dict[StreamId, list[int]] = {}
        self.acked: dict[StreamId, set[int]] = {}
        self.grants: list[tuple[Grant, int, int]] = []
        """(grant, granted offset, first unacknowledged offset at that time)."""
        self.above_hole: dict[StreamId, set[int]] = {}
        """Offsets acknowledged while an offset below was not (see `Session.ack`)."""
        self.lineage_violations: list[StreamId] = []
        self._apply_leader(self.leader.handle(self.log.renewed(), self.now))

    # ----------------------------------------------------------------- bus

    def _fault(self, to: Address, message: Message) -> int:
        if self.drop_filter is not None and self.drop_filter(to, message):
            self.lost_any = True
            return 0
        if self.lose > 0:
            self.lose -= 1
            self.lost_any = True
            return 0
        if self.duplicate > 0:
            self.duplicate -= 1
            return 2
        return 1

    def _find_leader(self, group: GroupId) -> str | None:
        """The registry's lookup: the running Leader, or a new one that resumes
        from the saved progress if the last one stopped."""
        if self.lookup_fails:
            return None
        if self.stopped:
            self.bus.unregister(self.leader.id)
            self.leaders_started += 1
            self.leader = Leader(
                f"leader-{self.leaders_started}", GROUP, self.config, self.now, self.saved
            )
            self.bus.register(self.leader.id, self._leader_receive)
            self.stopped = False
            self._apply_leader(self.leader.handle(self.log.renewed(), self.now))
        return self.leader.id

    def _leader_receive(self, message: Message) -> None:
        self._apply_leader(self.leader.handle(message, self.now))

    def _apply_leader(self, effects: list[LeaderEffect]) -> None:
        for effect in effects:
            match effect:
                case SaveProgress(progress):
                    self.saved = dict(progress)
                    self.saves += 1
                case RenewStreams():
                    self._apply_leader(self.leader.handle(self.log.renewed(), self.now))
                case Stop():
                    self.stopped = True
                    self.registry.set_leader(GROUP, None)
                case _:
                    self.bus.send(effect.to, effect.message)

    def drain(self) -> None:
        self.bus.drain()

    # ----------------------------------------------------------------- sessions

    def session(self, name: str) -> Session:
        if name not in self.sessions:
            self.sessions[name] = Session(self, name)
        return self.sessions[name]

    def subscribe(self, name: str, text: str = "$share/g/t/#") -> Session:
        s = self.session(name)
        s.apply(s.handler.subscribe(text, self.now))
        self.drain()
        return s

    def unsubscribe(self, name: str, text: str = "$share/g/t/#") -> None:
        s = self.sessions[name]
        s.apply(s.handler.unsubscribe(text, self.now))
        self.drain()

    def disconnect(self, name: str) -> None:
        s = self.sessions.pop(name)
        s.apply(s.handler.disconnect(self.now))
        self._unregister(s)
        self.drain()

    def crash(self, name: str) -> None:
        """The session vanishes: nothing more is sent or received."""
        self._unregister(self.sessions.pop(name))

    def _unregister(self, s: Session) -> None:
        for borrower in s.registered:
            self.bus.unregister(borrower)

    def on_start(self, session: Session, grant: Grant, offset: int) -> None:
        acked = self.acked.get(grant.stream, set())
        first_unacked = 0
        while first_unacked in acked:
            first_unacked += 1
        self.grants.append((grant, offset, first_unacked))
        stream = grant.stream
        if stream.generation > 0:
            # Lineage: every stream of the lineage before must be fully consumed.
            previous = self.log.generations[stream.generation - 1].record
            current = self.log.generations[stream.generation].record
            for p in predecessors(previous, current, stream.partition):
                pred = StreamId(TOPIC, previous.generation, p)
                head = self.log.head(pred)
                done = self.acked.get(pred, set())
                if not (head.sealed and all(o in done for o in range(head.next_offset))):
                    self.lineage_violations.append(stream)

    # ----------------------------------------------------------------- time

    def deadlines(self) -> list[float]:
        times = [self.leader.next_deadline()]
        times += [s.handler.next_deadline() for s in self.sessions.values()]
        return [t for t in times if t is not None]

    def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer on its due time on the way."""
        target = self.now + seconds
        for _ in range(100_000):
            due = [t for t in self.deadlines() if t <= target]
            self.now = max(self.now, min(due)) if due else target
            self._apply_leader(self.leader.handle(Tick(), self.now))
            for s in list(self.sessions.values()):
                s.apply(s.handler.tick(self.now))
            self.drain()
            if not due:
                return
        raise AssertionError(f"a timer due at {self.now} keeps firing without moving on")

    # ----------------------------------------------------------------- views

    def holders(self) -> dict[StreamId, list[str]]:
        """Borrowers (of live sessions) holding each stream, granted or revoking."""
        out: dict[StreamId, list[str]] = {}
        for s in self.sessions.values():
            for bid, borrower in s.handler.agent.borrowers.items():
                for stream in borrower.streams:
                    out.setdefault(stream, []).append(bid)
        return out

    def first_unacked(self, stream: StreamId) -> int:
        acked = self.acked.get(stream, set())
        n = 0
        while n in acked:
            n += 1
        return n

    def consume_all(self, rounds: int = 200) -> None:
        """Let every live session fetch and acknowledge until nothing moves."""
        for _ in range(rounds):
            moved = 0
            for s in list(self.sessions.values()):
                moved += s.fetch(50)
                moved += s.ack_all()
            self.drain()
            self.advance(0.5)
            if not moved and self.all_consumed():
                return

    def all_consumed(self) -> bool:
        return all(self.first_unacked(h.stream) >= h.next_offset for h in self.log.heads()) and all(
            self.leader.progress.get(h.stream, 0) >= h.next_offset for h in self.log.heads()
        )


def _grant_order(grant: Grant) -> tuple[str, tuple[str, int, int]]:
    return (grant.borrower, stream_order(grant.stream))
