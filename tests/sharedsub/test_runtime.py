"""The shared-subscription runtime on a real event loop and clock
(sharedsub/runtime.py), on both backends: Borrowers on the loop, the Leader in
its thread, messages crossing between them; two sharers split a topic's streams
with no loss and no duplicate, and a sharer that leaves hands its streams over."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from harness.waiting import eventually_async
from riverbed.errors import StorageUnavailable
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.sharedsub.borrower import Send
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.handler import SessionEffect, SharedSubscriptionHandler
from riverbed.sharedsub.protocol import GroupId, Ping, PingResponse
from riverbed.sharedsub.protocol import Message as BusMessage
from riverbed.sharedsub.runtime import SharedRuntime

SHARE = "$share/g/t/#"
FAST = SharedSubConfig(
    find_leader_retry=0.2,
    ping_interval=0.5,
    ping_timeout=0.5,
    unsubscribe_timeout=0.2,
    leader_borrower_timeout=1.5,
    fence_margin=0.2,
    leader_periodic=0.2,
    leader_resend=0.2,
    leader_claim_lease=5.0,
    leader_idle_stop=5.0,
)


class Sharer:
    """A session with `$share/g/t/#`: takes in and acknowledges what its grants hold."""

    def __init__(self, runtime: SharedRuntime, log: Log, name: str) -> None:
        self.runtime, self.log = runtime, log
        self.handler = SharedSubscriptionHandler(name, runtime.config, nonce=name)
        self.got: list[tuple[str, int]] = []
        self.registered: set[str] = set()

    def apply(self, effects: list[SessionEffect]) -> None:
        for borrower in self.handler.agent.borrowers:
            if borrower not in self.registered:
                self.registered.add(borrower)
                self.runtime.register(borrower, self.receive)
        for effect in effects:
            if isinstance(effect, Send):
                self.runtime.send(effect.to, effect.message)
                self.sent(effect.message)

    def sent(self, message: BusMessage) -> None:
        """What a sharer does after each message it sends (nothing here)."""

    def receive(self, message: BusMessage) -> None:
        self.apply(self.handler.receive(message, time.monotonic()))

    def step(self) -> None:
        now = time.monotonic()
        keys = {h.stream: h.key for h in self.log.storage.list_streams()}
        for grant, position in list(self.handler.grants.items()):
            rows = self.log.storage.read(keys[grant.stream], position, 50)
            if rows:
                offsets = [r.offset for r in rows]
                self.got.extend((str(grant.stream), o) for o in offsets)
                self.apply(self.handler.fetched(grant, offsets[-1] + 1, offsets, now))
                for offset in offsets:
                    self.apply(self.handler.acked(grant, offset, now))
        self.apply(self.handler.tick(now))


@pytest.fixture
def log(storage_url: str) -> Iterator[Log]:
    with Log.open(storage_url) as opened:
        opened.topics.create("t", 4, binding="t/#")
        yield opened


def _publish(log: Log, first: int, count: int) -> None:
    log.produce(
        "t",
        [Message(b"%d" % i, key=f"k{i % 16}", mqtt_topic="t/x") for i in range(first, count)],
    )


def _all(log: Log) -> list[tuple[str, int]]:
    return sorted(
        (str(h.stream), o)
        for h in log.storage.list_streams("t")
        for o in range(h.start_offset, h.next_offset)
    )


async def _run(sharers: list[Sharer], until: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        for sharer in sharers:
            sharer.step()
        await asyncio.sleep(0.02)


def test_two_sharers_split_the_streams_and_one_hands_over(log: Log) -> None:
    GroupStore(log.storage).create(GroupId("g", "t/#"), start_us=None, now_us=0)
    _publish(log, 0, 200)

    async def go() -> tuple[Sharer, Sharer, tuple[int, int]]:
        runtime = SharedRuntime(log.storage, FAST, "node-1")
        a, b = Sharer(runtime, log, "a"), Sharer(runtime, log, "b")
        try:
            a.apply(a.handler.subscribe(SHARE, time.monotonic()))
            b.apply(b.handler.subscribe(SHARE, time.monotonic()))

            def split() -> bool:
                return len(a.handler.grants) + len(b.handler.grants) >= 4 and all(
                    s.handler.grants for s in (a, b)
                )

            await _run([a, b], split)
            await _run([a, b], lambda: len(a.got) + len(b.got) >= 200)
            both = len(a.handler.grants), len(b.handler.grants)
            # The Leader saves who holds what (for `riverbed group describe`).
            store = GroupStore(log.storage)

            def saved() -> bool:
                record = store.get(GroupId("g", "t/#"))
                return record is not None and sorted(
                    len(held) for held in record.holdings.values()
                ) == [10, 10]

            await _run([a, b], saved)
            # a leaves gracefully: b takes its streams over and reads what follows.
            a.apply(a.handler.unsubscribe(SHARE, time.monotonic()))
            _publish(log, 200, 300)
            await _run([a, b], lambda: len(a.got) + len(b.got) >= 300)
            return a, b, both
        finally:
            await runtime.close()

    a, b, (held_a, held_b) = asyncio.run(go())
    # 20 streams reachable (4 of `t`, 16 of the built-in `mqtt`): while both
    # were there, each held its half.
    assert (held_a, held_b) == (10, 10)
    got = sorted(a.got + b.got)
    assert got == _all(log)  # nothing lost, nothing twice
    record = GroupStore(log.storage).get(GroupId("g", "t/#"))
    assert record is not None
    assert {str(s): o for s, o in record.progress.items() if s.topic == "t"} == {
        str(h.stream): h.next_offset for h in log.storage.list_streams("t")
    }
    assert GroupStore(log.storage).leader_of(GroupId("g", "t/#"), time.time_ns() // 1000) is None


def test_sharers_on_two_nodes_share_one_leader_over_postgres(postgres_url: str) -> None:
    # Nodes talk over LISTEN/NOTIFY (cluster/bus.py): the sharer on the node
    # without the Leader reaches it there, and the two split the streams.
    with Log.open(postgres_url) as log_1, Log.open(postgres_url) as log_2:
        log_1.topics.create("t", 4, binding="t/#")
        GroupStore(log_1.storage).create(GroupId("g", "t/#"), start_us=None, now_us=0)
        _publish(log_1, 0, 200)

        async def go() -> tuple[Sharer, Sharer, list[str]]:
            one = SharedRuntime(log_1.storage, FAST, "node-1", remote_url=postgres_url)
            two = SharedRuntime(log_2.storage, FAST, "node-2", remote_url=postgres_url)
            await one.start()
            await two.start()
            a, b = Sharer(one, log_1, "a"), Sharer(two, log_2, "b")
            try:
                a.apply(a.handler.subscribe(SHARE, time.monotonic()))
                await _run([a, b], lambda: bool(a.handler.grants))  # node-1 leads
                b.apply(b.handler.subscribe(SHARE, time.monotonic()))
                await _run(
                    [a, b],
                    lambda: len(a.handler.grants) == 10 and len(b.handler.grants) == 10,
                )
                _publish(log_1, 200, 300)
                await _run([a, b], lambda: len(a.got) + len(b.got) >= 300)
                leaders = [
                    h.leader.id for h in (*one.host.leaders.values(), *two.host.leaders.values())
                ]
                return a, b, leaders
            finally:
                await two.close()
                await one.close()

        a, b, leaders = asyncio.run(go())
        assert len(leaders) == 1 and leaders[0].startswith("node-1/")
        assert sorted(a.got + b.got) == _all(log_1)  # no loss, no duplicate
        assert a.got and b.got


def test_an_unreachable_store_costs_the_leader_side_a_line_not_its_ticks(
    log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    """A tick that meets a store being restarted is logged in one line, without
    a traceback, and the ticks go on: the sharer still gets every message."""
    GroupStore(log.storage).create(GroupId("g", "t/#"), start_us=None, now_us=0)
    _publish(log, 0, 100)

    async def go() -> Sharer:
        runtime = SharedRuntime(log.storage, FAST, "node-1")
        real_tick = runtime.host.tick
        failures = iter(range(2))

        def tick() -> None:
            if next(failures, None) is not None:
                raise StorageUnavailable(
                    "cannot connect to PostgreSQL: the database system is shutting down"
                )
            real_tick()

        runtime.host.tick = tick  # type: ignore[method-assign]
        a = Sharer(runtime, log, "a")
        try:
            a.apply(a.handler.subscribe(SHARE, time.monotonic()))
            await _run([a], lambda: len(a.got) >= 100)
            return a
        finally:
            await runtime.close()

    with caplog.at_level(logging.WARNING, "riverbed.sharedsub.runtime"):
        a = asyncio.run(go())
    assert sorted(a.got) == _all(log)
    lines = [r for r in caplog.records if r.name == "riverbed.sharedsub.runtime"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    assert all(r.exc_info is None for r in lines)
    assert "waits for the store" in lines[0].getMessage()


class TimedSharer(Sharer):
    """A sharer whose Handler is ticked by a loop timer at its next deadline, as
    a broker's session ticks it (mqtt/sharing.py), and which can stall the loop
    right after it sends a ping (a busy machine, a long callback)."""

    def __init__(self, runtime: SharedRuntime, log: Log, name: str) -> None:
        super().__init__(runtime, log, name)
        self.timer: asyncio.TimerHandle | None = None
        self.stall = 0.0
        self.stalls = 0
        self.answers = 0
        """Ping answers that came after the first stall."""

    def receive(self, message: BusMessage) -> None:
        if isinstance(message, PingResponse) and self.stalls:
            self.answers += 1
        super().receive(message)

    def apply(self, effects: list[SessionEffect]) -> None:
        super().apply(effects)
        self.arm()

    def sent(self, message: BusMessage) -> None:
        if isinstance(message, Ping) and self.stall:
            # The loop is stuck in this callback while the Leader answers.
            time.sleep(self.stall)
            self.stall, self.stalls = 0.0, self.stalls + 1

    def arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        deadline = self.handler.next_deadline()
        if deadline is not None:
            self.timer = asyncio.get_running_loop().call_at(deadline, self.tick)

    def tick(self) -> None:
        self.timer = None
        self.apply(self.handler.tick(time.monotonic()))


def test_an_answer_that_came_while_the_loop_stalled_counts_before_the_fence(log: Log) -> None:
    """The Leader answered a ping while the loop was stuck past the Borrower's
    old fence (but within the window the answer gives): the answer moves the
    fence before the timers that came due in the stall run, so the Borrower keeps
    its streams. Before, the answer waited one loop turn more behind those timers,
    the Borrower fenced itself off, and its in-flight window went out again."""
    GroupStore(log.storage).create(GroupId("g", "t/#"), start_us=None, now_us=0)
    # Pings every 2.5 s, an answer gives a fence 5.5 s after its ping was sent.
    config = SharedSubConfig(
        find_leader_retry=0.2,
        ping_interval=2.5,
        ping_timeout=3.0,
        unsubscribe_timeout=0.5,
        leader_borrower_timeout=6.0,
        fence_margin=0.5,
        leader_periodic=0.5,
        leader_resend=0.5,
        leader_claim_lease=30.0,
        leader_idle_stop=30.0,
    )

    async def go() -> TimedSharer:
        runtime = SharedRuntime(log.storage, config, "node-1")
        a = TimedSharer(runtime, log, "a")
        try:
            a.apply(a.handler.subscribe(SHARE, time.monotonic()))
            await eventually_async(lambda: len(a.handler.grants) == 20, 30.0, "20 grants")
            # Stalled 4 s after a ping: the fence of the ping before (3 s after
            # this one) and this ping's timeout (3 s) fall inside the stall.
            a.stall = 4.0
            await eventually_async(lambda: a.stalls == 1, 30.0, "a stall")
            # The stalled ping's answer, and the next one's.
            await eventually_async(lambda: a.answers >= 2, 30.0, "two answers")
            return a
        finally:
            if a.timer is not None:
                a.timer.cancel()
            await runtime.close()

    a = asyncio.run(go())
    assert list(a.handler.agent.replaced) == []
    assert len(a.handler.grants) == 20


def test_pings_are_answered_while_the_leaders_saves_are_slow(log: Log) -> None:
    """Each save of the Leaders' progress takes 5 s (a busy database), longer
    than a ping's answer may take (3.5 s here): the leader thread answers pings
    while the saving thread makes the save, so the Borrower keeps its streams.
    Before, pings waited behind the save and the Borrower fenced itself off at
    each one. What was sent while a save was made waits for it."""
    GroupStore(log.storage).create(GroupId("g", "t/#"), start_us=None, now_us=0)
    # Pings every second; an answer gives a fence 4.5 s after its ping was sent.
    config = SharedSubConfig(
        find_leader_retry=0.2,
        ping_interval=1.0,
        ping_timeout=4.0,
        unsubscribe_timeout=0.5,
        leader_borrower_timeout=5.0,
        fence_margin=0.5,
        leader_periodic=0.5,
        leader_resend=0.5,
        leader_claim_lease=30.0,
        leader_idle_stop=30.0,
    )
    slow_saves: list[float] = []

    async def go() -> Sharer:
        runtime = SharedRuntime(log.storage, config, "node-1")
        store = runtime.host.store
        save_many = store.save_many

        def slow_save_many(saves, **kw):  # type: ignore[no-untyped-def]
            if grants_taken:
                time.sleep(5.0)  # the database is busy: a fault injected, not a wait
                slow_saves.append(time.monotonic())
            return save_many(saves, **kw)

        store.save_many = slow_save_many  # type: ignore[method-assign]
        grants_taken: list[bool] = []
        a = TimedSharer(runtime, log, "a")
        published = 0
        try:
            a.apply(a.handler.subscribe(SHARE, time.monotonic()))
            await eventually_async(lambda: len(a.handler.grants) == 20, 30.0, "20 grants")
            grants_taken.append(True)

            def four_slow_saves() -> bool:
                nonlocal published
                _publish(log, published, published + 5)  # progress to save, all along
                published += 5
                return len(slow_saves) >= 4

            await _run([a], four_slow_saves, timeout=60.0)
            return a
        finally:
            if a.timer is not None:
                a.timer.cancel()
            await runtime.close()

    a = asyncio.run(go())
    assert list(a.handler.agent.replaced) == []
    assert len(a.handler.grants) == 20
    assert sorted(a.got) == sorted(set(a.got))  # nothing twice
