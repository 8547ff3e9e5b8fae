"""Named subscriptions: start positions, filters, commits, resets, lag, wake-ups."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from harness.clock import moment_between
from harness.waiting import eventually
from riverbed.errors import (
    AlreadyExists,
    InvalidInput,
    InvalidOffset,
    InvalidTopicFilter,
    SubscriptionNotFound,
    TopicNotFound,
)
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.storage import Storage
from riverbed.storage.base import StartKind, SubscriptionRecord
from riverbed.subscriptions.named import Consumer, Subscriptions
from riverbed.subscriptions.provisioning import delete_subscription
from riverbed.subscriptions.reset import reset_subscription
from riverbed.subscriptions.workers import Worker

S0 = StreamId("t", 0, 0)


@pytest.fixture
def log(storage: Storage) -> Iterator[Log]:
    opened = Log(storage)
    opened.topics.create("t", 1)
    try:
        yield opened
    finally:
        opened.appender.close()


@pytest.fixture
def subs(storage: Storage) -> Subscriptions:
    return Subscriptions(storage)


def produce(log: Log, *payloads: bytes, mqtt_topic: str = "", topic: str = "t") -> None:
    log.produce(topic, [Message(p, key="k", mqtt_topic=mqtt_topic) for p in payloads])


def drain(consumer: Consumer, batch: int = 100) -> list[bytes]:
    out: list[bytes] = []
    while got := consumer.poll(batch):
        out.extend(d.message.payload for d in got)
    return out


def cursors(storage: Storage, name: str) -> dict[StreamId, int]:
    by_key = {h.key: h.stream for h in storage.list_streams()}
    return {by_key[k]: v for k, v in storage.get_cursors(name).items()}


# --------------------------------------------------------------------- create


def test_create_get_list_delete(log: Log, subs: Subscriptions) -> None:
    record = subs.create("s", "t", topic_filter="a/#")
    assert subs.get("s") == record
    assert record.start is StartKind.EARLIEST and record.filter == "a/#"
    assert [r.name for r in subs.list("t")] == ["s"]
    assert subs.list("other") == []
    subs.delete("s")
    with pytest.raises(SubscriptionNotFound):
        subs.get("s")


def test_create_refuses_bad_input_writing_nothing(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    subs.create("s", "t")
    with pytest.raises(AlreadyExists):
        subs.create("s", "t")
    with pytest.raises(TopicNotFound):
        subs.create("s2", "nope")
    with pytest.raises(InvalidTopicFilter):
        subs.create("s3", "t", topic_filter="a/#/b")
    for bad_name in ("", "-s", "a b", "x" * 201):
        with pytest.raises(InvalidInput, match=repr(bad_name)):
            subs.create(bad_name, "t")
    with pytest.raises(InvalidInput, match="before the epoch"):
        subs.create("s4", "t", start=-1)
    assert [r.name for r in subs.list()] == ["s"]


# --------------------------------------------------------------------- start positions


def test_start_earliest_latest_and_time(log: Log, subs: Subscriptions) -> None:
    for i in range(5):
        produce(log, b"old%d" % i)
        moment_between()  # the scenario: distinct timestamps
    stored = log.storage.read(log.storage.list_streams("t")[0].key, 0, 10)
    subs.create("earliest", "t", start=StartKind.EARLIEST)
    subs.create("latest", "t", start=StartKind.LATEST)
    subs.create("time", "t", start=stored[2].timestamp_us)
    subs.create("future", "t", start=stored[-1].timestamp_us + 10**9)
    produce(log, b"new")
    assert drain(subs.consumer("earliest")) == [b"old0", b"old1", b"old2", b"old3", b"old4", b"new"]
    assert drain(subs.consumer("latest")) == [b"new"]
    assert drain(subs.consumer("time")) == [b"old2", b"old3", b"old4", b"new"]
    assert drain(subs.consumer("future")) == [b"new"]


def test_streams_added_later_start_at_their_beginning(log: Log, subs: Subscriptions) -> None:
    produce(log, b"a")
    subs.create("latest", "t", start=StartKind.LATEST)
    log.topics.add_storage_topic("t", 2)
    log.topics.switch_produce("t")
    produce(log, b"b", b"c")
    assert drain(subs.consumer("latest")) == [b"b", b"c"]


# --------------------------------------------------------------------- filter


def test_filter_skips_but_moves_past(storage: Storage, log: Log, subs: Subscriptions) -> None:
    subs.create("s", "t", topic_filter="a/#")
    produce(log, b"1", mqtt_topic="a/x")
    produce(log, b"2", mqtt_topic="b/y")
    produce(log, b"3", mqtt_topic="a")
    produce(log, b"4", mqtt_topic="b/z")
    consumer = subs.consumer("s")
    got = consumer.poll(100)
    assert [d.message.payload for d in got] == [b"1", b"3"]
    assert all(d.stream == S0 for d in got)
    assert consumer.poll(100) == []
    consumer.commit()
    # The cursor is past the unmatched messages: nothing is pinned by them.
    assert cursors(storage, "s") == {S0: 4}
    assert [lag.lag for lag in subs.lag("s")] == [0]


def test_only_unmatched_messages_are_read_past_in_one_poll(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    subs.create("s", "t", topic_filter="wanted")
    produce(log, *[b"x"] * 30, mqtt_topic="unwanted")
    produce(log, b"yes", mqtt_topic="wanted")
    consumer = subs.consumer("s")
    assert [d.message.payload for d in consumer.poll(max_messages=5)] == [b"yes"]


# --------------------------------------------------------------------- commit


def test_commit_never_moves_backwards(storage: Storage, log: Log, subs: Subscriptions) -> None:
    produce(log, *[b"m%d" % i for i in range(5)])
    subs.create("s", "t")
    slow = subs.consumer("s")
    assert len(slow.poll(2)) == 2  # slow has positions from before fast commits
    fast = subs.consumer("s")
    assert len(drain(fast)) == 5
    fast.commit()
    assert cursors(storage, "s") == {S0: 5}
    slow.commit()  # at 2: does not move the cursor back
    assert cursors(storage, "s") == {S0: 5}
    storage.commit_cursors("s", {storage.list_streams("t")[0].key: 1})
    assert cursors(storage, "s") == {S0: 5}


def test_a_new_consumer_resumes_at_the_commit_and_gets_uncommitted_again(
    log: Log, subs: Subscriptions
) -> None:
    produce(log, *[b"m%d" % i for i in range(6)])
    subs.create("s", "t")
    first = subs.consumer("s")
    assert [d.message.payload for d in first.poll(2)] == [b"m0", b"m1"]
    first.commit()
    assert [d.message.payload for d in first.poll(2)] == [b"m2", b"m3"]  # not committed
    # first "crashes"; the next consumer gets what was not committed again.
    second = subs.consumer("s")
    assert drain(second) == [b"m2", b"m3", b"m4", b"m5"]


def test_commit_without_changes_writes_nothing(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    subs.create("s", "t")
    consumer = subs.consumer("s")
    consumer.poll(10)
    consumer.commit()
    assert cursors(storage, "s") == {S0: 0}


def test_poll_refuses_bad_max(log: Log, subs: Subscriptions) -> None:
    subs.create("s", "t")
    with pytest.raises(InvalidInput, match="0"):
        subs.consumer("s").poll(0)


# --------------------------------------------------------------------- reset


def test_reset_earliest_latest_time_explicit(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    for i in range(5):
        produce(log, b"m%d" % i)
        moment_between()  # the scenario: distinct timestamps
    stored = storage.read(storage.list_streams("t")[0].key, 0, 10)
    subs.create("s", "t")
    c = subs.consumer("s")
    drain(c)
    c.commit()
    assert subs.reset("s", StartKind.EARLIEST) == {S0: 0}
    assert drain(subs.consumer("s")) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert subs.reset("s", StartKind.LATEST) == {S0: 5}
    assert drain(subs.consumer("s")) == []
    assert subs.reset("s", stored[3].timestamp_us) == {S0: 3}
    assert drain(subs.consumer("s")) == [b"m3", b"m4"]
    assert subs.reset("s", {S0: 1}) == {S0: 1}
    assert cursors(storage, "s") == {S0: 1}
    assert drain(subs.consumer("s")) == [b"m1", b"m2", b"m3", b"m4"]
    assert subs.reset("s", {S0: 5}) == {S0: 5}  # the head itself is fine


def test_explicit_reset_keeps_other_streams(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    log.topics.create("two", 2)
    log.produce("two", [Message(b"x", key=str(i)) for i in range(10)])
    subs.create("s", "two", start=StartKind.LATEST)
    heads = storage.list_streams("two")
    a, b = heads[0].stream, heads[1].stream
    assert subs.reset("s", {a: 0}) == {a: 0, b: heads[1].next_offset}


@pytest.mark.parametrize(
    ("offsets", "error", "text"),
    [
        ({S0: -1}, InvalidOffset, "-1"),
        ({S0: 6}, InvalidOffset, "outside"),
        ({S0: "3"}, InvalidOffset, "'3'"),
        ({S0: 1.0}, InvalidOffset, "1.0"),
        ({StreamId("t", 0, 1): 0}, InvalidInput, "t/0/1"),
        ({StreamId("other", 0, 0): 0}, InvalidInput, "other/0/0"),
        ({StreamId("t", 0, 0): 3, StreamId("t", 9, 0): 0}, InvalidInput, "t/9/0"),
    ],
)
def test_explicit_reset_refuses_bad_offsets_changing_nothing(
    storage: Storage,
    log: Log,
    subs: Subscriptions,
    offsets: dict[StreamId, object],
    error: type[Exception],
    text: str,
) -> None:
    produce(log, *[b"m"] * 5)
    subs.create("s", "t")
    c = subs.consumer("s")
    c.poll(2)
    c.commit()
    before = cursors(storage, "s")
    with pytest.raises(error, match=text):
        subs.reset("s", offsets)  # type: ignore[arg-type]
    assert cursors(storage, "s") == before == {S0: 2}


def test_explicit_reset_refuses_below_the_start(
    storage: Storage, log: Log, subs: Subscriptions
) -> None:
    produce(log, *[b"m"] * 5)
    subs.create("s", "t", start=StartKind.LATEST)
    storage.delete_before(storage.list_streams("t")[0].key, 3)
    with pytest.raises(InvalidOffset, match=r"\[3, 5\]"):
        subs.reset("s", {S0: 2})
    assert cursors(storage, "s") == {S0: 5}
    assert subs.reset("s", {S0: 3}) == {S0: 3}
    assert subs.reset("s", StartKind.EARLIEST) == {S0: 3}


def test_reset_refuses_times_before_the_epoch_and_unknown_subscriptions(
    log: Log, subs: Subscriptions
) -> None:
    subs.create("s", "t")
    with pytest.raises(InvalidInput, match="epoch"):
        subs.reset("s", -5)
    with pytest.raises(InvalidInput, match="timestamp"):
        subs.reset("s", StartKind.TIME)
    with pytest.raises(SubscriptionNotFound):
        subs.reset("nope", StartKind.EARLIEST)


@pytest.mark.parametrize("name", ["$session.c1.t", "$share.g1.t"])
def test_a_cursor_the_broker_owns_is_not_moved_by_name(
    storage: Storage, log: Log, subs: Subscriptions, name: str
) -> None:
    """The cursors of MQTT sessions and shared subscription groups live among
    the named subscriptions; their owners keep their positions in memory and
    in their records, so none of the ways to move a subscription by name may
    touch them (the session's record would not know; messages would be
    skipped under it). Each refusal names the subscription and changes nothing."""
    produce(log, b"a", b"b", b"c")
    storage.create_subscription(
        SubscriptionRecord(name, "t", None, StartKind.EARLIEST, None, 0), lambda heads: {}
    )
    storage.reset_cursors(name, {storage.list_streams("t")[0].key: 1})
    before = storage.get_cursors(name)
    rule = re.escape(f"subscription {name!r} is the broker's own")
    attempts: list[Callable[[], object]] = [
        lambda: subs.reset(name, StartKind.LATEST),
        lambda: reset_subscription(storage, name, StartKind.EARLIEST),
        lambda: subs.delete(name),
        lambda: delete_subscription(storage, name),
        lambda: subs.consumer(name),
        lambda: Worker(storage, name, lambda batch: None),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidInput, match=rule):
            attempt()
        assert storage.get_cursors(name) == before
    assert subs.get(name).name == name


# --------------------------------------------------------------------- lag


def test_lag_per_stream_with_readable_flag(log: Log, subs: Subscriptions) -> None:
    log.topics.create("g", 2)
    subs.create("s", "g")
    log.produce("g", [Message(b"x", key=str(i)) for i in range(20)])
    log.topics.add_storage_topic("g", 4)
    log.topics.switch_produce("g")
    log.produce("g", [Message(b"y", key=str(i)) for i in range(20)])
    lags = {lag.stream: lag for lag in subs.lag("s")}
    assert len(lags) == 6
    gen0 = [lag for s, lag in lags.items() if s.generation == 0]
    gen1 = [lag for s, lag in lags.items() if s.generation == 1]
    assert sum(lag.lag for lag in gen0) == 20 and sum(lag.lag for lag in gen1) == 20
    assert all(lag.readable for lag in gen0)
    # gen1 waits for gen0 (its lineage); a lineage with an empty gen0 stream opens.
    assert all(
        lag.readable == (lags[StreamId("g", 0, lag.stream.partition // 2)].lag == 0) for lag in gen1
    )
    c = subs.consumer("s")
    drain(c)
    c.commit()
    lags = {lag.stream: lag for lag in subs.lag("s")}
    assert all(lag.lag == 0 and lag.readable for lag in lags.values())
    assert all(lag.committed == lag.head for lag in lags.values())


# --------------------------------------------------------------------- wake-ups


class WakeUps:
    """`storage.wakeups.wait` without its time-out: a poll re-reads every 0.5 s
    whatever happens, so to see that it was woken take those re-reads away.
    `woken` counts the waits that ended because something was appended. (Poll
    once with a time-out before: the watcher of other processes' commits starts
    at a first wait, and notifies once as it starts.)"""

    def __init__(self, storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
        wakeups = storage.wakeups
        self.waiting = lambda: wakeups._waiting > 0
        self.woken = 0
        wait = wakeups.wait

        def no_timeout(seen: int, timeout: float, latency: float | None = None) -> int:
            version = wait(seen, 60.0, latency)
            self.woken += version != seen
            return version

        monkeypatch.setattr(wakeups, "wait", no_timeout)


def test_poll_wakes_up_on_an_append_from_another_thread(
    log: Log, subs: Subscriptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    subs.create("s", "t")
    consumer = subs.consumer("s")
    assert consumer.poll(10, timeout=0.1) == []  # the watcher runs from now on
    wakeups = WakeUps(log.storage, monkeypatch)

    def later() -> None:
        eventually(wakeups.waiting, what="the poll to wait")
        produce(log, b"wake")

    thread = threading.Thread(target=later)
    thread.start()
    got = consumer.poll(10, timeout=30)
    thread.join()
    assert [d.message.payload for d in got] == [b"wake"]
    assert wakeups.woken == 1  # it did wait, and the append ended the wait


def test_poll_times_out_empty(log: Log, subs: Subscriptions) -> None:
    subs.create("s", "t")
    started = time.monotonic()
    assert subs.consumer("s").poll(10, timeout=0.2) == []
    assert 0.15 <= time.monotonic() - started < 10  # the upper bound: no hang


PRODUCER = """
import sys, time
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage

log = Log(open_storage(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
log.produce("t", [Message(b"from-afar", key="k")])
log.close()
"""


def test_poll_wakes_up_on_an_append_from_another_process(
    storage_url: str, log: Log, subs: Subscriptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    subs.create("s", "t")
    consumer = subs.consumer("s")
    # No waiting poll before: the cross-process watcher starts inside the poll
    # below, and its notice as it starts ends the poll's first wait.
    assert consumer.poll(10) == []
    with subprocess.Popen(
        [sys.executable, "-c", PRODUCER, storage_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "ready"
            wakeups = WakeUps(log.storage, monkeypatch)
            stdin = proc.stdin

            def go() -> None:  # once the poll waits again, the watcher running
                eventually(
                    lambda: wakeups.woken >= 1 and wakeups.waiting(), what="the poll to wait"
                )
                stdin.write("go\n")
                stdin.flush()

            thread = threading.Thread(target=go)
            thread.start()
            got = consumer.poll(10, timeout=30)
            thread.join()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert [d.message.payload for d in got] == [b"from-afar"]
    assert wakeups.woken >= 2  # the other process's commit ended a wait
