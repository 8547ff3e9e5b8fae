"""The session record's epoch (sessions/store.py): read as 0 from a record
written before it existed, kept through a write; and the writes of a connection
whose session was taken (its checkpoint, its QoS 2 window, its save at
disconnect) all fail their compare-and-set once the next connection wrote the
record with the epoch moved on."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from riverbed.errors import PreconditionFailed
from riverbed.sessions.store import NAMESPACE, SessionRecord, SessionStore
from riverbed.storage import Storage


def record(epoch: int = 0) -> SessionRecord:
    return SessionRecord("c", "s1", 5, 600, True, 1, node="node-a", epoch=epoch)


def test_a_record_without_an_epoch_reads_as_epoch_0(storage: Storage) -> None:
    raw = json.loads(record().to_json())
    del raw["epoch"]
    storage.kv_put(NAMESPACE, "c", json.dumps(raw).encode())
    stored = SessionStore(storage).load("c")
    assert stored is not None
    assert stored.record.epoch == 0
    assert stored.record == record()


def test_the_epoch_survives_a_write(storage: Storage) -> None:
    store = SessionStore(storage)
    store.write(record(epoch=7), None)
    stored = store.load("c")
    assert stored is not None and stored.record.epoch == 7


def test_the_old_connection_cannot_write_once_the_session_was_taken(storage: Storage) -> None:
    store = SessionStore(storage)
    old = store.write(record(epoch=3), None)
    # Another node's connection takes it (epoch + 1, its node).
    new = store.write(replace(old.record, epoch=4, node="node-b"), old.version)
    for attempt in (
        lambda: store.commit(old, {}, {1: 10}),  # a checkpoint
        lambda: store.write(replace(old.record, qos2=()), old.version),  # the QoS 2 window
        lambda: store.commit(replace(old, record=replace(old.record, connected=False)), {}, {}),
    ):
        with pytest.raises(PreconditionFailed):
            attempt()
    current = store.load("c")
    assert current is not None
    assert current == new
    assert current.record.epoch == 4 and current.record.node == "node-b"
