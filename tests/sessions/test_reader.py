"""The resume reader on both backends: clients that ask while a read runs are
read together by the next one, each answered with what it alone would read."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from harness.storage import create_topic, numbered_rows
from riverbed.errors import StorageUnavailable
from riverbed.sessions.reader import ResumeReader
from riverbed.sessions.store import Resuming, SessionRecord, SessionStore
from riverbed.storage import Storage, open_storage

TIMEOUT = 30.0


def _stored_sessions(storage: Storage, count: int) -> SessionStore:
    (stream,) = create_topic(storage, "t", partitions=1)
    storage.append({stream.key: numbered_rows(count)})
    store = SessionStore(storage)
    for i in range(count):
        store.ensure_cursors(f"s{i}", ["t"], None, {stream.key: i})
        store.write(SessionRecord(f"c{i}", f"s{i}", 5, 60, False, 1, topics=("t",)), None)
    return store


class HeldReads:
    """A store whose `load_resuming_many` waits until released, recording the
    clients of each call (so that callers can queue up behind a running read)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.storage = store.storage
        self.calls: list[list[str]] = []
        self.running = threading.Event()
        self.release = threading.Event()
        self.fail: Exception | None = None

    def load_resuming(self, client_id: str) -> Resuming:
        return self.store.load_resuming(client_id)

    def load_resuming_many(self, client_ids: Sequence[str]) -> dict[str, Resuming]:
        self.calls.append(list(client_ids))
        self.running.set()
        self.release.wait(TIMEOUT)
        if self.fail is not None:
            raise self.fail
        return self.store.load_resuming_many(client_ids)


def test_clients_that_ask_during_a_read_share_the_next(storage: Storage) -> None:
    store = _stored_sessions(storage, 30)
    held = HeldReads(store)
    reader = ResumeReader(held, max_batch=20)  # type: ignore[arg-type]

    async def storm() -> list[Resuming]:
        first = asyncio.ensure_future(reader.load_resuming("c0"))
        if not storage.appends_inline:
            await asyncio.to_thread(held.running.wait, TIMEOUT)
        rest = [asyncio.ensure_future(reader.load_resuming(f"c{i}")) for i in range(1, 30)]
        late = asyncio.ensure_future(reader.load_resuming("nobody"))
        await asyncio.sleep(0)  # all of them queued behind the running read
        held.release.set()
        return await asyncio.wait_for(asyncio.gather(first, *rest, late), TIMEOUT)

    answers = asyncio.run(storm())
    expected = [store.load_resuming(f"c{i}") for i in range(30)] + [(None, {})]
    if storage.appends_inline:
        assert held.calls == [] and reader.reads == 0  # SQLite: read on the loop, one each
    else:
        # The first alone, then the 30 that queued behind it in parts of 20 at most.
        assert [len(c) for c in held.calls] == [1, 20, 10] and reader.reads == 3
        assert held.calls[1][0] == "c1" and held.calls[2][-1] == "nobody"
    assert answers == expected
    (stream,) = storage.list_streams("t")
    assert answers[3][1] == {"t": {stream.key: 3}}


@pytest.fixture
def pg_storage(postgres_url: str) -> Iterator[Storage]:
    """PostgreSQL alone: on SQLite each client is read on the loop by itself."""
    opened = open_storage(postgres_url)
    yield opened
    opened.close()


def test_a_failed_read_fails_its_clients_and_the_next_read_goes_on(pg_storage: Storage) -> None:
    storage = pg_storage
    store = _stored_sessions(storage, 3)
    held = HeldReads(store)
    reader = ResumeReader(held)  # type: ignore[arg-type]

    async def scenario() -> tuple[list[Any], Resuming]:
        held.fail = StorageUnavailable("the database went away")
        failing = [asyncio.ensure_future(reader.load_resuming(f"c{i}")) for i in range(2)]
        await asyncio.to_thread(held.running.wait, TIMEOUT)
        held.release.set()
        outcomes = await asyncio.gather(*failing, return_exceptions=True)
        held.fail = None
        return outcomes, await asyncio.wait_for(reader.load_resuming("c2"), TIMEOUT)

    outcomes, after = asyncio.run(scenario())
    assert [type(o) for o in outcomes] == [StorageUnavailable, StorageUnavailable]
    assert "went away" in str(outcomes[0])
    assert after == store.load_resuming("c2")


def test_a_client_that_stops_waiting_leaves_the_others_answered(pg_storage: Storage) -> None:
    storage = pg_storage
    store = _stored_sessions(storage, 3)
    held = HeldReads(store)
    reader = ResumeReader(held)  # type: ignore[arg-type]

    async def scenario() -> list[Resuming]:
        waiting = [asyncio.ensure_future(reader.load_resuming(f"c{i}")) for i in range(3)]
        await asyncio.to_thread(held.running.wait, TIMEOUT)
        waiting[1].cancel()  # its connection closed while the read ran
        held.release.set()
        done = await asyncio.gather(*waiting, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        return [done[0], done[2]]  # type: ignore[list-item]

    assert asyncio.run(scenario()) == [store.load_resuming("c0"), store.load_resuming("c2")]


def test_a_batch_size_below_one_is_refused(storage: Storage) -> None:
    with pytest.raises(ValueError, match="max_batch 0 must be at least 1"):
        ResumeReader(SessionStore(storage), max_batch=0)
