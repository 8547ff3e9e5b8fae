"""Competing consumers in one process (seed 004): worker threads, on both backends.

An observer (every handler call records its stream, worker and enter/exit times)
checks what the runner promises instead of assuming it: every message handled,
no stream handled by two workers at once, offsets in order per stream. Then the
error policies, exactly-once rollback, lineage order across a scale-up, filters,
and bad input.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from harness.clock import moment_between
from harness.waiting import eventually
from riverbed.errors import HandlerFailed, InvalidInput, RiverbedError, SubscriptionNotFound
from riverbed.log.log import Log
from riverbed.log.partitioning import key_hash, route
from riverbed.model import Message
from riverbed.storage import Storage
from riverbed.storage.locks import LeaseLocks, session_locks
from riverbed.storage.transactions import transaction
from riverbed.subscriptions import Subscriptions
from riverbed.subscriptions.handling import (
    Batch,
    ErrorPolicy,
    Failure,
    Guarantee,
    OnError,
    load_handler,
)
from riverbed.subscriptions.running import WorkerOptions
from riverbed.subscriptions.workers import Worker


@pytest.fixture
def log(storage: Storage) -> Iterator[Log]:
    opened = Log(storage)
    try:
        yield opened
    finally:
        opened.appender.close()


def publish(log: Log, topic: str, count: int, keys: int, first: int = 0) -> None:
    log.produce(
        topic,
        [Message(b"%d" % i, key=f"k{i % keys}") for i in range(first, first + count)],
    )


@dataclass
class Observer:
    """What every handler call saw, and when."""

    calls: list[tuple[str, str, int, int, list[int], list[bytes]]] = field(default_factory=list)
    """(stream, worker, enter ns, exit ns, offsets, payloads)"""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self, worker: str, pause: float = 0.0) -> Callable[[Batch], None]:
        def handle(batch: Batch) -> None:
            enter = time.monotonic_ns()
            if pause:
                time.sleep(pause)  # the scenario: a handler's work takes time
            offsets = [m.offset for m in batch.messages]
            payloads = [m.payload for m in batch.messages]
            with self.lock:
                self.calls.append(
                    (str(batch.stream), worker, enter, time.monotonic_ns(), offsets, payloads)
                )

        return handle

    def payloads(self) -> list[bytes]:
        with self.lock:
            return [p for call in self.calls for p in call[5]]

    def check_no_overlap_and_order(self) -> None:
        by_stream: dict[str, list[tuple[str, str, int, int, list[int], list[bytes]]]] = {}
        for call in self.calls:
            by_stream.setdefault(call[0], []).append(call)
        for stream, calls in by_stream.items():
            calls.sort(key=lambda c: c[2])
            for before, after in itertools.pairwise(calls):
                assert after[2] >= before[3], f"{stream}: {before[1]} and {after[1]} overlap"
            offsets = [o for c in calls for o in c[4]]
            assert offsets == sorted(offsets), f"{stream} out of order"


def run_workers(workers: list[Worker], done: Callable[[], bool], timeout: float = 60) -> None:
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    try:
        eventually(done, timeout, "the workers to finish")
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(timeout=30)


# --------------------------------------------------------------------- competing threads


@pytest.mark.parametrize("locks", ["default", "session"])
def test_worker_threads_share_streams_each_message_once_in_order(
    storage: Storage, log: Log, locks: str
) -> None:
    log.topics.create("t", 8)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 2000, keys=40)
    observer = Observer()
    workers = [
        Worker(
            storage,
            "s",
            observer.handler(f"w{i}", 0.001),
            batch_size=25,
            poll_interval=0.1,
            locks=session_locks(storage) if locks == "session" else None,
        )
        for i in range(4)
    ]
    run_workers(workers, lambda: len(observer.payloads()) >= 2000)
    for w in workers:
        w.locks.close()

    payloads = observer.payloads()
    assert sorted(payloads) == sorted(b"%d" % i for i in range(2000))  # no loss, no duplicate
    observer.check_no_overlap_and_order()
    # Per key, publish order.
    by_key: dict[int, list[int]] = {}
    for p in payloads:
        by_key.setdefault(int(p) % 40, []).append(int(p))
    assert all(v == sorted(v) for v in by_key.values())
    assert sum(1 for w in workers if w.stats.batches) >= 2, "the work was not shared"
    assert sum(w.stats.messages for w in workers) == 2000
    # Positions recorded: nothing left.
    assert all(s.lag == 0 for s in Subscriptions(storage).lag("s"))


def test_worker_wakes_up_on_new_messages(storage: Storage, log: Log) -> None:
    log.topics.create("t", 2)
    Subscriptions(storage).create("s", "t")
    observer = Observer()
    worker = Worker(storage, "s", observer.handler("w"), poll_interval=30)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # Idle, waiting for a wake-up (else its first pass would find them).
        eventually(lambda: storage.wakeups._waiting, what="the worker to wait")
        started = time.monotonic()
        publish(log, "t", 10, keys=3)
        # Woken, not polled: well before poll_interval (30 s).
        eventually(lambda: len(observer.payloads()) >= 10, 20, "10 messages", interval=0.005)
        assert time.monotonic() - started < 20
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_partitions_ordered_by_oldest_unprocessed_message(storage: Storage, log: Log) -> None:
    log.topics.create("t", 4)
    Subscriptions(storage).create("s", "t")
    keys: dict[int, str] = {}
    for i in range(1000):
        keys.setdefault(route(key_hash(f"key{i}"), 4, 1), f"key{i}")
    order = [3, 1, 0, 2]
    for partition in order:  # one message each, the oldest in partition 3
        log.produce("t", [Message(b"x", key=keys[partition])])
        moment_between()  # the scenario: distinct timestamps
    seen: list[int] = []
    worker = Worker(storage, "s", lambda b: seen.append(b.stream.partition), batch_size=1)
    assert worker.run_once() == 4
    worker.close()
    assert seen == order


def test_lineage_order_across_a_scale_up(storage: Storage, log: Log) -> None:
    log.topics.create("t", 2)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 300, keys=20)
    log.topics.add_storage_topic("t", 4)
    log.topics.switch_produce("t")
    publish(log, "t", 300, keys=20, first=300)
    observer = Observer()
    workers = [
        Worker(storage, "s", observer.handler(f"w{i}"), batch_size=7, poll_interval=0.1)
        for i in range(3)
    ]
    run_workers(workers, lambda: len(observer.payloads()) >= 600)
    payloads = [int(p) for p in observer.payloads()]
    assert sorted(payloads) == list(range(600))
    by_key: dict[int, list[int]] = {}
    for p in payloads:
        by_key.setdefault(p % 20, []).append(p)
    assert all(v == sorted(v) for v in by_key.values()), "a key overtook itself"


def test_filter_skips_unmatched_messages_and_records_past_them(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t", topic_filter="a/#")
    log.produce(
        "t", [Message(b"%d" % i, key="k", mqtt_topic="a/x" if i % 2 else "b/x") for i in range(10)]
    )
    got: list[bytes] = []
    worker = Worker(storage, "s", lambda b: got.extend(m.payload for m in b.messages))
    assert worker.run_once() == 10
    worker.close()
    assert got == [b"1", b"3", b"5", b"7", b"9"]
    assert all(s.lag == 0 for s in Subscriptions(storage).lag("s"))


def test_a_held_lock_keeps_other_workers_off_the_stream(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 5, keys=1)
    blocker = session_locks(storage)  # on PostgreSQL, the same keys as the default's
    head = storage.list_streams("t")[0]
    lock = blocker.try_lock("s", head.key)
    assert lock is not None
    other = Worker(storage, "s", lambda b: pytest.fail("handled a locked stream"))
    assert other.run_once() == 0
    blocker.unlock(lock)
    got: list[int] = []
    third = Worker(storage, "s", lambda b: got.extend(m.offset for m in b.messages))
    assert third.run_once() == 5
    assert got == [0, 1, 2, 3, 4]
    for w in (other, third):
        w.close()
    blocker.close()


# --------------------------------------------------------------------- exactly once


def make_effects(storage: Storage) -> None:
    with transaction(storage) as tx:
        tx.execute("CREATE TABLE effects (stream INTEGER, off INTEGER, payload TEXT)")


def effects(storage: Storage) -> list[tuple[int, int]]:
    with transaction(storage) as tx:
        rows = tx.execute("SELECT stream, off FROM effects ORDER BY stream, off").fetchall()
    return [(int(s), int(o)) for s, o in rows]


def test_exactly_once_handler_writes_commit_with_the_position(storage: Storage, log: Log) -> None:
    log.topics.create("t", 2)
    Subscriptions(storage).create("s", "t")
    make_effects(storage)
    publish(log, "t", 40, keys=5)
    keys = {h.stream: h.key for h in storage.list_streams("t")}
    failed_once: set[tuple[str, int]] = set()

    def handle(batch: Batch) -> None:
        for m in batch.messages:
            batch.tx.execute(
                "INSERT INTO effects (stream, off, payload) VALUES (?, ?, ?)",
                (keys[batch.stream], m.offset, m.payload.decode()),
            )
        if (str(batch.stream), batch.start) not in failed_once:  # fail after writing:
            failed_once.add((str(batch.stream), batch.start))  # the writes must vanish
            raise RuntimeError("boom")

    worker = Worker(
        storage,
        "s",
        handle,
        batch_size=8,
        guarantee=Guarantee.EXACTLY_ONCE,
        on_error=ErrorPolicy(OnError.RETRY, backoff=0),
    )
    while worker.run_once():
        pass
    worker.close()
    rows = effects(storage)
    assert len(rows) == 40 and len(set(rows)) == 40
    assert worker.stats.failures == worker.stats.batches


def test_batch_tx_is_refused_at_least_once(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 1, keys=1)
    errors: list[Exception] = []

    def handle(batch: Batch) -> None:
        try:
            batch.tx  # noqa: B018
        except RiverbedError as exc:
            errors.append(exc)

    worker = Worker(storage, "s", handle)
    worker.run_once()
    worker.close()
    assert len(errors) == 1 and "EXACTLY_ONCE" in str(errors[0])


# --------------------------------------------------------------------- handler errors


def failing(times: int) -> tuple[Callable[[Batch], None], list[int]]:
    calls: list[int] = []

    def handle(batch: Batch) -> None:
        calls.append(batch.attempt)
        if len(calls) <= times:
            raise ValueError(f"failure {len(calls)}")

    return handle, calls


@pytest.fixture
def one_message(storage: Storage, log: Log) -> Storage:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 3, keys=1)
    return storage


def test_on_error_stop_raises_and_keeps_the_position(one_message: Storage) -> None:
    handle, _ = failing(1)
    worker = Worker(one_message, "s", handle)
    with pytest.raises(HandlerFailed, match="failure 1") as raised:
        worker.run()
    assert raised.value.failure is not None and raised.value.failure.action is OnError.STOP
    assert Subscriptions(one_message).lag("s")[0].committed == 0


def test_on_error_retry_backs_off_then_succeeds(one_message: Storage) -> None:
    handle, calls = failing(2)
    worker = Worker(one_message, "s", handle, on_error=ErrorPolicy(OnError.RETRY, backoff=0.01))
    started = time.monotonic()
    assert worker.run_once() == 3
    assert calls == [1, 2, 3]
    assert time.monotonic() - started >= 0.03  # 0.01 + 0.02
    worker.close()


@pytest.mark.parametrize("guarantee", list(Guarantee))
def test_retry_gives_up_skips_and_calls_the_failure_hook_in_the_skip_transaction(
    one_message: Storage, guarantee: Guarantee
) -> None:
    make_effects(one_message)
    handle, calls = failing(100)
    failures: list[Failure] = []

    def hook(failure: Failure) -> None:
        failures.append(failure)
        for m in failure.batch.messages:
            failure.tx.execute(
                "INSERT INTO effects (stream, off, payload) VALUES (0, ?, 'dlq')", (m.offset,)
            )

    policy = ErrorPolicy(
        OnError.RETRY, max_attempts=3, backoff=0, give_up=OnError.SKIP, on_failure=hook
    )
    worker = Worker(one_message, "s", handle, guarantee=guarantee, on_error=policy)
    assert worker.run_once() == 3
    worker.close()
    assert calls == [1, 2, 3]
    (failure,) = failures
    assert failure.attempts == 3 and failure.action is OnError.SKIP
    assert isinstance(failure.error, ValueError)
    assert [m.offset for m in failure.batch.messages] == [0, 1, 2]
    assert effects(one_message) == [(0, 0), (0, 1), (0, 2)]
    assert Subscriptions(one_message).lag("s")[0].committed == 3
    assert worker.stats.skipped == 1


def test_a_failure_hook_that_raises_stops_without_moving(one_message: Storage) -> None:
    handle, _ = failing(100)

    def hook(failure: Failure) -> None:
        raise OSError("queue down")

    worker = Worker(one_message, "s", handle, on_error=ErrorPolicy(OnError.SKIP, on_failure=hook))
    with pytest.raises(HandlerFailed, match="queue down"):
        worker.run_once()
    worker.close()
    assert Subscriptions(one_message).lag("s")[0].committed == 0


def test_stop_during_a_retry_backoff_abandons_the_batch_unrecorded(one_message: Storage) -> None:
    handle, calls = failing(100)
    worker = Worker(one_message, "s", handle, on_error=ErrorPolicy(OnError.RETRY, backoff=60))
    thread = threading.Thread(target=worker.run)
    thread.start()
    eventually(lambda: calls, what="the first handler call", interval=0.005)
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert Subscriptions(one_message).lag("s")[0].committed == 0
    assert worker.stats.abandoned == 1


def test_a_lost_lease_abandons_the_batch(
    storage: Storage, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 3, keys=1)
    locks = LeaseLocks(storage, ttl=60, heartbeat=False)
    thief = LeaseLocks(storage, ttl=60, heartbeat=False)
    key = storage.list_streams("t")[0].key

    def handle(batch: Batch) -> None:
        # Someone takes the stream meanwhile (as after an expiry): our fence is gone.
        storage_lock = locks.holder("s", key)
        assert storage_lock is not None
        with transaction(storage) as tx:
            tx.execute("UPDATE partition_locks SET expires_us = 0")
        assert thief.try_lock("s", key) is not None

    worker = Worker(storage, "s", handle, locks=locks)
    with caplog.at_level(logging.WARNING, "riverbed.subscriptions.workers"):
        assert worker.run_once() == 0
    assert worker.stats.abandoned == 1
    assert Subscriptions(storage).lag("s")[0].committed == 0
    # A worker logs warnings only: the repeat that follows is explained there.
    assert any("lost its lock of stream" in r.getMessage() for r in caplog.records)
    thief.close()
    locks.close()


# --------------------------------------------------------------------- bad input


def test_bad_input_is_refused_naming_value_and_rule(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    with pytest.raises(SubscriptionNotFound, match="'nope'"):
        Worker(storage, "nope", lambda b: None)
    for size in (0, -1, 1.5, True):
        with pytest.raises(InvalidInput, match=rf"batch size {size!r} must be an integer >= 1"):
            Worker(storage, "s", lambda b: None, batch_size=size)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="poll interval 0"):
        Worker(storage, "s", lambda b: None, poll_interval=0)
    with pytest.raises(InvalidInput, match="is not callable"):
        Worker(storage, "s", "print")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="max attempts 0"):
        ErrorPolicy(OnError.RETRY, max_attempts=0)
    with pytest.raises(InvalidInput, match="give-up action"):
        ErrorPolicy(OnError.RETRY, give_up=OnError.RETRY)
    with pytest.raises(InvalidInput, match="backoff -1"):
        ErrorPolicy(backoff=-1)
    with pytest.raises(InvalidInput, match="lease time-to-live 0"):
        LeaseLocks(storage, ttl=0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("json", "is not MODULE:FUNCTION"),
        (":dumps", "is not MODULE:FUNCTION"),
        ("json:", "is not MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
        ("json:nope", "module 'json' has no attribute 'nope'"),
        ("json:__name__", "is a str, not a callable"),
    ],
)
def test_load_handler_refuses_bad_names(spec: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as raised:
        load_handler(spec)
    assert repr(spec) in str(raised.value)


def test_load_handler_finds_dotted_attributes() -> None:
    import json

    assert load_handler("json:dumps") is json.dumps
    assert load_handler("json:JSONDecoder.decode") is json.JSONDecoder.decode


def test_subscriptions_worker_is_a_shortcut(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    subscriptions = Subscriptions(storage)
    subscriptions.create("s", "t")
    publish(log, "t", 3, keys=1)
    got: list[bytes] = []
    worker = subscriptions.worker(
        "s", lambda b: got.extend(m.payload for m in b.messages), batch_size=2
    )
    assert worker.batch_size == 2
    while worker.run_once():
        pass
    worker.close()
    assert got == [b"0", b"1", b"2"]


def test_stop_lets_the_batch_in_hand_finish_and_record(storage: Storage, log: Log) -> None:
    log.topics.create("t", 1)
    Subscriptions(storage).create("s", "t")
    publish(log, "t", 10, keys=1)
    entered = threading.Event()
    stopping = threading.Event()
    handled: list[int] = []

    def slow(batch: Batch) -> None:
        entered.set()
        assert stopping.wait(30)  # the batch in hand lasts until the stop is asked
        handled.extend(m.offset for m in batch.messages)

    worker = Worker(storage, "s", slow, batch_size=4)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert entered.wait(30)
    worker.stop()  # mid-batch
    stopping.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert handled == [0, 1, 2, 3]  # finished, and no further batch begun
    assert Subscriptions(storage).lag("s")[0].committed == 4


def test_worker_options_of_the_command_make_the_policy() -> None:
    retry = WorkerOptions(on_error=OnError.RETRY, max_attempts=3).policy()
    assert retry == ErrorPolicy(OnError.RETRY, max_attempts=3, give_up=OnError.STOP)
    assert WorkerOptions(on_error=OnError.SKIP).policy().final_action() is OnError.SKIP
    assert WorkerOptions().policy().final_action() is OnError.STOP
    assert ErrorPolicy(backoff=0.1, max_backoff=0.3).delay(1) == 0.1
    assert ErrorPolicy(backoff=0.1, max_backoff=0.3).delay(5) == 0.3
