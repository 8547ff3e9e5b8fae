"""The messages between Borrowers and a Leader (seed 001), plain and serialisable.

A shared subscription group (`$share/GROUP/FILTER`, or `$queue/FILTER`) has one
Leader cluster-wide. Each session that subscribes runs one Borrower per
subscription; a Borrower finds the Leader through the node-local registry, and
from then on they talk only through these messages, over a `Bus`
(`sharedsub/bus.py`). Every message names its group, its borrower and (once
known) its leader, so a bus between processes needs nothing else to route it.

Borrower → registry / Leader:

- `leader_wanted`: "who leads this group?" Sent to the registry (which finds or
  starts the Leader and forwards it), repeated every find-leader retry period
  until answered.
- `ping`: keep-alive, every ping period; the Leader answers `ping_response`.
- `update_progress`: the acknowledged prefix of a stream moved to `offset` (the
  first offset not yet consumed). `final` marks the last progress of a stream
  being revoked: the session has stopped fetching it and nothing of it is in
  flight any more (or the unsubscribe timeout passed).
- `revoke_finished`: the Borrower forgot a revoked stream.
- `disconnect`: the Borrower leaves; carries the last progress of every stream
  it held.

Leader → Borrower:

- `leader_connect_response`: answer to `leader_wanted`, with the Leader's id.
- `ping_response`: answer to `ping`.
- `grant`: the stream is the Borrower's from `offset` on.
- `revoke`: give the stream back (stop fetching, drain, send final progress).
- `revoked`: the final progress is saved; forget the stream.
- `invalidate`: the Leader does not know this Borrower (any more); it must stop
  and be recreated with a new id.

`leader_wanted` and `ping` carry a sequence number that their answers echo: it
tells the Borrower which of its requests the Leader saw, hence the earliest time
the Leader may consider it gone (the Borrower's fence, see `borrower.py`).

`encode` / `decode` turn a message into JSON bytes and back; `decode` checks
every field and raises `InvalidMessage` for anything else, so a bus between
nodes can hand over untrusted bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from riverbed.errors import InvalidInput, InvalidTopicFilter
from riverbed.model import StreamId
from riverbed.topics.filters import validate_filter

BorrowerId = str
"""A Borrower's identity: unique per Borrower, never reused (a recreated Borrower
gets a new one, seed 001)."""

LeaderId = str
"""A Leader incarnation's identity, also its bus address."""

Address = str
"""Where a bus delivers: a borrower id, a leader id, or `REGISTRY`."""

REGISTRY: Address = "registry"
"""The node-local registry's address: `leader_wanted` goes here."""

QUEUE_GROUP = "$queue"
"""`$queue/FILTER` is the group `$queue` of FILTER."""


class InvalidMessage(InvalidInput):
    """Bytes or fields that are not a valid Borrower/Leader message."""


@dataclass(frozen=True, slots=True, order=True)
class GroupId:
    """A shared subscription group: a group name and the topic filter it shares."""

    name: str
    topic_filter: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidTopicFilter(f"share group name {self.name!r} must not be empty")
        if any(c in self.name for c in "/+#"):
            # [MQTT-4.8.2-2] a ShareName must not contain '/', '+' or '#'.
            raise InvalidTopicFilter(
                f"share group name {self.name!r} must not contain '/', '+' or '#' [MQTT-4.8.2-2]"
            )
        if not isinstance(self.topic_filter, str):
            raise InvalidTopicFilter(f"topic filter {self.topic_filter!r} is not a string")
        validate_filter(self.topic_filter)

    @classmethod
    def parse(cls, text: str) -> GroupId:
        """Parse `$share/GROUP/FILTER` or `$queue/FILTER`."""
        if text.startswith("$share/"):
            name, sep, topic_filter = text[len("$share/") :].partition("/")
            if not sep or not topic_filter:
                raise InvalidTopicFilter(
                    f"shared subscription {text!r} must be $share/GROUP/FILTER [MQTT-4.8.2-1]"
                )
            return cls(name, topic_filter)
        if text.startswith("$queue/"):
            topic_filter = text[len("$queue/") :]
            if not topic_filter:
                raise InvalidTopicFilter(f"queue subscription {text!r} has no filter")
            return cls(QUEUE_GROUP, topic_filter)
        raise InvalidTopicFilter(
            f"{text!r} is not a shared subscription ($share/GROUP/FILTER or $queue/FILTER)"
        )

    @property
    def key(self) -> str:
        """`GROUP/FILTER`: unambiguous, since a group name has no '/'."""
        return f"{self.name}/{self.topic_filter}"

    @classmethod
    def from_key(cls, key: str) -> GroupId:
        name, sep, topic_filter = key.partition("/")
        if not sep:
            raise InvalidMessage(f"group key {key!r} is not GROUP/FILTER")
        return cls(name, topic_filter)

    def __str__(self) -> str:
        if self.name == QUEUE_GROUP:
            return f"$queue/{self.topic_filter}"
        return f"$share/{self.name}/{self.topic_filter}"


def stream_order(stream: StreamId) -> tuple[str, int, int]:
    """A sort key for streams (`StreamId` itself does not order)."""
    return (stream.topic, stream.generation, stream.partition)


# --------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class LeaderWanted:
    type: ClassVar[str] = "leader_wanted"
    group: GroupId
    borrower: BorrowerId
    seq: int


@dataclass(frozen=True, slots=True)
class LeaderConnectResponse:
    type: ClassVar[str] = "leader_connect_response"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    seq: int


@dataclass(frozen=True, slots=True)
class Ping:
    type: ClassVar[str] = "ping"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    seq: int


@dataclass(frozen=True, slots=True)
class PingResponse:
    type: ClassVar[str] = "ping_response"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    seq: int


@dataclass(frozen=True, slots=True)
class Grant:
    type: ClassVar[str] = "grant"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    stream: StreamId
    offset: int


@dataclass(frozen=True, slots=True)
class Revoke:
    type: ClassVar[str] = "revoke"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    stream: StreamId


@dataclass(frozen=True, slots=True)
class Revoked:
    type: ClassVar[str] = "revoked"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    stream: StreamId


@dataclass(frozen=True, slots=True)
class UpdateProgress:
    type: ClassVar[str] = "update_progress"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    stream: StreamId
    offset: int
    final: bool = False


@dataclass(frozen=True, slots=True)
class RevokeFinished:
    type: ClassVar[str] = "revoke_finished"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId
    stream: StreamId


@dataclass(frozen=True, slots=True)
class Disconnect:
    type: ClassVar[str] = "disconnect"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId | None
    """None when the Borrower never learned its Leader (sent via the registry)."""
    progress: tuple[tuple[StreamId, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Invalidate:
    type: ClassVar[str] = "invalidate"
    group: GroupId
    borrower: BorrowerId
    leader: LeaderId


ToLeader = LeaderWanted | Ping | UpdateProgress | RevokeFinished | Disconnect
ToBorrower = LeaderConnectResponse | PingResponse | Grant | Revoke | Revoked | Invalidate
Message = ToLeader | ToBorrower

MESSAGE_TYPES: Mapping[str, type[Message]] = {
    cls.type: cls
    for cls in (
        LeaderWanted,
        LeaderConnectResponse,
        Ping,
        PingResponse,
        Grant,
        Revoke,
        Revoked,
        UpdateProgress,
        RevokeFinished,
        Disconnect,
        Invalidate,
    )
}


# --------------------------------------------------------------------- encoding


def to_dict(message: Message) -> dict[str, Any]:
    """The message as JSON-ready values: `type` is the seed's message name."""
    out: dict[str, Any] = {"type": message.type}
    for f in fields(message):
        value = getattr(message, f.name)
        if isinstance(value, GroupId):
            out[f.name] = value.key
        elif isinstance(value, StreamId):
            out[f.name] = str(value)
        elif f.name == "progress":
            out[f.name] = [[str(stream), offset] for stream, offset in value]
        else:
            out[f.name] = value
    return out


def from_dict(data: Mapping[str, Any]) -> Message:
    """Rebuild a message from `to_dict`'s form; raises `InvalidMessage`."""
    if not isinstance(data, Mapping):
        raise InvalidMessage(f"a message must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None or not isinstance(kind, str):
        raise InvalidMessage(f"unknown message type {kind!r}")
    names = {f.name for f in fields(cls)}
    extra = set(data) - names - {"type"}
    if extra:
        raise InvalidMessage(f"{kind} message has unknown fields {sorted(extra)}")
    values: dict[str, Any] = {}
    try:
        for name in names:
            if name not in data:
                if name in ("final", "progress"):
                    continue
                raise InvalidMessage(f"{kind} message lacks field {name!r}")
            raw = data[name]
            values[name] = _field(kind, name, raw)
        return cls(**values)
    except InvalidMessage:
        raise
    except InvalidInput as exc:
        raise InvalidMessage(f"{kind} message: {exc}") from None


def _field(kind: str, name: str, raw: Any) -> Any:
    if name == "group":
        return GroupId.from_key(_str(kind, name, raw))
    if name == "stream":
        return StreamId.parse(_str(kind, name, raw))
    if name in ("offset", "seq"):
        return _offset(kind, name, raw)
    if name == "final":
        if not isinstance(raw, bool):
            raise InvalidMessage(f"{kind} message: final {raw!r} is not a boolean")
        return raw
    if name == "leader" and raw is None and kind == Disconnect.type:
        return None
    if name == "progress":
        if not isinstance(raw, list):
            raise InvalidMessage(f"{kind} message: progress {raw!r} is not a list")
        pairs = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 2:
                raise InvalidMessage(f"{kind} message: progress entry {item!r} is not a pair")
            pairs.append(
                (StreamId.parse(_str(kind, name, item[0])), _offset(kind, "progress", item[1]))
            )
        return tuple(pairs)
    return _str(kind, name, raw)  # borrower, leader


def _str(kind: str, name: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise InvalidMessage(f"{kind} message: {name} {raw!r} is not a non-empty string")
    return raw


def _offset(kind: str, name: str, raw: Any) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        raise InvalidMessage(f"{kind} message: {name} {raw!r} is not an offset (integer >= 0)")
    return raw


def encode(message: Message) -> bytes:
    """The message as compact JSON bytes (what a bus between nodes carries)."""
    return json.dumps(to_dict(message), separators=(",", ":")).encode()


def decode(raw: bytes) -> Message:
    """The message `encode` made; raises `InvalidMessage` for anything else."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"a message is not JSON: {exc}") from None
    return from_dict(data)
