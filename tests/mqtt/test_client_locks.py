"""A client id's lock (`Broker.client_lock`): it serializes the CONNECTs of one
client id and an administrator's deletion of its session, and is dropped once
nobody holds or awaits it, so client ids that never come back leave nothing
behind (a session deleted over the API used to leave its lock for good)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from riverbed.log.log import Log
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners


def _broker(tmp_path: Path) -> tuple[Log, Broker]:
    log = Log.open(f"sqlite:///{tmp_path / 'r.db'}")
    config = BrokerConfig(
        listeners=Listeners(Address("127.0.0.1", 0)), auth=AuthConfig(allow_anonymous=True)
    )
    return log, Broker(config, log)


def test_a_client_lock_excludes_and_is_dropped_when_nobody_wants_it(tmp_path: Path) -> None:
    log, broker = _broker(tmp_path)
    order: list[str] = []

    async def holder(name: str, entered: asyncio.Event, leave: asyncio.Event) -> None:
        async with broker.client_lock("c1"):
            order.append(f"{name} in")
            entered.set()
            await leave.wait()
            order.append(f"{name} out")

    async def scenario() -> None:
        first_in, first_leave = asyncio.Event(), asyncio.Event()
        second_in, second_leave = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(holder("first", first_in, first_leave))
        await first_in.wait()
        second = asyncio.create_task(holder("second", second_in, second_leave))
        await asyncio.sleep(0)  # the second now waits for the lock
        assert not second_in.is_set()
        assert broker.client_locks == 1
        first_leave.set()
        await second_in.wait()
        # Released by the first with the second still holding: kept.
        assert broker.client_locks == 1
        second_leave.set()
        await asyncio.gather(first, second)
        assert broker.client_locks == 0

        # Many client ids that lock once and never come back leave nothing.
        for n in range(100):
            async with broker.client_lock(f"gone-{n}"):
                pass
        assert broker.client_locks == 0

    try:
        asyncio.run(scenario())
    finally:
        log.close()
    assert order == ["first in", "first out", "second in", "second out"]


def test_a_lock_whose_holder_fails_is_released_and_dropped(tmp_path: Path) -> None:
    log, broker = _broker(tmp_path)

    async def scenario() -> None:
        try:
            async with broker.client_lock("c1"):
                raise RuntimeError("the CONNECT failed")
        except RuntimeError:
            pass
        assert broker.client_locks == 0
        async with broker.client_lock("c1"):  # not left locked
            assert broker.client_locks == 1

    try:
        asyncio.run(scenario())
    finally:
        log.close()
