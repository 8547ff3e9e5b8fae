"""A raw MQTT 5 client over a socket, built on riverbed's own codec, for tests
that must send exactly the packets a real client would send only by accident
(a PUBLISH resent after a broker crash, a PUBREC never sent); `AsyncRawClient`
is the same on asyncio, for many connections at once (storms, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable
from typing import Self, TypeVar

from riverbed.mqtt.codec import (
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscribeTopic,
    encode,
)
from riverbed.mqtt.codec.properties import ConnectProperties

P = TypeVar("P")


class RawClient:
    """One MQTT 5 connection (`level=MQTT_3_1_1`: 3.1.1); `expect` returns the
    next packet, of a given type."""

    def __init__(
        self,
        port: int,
        timeout: float = 10.0,
        level: int = MQTT_5,
        *,
        receive_buffer: int | None = None,
    ) -> None:
        """`receive_buffer`: SO_RCVBUF, set before connecting (a small one makes
        a client that stops reading fill the broker's buffers sooner)."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.level = level
        self.decoder = Decoder(level)
        self.pending: list[Packet] = []

    def connect(
        self,
        client_id: str,
        *,
        clean: bool,
        expiry: int = 0,
        alias_maximum: int = 0,
        keep_alive: int = 60,
    ) -> Connack:
        props = ConnectProperties(
            session_expiry_interval=expiry or None, topic_alias_maximum=alias_maximum or None
        )
        self.send(Connect(client_id, clean, keep_alive, properties=props))
        return self.expect(Connack)

    def publish_many(self, messages: Iterable[tuple[str, bytes]], window: int = 100) -> int:
        """PUBLISH each (topic, payload) at QoS 1, up to `window` unacknowledged
        at a time (the broker's Receive Maximum is 100), sent in batches; return
        once every one is acknowledged. Returns how many were published."""
        inflight: set[int] = set()
        next_id = 0
        count = 0
        pending = iter(messages)
        exhausted = False
        while not exhausted or inflight:
            batch = []
            while not exhausted and len(inflight) < window:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                next_id = next_id % 0xFFFF + 1
                inflight.add(next_id)
                batch.append(encode(Publish(item[0], item[1], 1, packet_id=next_id), MQTT_5))
                count += 1
            if batch:
                self.sock.sendall(b"".join(batch))
            while inflight and (len(inflight) > window // 2 or exhausted):
                packet = self.next()
                assert isinstance(packet, Puback), f"expected PUBACK, got {packet!r}"
                assert packet.reason_code < 0x80, f"PUBLISH refused: {packet!r}"
                inflight.remove(packet.packet_id)
        return count

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


class AsyncRawClient:
    """One raw MQTT 5 connection on asyncio: write packets, wait for the next
    one (at most `timeout` seconds each)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.decoder = Decoder(MQTT_5)
        self.pending: list[Packet] = []

    @classmethod
    async def open(cls, port: int, timeout: float = 60.0) -> Self:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, timeout)

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, MQTT_5))

    async def next(self) -> Packet:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), self.timeout)
            if not data:
                raise ConnectionResetError("the broker closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def expect(self, kind: type[P]) -> P:
        packet = await self.next()
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    async def connect(
        self, client_id: str, *, expiry: int, keep_alive: int = 600, clean: bool = False
    ) -> Connack:
        """CONNECT with Clean Start 0 (`clean`: 1) and a session expiry; the
        CONNACK, whatever its code."""
        props = ConnectProperties(session_expiry_interval=expiry)
        self.send(Connect(client_id, clean, keep_alive, properties=props))
        return await self.expect(Connack)

    async def subscribe(self, topic_filter: str, qos: int = 1) -> Suback:
        self.send(Subscribe(1, (SubscribeTopic(topic_filter, qos),)))
        return await self.expect(Suback)

    async def receive(self, count: int, into: list[bytes] | None = None) -> list[bytes]:
        """The payloads of the next `count` PUBLISHes, each acknowledged (QoS 1)
        as it comes; collected in `into` when given (what came before a timeout)."""
        got = [] if into is None else into
        while len(got) < count:
            packet = await self.next()
            assert isinstance(packet, Publish), f"expected PUBLISH, got {packet!r}"
            got.append(packet.payload)
            if packet.packet_id is not None:
                self.send(Puback(packet.packet_id))
        return got

    async def leave(self) -> None:
        """DISCONNECT 0x00, then wait until the broker closes the connection."""
        self.send(Disconnect())
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        self.writer.close()

    def close(self) -> None:
        self.writer.close()
