"""How a broker stops (`mqtt.broker.serve`): in process, with the test's own
event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import cast

from harness.waiting import eventually, eventually_async
from riverbed.log.log import Log
from riverbed.mqtt import broker as broker_module
from riverbed.mqtt.broker import ExitDeadline, serve
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners


async def _nothing() -> None:
    return None


def _serve_and_stop(
    url: str,
    meanwhile: Callable[[], Awaitable[object]] = _nothing,
    deadline: ExitDeadline | None = None,
) -> None:
    """Run `serve` on a loop of this thread, do `meanwhile`, stop it and wait
    for it to return."""

    async def scenario() -> None:
        config = BrokerConfig(
            listeners=Listeners(Address("127.0.0.1", 0)), auth=AuthConfig(allow_anonymous=True)
        )
        stop = asyncio.Event()
        with Log.open(url) as log:
            running = asyncio.create_task(serve(config, log, stop, deadline=deadline))
            await asyncio.sleep(0)  # the broker starts
            await meanwhile()
            stop.set()
            await running

    asyncio.run(scenario())


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

    async def read_then_cancel() -> None:
        reading = asyncio.create_task(asyncio.to_thread(slow_read))
        await eventually_async(started.is_set, what="the read started")
        reading.cancel()  # as the broker's stop cancels its sweep

    _serve_and_stop(sqlite_url, read_then_cancel)
    assert finished.is_set(), "serve returned while a thread still read the storage"


def _deadlines() -> list[threading.Thread]:
    """Live timers that would end this process (`ExitDeadline`'s)."""
    return [
        thread
        for thread in threading.enumerate()
        if isinstance(thread, threading.Timer)
        and getattr(thread, "function", None) is broker_module._exit_now
    ]


def test_a_broker_that_stopped_in_time_leaves_no_deadline_behind(sqlite_url: str) -> None:
    """`serve` arms a deadline when it stops (past it the process exits, status
    1). Once it has returned in time, nothing may end the process later: a test
    worker running a broker in process was ended 25 s after the test (os._exit:
    "node down: Not properly terminated" in the full run, and the test running
    then blamed)."""
    try:
        _serve_and_stop(sqlite_url)
        # Well within the deadline (stop_grace 20 s + 5 s): a failure here is a
        # failure, not this process ended.
        eventually(lambda: not _deadlines(), 10, "no deadline left armed", explain=_deadlines)
    finally:
        for timer in _deadlines():
            cast(threading.Timer, timer).cancel()


def test_a_deadline_given_by_the_caller_stays_armed_until_it_disarms(sqlite_url: str) -> None:
    """The CLI passes its own deadline, to bound what it does after `serve`
    (closing the log): `serve` arms it and leaves it to the caller."""
    deadline = ExitDeadline(300)
    try:
        _serve_and_stop(sqlite_url, deadline=deadline)
        assert len(_deadlines()) == 1
    finally:
        deadline.disarm()
    eventually(lambda: not _deadlines(), what="the deadline disarmed", explain=_deadlines)
