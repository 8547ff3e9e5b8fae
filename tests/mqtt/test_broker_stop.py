"""How a broker stops (`mqtt.broker.serve`): in process, with the test's own
event loop."""

from __future__ import annotations

import asyncio
import threading
import time

from harness.waiting import eventually_async
from riverbed.log.log import Log
from riverbed.mqtt.broker import serve
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners


def test_serve_returns_only_once_storage_work_in_threads_has_ended(sqlite_url: str) -> None:
    """What a stopped broker left running in worker threads (a sweep cancelled
    in the middle of its reads) ends before `serve` returns and its caller
    closes the storage: a SQLite connection closed under a thread using it
    crashed a broker once (SIGSEGV at the end of a test)."""
    started, finished = threading.Event(), threading.Event()

    def slow_read() -> None:
        started.set()
        time.sleep(0.5)  # the storage read that takes a while (what is waited for)
        finished.set()

    async def scenario() -> None:
        config = BrokerConfig(
            listeners=Listeners(Address("127.0.0.1", 0)), auth=AuthConfig(allow_anonymous=True)
        )
        stop = asyncio.Event()
        with Log.open(sqlite_url) as log:
            running = asyncio.create_task(serve(config, log, stop))
            await asyncio.sleep(0)  # the broker starts
            reading = asyncio.create_task(asyncio.to_thread(slow_read))
            await eventually_async(started.is_set, what="the read started")
            reading.cancel()  # as the broker's stop cancels its sweep
            stop.set()
            await running
            assert finished.is_set(), "serve returned while a thread still read the storage"

    asyncio.run(scenario())
