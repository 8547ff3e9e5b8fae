"""Group reads for resuming sessions: many connections' records and cursors in
one read, as the session writer commits many connections' writes in one
transaction.

A session that resumes reads its record and its cursors
(`SessionStore.load_resuming`) before its CONNACK. On a database in another
process (PostgreSQL) that was two round trips from a worker thread per
session, and a fleet coming back at once kept the worker threads busy with the
same small statements (a thread's share of the storm was about 300 µs of CPU
per session). `ResumeReader.load_resuming` asks for one client's; while a read
runs, the clients that ask meanwhile wait and are read together by the next
one (`SessionStore.load_resuming_many`: two statements for all of them). One
client alone is read at once, as before.

On an embedded database (SQLite) the read is made where it is asked for, on
the event loop, as `Broker.read` makes every small read there: a few indexed
rows cost less than a hand-over to a thread.
"""

from __future__ import annotations

import asyncio

from riverbed.sessions.store import Resuming, SessionStore

MAX_BATCH = 500
"""Clients in one read at most."""


class ResumeReader:
    """Reads the records and cursors of resuming sessions for one event loop,
    many clients per read while reads queue up."""

    def __init__(self, store: SessionStore, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch!r} must be at least 1")
        self.store = store
        self.max_batch = max_batch
        self._waiting: dict[str, list[asyncio.Future[Resuming]]] = {}
        self._reading: asyncio.Task[None] | None = None
        self.reads = 0
        """Reads made so far in a thread (for tests and benchmarks)."""

    async def load_resuming(self, client_id: str) -> Resuming:
        """`SessionStore.load_resuming(client_id)`, read with whoever else asks
        while the read before runs. Raises what the read raised."""
        if self.store.storage.appends_inline:
            return self.store.load_resuming(client_id)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Resuming] = loop.create_future()
        self._waiting.setdefault(client_id, []).append(answer)
        if self._reading is None:
            self._reading = loop.create_task(self._read(), name="riverbed-resume-reader")
        return await answer

    async def _read(self) -> None:
        batch: dict[str, list[asyncio.Future[Resuming]]] = {}
        try:
            while self._waiting:
                batch = dict(list(self._waiting.items())[: self.max_batch])
                for client_id in batch:
                    del self._waiting[client_id]
                try:
                    found = await asyncio.to_thread(self.store.load_resuming_many, list(batch))
                except Exception as exc:  # the storage's: each waiter gets it
                    for answers in batch.values():
                        for answer in answers:
                            if not answer.done():
                                answer.set_exception(exc)
                    continue
                finally:
                    self.reads += 1
                for client_id, answers in batch.items():
                    for answer in answers:
                        if not answer.done():  # else its connection stopped waiting
                            answer.set_result(found[client_id])
        finally:
            # Cancelled (the loop is closing): nobody waits for ever.
            self._reading = None
            for answers in [*batch.values(), *self._waiting.values()]:
                for answer in answers:
                    if not answer.done():
                        answer.cancel()
            self._waiting.clear()
