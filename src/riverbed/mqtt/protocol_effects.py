"""What the connection core (`mqtt/protocol.py`) asks of the runtime, and what
the runtime tells it back.

Effects are small frozen dataclasses the core returns from every call; the
runtime (the asyncio adapter in `mqtt/connection.py`) carries them out in
order. Events are the answers to the effects that take time (authentication,
opening the session, deleting a QoS 2 marker) and the things only the runtime
knows (another connection took the client id over). The hot path has no
effect or event objects of its own: an accepted QoS 0/1 PUBLISH that needs no
waiting is handed over as the codec's `Publish` itself (append it to the log
under its own topic name), the client's PUBACK/PUBREC/PUBCOMP as themselves
(for the session), commits are reported with a plain method call
(`ConnectionCore.committed`, a count, in the order of the appends) and a
delivery is encoded by `ConnectionCore.publish`.

Nothing here imports asyncio, sockets, clocks or storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.mqtt.codec import (
    ConnectReason,
    DisconnectReason,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Subscribe,
    Unsubscribe,
    Will,
)

# --------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    """Write these bytes to the client (consecutive packets of one call are
    joined into one `Send`)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Check the CONNECT's credentials (password hashing is slow: a worker
    thread); answer with `Authenticated`."""

    client_id: str
    username: str | None
    password: bytes | None


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Take the client id over from any other connection holding it, then
    resume or create its session record [MQTT-3.1.2-4], [MQTT-3.1.2-5]; a clean
    start fires a pending Will, a resume cancels it [MQTT-3.1.3-9]. Answer with
    `SessionOpened` or `SessionRefused`."""

    client_id: str
    clean_start: bool
    level: int
    expiry: int
    will: Will | None


@dataclass(frozen=True, slots=True)
class Append:
    """Commit an accepted PUBLISH to the log under its (alias-resolved) topic
    name; report it with `ConnectionCore.committed` or `ConnectionCore.refused`,
    in the order of the appends. QoS 2 commits exactly once, with a marker per
    packet id. (The common case, a QoS 0/1 PUBLISH neither retained nor sent
    under a topic alias, comes as the `Publish` itself: no object per message.)"""

    publish: Publish
    topic: str
    waits: bool = False
    """QoS 2 or retained: the core holds what follows until `resume`."""


@dataclass(frozen=True, slots=True)
class ForgetPacketId:
    """PUBREL: delete the QoS 2 marker of `packet_id` durably, then answer with
    `Released` (the PUBCOMP waits for it)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class ToSession:
    """SUBSCRIBE or UNSUBSCRIBE, for the session; answer with `resume` once the
    SUBACK/UNSUBACK is out. (The client's acknowledgements of what was delivered
    to it, PUBACK, PUBREC and PUBCOMP, come to the runtime as the packets
    themselves: the session's too, with no object per message.)"""

    packet: Subscribe | Unsubscribe


@dataclass(frozen=True, slots=True)
class Close:
    """Close the transport (after the `Send`s before it). `reason` is why (a
    CONNACK refusal before the CONNACK was sent, a DISCONNECT reason after; None:
    closed without a word, e.g. no CONNECT in time); `by_client` when the client
    sent DISCONNECT; `error` says which rule the client broke, if it did."""

    reason: ConnectReason | DisconnectReason | None
    by_client: bool = False
    error: str = ""
    """The rule the client broke, for the log (empty: none)."""


@dataclass(frozen=True, slots=True)
class ScheduleWill:
    """The connection ended without DISCONNECT 0x00: publish the Will after
    `delay` seconds, or when the session ends if sooner [MQTT-3.1.3-9]."""

    client_id: str
    username: str | None
    will: Will
    delay: int


Effect = (
    Publish
    | Puback
    | Pubrec
    | Pubcomp
    | Send
    | Authenticate
    | OpenSession
    | Append
    | ForgetPacketId
    | ToSession
    | Close
    | ScheduleWill
)
"""Everything the core may ask of the runtime. A `Publish` is `Append(publish,
publish.topic)` for a PUBLISH that does not wait (QoS 0/1, not retained); a
`Puback`, `Pubrec` or `Pubcomp` is the client's acknowledgement of a delivery,
for the session."""

# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The answer to `Authenticate`: `reason` SUCCESS, or the refusal."""

    reason: ConnectReason
    username: str | None


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """The answer to `OpenSession`: the session is this connection's."""

    present: bool


@dataclass(frozen=True, slots=True)
class SessionRefused:
    """The answer to `OpenSession` when the session cannot be opened (0x89 Server
    busy: another node wrote it meanwhile; 0x88: the store refuses writes)."""

    reason: ConnectReason


@dataclass(frozen=True, slots=True)
class Released:
    """The answer to `ForgetPacketId`: whether a marker was there."""

    packet_id: int
    known: bool


@dataclass(frozen=True, slots=True)
class TakenOver:
    """Another connection claims this client id [MQTT-3.1.4-3]."""


@dataclass(frozen=True, slots=True)
class ServerClose:
    """The runtime closes the connection for a reason of its own (an error, the
    broker stopping, the store refusing). `server_reference`: the Server
    Reference to send with it (MQTT 5.0 §4.11; a drained node's 0x9C)."""

    reason: DisconnectReason
    server_reference: str | None = None


Event = Authenticated | SessionOpened | SessionRefused | Released | TakenOver | ServerClose
"""Everything the runtime may tell the core through `ConnectionCore.handle`."""
