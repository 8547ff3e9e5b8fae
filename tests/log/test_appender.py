"""Group commit: many producers, one transaction per batch, positions after commit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from harness.waiting import eventually
from riverbed.errors import TopicNotFound
from riverbed.log.appender import Appender, Position
from riverbed.log.topics import Topics
from riverbed.model import Message, StoredMessage, StreamId
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import Row

TOPIC = "t"


def read_all(storage: Storage, topic: str) -> dict[StreamId, list[StoredMessage]]:
    out: dict[StreamId, list[StoredMessage]] = {}
    for head in storage.list_streams(topic):
        messages: list[StoredMessage] = []
        while True:
            batch = storage.read(head.key, head.start_offset + len(messages), 5000)
            if not batch:
                break
            messages.extend(batch)
        out[head.stream] = messages
    return out


def check_dense(streams: Mapping[StreamId, list[StoredMessage]]) -> None:
    for stream, messages in streams.items():
        assert [m.offset for m in messages] == list(range(len(messages))), stream


class CountingAppends:
    """Wraps `storage.append` to record the number of rows of every call."""

    def __init__(self, storage: Storage) -> None:
        self.sizes: list[int] = []
        self._inner: Callable[[Mapping[int, Sequence[Row]]], dict[int, int]] = storage.append
        storage.append = self  # type: ignore[method-assign]

    def __call__(self, batches: Mapping[int, Sequence[Row]]) -> dict[int, int]:
        result = self._inner(batches)
        self.sizes.append(sum(len(rows) for rows in batches.values()))
        return result


@pytest.fixture
def topics(storage: Storage) -> Topics:
    t = Topics(storage)
    t.create(TOPIC, 4)
    return t


@pytest.fixture
def make_appender(storage: Storage) -> Iterator[Callable[..., Appender]]:
    made: list[Appender] = []

    def make(**options: object) -> Appender:
        appender = Appender(storage, **options)  # type: ignore[arg-type]
        made.append(appender)
        return appender

    yield make
    for appender in made:
        appender.close()


def payload(producer: int, call: int, index: int) -> bytes:
    return f"{producer}:{call}:{index}".encode()


def parse(p: bytes) -> tuple[int, int, int]:
    a, b, c = p.decode().split(":")
    return int(a), int(b), int(c)


def check_order_per_key_and_producer(streams: Mapping[StreamId, list[StoredMessage]]) -> None:
    """Within each stream, each producer's messages of one key keep submission order."""
    for messages in streams.values():
        last: dict[tuple[str | None, int], tuple[int, int]] = {}
        for m in messages:
            producer, call, index = parse(m.payload)
            ident = (m.key, producer)
            assert last.get(ident, (-1, -1)) < (call, index), (m.key, producer, call, index)
            last[ident] = (call, index)


# --------------------------------------------------------------------- group commit


def test_concurrent_producers_every_message_once_dense_and_ordered(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    counter = CountingAppends(storage)
    appender = make_appender()
    threads_n, calls, per_call = 8, 200, 5
    keys = ["a", "b", "c", "d", "e", "f"]
    stream_keys = {h.stream: h.key for h in storage.list_streams(TOPIC)}
    errors: list[BaseException] = []
    returned: list[list[Position]] = [[] for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n)

    def produce(producer: int) -> None:
        try:
            barrier.wait()
            for call in range(calls):
                messages = [
                    Message(payload(producer, call, i), key=keys[(call + i) % len(keys)])
                    for i in range(per_call)
                ]
                positions = appender.append(TOPIC, messages)
                returned[producer].extend(positions)
                # Committed before append returned: readable at once.
                stream, offset = positions[-1]
                [stored] = storage.read(stream_keys[stream], offset, 1)
                assert stored.payload == messages[-1].payload
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]

    streams = read_all(storage, TOPIC)
    check_dense(streams)
    payloads = [m.payload for ms in streams.values() for m in ms]
    expected = {
        payload(p, c, i) for p in range(threads_n) for c in range(calls) for i in range(per_call)
    }
    assert len(payloads) == len(expected) and set(payloads) == expected
    check_order_per_key_and_producer(streams)
    # Positions returned are where the messages are.
    by_position = {(s, m.offset): m.payload for s, ms in streams.items() for m in ms}
    for producer, positions in enumerate(returned):
        assert [by_position[p] for p in positions] == [
            payload(producer, c, i) for c in range(calls) for i in range(per_call)
        ]
    # Group commit happened: fewer transactions than calls.
    assert sum(counter.sizes) == len(expected)
    assert len(counter.sizes) < threads_n * calls


def test_max_batch_is_respected(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    counter = CountingAppends(storage)
    appender = make_appender(max_batch=10, linger=0.01)
    futures = [
        appender.submit(TOPIC, [Message(payload(0, c, i), key="k") for i in range(5)])
        for c in range(100)
    ]
    for f in futures:
        f.result(timeout=30)
    assert sum(counter.sizes) == 500
    assert max(counter.sizes) <= 10
    assert len(counter.sizes) >= 50
    check_order_per_key_and_producer(read_all(storage, TOPIC))


def test_linger_waits_for_more_messages(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    counter = CountingAppends(storage)
    linger = 1.0  # room for a busy machine between the two submits
    appender = make_appender(linger=linger)
    started = time.monotonic()
    first = appender.submit(TOPIC, [Message(b"1", key="k")])
    time.sleep(0.05)  # the scenario: the second comes a little later
    second = appender.submit(TOPIC, [Message(b"2", key="k")])
    first.result(timeout=30)
    second.result(timeout=30)
    elapsed = time.monotonic() - started
    assert counter.sizes == [2]  # one transaction for both
    assert linger - 0.05 <= elapsed < 30  # it lingered (the upper bound: no hang)


def test_a_full_batch_does_not_linger(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    appender = make_appender(max_batch=5, linger=30.0)
    started = time.monotonic()
    appender.append(TOPIC, [Message(b"x", key="k")] * 5, timeout=30)
    assert time.monotonic() - started < 15  # well before the linger of 30 s


def test_without_linger_a_lone_producer_commits_each_call(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    counter = CountingAppends(storage)
    appender = make_appender()
    for call in range(5):
        appender.append(TOPIC, [Message(payload(0, call, i)) for i in range(3)])
    assert counter.sizes == [3] * 5
    # Unkeyed messages are spread over the streams.
    assert sum(1 for ms in read_all(storage, TOPIC).values() if ms) > 1


def test_empty_submit_resolves_at_once(storage: Storage, make_appender: Callable[..., Appender]):
    assert make_appender().append(TOPIC, []) == []


def test_unknown_topic_fails_only_its_producer(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    counter = CountingAppends(storage)
    appender = make_appender(linger=0.2)
    good1 = appender.submit(TOPIC, [Message(b"1", key="k")])
    bad = appender.submit("nope", [Message(b"2", key="k")])
    good2 = appender.submit(TOPIC, [Message(b"3", key="k")])
    with pytest.raises(TopicNotFound):
        bad.result(timeout=10)
    (s1, o1), (s2, o2) = good1.result(timeout=10)[0], good2.result(timeout=10)[0]
    assert s1 == s2 and (o1, o2) == (0, 1)
    assert counter.sizes == [2]  # same batch, one transaction


def test_unknown_topic_in_a_batch_that_must_be_rerouted(
    storage_url: str, storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    """A batch with a failed producer that meets StreamSealed is routed again; the
    failed producer is not failed twice and the others still succeed."""
    other = open_storage(storage_url)
    try:
        Topics(other).add_storage_topic(TOPIC, 8)
        inner = storage.append
        calls: list[int] = []

        def switch_first(batches: Mapping[int, Sequence[Row]]) -> dict[int, int]:
            if not calls:
                Topics(other).switch_produce(TOPIC)  # another process switches
            calls.append(1)
            return inner(batches)

        storage.append = switch_first  # type: ignore[method-assign]
        appender = make_appender(linger=0.2)
        bad = appender.submit("nope", [Message(b"x", key="k")])
        good = appender.submit(TOPIC, [Message(b"y", key="k")])
        [(stream, offset)] = good.result(timeout=10)
        assert (stream.generation, offset) == (1, 0)
        with pytest.raises(TopicNotFound):
            bad.result(timeout=10)
        assert len(calls) == 2
    finally:
        other.close()


def test_cancelled_producer_does_not_break_its_batch(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    """A caller may cancel its future (asyncio cancels a wrapped future when its task
    is cancelled). Others in the same batch must still be told their messages are
    committed."""
    appender = make_appender(linger=0.2)
    cancelled = appender.submit(TOPIC, [Message(b"gone", key="k")])
    good = appender.submit(TOPIC, [Message(b"kept", key="k")])
    assert cancelled.cancel()
    [(stream, offset)] = good.result(timeout=10)
    streams = read_all(storage, TOPIC)
    assert [m.payload for ms in streams.values() for m in ms] == [b"kept"]
    assert streams[stream][offset].payload == b"kept"


def test_closed_appender_refuses_and_committed_work_is_flushed(
    storage: Storage, topics: Topics
) -> None:
    appender = Appender(storage, linger=0.5)
    future = appender.submit(TOPIC, [Message(b"x")])
    appender.close()  # commits what is queued before stopping
    assert future.result(timeout=0)[0][1] == 0
    with pytest.raises(Exception, match="closed"):
        appender.submit(TOPIC, [Message(b"y")])


@pytest.mark.parametrize("options", [{"max_batch": 0}, {"linger": -1.0}])
def test_appender_refuses_bad_options(storage: Storage, options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=str(next(iter(options.values())))):
        Appender(storage, **options)  # type: ignore[arg-type]


# --------------------------------------------------------------------- SwitchProduce


def test_switch_produce_from_another_process_loses_nothing(
    storage_url: str, storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    other = open_storage(storage_url)
    other_topics = Topics(other)
    appender = make_appender()
    stop = threading.Event()
    produced: list[bytes] = []
    errors: list[BaseException] = []

    def produce(producer: int) -> None:
        call = 0
        try:
            while not stop.is_set() or call < 50:
                messages = [Message(payload(producer, call, i), key=f"k{i}") for i in range(3)]
                appender.append(TOPIC, messages, timeout=30)
                produced.extend(m.payload for m in messages)
                call += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
    for thread in threads:
        thread.start()

    def more() -> None:
        """Wait until the producers got a few more appends in (while they run)."""
        mark = len(produced)

        def appended() -> bool:
            assert not errors, errors[0]
            return len(produced) >= mark + 9

        eventually(appended, what="more appends")

    sealed_heads: dict[int, int] = {}
    try:
        for partitions in (8, 12, 6):
            more()
            other_topics.add_storage_topic(TOPIC, partitions)
            more()
            other_topics.switch_produce(TOPIC)
            for head in other.list_streams(TOPIC):
                if head.sealed:
                    sealed_heads.setdefault(head.key, head.next_offset)
        more()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        other.close()
    assert not errors, errors[0]

    heads = storage.list_streams(TOPIC)
    # Nothing was written to a stream after it read as sealed.
    for head in heads:
        if head.key in sealed_heads:
            assert head.next_offset == sealed_heads[head.key], head.stream
    streams = read_all(storage, TOPIC)
    check_dense(streams)
    check_order_per_key_and_producer(streams)
    stored = [m.payload for ms in streams.values() for m in ms]
    assert sorted(stored) == sorted(produced) and len(set(stored)) == len(stored)
    # Each producer's messages of a key went through the generations in order.
    by_generation: dict[tuple[str | None, int], list[tuple[int, int, int]]] = defaultdict(list)
    for stream, messages in streams.items():
        for m in messages:
            producer, call, index = parse(m.payload)
            by_generation[m.key, producer].append((stream.generation, call, index))
    for ident, seen in by_generation.items():
        calls_in_generation_order = [(c, i) for _, c, i in sorted(seen)]
        assert calls_in_generation_order == sorted(calls_in_generation_order), ident
    generations_used = {s.generation for s, ms in streams.items() if ms}
    assert generations_used == {0, 1, 2, 3}


# --------------------------------------------------------------------- processes

PRODUCER = """
import sys
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage

url, producer, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
log = Log(open_storage(url))
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
for call in range(calls):
    log.produce("t", [
        Message(f"{producer}:{call}:{i}".encode(), key=f"k{(call + i) % 5}") for i in range(4)
    ])
log.close()
print("done", flush=True)
"""


def test_three_processes_produce_concurrently(storage_url: str, storage: Storage, topics: Topics):
    processes_n, calls = 3, 150
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", PRODUCER, storage_url, str(p), str(calls)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for p in range(processes_n)
        ]
        for proc in procs:  # runs before each Popen's own exit (which waits)
            stack.callback(lambda proc=proc: proc.poll() is None and proc.kill())
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # all start together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out.strip() == "done"

    streams = read_all(storage, TOPIC)
    check_dense(streams)
    stored = [m.payload for ms in streams.values() for m in ms]
    expected = {
        payload(p, c, i) for p in range(processes_n) for c in range(calls) for i in range(4)
    }
    assert len(stored) == len(expected) and set(stored) == expected
    check_order_per_key_and_producer(streams)


def test_try_append_now_commits_in_place_or_says_no(
    storage: Storage, storage_url: str, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    # Committed on the calling thread where the storage commits inline (SQLite)
    # and nothing else is committing; otherwise None and nothing written: the
    # caller submits instead (PostgreSQL always, SQLite behind another writer).
    appender = make_appender()
    messages = [Message(b"%d" % i, key="k") for i in range(3)]
    positions = appender.try_append_now(TOPIC, messages)
    if not storage.appends_inline:
        assert positions is None
        assert sum(len(v) for v in read_all(storage, TOPIC).values()) == 0
        return
    assert positions is not None
    stream, first = positions[0]
    assert list(positions) == [(stream, first + i) for i in range(3)]
    assert [m.payload for m in read_all(storage, TOPIC)[stream]] == [b"0", b"1", b"2"]

    # Another process holds SQLite's write lock: no waiting, nothing written.
    other = open_storage(storage_url)
    try:
        with other._write():  # type: ignore[attr-defined]  # BEGIN IMMEDIATE, held
            started = time.monotonic()
            assert appender.try_append_now(TOPIC, messages) is None
            assert time.monotonic() - started < 10  # no waiting (the busy timeout is 60 s)
    finally:
        other.close()
    assert sum(len(v) for v in read_all(storage, TOPIC).values()) == 3
    # And the lock free again, the next call commits in place after the first.
    again = appender.try_append_now(TOPIC, messages)
    assert again is not None and again[0] == (stream, first + 3)


def test_try_append_now_never_overtakes_a_queued_commit(
    storage: Storage, topics: Topics, make_appender: Callable[..., Appender]
) -> None:
    appender = make_appender()
    with appender._cond:  # a commit in progress (the writer thread's)
        appender._committing = True
    try:
        assert appender.try_append_now(TOPIC, [Message(b"x", key="k")]) is None
    finally:
        with appender._cond:
            appender._committing = False
    assert sum(len(v) for v in read_all(storage, TOPIC).values()) == 0
