"""The commit pacer (mqtt/pacer.py): when the broker's PUBLISHes are committed,
and together with what. In process, with a real log; the connections are
stand-ins with the two methods the pacer calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from harness.waiting import eventually_async
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.mqtt.pacer import CommitPacer, TopicBatch

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


class FakeInbound:
    """A connection's inbound side as the pacer sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: dict[str, TopicBatch] = {}
        self.done: list[TopicBatch] = []
        self.committed_at: list[float] = []

    def add(self, topic: str, *messages: Message) -> None:
        batch = self.batches.get(topic)
        if batch is None:
            batch = self.batches[topic] = TopicBatch(self, topic)  # type: ignore[arg-type]
        batch.messages.extend(messages)

    def take_batches(self) -> list[TopicBatch]:
        batches = list(self.batches.values())
        self.batches.clear()
        return batches

    def committed(self, batch: TopicBatch) -> None:
        self.done.append(batch)
        self.committed_at.append(asyncio.get_running_loop().time())


def _positions(batch: TopicBatch) -> list[tuple[StreamId, int]]:
    assert batch.positions is not None
    return [batch.positions[batch.start + i] for i in range(len(batch.messages))]


def _payloads(log: Log, stream: StreamId) -> list[bytes]:
    (key,) = [h.key for h in log.storage.list_streams(stream.topic) if h.stream == stream]
    return [m.payload for m in log.storage.read(key, 0, 100)]


@pytest.fixture
def log(sqlite_url: str) -> Iterator[Log]:
    """A log with topic `t` (one partition)."""
    with Log.open(sqlite_url) as opened:
        opened.topics.create("t", 1)
        yield opened


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Runs a scenario on asyncio's own loop, then on uvloop's (the broker's),
    whose handles are not asyncio's classes."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


def test_connections_of_one_loop_turn_share_one_commit(log: Log, run: Runner) -> None:

    async def go() -> tuple[FakeInbound, FakeInbound]:
        pacer = CommitPacer(log, interval=0.0)
        a, b = FakeInbound("a"), FakeInbound("b")
        a.add("t", Message(b"a1", key="k", mqtt_topic="x"), Message(b"a2", key="k"))
        b.add("t", Message(b"b1", key="k"))
        assert pacer.want(a) is False  # nothing committed lately: this turn
        assert pacer.want(b) is False
        assert not a.done and not b.done  # not before the end of the turn
        await asyncio.sleep(0)  # the scenario: the loop turn ends
        return a, b

    a, b = run(go())
    ((batch_a,), (batch_b,)) = a.done, b.done
    (stream,) = {s for s, _ in _positions(batch_a) + _positions(batch_b)}
    # One commit: consecutive offsets, in the order the connections asked.
    assert [o for _, o in _positions(batch_a)] == [0, 1]
    assert [o for _, o in _positions(batch_b)] == [2]
    assert _payloads(log, stream) == [b"a1", b"a2", b"b1"]


def test_a_commit_soon_after_another_waits_for_the_interval(log: Log, run: Runner) -> None:
    interval = 0.2

    async def go() -> tuple[list[float], list[bool], FakeInbound]:
        loop = asyncio.get_running_loop()
        pacer = CommitPacer(log, interval=interval)
        c = FakeInbound("c")
        waits = []
        c.add("t", Message(b"1", key="k"))
        waits.append(pacer.want(c))  # quiet until now: at once
        await asyncio.sleep(0)  # the scenario: the loop turn ends
        first = loop.time()
        c.add("t", Message(b"2", key="k"))
        waits.append(pacer.want(c))  # too soon: waits
        c.add("t", Message(b"3", key="k"))
        waits.append(pacer.want(c))  # joins the waiting batch
        await eventually_async(lambda: len(c.done) >= 2, what="the second commit")
        return [first, *c.committed_at], waits, c

    (first, t1, t2), waits, c = run(go())
    assert waits == [False, True, True]
    assert t1 <= first
    assert t2 - t1 >= interval * 0.9  # the loop clock's granularity
    assert [len(b.messages) for b in c.done] == [1, 2]
    ((stream, _),) = {p for p in _positions(c.done[0])}
    assert _payloads(log, stream) == [b"1", b"2", b"3"]


def test_commit_now_does_not_wait_for_the_interval(log: Log, run: Runner) -> None:

    async def go() -> FakeInbound:
        pacer = CommitPacer(log, interval=10.0)
        c = FakeInbound("c")
        c.add("t", Message(b"1", key="k"))
        pacer.want(c)
        await asyncio.sleep(0)  # the scenario: the loop turn ends
        c.add("t", Message(b"2", key="k"))
        assert pacer.want(c) is True
        pacer.commit_now()  # a QoS 2 PUBLISH behind it, or shutdown
        assert len(c.done) == 2
        pacer.commit_now()  # nothing waiting: nothing happens
        return c

    c = run(go())
    assert [len(b.messages) for b in c.done] == [1, 1]


def test_one_connections_bad_batch_does_not_refuse_the_others(log: Log, run: Runner) -> None:
    log.topics.create("bound", 1, binding="sensors/#")

    async def go() -> tuple[FakeInbound, FakeInbound]:
        pacer = CommitPacer(log, interval=0.0)
        good, bad = FakeInbound("good"), FakeInbound("bad")
        good.add("bound", Message(b"ok", key="k", mqtt_topic="sensors/1"))
        bad.add("bound", Message(b"no", key="k", mqtt_topic="other/1"))  # not its binding
        pacer.want(good)
        pacer.want(bad)
        await asyncio.sleep(0)  # the scenario: the loop turn ends
        return good, bad

    good, bad = run(go())
    assert good.done[0].error is None and good.done[0].positions is not None
    error = bad.done[0].error
    assert error is not None and "other/1" in str(error) and "sensors/#" in str(error)
    (stream,) = {s for s, _ in _positions(good.done[0])}
    assert _payloads(log, stream) == [b"ok"]


def test_a_commit_of_its_own_callback_ends_the_turn_right_after(log: Log, run: Runner) -> None:
    """`after` (the broker's end of turn, mqtt/turns.py) runs in the callback
    that committed, once its batches are reported; a `commit_now` called from
    other work does not run it (that work is not done yet)."""

    async def go() -> list[str]:
        events: list[str] = []
        c = FakeInbound("c")

        def committed(batch: TopicBatch) -> None:
            events.append(f"committed {len(batch.messages)}")

        c.committed = committed  # type: ignore[method-assign]
        pacer = CommitPacer(log, interval=0.0, after=lambda: events.append("after"))
        c.add("t", Message(b"1", key="k"))
        pacer.want(c)
        await asyncio.sleep(0)  # the scenario: the loop turn ends
        c.add("t", Message(b"2", key="k"), Message(b"3", key="k"))
        pacer.want(c)
        pacer.commit_now()  # a QoS 2 PUBLISH behind it: no end of turn here
        events.append("called")
        await asyncio.sleep(0)
        return events

    assert run(go()) == ["committed 1", "after", "committed 2", "called"]
