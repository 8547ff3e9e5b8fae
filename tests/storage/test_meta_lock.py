"""New subscriptions and metadata changes on PostgreSQL (`_lock_meta`).

A subscription reads its topic's streams as no metadata change in progress
leaves them: creating one is excluded by a topic's scale-up or deletion and by
retention's deletion of what every subscription has consumed (all of which
take the metadata lock), but not by another new subscription. Sessions'
SUBSCRIBEs on every node make their cursors at once, where they used to queue
behind one another's transactions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from harness.waiting import eventually
from riverbed.log.topics import Topics
from riverbed.storage import Storage, open_storage
from riverbed.storage.base import StartKind, StreamHead, SubscriptionRecord
from riverbed.storage.transactions import create_subscription_in, transaction


@pytest.fixture
def storages(postgres_url: str) -> Iterator[list[Storage]]:
    opened = [open_storage(postgres_url) for _ in range(3)]
    yield opened
    for storage in opened:
        storage.close()


def _record(name: str) -> SubscriptionRecord:
    return SubscriptionRecord(name, "t", None, StartKind.LATEST, None, 1)


def _at_heads(heads: list[StreamHead]) -> dict[int, int]:
    return {h.key: h.next_offset for h in heads}


def _waiting_for_advisory_locks(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_new_subscriptions_do_not_wait_for_one_another_but_a_scale_up_waits(
    storages: list[Storage], postgres_url: str
) -> None:
    a, b, c = storages
    Topics(a).create("t", 2)
    created = threading.Event()
    scaled = threading.Event()

    def other_subscription() -> None:
        b.create_subscription(_record("s2"), _at_heads)
        created.set()

    def scale_up() -> None:
        Topics(c).add_storage_topic("t", 4)
        scaled.set()

    threads = [threading.Thread(target=other_subscription), threading.Thread(target=scale_up)]
    with transaction(a) as tx:
        create_subscription_in(tx, _record("s1"), _at_heads)
        threads[0].start()
        eventually(created.is_set, what="the other subscription made while the first is open")
        threads[1].start()
        eventually(
            lambda: _waiting_for_advisory_locks(postgres_url) == 1,
            what="the scale-up waiting for the open subscription's transaction",
        )
        assert not scaled.is_set()
    eventually(scaled.is_set, what="the scale-up once the subscription is committed")
    for thread in threads:
        thread.join(30)
    assert {s.name for s in a.list_subscriptions()} == {"s1", "s2"}
    # The scale-up came after both: each has a cursor on every stream of the
    # generation it saw, none on the new one's.
    assert len(a.get_cursors("s1")) == len(a.get_cursors("s2")) == 2
