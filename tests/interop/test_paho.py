"""paho-mqtt (Python) against `riverbed serve`: the interop feature list
(`features.py`), MQTT 5 and 3.1.1, through the harness's paho client."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest

from harness.broker import Client
from interop.clients import Endpoint, MakeClient, Message, Refused
from interop.features import Features
from interop.paho_codes import wire_code

PROTOCOLS = {5: paho.MQTTv5, 4: paho.MQTTv311}


class PahoClient:
    """`harness.broker.Client` as an `InteropClient`."""

    def __init__(self, endpoint: Endpoint, client_id: str, version: int) -> None:
        self.endpoint = endpoint
        self.client_id = client_id
        self.version = version
        self.client: Client | None = None

    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        will: tuple[str, str, int] | None = None,
        credentials: tuple[str, str] | None = None,
        tls: bool = False,
    ) -> bool | None:
        context = None
        if tls:
            context = ssl.create_default_context(cafile=self.endpoint.ca)
        port = self.endpoint.tls_port if tls else self.endpoint.port
        self.client = Client(port, self.client_id, protocol=PROTOCOLS[self.version], tls=context)
        username, password = credentials or (None, None)
        try:
            return self.client.connect(
                clean=clean,
                expiry=expiry,
                will=None if will is None else (will[0], will[1].encode(), will[2], False),
                username=username,
                password=password,
            )
        except AssertionError:
            connack = self.client.connack
            self.client.close()
            if connack is None:
                raise
            raise Refused(wire_code(connack[1], self.version)) from None

    def subscribe(self, topic_filter: str, qos: int) -> list[int]:
        assert self.client is not None
        return self.client.subscribe(topic_filter, qos=qos)

    def publish(self, topic: str, payload: str, qos: int, retain: bool = False) -> None:
        assert self.client is not None
        info = self.client.publish(topic, payload.encode(), qos, retain)
        info.wait_for_publish(30)
        assert info.is_published()

    def messages(self) -> list[Message]:
        if self.client is None:
            return []
        return [
            Message(m.topic, m.payload.decode(), m.qos, m.retain)
            for m in self.client.received_now()
        ]

    def disconnect(self) -> None:
        assert self.client is not None
        self.client.disconnect()

    def crash(self) -> None:
        assert self.client is not None
        self.client.drop()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


@pytest.fixture
def make_client(endpoint: Endpoint, version: int) -> Iterator[MakeClient]:
    made: list[PahoClient] = []

    def make(client_id: str) -> PahoClient:
        made.append(PahoClient(endpoint, client_id, version))
        return made[-1]

    yield make
    for client in made:
        client.close()


class TestPaho(Features):
    pass
