"""`Inbound.committed`: a committed batch reaches the fan-out one run per stream."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from riverbed.metrics import Counts
from riverbed.model import Message, StoredMessage, StreamId
from riverbed.mqtt.inbound import Inbound
from riverbed.mqtt.pacer import TopicBatch
from riverbed.mqtt.protocol import ConnectionCore, ProtocolLimits

STREAMS = [StreamId("t", 0, p) for p in range(3)]


class Fanout:
    """Records `committed` calls as (stream, first, offsets)."""

    def __init__(self) -> None:
        self.calls: list[tuple[StreamId, int, list[int]]] = []

    def committed(self, stream: StreamId, first: int, rows: list[StoredMessage]) -> None:
        self.calls.append((stream, first, [r.offset for r in rows]))


def commit(placed: list[tuple[int, int]]) -> Fanout:
    """Hand `Inbound.committed` a batch whose messages landed at `placed`
    ((stream index, offset) each) and return what the fan-out was told."""
    fanout = Fanout()
    broker = SimpleNamespace(fanout=fanout, counts=Counts())  # only routing runs
    core = ConnectionCore(ProtocolLimits(), 0.0, new_client_id=str)
    inbound = Inbound(cast(Any, broker), core, apply=lambda effects: None, quickack=lambda: None)
    batch = TopicBatch(inbound, "t")
    batch.messages = [Message(b"%d" % i, key=None, mqtt_topic="t/x") for i in range(len(placed))]
    batch.positions = cast(Any, [(STREAMS[s], offset) for s, offset in placed])
    inbound.committed(batch)
    return fanout


def test_interleaved_streams_are_routed_one_run_each() -> None:
    # round robin over three streams, as key mode `none` spreads a publisher
    placed = [(i % 3, 10 + i // 3) for i in range(9)]
    assert commit(placed).calls == [
        (STREAMS[0], 10, [10, 11, 12]),
        (STREAMS[1], 10, [10, 11, 12]),
        (STREAMS[2], 10, [10, 11, 12]),
    ]


def test_a_gap_in_a_stream_starts_a_new_run_in_order() -> None:
    # another connection's messages took offsets 2 and 3 of stream 0 in between
    placed = [(0, 0), (1, 5), (0, 1), (0, 4), (1, 6)]
    assert commit(placed).calls == [
        (STREAMS[0], 0, [0, 1]),
        (STREAMS[0], 4, [4]),
        (STREAMS[1], 5, [5, 6]),
    ]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), max_size=40))
def test_every_message_is_routed_once_in_stream_order_in_contiguous_runs(
    steps: list[tuple[int, int]],
) -> None:
    """Per stream, offsets rise (with gaps where others appended): the fan-out
    gets each message once, each run contiguous, each stream's runs in order."""
    nexts = [0, 0, 0]
    placed = []
    for stream, advance in steps:
        nexts[stream] += advance - 1  # advance 1: no gap
        placed.append((stream, nexts[stream]))
        nexts[stream] += 1
    calls = commit(placed).calls
    for index, stream in enumerate(STREAMS):
        mine = [offsets for s, _, offsets in calls if s == stream]
        assert [o for offsets in mine for o in offsets] == [o for s, o in placed if s == index]
        for first, offsets in [(f, o) for s, f, o in calls if s == stream]:
            assert offsets == list(range(first, first + len(offsets)))
