"""The Leader over a filter that reaches two topics (a bound topic and `mqtt`)."""

from __future__ import annotations

import pytest

from riverbed.model import StreamId
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.leader import Effect, Leader, Send, StreamsRenewed, TopicStreams
from riverbed.sharedsub.protocol import Grant, GroupId, LeaderWanted, Revoke, UpdateProgress
from riverbed.storage.base import StorageTopicRecord, StreamHead

G = GroupId("g", "jobs/#")


def two_topics(jobs: int, mqtt: int) -> StreamsRenewed:
    found = []
    key = 0
    for topic, partitions in (("jobs", jobs), ("mqtt", mqtt)):
        heads = []
        for p in range(partitions):
            key += 1
            heads.append(StreamHead(key, StreamId(topic, 0, p), 0, 10, False))
        found.append(TopicStreams([StorageTopicRecord(topic, 0, partitions, 1)], heads))
    return StreamsRenewed(tuple(found))


def granted(effects: list[Effect]) -> list[StreamId]:
    return [
        e.message.stream for e in effects if isinstance(e, Send) and isinstance(e.message, Grant)
    ]


@pytest.mark.parametrize("jobs", [16, 4, 6])
def test_each_member_gets_part_of_every_topic(jobs: int) -> None:
    """Before, streams were lent in (topic, partition) order: of two members,
    one held all of `jobs` and the other all of `mqtt`, so one did all the
    work of the bound topic; by partition alone, the few streams of a small
    topic all came first, to one member."""
    leader = Leader("L", G, SharedSubConfig(), 0.0)
    leader.handle(two_topics(jobs, 16), 0.0)
    effects = leader.handle(LeaderWanted(G, "b1", 1), 0.0)
    for stream in granted(effects):
        leader.handle(UpdateProgress(G, "b1", "L", stream, 0), 0.0)
    effects = leader.handle(LeaderWanted(G, "b2", 1), 0.1)
    half = (jobs + 16) // 2
    assert leader.quotas() == {"b1": half, "b2": half}
    # b1 keeps half and gives back half (for b2): each half of every topic.
    kept = leader.holdings()["b1"]
    moving = [
        e.message.stream for e in effects if isinstance(e, Send) and isinstance(e.message, Revoke)
    ]
    assert len(kept) == len(moving) == half
    for topic, partitions in (("jobs", jobs), ("mqtt", 16)):
        assert [s.topic for s in kept].count(topic) == partitions // 2, kept
        assert [s.topic for s in moving].count(topic) == partitions // 2, moving
