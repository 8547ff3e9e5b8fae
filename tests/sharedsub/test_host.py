"""The Leader side of the runtime over a real storage (sharedsub/host.py), on
both backends: Leaders started on demand from the group record, progress
persisted and resumed, one Leader per group across nodes, fencing.

Sessions are model clients around the sans-I/O Handler (take in what their
grants' streams hold, acknowledge it); the clocks are fakes moved by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from harness.clock import FakeClock
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.sharedsub.borrower import Send
from riverbed.sharedsub.bus import InProcessBus, Registry
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.handler import SessionEffect, SharedSubscriptionHandler
from riverbed.sharedsub.host import LeaderHost
from riverbed.sharedsub.protocol import REGISTRY, GroupId
from riverbed.sharedsub.protocol import Message as BusMessage

GROUP = GroupId("g", "t/#")
SHARE = "$share/g/t/#"


@dataclass
class Node:
    """One broker node: its bus, registry and Leader host."""

    host: LeaderHost
    bus: InProcessBus
    clients: list[Client] = field(default_factory=list)


class Client:
    """A session with a shared subscription: takes in every message of its
    grants and acknowledges it when told."""

    def __init__(self, node: Node, name: str, clock: FakeClock, log: Log) -> None:
        self.node, self.clock, self.log = node, clock, log
        self.handler = SharedSubscriptionHandler(name, node.host.config, nonce=name)
        self.got: dict[StreamId, list[int]] = {}
        self.registered: set[str] = set()
        node.clients.append(self)

    def apply(self, effects: list[SessionEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self.node.bus.send(effect.to, effect.message)
        for borrower in self.handler.agent.borrowers:
            if borrower not in self.registered:
                self.registered.add(borrower)
                self.node.bus.register(borrower, self.receive)

    def receive(self, message: BusMessage) -> None:
        self.apply(self.handler.receive(message, self.clock()))

    def pump(self) -> int:
        """Take in and acknowledge what the grants' streams hold."""
        keys = {h.stream: h.key for h in self.log.storage.list_streams()}
        done = 0
        for grant, position in list(self.handler.grants.items()):
            rows = self.log.storage.read(keys[grant.stream], position, 100)
            if not rows:
                continue
            offsets = [r.offset for r in rows]
            self.got.setdefault(grant.stream, []).extend(offsets)
            self.apply(self.handler.fetched(grant, offsets[-1] + 1, offsets, self.clock()))
            for offset in offsets:
                self.apply(self.handler.acked(grant, offset, self.clock()))
            done += len(offsets)
        return done


class World:
    def __init__(self, log: Log, config: SharedSubConfig) -> None:
        self.log, self.config, self.clock = (
            log,
            config,
            FakeClock(seconds=1_000_000),
        )  # the wall clock (µs) at 10**12
        self.nodes: list[Node] = []

    def node(self, name: str) -> Node:
        bus = InProcessBus()
        registry = Registry(bus)
        host = LeaderHost(
            self.log.storage,
            bus,
            registry,
            self.config,
            name,
            clock=self.clock,
            wall_us=self.clock.us,
        )
        registry.find_leader = host.find_leader
        bus.register(REGISTRY, registry.deliver)
        node = Node(host, bus)
        self.nodes.append(node)
        return node

    def settle(self) -> None:
        for _ in range(50):
            moved = sum(n.bus.drain() for n in self.nodes)
            moved += sum(c.pump() for n in self.nodes for c in n.clients)
            moved += sum(n.bus.drain() for n in self.nodes)
            if not moved:
                return

    def advance(self, seconds: float, step: float = 0.25) -> None:
        end = self.clock.ns() + round(seconds * 1e9)
        while self.clock.ns() < end:
            self.clock.advance(ns=min(round(step * 1e9), end - self.clock.ns()))
            for n in self.nodes:
                n.host.tick()
                for c in n.clients:
                    c.apply(c.handler.tick(self.clock()))
            self.settle()


@pytest.fixture
def log(storage_url: str) -> Iterator[Log]:
    with Log.open(storage_url) as opened:
        opened.topics.create("t", 4, binding="t/#")
        yield opened


def publish(log: Log, count: int, start: int = 0) -> None:
    log.produce(
        "t", [Message(b"%d" % i, key=f"k{i % 8}", mqtt_topic="t/x") for i in range(start, count)]
    )


def delivered(*clients: Client) -> list[tuple[str, int]]:
    return sorted((str(s), o) for c in clients for s, offsets in c.got.items() for o in offsets)


def all_offsets(log: Log) -> list[tuple[str, int]]:
    return sorted(
        (str(h.stream), o)
        for h in log.storage.list_streams("t")
        for o in range(h.start_offset, h.next_offset)
    )


def test_a_leader_starts_on_demand_and_its_progress_survives_it(log: Log) -> None:
    GroupStore(log.storage).create(GROUP, start_us=None, now_us=0)  # from the earliest
    publish(log, 40)
    world = World(log, SharedSubConfig(leader_idle_stop=3.0))
    node = world.node("n1")
    first = Client(node, "s1", world.clock, log)
    first.apply(first.handler.subscribe(SHARE, world.clock()))
    world.advance(2.0)
    assert delivered(first) == all_offsets(log)  # published before it subscribed
    (leader,) = node.host.leaders.values()
    saved = GroupStore(log.storage).get(GROUP)
    assert saved is not None and saved.leader == leader.leader.id
    assert sum(saved.progress.values()) == 40  # every stream's progress at its head

    # The sharer leaves; with no Borrower for leader_idle_stop the Leader saves,
    # releases its claim and goes.
    first.apply(first.handler.unsubscribe(SHARE, world.clock()))
    world.advance(5.0)
    assert node.host.leaders == {}
    assert GroupStore(log.storage).leader_of(GROUP, world.clock.us()) is None

    # More messages; a new sharer: a new Leader resumes from the saved progress.
    publish(log, 60, start=40)
    second = Client(node, "s2", world.clock, log)
    second.apply(second.handler.subscribe(SHARE, world.clock()))
    world.advance(2.0)
    assert len(delivered(second)) == 20
    assert sorted(delivered(first) + delivered(second)) == all_offsets(log)


def test_one_leader_per_group_across_nodes_and_a_stale_one_is_fenced(log: Log) -> None:
    publish(log, 16)
    world = World(log, SharedSubConfig())
    a, b = world.node("a"), world.node("b")
    assert a.host.find_leader(GROUP) is not None  # creates the group, starting now
    assert b.host.find_leader(GROUP) is None  # a's claim holds
    (on_a,) = a.host.leaders.values()

    # a stalls (no tick) past its claim's lease; b takes the group over.
    world.clock.advance(world.config.leader_claim_lease + 1)
    assert b.host.find_leader(GROUP) is not None
    # a wakes up: its renewal (or its next save) is refused, and it lets go.
    a.host.tick()
    assert a.host.leaders == {}
    record = GroupStore(log.storage).get(GROUP)
    assert record is not None and record.leader == b.host.leaders[GROUP].leader.id
    assert on_a.leader.id != record.leader


def one_sharer(log: Log, messages: int) -> tuple[World, Node, Client]:
    """`messages` published, one node, one sharer that has taken them in."""
    publish(log, messages)
    world = World(log, SharedSubConfig())
    node = world.node("n1")
    client = Client(node, "s1", world.clock, log)
    client.apply(client.handler.subscribe(SHARE, world.clock()))
    world.advance(1.0)
    return world, node, client


def test_deleting_the_group_stops_its_leader(log: Log) -> None:
    world, node, _ = one_sharer(log, 8)
    assert GROUP in node.host.leaders
    GroupStore(log.storage).delete(GROUP)
    publish(log, 16, start=8)
    world.advance(3.0)  # the next save is refused
    assert GROUP not in node.host.leaders


def test_close_saves_and_releases(log: Log) -> None:
    world, node, client = one_sharer(log, 8)
    assert delivered(client) == all_offsets(log)
    progress = dict(node.host.leaders[GROUP].leader.progress)
    node.host.close()
    store = GroupStore(log.storage)
    assert node.host.leaders == {}
    assert store.leader_of(GROUP, world.clock.us()) is None
    record = store.get(GROUP)
    assert record is not None and dict(record.progress) == progress
    assert sum(progress.values()) == 8


def test_a_round_renews_and_saves_every_leader_in_one_write_each(log: Log) -> None:
    """A node's Leaders started together fall due together: their claims are
    renewed in one transaction and their periodic saves made in one (with
    `batching`, at the runtime's `flush`), so the leader thread is not held up
    answering pings for one commit per group. One renewal refused (the claim
    moved under it) stops that Leader alone."""
    world = World(log, SharedSubConfig())
    node = world.node("n1")
    host = node.host
    host.batching = True
    groups = [GroupId(f"g{i}", "t/#") for i in range(3)]
    for group in groups:
        assert host.find_leader(group) is not None
    store = host.store
    calls: list[tuple[str, int]] = []
    renew_many, save_many = store.renew_many, store.save_many

    def counted_renew_many(claims, **kw):  # type: ignore[no-untyped-def]
        calls.append(("renew", len(claims)))
        return renew_many(claims, **kw)

    def counted_save_many(saves, **kw):  # type: ignore[no-untyped-def]
        calls.append(("save", len(saves)))
        return save_many(saves, **kw)

    store.renew_many = counted_renew_many  # type: ignore[method-assign]
    store.save_many = counted_save_many  # type: ignore[method-assign]
    before = {g: host.leaders[g].claim.lease for g in groups}
    # Another writer moves g2's claim record: its renewal is refused.
    moved = store.leases.end(before[groups[2]], before[groups[2]].expires_us)

    world.clock.advance(world.config.leader_claim_lease / 3 + 0.1)
    host.tick()
    assert calls == [("renew", 3)]
    assert set(host.leaders) == set(groups[:2])
    for group in groups[:2]:
        lease = host.leaders[group].claim.lease
        assert lease.expires_us > before[group].expires_us
        assert store.leases.get(lease.name) == lease
    assert store.leases.get(moved.name) == moved  # refused: untouched
    # The periodic saves (who holds what moved: nothing known saved yet) wait
    # for the flush, then go in one transaction.
    assert all(host.leaders[g].pending is not None for g in groups[:2])
    host.flush()
    assert calls == [("renew", 3), ("save", 2)]
    for group in groups[:2]:
        record = store.get(group)
        assert record is not None and record.leader == host.leaders[group].leader.id
        assert host.leaders[group].saved_holdings == {}
