"""One exception tree for Riverbed.

`RiverbedError` is the root. Bad input raises a subclass that is also a
`ValueError`, so callers that only know the standard library still catch it;
nothing that raises one of those has changed any stored state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RiverbedError(Exception):
    """Root of every error Riverbed raises on purpose."""


class InvalidInput(RiverbedError, ValueError):
    """The caller handed us a value that breaks a rule; nothing was changed."""


class InvalidTopicName(InvalidInput):
    """An MQTT topic name breaks a rule of [MQTT-4.7]."""


class InvalidTopicFilter(InvalidInput):
    """An MQTT topic filter breaks a rule of [MQTT-4.7]."""


class ProtocolError(InvalidInput):
    """An MQTT packet breaks a rule of the MQTT 5.0 or 3.1.1 specification.

    `reason_code` is the MQTT 5 reason code to answer with: in a CONNACK when the
    broken packet is the CONNECT, else in a DISCONNECT (an MQTT 3.1.1 connection
    is just closed, or gets the CONNACK return code that matches). The codec uses
    0x81 Malformed Packet, 0x82 Protocol Error, 0x84 Unsupported Protocol Version,
    0x85 Client Identifier not valid, 0x94 Topic Alias invalid and 0x95 Packet too
    large; the message cites the rule, e.g. "[MQTT-3.3.1-4]".
    """

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[int, str]]:
        return (type(self), (self.reason_code, str(self)))


class LocalProtocolError(RiverbedError):
    """The MQTT connection core was misused by the code driving it (an event in
    the wrong state, a delivery beyond the client's window): a bug on the
    server's side, not the client's. `ProtocolError` is the peer's fault (h11
    draws the same line); this one closes the connection with 0x80 Unspecified
    error and is logged as a bug."""


class InvalidPartitionCount(InvalidInput):
    """A partition count is not 1, 2, 3 or a multiple of 4 or 6 (seed 003)."""


class InvalidOffset(InvalidInput):
    """An offset is negative or outside a stream's retained range."""


class InvalidConfig(InvalidInput):
    """A configuration value (URL, duration, option) is malformed."""


class BindingOverlap(InvalidInput):
    """A topic's binding filter overlaps another topic's binding."""


class NotFound(RiverbedError, LookupError):
    """A named thing (topic, subscription, stream, key) does not exist."""


class TopicNotFound(NotFound):
    """No topic has that name."""


class SubscriptionNotFound(NotFound):
    """No subscription has that name."""


class AlreadyExists(RiverbedError):
    """A thing with that name exists already."""


class PreconditionFailed(RiverbedError):
    """A compare-and-set or fenced write found another version than expected."""


class LeaseHeld(PreconditionFailed):
    """A lease is held by another owner and has not expired."""


class StorageError(RiverbedError):
    """The database failed or could not be reached."""


class StorageUnavailable(StorageError):
    """The database could not be opened or reached."""


class StorageBusy(StorageError):
    """A transaction that does not wait (`storage.transactions.transaction_now`)
    found the database's write lock held by another connection; nothing was
    written."""


class StorageFull(StorageError):
    """The database refused a write because it is full (the disk, or a size cap
    such as SQLite's `max_size`) or accepts no writes (a read-only PostgreSQL);
    nothing of that write was stored. The same write may succeed once space
    returns: the connection and the caller's thread carry on."""


class DatabaseNotFound(NotFound):
    """A storage opened only to read or change what exists (`create=False`)
    names no Riverbed database: a SQLite file that is missing or holds no
    Riverbed tables, a PostgreSQL database without the schema. Nothing was
    created."""


class CannotListen(RiverbedError):
    """The broker could not listen on a configured address (in use, not an
    address of this machine, a port it may not open)."""


class StreamSealed(RiverbedError):
    """An append targeted a stream that is sealed or gone; nothing was written.

    The appender refreshes its view of the topic and routes again.
    """

    def __init__(self, stream_keys: Sequence[int]) -> None:
        super().__init__(f"streams {sorted(stream_keys)} are sealed or deleted")
        self.stream_keys = tuple(stream_keys)


class LentElsewhere(PreconditionFailed):
    """A session's write recording QoS 2 messages as released to a shared
    group's member was refused: a stream they came from has been lent to a
    member since (`sharedsub.claims.lend`). Nothing of the write was stored."""


class NodeRunning(AlreadyExists):
    """A broker node of the same name runs on the same SQLite file (another
    process holds its presence, `cluster/presence.py`)."""


class ShardsChanged(PreconditionFailed):
    """A subscription's definition (its shard count) changed under an
    operation on its shards."""


class Superseded(StorageError):
    """Another run of the same shard committed first; this one wrote nothing."""


class DeliveryFailed(RiverbedError):
    """A delivering subscription's Spark query stopped with an error (a task
    failed for good, or the job lost its lease on the subscription)."""


class HandlerFailed(RiverbedError):
    """A worker's handler raised and the error policy said STOP; `failure` (a
    `riverbed.subscriptions.workers.Failure`, None if the worker stopped
    before it had one) says which batch and why. The position was not moved
    past the batch."""

    failure: Any

    def __init__(self, failure: Any, message: str) -> None:
        super().__init__(message)
        self.failure = failure
