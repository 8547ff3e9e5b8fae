"""Lineage order: which streams a reader may read, and per-key order end to end."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.log.lineage import _by_lineage, predecessors, readable_streams
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.storage import open_storage
from riverbed.storage.base import StorageTopicRecord, StreamHead
from riverbed.subscriptions.named import Consumer, Subscriptions


def gen(generation: int, partitions: int, k: int) -> StorageTopicRecord:
    return StorageTopicRecord("t", generation, partitions, k)


def head(generation: int, partition: int, next_offset: int, sealed: bool) -> StreamHead:
    return StreamHead(key(generation, partition), StreamId("t", generation, partition), 0,
                      next_offset, sealed)  # fmt: skip


def key(generation: int, partition: int) -> int:
    return generation * 100 + partition


def readable_set(
    gens: list[StorageTopicRecord], heads: list[StreamHead], committed: dict[int, int]
) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    readable, consumed = readable_streams(gens, heads, committed)
    by_key = {h.key: (h.stream.generation, h.stream.partition) for h in heads}
    return {by_key[h.key] for h in readable}, {by_key[k] for k in consumed}


# --------------------------------------------------------------------- unit: predecessors


def test_predecessors_in_the_same_lineage() -> None:
    # 2 -> 4 (K=2): partitions 0, 1 refine lineage 0; 2, 3 lineage 1.
    assert list(predecessors(gen(0, 2, 1), gen(1, 4, 2), 0)) == [0]
    assert list(predecessors(gen(0, 2, 1), gen(1, 4, 2), 1)) == [0]
    assert list(predecessors(gen(0, 2, 1), gen(1, 4, 2), 3)) == [1]
    # 4 (K=2) -> 8 (K=4): lineage 1 is partitions 2, 3 before and 4..7 after.
    assert list(predecessors(gen(1, 4, 2), gen(2, 8, 4), 5)) == [2, 3]
    # Scale down to the base: 8 (K=4) -> 2 (K=1).
    assert list(predecessors(gen(1, 8, 4), gen(2, 2, 1), 1)) == [4, 5, 6, 7]
    # K=1 reset (base 4 -> 6): everything before.
    assert list(predecessors(gen(0, 4, 1), gen(1, 6, 1), 5)) == [0, 1, 2, 3]


# --------------------------------------------------------------------- unit: readable_streams


def test_single_generation_is_all_readable() -> None:
    heads = [head(0, p, 3, False) for p in range(4)]
    readable, consumed = readable_set([gen(0, 4, 1)], heads, {})
    assert readable == {(0, p) for p in range(4)}
    assert consumed == set()


@given(
    st.integers(0, 3),
    st.integers(1, 6),
    st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 5), st.integers(0, 5), st.booleans()),
        unique_by=lambda t: t[0],
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
def test_one_generation_answers_as_the_lineage_walk_does(
    generation: int,
    partitions: int,
    streams: list[tuple[int, int, int, bool]],
    random: object,
) -> None:
    """A topic with one generation (the shortcut): the same readable streams, in
    the same order, and the same consumed ones as the walk by lineage, whatever
    the order of the heads, their start, end and seal, the reader's cursors, and
    heads of partitions or generations the record does not have."""
    heads = [
        StreamHead(key(generation, p), StreamId("t", generation, p), start, start + more, sealed)
        for p, start, more, sealed in streams
    ]
    heads.append(head(generation + 1, 0, 3, False))  # not of this generation
    random.shuffle(heads)  # type: ignore[attr-defined]
    committed = {h.key: (h.next_offset + h.stream.partition) % 7 for h in heads}
    only = [gen(generation, partitions, 1)]
    assert readable_streams(only, heads, committed) == _by_lineage(only, heads, committed)


def test_next_generation_waits_for_its_lineage_sealed_and_consumed() -> None:
    gens = [gen(0, 2, 1), gen(1, 4, 2)]
    heads = [head(0, 0, 5, True), head(0, 1, 5, True)] + [head(1, p, 2, False) for p in range(4)]
    # Lineage 0 (gen0 p0) read to its end; lineage 1 (gen0 p1) not.
    readable, consumed = readable_set(gens, heads, {key(0, 0): 5, key(0, 1): 4})
    assert readable == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert consumed == {(0, 0)}
    # Everything read: all of gen 1 opens.
    readable, consumed = readable_set(gens, heads, {key(0, 0): 5, key(0, 1): 5})
    assert readable == {(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)}
    assert consumed == {(0, 0), (0, 1)}


def test_read_to_the_end_but_not_sealed_is_not_consumed() -> None:
    """A producer may still write to an unsealed stream: the next generation waits."""
    gens = [gen(0, 2, 1), gen(1, 4, 2)]
    heads = [head(0, 0, 5, False), head(0, 1, 0, False)] + [head(1, p, 0, False) for p in range(4)]
    readable, consumed = readable_set(gens, heads, {key(0, 0): 5})
    assert readable == {(0, 0), (0, 1)}
    assert consumed == set()


def test_an_empty_sealed_stream_with_nothing_before_it_is_consumed() -> None:
    gens = [gen(0, 2, 1), gen(1, 4, 2)]
    heads = [head(0, 0, 0, True), head(0, 1, 0, True)] + [head(1, p, 0, False) for p in range(4)]
    readable, consumed = readable_set(gens, heads, {})
    assert readable == {(0, 0), (0, 1), *((1, p) for p in range(4))}
    assert consumed == {(0, 0), (0, 1)}


def test_after_a_k1_reset_everything_before_must_be_consumed() -> None:
    gens = [gen(0, 4, 1), gen(1, 6, 1)]
    heads = [head(0, p, 3, True) for p in range(4)] + [head(1, p, 1, False) for p in range(6)]
    three_of_four = {key(0, p): 3 for p in range(3)}
    readable, _ = readable_set(gens, heads, three_of_four)
    assert readable == {(0, p) for p in range(4)}
    readable, consumed = readable_set(gens, heads, {**three_of_four, key(0, 3): 3})
    assert readable == {(0, p) for p in range(4)} | {(1, p) for p in range(6)}
    assert consumed == {(0, p) for p in range(4)}


def test_consumed_is_recursive_an_empty_stream_behind_unread_ones_does_not_count() -> None:
    """gen1 p0 is sealed and empty, but gen0 p0 before it is unread: gen1 p0 is not
    readable yet, so not consumed, and gen2 of lineage 0 must keep waiting."""
    gens = [gen(0, 2, 1), gen(1, 2, 1), gen(2, 4, 2)]
    heads = [
        head(0, 0, 5, True),  # unread
        head(0, 1, 0, True),
        head(1, 0, 0, True),  # empty, sealed
        head(1, 1, 0, True),
        *(head(2, p, 1, False) for p in range(4)),
    ]
    readable, consumed = readable_set(gens, heads, {})
    assert readable == {(0, 0), (0, 1), (1, 1), (2, 2), (2, 3)}
    assert (1, 0) not in consumed and (0, 0) not in consumed
    assert consumed == {(0, 1), (1, 1)}
    # Once gen0 p0 is read, the whole chain of lineage 0 opens.
    readable, consumed = readable_set(gens, heads, {key(0, 0): 5})
    assert readable == {(g, p) for g, n in ((0, 2), (1, 2), (2, 4)) for p in range(n)}
    assert consumed == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_a_reset_behind_a_scale_up_waits_for_the_whole_generation() -> None:
    # 2 -> 4 (K=2) -> 6 (K=1 reset).
    gens = [gen(0, 2, 1), gen(1, 4, 2), gen(2, 6, 1)]
    heads = [head(0, p, 1, True) for p in range(2)]
    heads += [head(1, p, 1, True) for p in range(4)]
    heads += [head(2, p, 1, False) for p in range(6)]
    committed = {key(0, 0): 1, key(0, 1): 1, key(1, 0): 1, key(1, 1): 1, key(1, 2): 1}
    readable, _ = readable_set(gens, heads, committed)
    assert not any(g == 2 for g, _ in readable)
    readable, _ = readable_set(gens, heads, {**committed, key(1, 3): 1})
    assert {(2, p) for p in range(6)} <= readable


def test_below_the_start_counts_as_at_the_start() -> None:
    """Retention may delete what a reader has not read (EXPIRED): a sealed stream
    whose retained range is empty is consumed, or later generations would wait forever."""
    gens = [gen(0, 1, 1), gen(1, 2, 2)]
    heads = [
        StreamHead(key(0, 0), StreamId("t", 0, 0), 10, 10, True),
        head(1, 0, 1, False),
        head(1, 1, 1, False),
    ]
    readable, consumed = readable_set(gens, heads, {key(0, 0): 4})
    assert consumed == {(0, 0)}
    assert readable == {(0, 0), (1, 0), (1, 1)}


# --------------------------------------------------------------------- end to end


KEYS = [f"key-{i}" for i in range(24)]


def produce_round(log: Log, round_: int, per_key: int) -> None:
    # Several keys per call, several calls: stream contents interleave keys.
    for i in range(per_key):
        log.produce("t", [Message(f"{k}:{round_}:{i}".encode(), key=k) for k in KEYS])


def read_everything(consumer: Consumer, batch: int) -> list[tuple[StreamId, str, int, int]]:
    out = []
    while True:
        got = consumer.poll(max_messages=batch)
        if not got:
            return out
        for d in got:
            k, r, i = d.message.payload.decode().split(":")
            assert k == d.message.key
            out.append((d.stream, k, int(r), int(i)))


def assert_per_key_order(read: list[tuple[StreamId, str, int, int]], expected: int) -> None:
    assert len(read) == expected
    by_key: dict[str, list[tuple[int, int]]] = {}
    for _, k, r, i in read:
        by_key.setdefault(k, []).append((r, i))
    for k, seq in by_key.items():
        assert seq == sorted(seq), k
        assert len(set(seq)) == len(seq), k


@pytest.mark.parametrize(
    ("partitions", "expected_k"),
    [([8], [2]), ([6], [1]), ([8, 16], [2, 4]), ([8, 6, 12], [2, 1, 2])],
    ids=["4-8", "4-6-reset", "4-8-16", "4-8-6-12"],
)
@pytest.mark.parametrize("batch", [3, 50])
def test_per_key_order_across_generations(
    log: Log, partitions: list[int], expected_k: list[int], batch: int
) -> None:
    log.topics.create("t", 4)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    per_key = 3
    produce_round(log, 0, per_key)
    for round_, (p, k) in enumerate(zip(partitions, expected_k, strict=True), start=1):
        assert log.topics.add_storage_topic("t", p).k == k
        produce_round(log, round_, 1)  # still into the old generation
        log.topics.switch_produce("t")
        produce_round(log, round_, per_key)
    rounds = len(partitions)
    expected = len(KEYS) * (per_key + rounds * (per_key + 1))
    consumer = subs.consumer("s")
    read = read_everything(consumer, batch)
    # Within a round the '1 message into the old generation' comes first.
    fixed = [(s, k, r * 10 + (0 if s.generation < r else 1), i) for s, k, r, i in read]
    assert_per_key_order(fixed, expected)
    assert {s.generation for s, *_ in read} == set(range(rounds + 1))


def test_a_consumer_in_the_middle_of_a_scale_up(log: Log) -> None:
    """The reader starts gen1 only when gen0 is sealed, even if it reads while
    producers are still writing to gen0."""
    log.topics.create("t", 2)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    consumer = subs.consumer("s")
    produce_round(log, 0, 2)
    log.topics.add_storage_topic("t", 4)
    read = read_everything(consumer, 5)
    assert all(s.generation == 0 for s, *_ in read)
    produce_round(log, 1, 1)  # more into gen0 after the reader caught up
    log.topics.switch_produce("t")
    produce_round(log, 2, 2)
    read += read_everything(consumer, 5)
    assert_per_key_order(read, len(KEYS) * 5)
    assert all(s.generation == (1 if r == 2 else 0) for s, _, r, _ in read)


rounds = st.lists(
    st.tuples(
        st.integers(0, 30),  # produce into the current generation
        st.one_of(st.none(), st.sampled_from([1, 2, 3, 4, 6, 8, 12])),  # AddStorageTopic
        st.integers(0, 10),  # produce again (still the old generation)
        st.booleans(),  # SwitchProduce
        st.one_of(st.none(), st.integers(1, 20)),  # a poll of this many
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 6]), rounds, st.integers(1, 5))
def test_per_key_order_under_any_scaling_history(
    first: int, script: list[tuple[int, int | None, int, bool, int | None]], drain_batch: int
) -> None:
    """Whatever the sequence of AddStorageTopic, SwitchProduce, produce and poll, a
    consumer sees every message once and each key's messages in produce order."""
    with tempfile.TemporaryDirectory() as directory:
        log = Log(open_storage(f"sqlite:///{directory}/r.db"))
        try:
            log.topics.create("t", first)
            subs = Subscriptions(log.storage)
            subs.create("s", "t")
            consumer = subs.consumer("s")
            sequence = 0
            seen: list[tuple[str, int]] = []

            def produce(count: int) -> None:
                nonlocal sequence
                numbers = range(sequence, sequence + count)
                log.produce("t", [Message(b"%d" % n, key=f"k{n % 10}") for n in numbers])
                sequence += count

            def take(batch: int) -> int:
                got = consumer.poll(max_messages=batch)
                seen.extend((d.message.key or "", int(d.message.payload)) for d in got)
                return len(got)

            for before, add, between, switch, poll in script:
                produce(before)
                if add is not None:
                    log.topics.add_storage_topic("t", add)
                produce(between)
                if switch:
                    log.topics.switch_produce("t")
                if poll is not None:
                    take(poll)
            while take(drain_batch):
                pass
            assert sorted(n for _, n in seen) == list(range(sequence))
            by_key: dict[str, list[int]] = {}
            for k, n in seen:
                by_key.setdefault(k, []).append(n)
            for k, numbers in by_key.items():
                assert numbers == sorted(numbers), k
        finally:
            log.close()
