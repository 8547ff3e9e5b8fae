"""A CONNECT whose session cannot be opened for a reason nobody planned for (a
defect, the machine) is answered with a CONNACK refusal before the connection
closes: 0x80 Unspecified error, 3.1.1 return code 3 Server unavailable. Its
client learns that the server failed, not the network; the failure is logged
with its traceback, and the broker goes on serving. In process, on both
backends, the session's opening made to fail for one client id."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient, RawClient
from riverbed.mqtt.codec import MQTT_3_1_1, Connack, ConnectReason
from riverbed.mqtt.connection import Connection

DOOMED = ("doomed-5", "doomed-311")


def test_a_connect_that_fails_unexpectedly_gets_a_connack_refusal(
    storage_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    opening = Connection._open_session

    async def fails_for_the_doomed(self: Connection, *args: Any, **kwargs: Any) -> Any:
        if self.client_id in DOOMED:
            raise RuntimeError("the session store is on fire")
        return await opening(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "_open_session", fails_for_the_doomed)

    def connect_311(port: int) -> tuple[Connack, bytes]:
        with RawClient(port, level=MQTT_3_1_1) as raw:
            connack = raw.connect("doomed-311", clean=True)
            return connack, raw.sock.recv(1)  # then the end of the connection

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            v5 = await AsyncRawClient.open(broker.port)
            connack = await v5.connect("doomed-5", expiry=0, clean=True)
            assert connack.reason_code is ConnectReason.UNSPECIFIED_ERROR
            assert await v5.reader.read(1) == b""  # closed after it
            v5.close()

            connack, after = await asyncio.to_thread(connect_311, broker.port)
            assert connack.reason_code is ConnectReason.SERVER_UNAVAILABLE
            assert after == b""

            fine = await AsyncRawClient.open(broker.port)
            assert (await fine.connect("fine", expiry=0, clean=True)).reason_code is (
                ConnectReason.SUCCESS
            )
            assert not set(DOOMED) & set(broker.connections)
            await fine.leave()

    with caplog.at_level(logging.ERROR, logger="riverbed.mqtt.connection"):
        asyncio.run(scenario())
    failed = [r for r in caplog.records if "failed" in r.getMessage() and r.exc_info]
    assert {r.args[0] for r in failed if isinstance(r.args, tuple)} == set(DOOMED)
