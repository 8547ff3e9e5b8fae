"""What the interop tests ask of a client, whatever its kind.

Each client module adapts its client to `InteropClient`: paho-mqtt and the
mosquitto command-line tools in their modules, aiomqtt and MQTT.js through a
driver process that `remote.py` talks to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.broker import BrokerProcess

USERNAME = "alice"
PASSWORD = "looking-glass"
"""The one user in the interop broker's password file."""

NOT_AUTHORISED = {5: 0x86, 4: 4}
"""The CONNACK code of a wrong password: MQTT 5 "Bad User Name or Password",
MQTT 3.1.1 return code 4 (the same words)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the interop broker listens, and what a client needs to get in."""

    broker: BrokerProcess
    tls_port: int
    ca: Path
    """The CA that signed the TLS listener's certificate (for 127.0.0.1)."""
    username: str = USERNAME
    password: str = PASSWORD

    @property
    def port(self) -> int:
        return self.broker.port


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    payload: str
    qos: int
    retain: bool


class Refused(Exception):
    """The broker refused the CONNECT with `code` (CONNACK reason / return code)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"CONNECT refused: 0x{code:02X}")
        self.code = code


class InteropClient(Protocol):
    """One client of the kind under test, with one client id."""

    client_id: str

    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        will: tuple[str, str, int] | None = None,
        credentials: tuple[str, str] | None = None,
        tls: bool = False,
    ) -> bool | None:
        """Connect, waiting for the CONNACK; Session Present (None where the client
        does not tell). `expiry` is MQTT 5's Session Expiry Interval; `will` is
        (topic, payload, QoS). Raises `Refused` if the broker said no."""
        ...

    def subscribe(self, topic_filter: str, qos: int) -> list[int]:
        """SUBSCRIBE, waiting for the SUBACK; its codes."""
        ...

    def publish(self, topic: str, payload: str, qos: int, retain: bool = False) -> None:
        """PUBLISH, returning once the client says it is done (PUBACK, PUBCOMP)."""
        ...

    def messages(self) -> list[Message]:
        """What arrived so far."""
        ...

    def disconnect(self) -> None:
        """A normal DISCONNECT."""
        ...

    def crash(self) -> None:
        """Close the connection without a DISCONNECT (kill the client's process,
        or close its socket)."""
        ...


MakeClient = Callable[[str], InteropClient]
"""A fresh client of the kind under test, with the client id given."""
