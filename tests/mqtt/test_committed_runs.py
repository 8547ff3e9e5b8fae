"""The broker hands what it committed to the fan-out as runs of rows, one per
stream and consecutive offsets (`mqtt.messages.committed_runs`), from the
positions the log's appender returns (`log.appender.Positions`), with a fast
path for a batch that went to one stream in order."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.mqtt.messages import committed_runs

PARTITIONS = 4
KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "e"]))


@pytest.fixture(scope="module")
def log() -> Iterator[Log]:
    """One log for every example (a topic of a few partitions, nothing read back)."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        Log.open(f"sqlite:///{Path(tmp) / 'r.db'}") as opened,
    ):
        opened.topics.create("t", PARTITIONS)
        yield opened


def _messages(keys: list[str | None], tag: str) -> list[Message]:
    return [Message(f"{tag}{i}".encode(), key=key) for i, key in enumerate(keys)]


@settings(max_examples=60, deadline=None)
@given(
    before=st.lists(KEYS, max_size=5),
    keys=st.lists(KEYS, min_size=1, max_size=12),
    after=st.lists(KEYS, max_size=5),
)
def test_runs_put_every_message_where_the_log_did_in_order(
    log: Log, before: list[str | None], keys: list[str | None], after: list[str | None]
) -> None:
    """A batch in the middle of a shared commit (others' messages before and
    after it): every one of its messages is in exactly one run, at the position
    the log gave it, each run's offsets consecutive, in the batch's order per
    stream."""
    mine = _messages(keys, "m")
    positions = log.produce("t", [*_messages(before, "x"), *mine, *_messages(after, "y")])
    start = len(before)

    placed: dict[tuple[StreamId, int], bytes] = {}
    order: dict[StreamId, list[int]] = {}
    for stream, first, rows in committed_runs(mine, positions, start):
        assert rows
        assert [r.offset for r in rows] == list(range(first, first + len(rows)))
        for row in rows:
            assert (stream, row.offset) not in placed
            placed[(stream, row.offset)] = row.payload
            order.setdefault(stream, []).append(row.offset)
    assert placed == {positions[start + i]: m.payload for i, m in enumerate(mine)}
    for offsets in order.values():
        assert offsets == sorted(offsets)


def test_a_batch_of_one_key_is_one_run_found_without_a_lookup_per_message(log: Log) -> None:
    mine = _messages(["k"] * 5, "m")
    positions = log.produce("t", mine)
    run = positions.run(0, len(mine))
    assert run is not None and [positions[i] for i in range(5)] == [
        (run[0], run[1] + i) for i in range(5)
    ]
    ((stream, first, rows),) = committed_runs(mine, positions)
    assert (stream, first) == run
    assert [r.payload for r in rows] == [m.payload for m in mine]
    # Spread over streams: no single run, each message found by its position.
    spread = log.produce("t", _messages(["a", "b", "c", "d", "e"], "s"))
    assert len({s for s, _ in spread}) > 1
    assert spread.run(0, 5) is None


def test_nothing_committed_makes_no_run(log: Log) -> None:
    assert list(committed_runs([], log.produce("t", _messages(["k"], "z")), 1)) == []


def test_runs_are_what_a_reader_reads_back_there(log: Log) -> None:
    """Built from the rows the appender stored: each message with its id, time,
    key and encoded properties as a read at its position returns them."""
    mine = [
        Message(b"p0", key="a", mqtt_topic="x/0", properties=(("\x00client", "c1"),), qos=1),
        Message(b"p1", key="b", mqtt_topic="x/1", properties=(("u", "v"),), retain=True),
        Message(b"p2", key="a", mqtt_topic="x/2", qos=2),
    ]
    positions = log.produce("t", [*_messages(["c"], "x"), *mine])
    runs = list(committed_runs(mine, positions, 1))
    assert sum(len(rows) for _, _, rows in runs) == len(mine)
    for stream, first, rows in runs:
        key = log.storage.list_streams("t")
        (stored_key,) = [h.key for h in key if h.stream == stream]
        assert rows == log.storage.read(stored_key, first, len(rows))
