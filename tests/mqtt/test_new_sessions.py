"""A client id the broker has seen no record of gets its session made without a
read first; a record made meanwhile by another process is still found (the
create is refused by its compare-and-set), in process, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from harness.inprocess import running_broker
from harness.raw_mqtt import AsyncRawClient
from riverbed.clock import now_us
from riverbed.mqtt.broker import Broker
from riverbed.sessions.store import NAMESPACE, SessionRecord, SessionStore
from riverbed.storage import open_storage


def _count_record_reads(broker: Broker) -> list[str]:
    """The client ids of every read of session records from the storage."""
    calls: list[str] = []
    storage = broker.store.storage
    kv_get, kv_get_many = storage.kv_get, storage.kv_get_many

    def counting_get(namespace: str, key: str) -> Any:
        if namespace == NAMESPACE:
            calls.append(key)
        return kv_get(namespace, key)

    def counting_get_many(namespace: str, keys: Sequence[str]) -> Any:
        if namespace == NAMESPACE:
            calls.extend(keys)
        return kv_get_many(namespace, keys)

    storage.kv_get = counting_get  # type: ignore[method-assign]
    storage.kv_get_many = counting_get_many  # type: ignore[method-assign]
    return calls


def _made_elsewhere(url: str, client_id: str) -> SessionRecord:
    """A disconnected session record written by another process's store."""
    storage = open_storage(url)
    try:
        at = now_us()
        record = SessionRecord(client_id, "made-elsewhere", 5, 300, False, at, at, epoch=3)
        SessionStore(storage).write(record, None)
        return record
    finally:
        storage.close()


def test_a_new_client_gets_its_session_without_a_read(storage_url: str) -> None:
    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            reads = _count_record_reads(broker)
            client = await AsyncRawClient.open(broker.port)
            assert not (await client.connect("new", expiry=300)).session_present
            await client.subscribe("a/#", 1)
            await client.leave()
            assert reads == []
            stored = broker.store.load("new")
            assert stored is not None and stored.record.epoch == 0
            reads.clear()
            # Known now, and saved here at its disconnect: coming back resumes
            # it from what the save left, without a read either.
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("new", expiry=300)).session_present
            await client.leave()
            assert reads == []
            resumed = broker.store.load("new")
            assert resumed is not None
            assert resumed.record.session_id == stored.record.session_id
            assert resumed.record.epoch == 1

    asyncio.run(scenario())


def test_a_record_made_elsewhere_since_is_resumed_not_overwritten(storage_url: str) -> None:
    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            reads = _count_record_reads(broker)
            made = await asyncio.to_thread(_made_elsewhere, storage_url, "roams")
            assert not broker.store.known("roams")
            client = await AsyncRawClient.open(broker.port)
            assert (await client.connect("roams", expiry=300)).session_present
            await client.leave()
            assert reads == ["roams"]  # the create was refused, then it was read
            stored = broker.store.load("roams")
            assert stored is not None
            assert stored.record.session_id == made.session_id
            assert stored.record.epoch == made.epoch + 1

    asyncio.run(scenario())


def test_a_clean_start_over_a_record_made_elsewhere_replaces_it(storage_url: str) -> None:
    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            made = await asyncio.to_thread(_made_elsewhere, storage_url, "fresh")
            client = await AsyncRawClient.open(broker.port)
            assert not (await client.connect("fresh", expiry=300, clean=True)).session_present
            await client.leave()
            stored = broker.store.load("fresh")
            assert stored is not None
            assert stored.record.session_id != made.session_id
            assert stored.record.epoch == made.epoch + 1

    asyncio.run(scenario())
