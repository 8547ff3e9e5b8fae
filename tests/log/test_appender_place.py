"""`Appender.append_once(..., place=...)`: rows written to the partitions a
caller picks (a subscription shard's own range of its retry queue, issue 7),
exactly once per marker, on both backends; a partition outside the produce
generation is refused and nothing is written."""

from __future__ import annotations

import pytest

from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.storage.base import Row
from riverbed.subscriptions.shards import queue_partition


def rows(log: Log, keys: list[str]) -> list[Row]:
    ids = log.appender.ids.reserve(len(keys))
    return [
        (id_bytes, ts, "", key, f"{key}:{n}".encode(), None, 1, 0)
        for n, ((id_bytes, ts), key) in enumerate(zip(ids, keys, strict=True))
    ]


def test_rows_go_to_the_partitions_placed(storage_url: str) -> None:
    with Log.open(storage_url) as log:
        log.topics.create("billing.rq", 8)
        batch = rows(log, [f"g{n % 5}" for n in range(20)])

        def shard_two(h: int, partitions: int, k: int) -> int:
            return queue_partition(2, 4, h, partitions)

        firsts = log.appender.append_once("billing.rq", batch, "billing/2/batch-1", shard_two)
        assert firsts is not None
        heads = {h.stream.partition: h.next_offset for h in log.storage.list_streams("billing.rq")}
        assert {p for p, n in heads.items() if n} <= {4, 5}  # shard 2 of 4 owns 4-5
        assert sum(heads.values()) == 20
        # The same marker again: nothing more.
        assert log.appender.append_once("billing.rq", batch, "billing/2/batch-1", shard_two) is None
        again = {h.stream.partition: h.next_offset for h in log.storage.list_streams("billing.rq")}
        assert again == heads


def test_a_partition_outside_the_generation_is_refused(storage_url: str) -> None:
    with Log.open(storage_url) as log:
        log.topics.create("billing.rq", 4)
        batch = rows(log, ["g1", "g2"])
        with pytest.raises(InvalidInput, match=r"partition 4 for topic 'billing\.rq'"):
            log.appender.append_once("billing.rq", batch, "m", lambda h, p, k: 4)
        assert all(h.next_offset == 0 for h in log.storage.list_streams("billing.rq"))
        # The marker was not used up.
        assert log.appender.append_once("billing.rq", batch, "m", lambda h, p, k: 0) is not None
