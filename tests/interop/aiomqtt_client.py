"""One aiomqtt client, driven line by line for `test_aiomqtt.py`.

Run as a script (`python aiomqtt_client.py`): it reads commands on stdin and
writes events on stdout, one JSON object a line, in the language `remote.py`
describes (the MQTT.js driver, `js/client.js`, speaks the same). The test ends it
by closing stdin, or kills it (SIGKILL) to close the connection abruptly.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from contextlib import AsyncExitStack
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho_codes import wire_code  # beside this script: its directory is on sys.path


class Client(aiomqtt.Client):
    """aiomqtt's client, remembering the CONNACK's Session Present flag (aiomqtt
    does not expose it)."""

    session_present = False

    def _on_connect(self, client: Any, userdata: Any, flags: Any, *rest: Any) -> None:
        self.session_present = bool(flags.session_present)
        super()._on_connect(client, userdata, flags, *rest)


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def make_client(command: dict[str, Any]) -> Client:
    v5 = command["version"] == 5
    properties = None
    if v5 and command["expiry"] is not None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = command["expiry"]
    will = command["will"]
    tls = None
    if command["ca"] is not None:
        tls = ssl.create_default_context(cafile=command["ca"])
    return Client(
        "127.0.0.1",
        command["port"],
        identifier=command["clientId"],
        protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        clean_session=None if v5 else command["clean"],
        clean_start=command["clean"] if v5 else paho.MQTT_CLEAN_START_FIRST_ONLY,
        properties=properties,
        username=command["username"],
        password=command["password"],
        will=None if will is None else aiomqtt.Will(will["topic"], will["payload"], will["qos"]),
        tls_context=tls,
        timeout=30,
    )


async def receive(client: Client) -> None:
    async for message in client.messages:
        payload = message.payload
        emit(
            event="message",
            topic=str(message.topic),
            payload=payload.decode() if isinstance(payload, bytes | bytearray) else str(payload),
            qos=message.qos,
            retain=message.retain,
        )


async def handle(command: dict[str, Any], stack: AsyncExitStack, state: dict[str, Any]) -> None:
    client: Client | None = state.get("client")
    match command["op"]:
        case "connect":
            client = make_client(command)
            try:
                await stack.enter_async_context(client)
            except aiomqtt.MqttCodeError as exc:
                code = exc.rc.value if hasattr(exc.rc, "value") else exc.rc
                emit(event="refused", code=wire_code(int(code or 0), command["version"]))
                return
            state["client"] = client
            state["receiver"] = asyncio.create_task(receive(client))
            emit(event="connack", sessionPresent=client.session_present)
        case "subscribe":
            assert client is not None
            granted = await client.subscribe(command["filter"], command["qos"])
            emit(event="suback", codes=[int(getattr(g, "value", g)) for g in granted])
        case "publish":
            assert client is not None
            # Returns once the PUBACK / PUBCOMP came (QoS 1 / 2).
            await client.publish(
                command["topic"], command["payload"].encode(), command["qos"], command["retain"]
            )
            emit(event="published")
        case "disconnect":
            state.pop("receiver").cancel()
            await stack.aclose()
            state.pop("client")
            emit(event="disconnected")
        case other:
            emit(event="error", message=f"unknown op {other!r}")


async def main() -> None:
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {}
    async with AsyncExitStack() as stack:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip():
                try:
                    await handle(json.loads(line), stack, state)
                except Exception as exc:  # reported to the test, which fails on it
                    emit(event="error", message=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    asyncio.run(main())
