"""A broker in this process, on the test's event loop, listening on a free
loopback port (for tests that look at the broker's own objects: its
connections, sessions, writer).

    async with running_broker(url) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)

Anonymous clients are allowed; `changes` replace `BrokerConfig` fields
(`limits=Limits(...)`, `shared_subscriptions=...`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from riverbed.log.log import Log
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners


@asynccontextmanager
async def running_broker(url: str, **changes: object) -> AsyncIterator[Broker]:
    config = BrokerConfig(
        **{  # type: ignore[arg-type]
            "listeners": Listeners(Address("127.0.0.1", 0)),
            "auth": AuthConfig(allow_anonymous=True),
            **changes,
        }
    )
    with Log.open(url) as log:
        broker = Broker(config, log)
        await broker.start()
        try:
            yield broker
        finally:
            await broker.stop()
