"""Riverbed: a durable message bus over a partitioned, replayable log.

The public API, all importable from here:

    from riverbed import Log, Message, Subscriptions

    with Log.open("sqlite:///./riverbed-data/riverbed.db") as log:
        log.topics.create("orders", partitions=4, binding="orders/#", exist_ok=True)
        log.produce("orders", [Message(b"hello", key="customer-1")])

- the log: `Log`, `Message`, `StoredMessage`, `MessageId`, `RetentionPolicy`;
- storage: `open_storage`, `Storage` (the protocol both backends implement);
- named subscriptions: `Subscriptions`, `Consumer`, `Delivery`, `StreamLag`,
  `RetryPolicy`;
- competing consumers: `Worker`, `Batch`, `Failure`, `ErrorPolicy`, `OnError`,
  `Guarantee`;
- every exception Riverbed raises on purpose (`riverbed.errors`), `RiverbedError`
  at the root.

Spark is an extra (`riverbed.spark`), the broker a program (`riverbed serve`).
Names are loaded when first used, so `import riverbed` stays cheap for the
command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from riverbed.errors import (
    AlreadyExists,
    BindingOverlap,
    CannotListen,
    DatabaseNotFound,
    DeliveryFailed,
    HandlerFailed,
    InvalidConfig,
    InvalidInput,
    InvalidOffset,
    InvalidPartitionCount,
    InvalidTopicFilter,
    InvalidTopicName,
    LeaseHeld,
    LentElsewhere,
    LocalProtocolError,
    NodeRunning,
    NotFound,
    PreconditionFailed,
    ProtocolError,
    RiverbedError,
    ShardsChanged,
    StorageBusy,
    StorageError,
    StorageFull,
    StorageUnavailable,
    StreamSealed,
    SubscriptionNotFound,
    Superseded,
    TopicNotFound,
)

if TYPE_CHECKING:
    from riverbed.log.log import Log
    from riverbed.model import Message, MessageId, StoredMessage
    from riverbed.storage import open_storage
    from riverbed.storage.base import RetentionPolicy, Storage
    from riverbed.subscriptions.definition import RetryPolicy
    from riverbed.subscriptions.handling import Batch, ErrorPolicy, Failure, Guarantee, OnError
    from riverbed.subscriptions.named import Consumer, Delivery, StreamLag, Subscriptions
    from riverbed.subscriptions.workers import Worker

__version__ = "0.1.0"

_LAZY = {
    "Log": "riverbed.log.log",
    "Message": "riverbed.model",
    "MessageId": "riverbed.model",
    "StoredMessage": "riverbed.model",
    "open_storage": "riverbed.storage",
    "RetentionPolicy": "riverbed.storage.base",
    "Storage": "riverbed.storage.base",
    "Consumer": "riverbed.subscriptions.named",
    "Delivery": "riverbed.subscriptions.named",
    "StreamLag": "riverbed.subscriptions.named",
    "Subscriptions": "riverbed.subscriptions.named",
    "RetryPolicy": "riverbed.subscriptions.definition",
    "Batch": "riverbed.subscriptions.handling",
    "ErrorPolicy": "riverbed.subscriptions.handling",
    "Failure": "riverbed.subscriptions.handling",
    "Guarantee": "riverbed.subscriptions.handling",
    "OnError": "riverbed.subscriptions.handling",
    "Worker": "riverbed.subscriptions.workers",
}
"""Public name -> the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'riverbed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AlreadyExists",
    "Batch",
    "BindingOverlap",
    "CannotListen",
    "Consumer",
    "DatabaseNotFound",
    "Delivery",
    "DeliveryFailed",
    "ErrorPolicy",
    "Failure",
    "Guarantee",
    "HandlerFailed",
    "InvalidConfig",
    "InvalidInput",
    "InvalidOffset",
    "InvalidPartitionCount",
    "InvalidTopicFilter",
    "InvalidTopicName",
    "LeaseHeld",
    "LentElsewhere",
    "LocalProtocolError",
    "Log",
    "Message",
    "MessageId",
    "NodeRunning",
    "NotFound",
    "OnError",
    "PreconditionFailed",
    "ProtocolError",
    "RetentionPolicy",
    "RetryPolicy",
    "RiverbedError",
    "ShardsChanged",
    "Storage",
    "StorageBusy",
    "StorageError",
    "StorageFull",
    "StorageUnavailable",
    "StoredMessage",
    "StreamLag",
    "StreamSealed",
    "SubscriptionNotFound",
    "Subscriptions",
    "Superseded",
    "TopicNotFound",
    "Worker",
    "__version__",
    "open_storage",
]
