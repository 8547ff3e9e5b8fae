"""A raw MQTT 5 client over a socket, built on riverbed's own codec, for tests
that must send exactly the packets a real client would send only by accident
(a PUBLISH resent after a broker crash, a PUBREC never sent)."""

from __future__ import annotations

import socket
from typing import TypeVar

from riverbed.mqtt.codec import (
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    Packet,
    encode,
)
from riverbed.mqtt.codec.properties import ConnectProperties

P = TypeVar("P")


class RawClient:
    """One MQTT 5 connection (`level=MQTT_3_1_1`: 3.1.1); `expect` returns the
    next packet, of a given type."""

    def __init__(self, port: int, timeout: float = 10.0, level: int = MQTT_5) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.level = level
        self.decoder = Decoder(level)
        self.pending: list[Packet] = []

    def connect(
        self, client_id: str, *, clean: bool, expiry: int = 0, alias_maximum: int = 0
    ) -> Connack:
        props = ConnectProperties(
            session_expiry_interval=expiry or None, topic_alias_maximum=alias_maximum or None
        )
        self.send(Connect(client_id, clean, 60, properties=props))
        return self.expect(Connack)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def next(self) -> Packet:
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def expect(self, kind: type[P]) -> P:
        packet = self.next()
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def nothing(self, seconds: float) -> None:
        """Assert that no packet arrives within `seconds`."""
        assert not self.pending, f"unexpected {self.pending[0]!r}"
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        finally:
            self.sock.settimeout(10.0)
        raise AssertionError(f"unexpected {self.decoder.feed(data) if data else 'close'!r}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
