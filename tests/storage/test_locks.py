"""Partition locks (seed 004, "Locks"): the lease table with fencing as a
hypothesis state machine against a model, dead-owner reaping and heartbeats,
and PostgreSQL advisory locks on one connection per worker."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.clock import FakeClock
from harness.postgres import count_connections, terminate_connections
from harness.waiting import eventually
from riverbed.errors import InvalidInput
from riverbed.storage import Storage, open_storage
from riverbed.storage.locks import (
    AdvisoryLocks,
    LeaseLocks,
    PartitionLock,
    XactAdvisoryLocks,
    default_locks,
    new_owner,
    process_dead,
    session_locks,
)
from riverbed.storage.transactions import transaction

TTL_US = 1_000_000
OWNERS = ("a", "b", "c")
STREAMS = (1, 2)


class LeaseMachine(RuleBasedStateMachine):
    """Three owners, two streams, a fake clock. The model says who holds each
    lock, until when, and its fence; the table must agree, and a fenced check
    (the position commit) must pass only for the owner nobody overtook."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.storage = open_storage(f"sqlite:///{self.dir.name}/locks.db")
        self.clock = FakeClock(us=1_000_000_000)
        self.locks = {
            o: LeaseLocks(
                self.storage,
                owner=o,
                ttl=TTL_US / 1e6,
                clock=self.clock.us,
                heartbeat=False,
                reap_dead=False,
            )
            for o in OWNERS
        }
        self.model: dict[int, tuple[str, int, int]] = {}
        """stream -> (owner, expires µs, fence)"""
        self.got: dict[tuple[str, int], PartitionLock] = {}
        """The last lock object each owner got per stream (maybe stale by now)."""

    def teardown(self) -> None:
        self.storage.close()
        self.dir.cleanup()

    @rule(owner=st.sampled_from(OWNERS), stream=st.sampled_from(STREAMS))
    def try_lock(self, owner: str, stream: int) -> None:
        current = self.model.get(stream)
        free = current is None or current[1] <= self.clock.us()
        lock = self.locks[owner].try_lock("s", stream)
        if not free:
            assert lock is None
            return
        assert lock is not None
        fence = 1 if current is None else current[2] + 1
        assert lock.fence == fence and lock.owner == owner
        self.model[stream] = (owner, self.clock.us() + TTL_US, fence)
        self.got[(owner, stream)] = lock

    @rule(owner=st.sampled_from(OWNERS), stream=st.sampled_from(STREAMS))
    def unlock(self, owner: str, stream: int) -> None:
        lock = self.got.get((owner, stream))
        if lock is None:
            return
        self.locks[owner].unlock(lock)
        current = self.model.get(stream)
        if current is not None and current[0] == owner and current[2] == lock.fence:
            self.model[stream] = (owner, 0, lock.fence)

    @rule(owner=st.sampled_from(OWNERS), stream=st.sampled_from(STREAMS))
    def commit_position(self, owner: str, stream: int) -> None:
        lock = self.got.get((owner, stream))
        if lock is None:
            return
        with transaction(self.storage) as tx:
            held = self.locks[owner].still_held(lock, tx)
        current = self.model[stream]
        # Fencing: ours exactly when nobody took it since, expired or not.
        expected = current[0] == owner and current[2] == lock.fence
        assert held == expected
        if held:
            self.model[stream] = (owner, self.clock.us() + TTL_US, lock.fence)

    @precondition(lambda self: bool(self.model))
    @rule(owner=st.sampled_from(OWNERS), stream=st.sampled_from(STREAMS))
    def renew(self, owner: str, stream: int) -> None:
        lock = self.got.get((owner, stream))
        if lock is None:
            return
        renewed = self.locks[owner].renew(lock)
        current = self.model[stream]
        assert renewed == (current[0] == owner and current[2] == lock.fence)
        if renewed:
            self.model[stream] = (owner, self.clock.us() + TTL_US, lock.fence)

    @rule(micros=st.integers(0, 2 * TTL_US))
    def advance_clock(self, micros: int) -> None:
        self.clock.advance(us=micros)

    @invariant()
    def table_matches_model(self) -> None:
        for stream in STREAMS:
            row = self.locks["a"].holder("s", stream)
            current = self.model.get(stream)
            assert (row is None) == (current is None)
            if row is not None and current is not None:
                assert row == current

    @invariant()
    def at_most_one_live_holder(self) -> None:
        for stream in STREAMS:
            live = [
                o
                for o in OWNERS
                if (lock := self.got.get((o, stream))) is not None
                and (current := self.model.get(stream)) is not None
                and current[0] == o
                and current[2] == lock.fence
                and current[1] > self.clock.us()
            ]
            assert len(live) <= 1


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# --------------------------------------------------------------------- leases


def test_a_dead_processes_lease_is_taken_at_once(sqlite_url: str) -> None:
    storage = open_storage(sqlite_url)
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; from riverbed.storage import open_storage;"
         "from riverbed.storage.locks import LeaseLocks;"
         "s = open_storage(sys.argv[1]);"
         "assert LeaseLocks(s, ttl=3600, heartbeat=False).try_lock('s', 1) is not None",
         sqlite_url],
        timeout=60,
    )  # fmt: skip
    assert child.returncode == 0
    patient = LeaseLocks(storage, ttl=60, reap_dead=False, heartbeat=False)
    assert patient.try_lock("s", 1) is None  # unexpired for an hour
    reaper = LeaseLocks(storage, ttl=60, heartbeat=False)
    lock = reaper.try_lock("s", 1)
    assert lock is not None and lock.fence == 2
    reaper.close()
    patient.close()
    storage.close()


def test_process_dead_knows_only_this_machine() -> None:
    assert not process_dead(new_owner())  # ourselves
    assert not process_dead(f"{os.uname().nodename}-elsewhere/1/x")
    assert not process_dead("not-an-owner")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = new_owner().split("/")[0]
    assert process_dead(f"{host}/{child.pid}/x")


def test_heartbeat_keeps_a_lease_alive(sqlite_url: str) -> None:
    storage = open_storage(sqlite_url)
    locks = LeaseLocks(storage, ttl=2.0)  # renewed every 2/3 s
    lock = locks.try_lock("s", 1)
    assert lock is not None
    time.sleep(3.0)  # the scenario: past the first lease (only heartbeats keep it)
    other = LeaseLocks(storage, ttl=2.0, heartbeat=False)
    assert other.try_lock("s", 1) is None
    locks.close()  # releases
    assert other.try_lock("s", 1) is not None
    other.close()
    storage.close()


def test_lease_locks_work_on_postgres_too(postgres_url: str) -> None:
    storage = open_storage(postgres_url)
    first = LeaseLocks(storage, heartbeat=False)
    second = LeaseLocks(storage, heartbeat=False)
    lock = first.try_lock("s", 7)
    assert lock is not None and second.try_lock("s", 7) is None
    first.unlock(lock)
    taken = second.try_lock("s", 7)
    assert taken is not None and taken.fence == lock.fence + 1
    with transaction(storage) as tx:
        assert not first.still_held(lock, tx)
        assert second.still_held(taken, tx)
    first.close()
    second.close()
    storage.close()


# --------------------------------------------------------------------- advisory


@pytest.fixture
def pg(postgres_url: str) -> Storage:
    storage = open_storage(postgres_url)
    yield storage  # type: ignore[misc]
    storage.close()


def test_default_and_session_locks_by_backend(pg: Storage, sqlite_url: str) -> None:
    assert isinstance(default_locks(pg), XactAdvisoryLocks)
    assert isinstance(session_locks(pg), AdvisoryLocks)
    sqlite = open_storage(sqlite_url)
    assert isinstance(default_locks(sqlite), LeaseLocks)
    assert isinstance(session_locks(sqlite), LeaseLocks)
    with pytest.raises(InvalidInput, match="need PostgreSQL"):
        XactAdvisoryLocks(sqlite)
    sqlite.close()


def test_transaction_advisory_locks_last_as_long_as_their_transaction(pg: Storage) -> None:
    locks = XactAdvisoryLocks(pg)
    session = AdvisoryLocks(pg)
    answers: list[bool] = []

    def elsewhere() -> None:  # another thread: another connection, another transaction
        with transaction(pg) as other:
            answers.append(locks.try_lock_in(other, "s", 1))
        answers.append(session.try_lock("s", 1) is None)

    with transaction(pg) as tx:
        assert locks.try_lock_in(tx, "s", 1)
        assert locks.try_lock_in(tx, "s", 2)
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert answers == [False, True]  # excluded, by the session kind too
    with transaction(pg) as tx:  # COMMIT released them
        assert locks.try_lock_in(tx, "s", 1)
    session.close()


def test_advisory_locks_exclude_and_share_one_connection(pg: Storage, postgres_url: str) -> None:
    first, second = AdvisoryLocks(pg), AdvisoryLocks(pg)
    before = count_connections(postgres_url)
    held = [first.try_lock("s", k) for k in range(1, 21)]
    assert all(h is not None for h in held)
    assert count_connections(postgres_url) == before + 1  # one for twenty locks
    assert second.try_lock("s", 5) is None
    assert second.try_lock("other", 5) is not None  # another subscription's lock
    assert first.try_lock("s", 5) is None  # not reentrant
    lock = held[4]
    assert lock is not None
    with transaction(pg) as tx:
        assert first.still_held(lock, tx)
    first.unlock(lock)
    with transaction(pg) as tx:
        assert not first.still_held(lock, tx)
    assert second.try_lock("s", 5) is not None
    first.close()
    second.close()


def test_advisory_locks_vanish_with_their_connection(pg: Storage, postgres_url: str) -> None:
    first, second = AdvisoryLocks(pg), AdvisoryLocks(pg)
    lock = first.try_lock("s", 1)
    assert lock is not None and second.try_lock("s", 1) is None
    with transaction(pg) as tx:
        pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert pid != lock.fence
    terminate_connections(postgres_url)  # the lock connection among them
    # Released once the terminated backend has exited.
    taken = eventually(lambda: second.try_lock("s", 1), what="the lock free again")
    with transaction(pg) as tx:
        assert not first.still_held(lock, tx)  # fenced by the backend pid
        assert second.still_held(taken, tx)
    assert first.try_lock("s", 2) is not None  # reconnects
    first.close()
    second.close()


def test_transaction_rewrites_placeholders_and_rolls_back_on_error(
    storage: Storage, tmp_path: Path
) -> None:
    with transaction(storage) as tx:
        tx.execute("CREATE TABLE notes (n INTEGER)")
        tx.execute("INSERT INTO notes (n) VALUES (?)", (1,))
    with pytest.raises(RuntimeError), transaction(storage) as tx:
        tx.execute("INSERT INTO notes (n) VALUES (?)", (2,))
        raise RuntimeError("undo")
    with transaction(storage) as tx:
        assert tx.execute("SELECT n FROM notes").fetchall() == [(1,)]
        assert tx.backend in ("sqlite", "postgresql")
        kept = tx
    with pytest.raises(Exception, match="transaction has ended"):
        kept.execute("SELECT 1")
