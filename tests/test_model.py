"""Message ids, durations and properties (riverbed.model)."""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.clock import FakeClock
from riverbed.errors import InvalidInput
from riverbed.model import (
    Message,
    MessageId,
    MessageIdGenerator,
    StreamId,
    decode_properties,
    encode_properties,
    format_duration,
    parse_duration,
)

U64 = st.integers(0, (1 << 64) - 1)
U48 = st.integers(0, (1 << 48) - 1)
U16 = st.integers(0, (1 << 16) - 1)


# --------------------------------------------------------------------- MessageId


@given(U64, U48, U16)
def test_message_id_compose_parse_bytes_round_trip(ts: int, node: int, seq: int) -> None:
    mid = MessageId.compose(ts, node, seq)
    assert (mid.timestamp_us, mid.node, mid.sequence) == (ts, node, seq)
    assert MessageId.parse(str(mid)) == mid
    assert MessageId.from_bytes(mid.to_bytes()) == mid
    assert len(mid.to_bytes()) == 16
    assert len(str(mid)) == 32


@given(st.tuples(U64, U48, U16), st.tuples(U64, U48, U16))
def test_message_id_order_is_time_then_node_then_sequence(
    a: tuple[int, int, int], b: tuple[int, int, int]
) -> None:
    ida, idb = MessageId.compose(*a), MessageId.compose(*b)
    assert (ida < idb) == (a < b)
    # Byte order is id order: storage sorts ids as blobs.
    assert (ida.to_bytes() < idb.to_bytes()) == (a < b)


def test_message_id_known_layout() -> None:
    mid = MessageId.compose(1, 2, 3)
    assert str(mid) == "0000000000000001" + "000000000002" + "0003"


@pytest.mark.parametrize(
    ("ts", "node", "seq"),
    [(-1, 0, 0), (1 << 64, 0, 0), (0, -1, 0), (0, 1 << 48, 0), (0, 0, -1), (0, 0, 1 << 16)],
)
def test_message_id_compose_refuses_out_of_range(ts: int, node: int, seq: int) -> None:
    with pytest.raises(InvalidInput) as caught:
        MessageId.compose(ts, node, seq)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "text",
    [
        *("", "0" * 31, "0" * 33, "g" * 32, " " + "0" * 31, "-" + "0" * 31, "0x" + "0" * 30),
        *("+" + "0" * 31, "0_" + "0" * 30, "0" * 31 + "\n", "٣" * 32),
    ],
)
def test_message_id_parse_refuses_bad_text(text: str) -> None:
    with pytest.raises(InvalidInput, match="message id"):
        MessageId.parse(text)


@pytest.mark.parametrize("raw", [b"", b"\x00" * 15, b"\x00" * 17])
def test_message_id_from_bytes_refuses_wrong_length(raw: bytes) -> None:
    with pytest.raises(InvalidInput, match="16 bytes"):
        MessageId.from_bytes(raw)


@pytest.mark.parametrize("value", [-1, 1 << 128])
def test_message_id_refuses_values_beyond_128_bits(value: int) -> None:
    with pytest.raises(InvalidInput):
        MessageId(value)


# --------------------------------------------------------------------- MessageIdGenerator


# A step moves the clock (read in ns) this many ns before the next id; 0 stands still.
clock_steps = st.lists(
    st.one_of(
        st.just(0),
        st.integers(-5_000_000, -1),  # steps back
        st.integers(1, 999),  # within the same µs
        st.integers(1_000, 10**12),  # jumps forward
    ),
    min_size=1,
    max_size=300,
)


@given(st.integers(0, 2**62), clock_steps, U48)
def test_generator_ids_strictly_increase_whatever_the_clock_does(
    start: int, steps: list[int], node: int
) -> None:
    clock = FakeClock(ns=start)
    gen = MessageIdGenerator(node=node, clock=clock.ns)
    previous = gen.next_id()
    for step in steps:
        clock.advance(ns=step)  # never below 0
        current = gen.next_id()
        assert current > previous
        assert current.node == node
        previous = current


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 2**62),
    st.lists(
        st.tuples(
            st.integers(-3_000, 3_000),
            st.one_of(st.integers(0, 10), st.integers(65_530, 65_540)),
        ),
        max_size=6,
    ),
)
def test_reserved_and_single_ids_strictly_increase_together(
    start: int, script: list[tuple[int, int]]
) -> None:
    """`reserve(n)` (a batch) and `next_raw` (one) share the sequence: whatever the
    clock does, all ids of one generator strictly increase; n may pass 65,536."""
    clock = FakeClock(ns=start)
    gen = MessageIdGenerator(node=9, clock=clock.ns)
    previous = -1
    for step, count in script:
        clock.advance(ns=step)  # never below 0
        reserved = gen.reserve(count)
        values = [previous] + [int.from_bytes(b, "big") for b, _ in reserved]
        assert all(a < b for a, b in itertools.pairwise(values))
        assert all(v >> 64 == ts for v, (_, ts) in zip(values[1:], reserved, strict=True))
        assert all(MessageId(v).node == 9 for v in values[1::1000])
        previous = values[-1]
        raw, ts = gen.next_raw()
        assert raw > previous and raw >> 64 == ts
        previous = raw


def test_reserve_more_than_a_microsecond_of_sequence() -> None:
    gen = MessageIdGenerator(node=1, clock=FakeClock(ns=7_000).ns)  # 7 µs, standing still
    ids = [MessageId.from_bytes(b) for b, _ in gen.reserve(65_536 * 2 + 1)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert [(i.timestamp_us, i.sequence) for i in (ids[0], ids[65_535], ids[65_536], ids[-1])] == [
        (7, 0),
        (7, 65_535),
        (8, 0),
        (9, 0),
    ]
    assert gen.next_id() == MessageId.compose(9, 1, 1)


def test_generator_sequence_overflow_borrows_the_next_microsecond() -> None:
    clock = FakeClock(ns=5_000_000_000)  # 5_000_000 µs, standing still
    gen = MessageIdGenerator(node=7, clock=clock.ns)
    ids = [gen.next_id() for _ in range(65_536 * 2 + 10)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert ids[0].timestamp_us == 5_000_000 and ids[0].sequence == 0
    assert ids[65_535].timestamp_us == 5_000_000 and ids[65_535].sequence == 65_535
    assert ids[65_536].timestamp_us == 5_000_001 and ids[65_536].sequence == 0
    assert ids[2 * 65_536].timestamp_us == 5_000_002
    # When the clock passes the borrowed time, ids follow the clock again.
    clock.advance(ns=4_000_000_000)  # to 9_000_000 µs
    caught_up = gen.next_id()
    assert caught_up.timestamp_us == 9_000_000 and caught_up.sequence == 0
    # When it sits on the borrowed µs, the sequence keeps counting there.
    gen2 = MessageIdGenerator(node=7, clock=FakeClock(ns=1_000).ns)
    for _ in range(65_537):
        last = gen2.next_id()
    assert (last.timestamp_us, last.sequence) == (2, 0)
    clock2 = FakeClock(ns=2_000)
    gen2._clock = clock2.ns  # the clock reaches the borrowed µs
    assert gen2.next_id() == MessageId.compose(2, 7, 1)


def test_generator_next_raw_agrees_with_next_id() -> None:
    gen = MessageIdGenerator(node=3, clock=FakeClock(ns=123_456_789).ns)
    raw, ts = gen.next_raw()
    mid = MessageId(raw)
    assert mid.timestamp_us == ts == 123_456
    assert mid.node == 3


@settings(max_examples=30)
@given(
    st.lists(st.integers(-2_000_000, 2_000_000), min_size=1, max_size=200),
    st.integers(0, (1 << 48) - 2),
)
def test_two_generators_with_different_nodes_never_collide(steps: list[int], node: int) -> None:
    clock = FakeClock(ns=10**15)
    a = MessageIdGenerator(node=node, clock=clock.ns)
    b = MessageIdGenerator(node=node + 1, clock=clock.ns)
    seen: set[MessageId] = set()
    for step in steps:
        clock.advance(ns=step)
        for gen in (a, b):
            mid = gen.next_id()
            assert mid not in seen
            seen.add(mid)


def test_generator_is_thread_safe() -> None:
    clock = FakeClock(ns=10**15)  # standing still: every id shares the sequence
    gen = MessageIdGenerator(node=1, clock=clock.ns)
    results: list[list[MessageId]] = [[] for _ in range(4)]

    def mint(out: list[MessageId]) -> None:
        for _ in range(20_000):
            out.append(gen.next_id())

    threads = [threading.Thread(target=mint, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [mid for out in results for mid in out]
    assert len(set(everything)) == len(everything)
    for out in results:  # each thread saw its own ids increase
        assert all(x < y for x, y in itertools.pairwise(out))


@pytest.mark.parametrize("node", [-1, 1 << 48])
def test_generator_refuses_bad_node(node: int) -> None:
    with pytest.raises(InvalidInput, match="node"):
        MessageIdGenerator(node=node)


def test_generator_default_clock_and_node() -> None:
    gen = MessageIdGenerator()
    assert 0 <= gen.node < 1 << 48
    a, b = gen.next_id(), gen.next_id()
    assert a < b


# --------------------------------------------------------------------- StreamId


@given(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,20}", fullmatch=True),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_stream_id_round_trip(topic: str, generation: int, partition: int) -> None:
    sid = StreamId(topic, generation, partition)
    assert StreamId.parse(str(sid)) == sid


@pytest.mark.parametrize(
    "text", ["", "t", "t/1", "/1/2", "t/x/2", "t/1/-2", "t/1/", "t/²/1", "t/1/ 2", "t/+1/2"]
)
def test_stream_id_parse_refuses_bad_text(text: str) -> None:
    with pytest.raises(InvalidInput, match="topic/generation/partition"):
        StreamId.parse(text)


# --------------------------------------------------------------------- durations


@given(st.integers(0, 10**15))
def test_format_then_parse_duration_round_trips(micros: int) -> None:
    text = format_duration(micros)
    assert parse_duration(text) == micros
    assert " " not in text


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["us", "ms", "s", "m", "h", "d", "w"])),
        min_size=1,
        max_size=5,
    )
)
def test_parse_duration_of_combinations(parts: list[tuple[int, str]]) -> None:
    size = {"us": 1, "ms": 10**3, "s": 10**6, "m": 6 * 10**7, "h": 36 * 10**8}
    size["d"] = 24 * size["h"]
    size["w"] = 7 * size["d"]
    text = "".join(f"{n}{u}" for n, u in parts)
    expected = sum(n * size[u] for n, u in parts)
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        *(("500ms", 500_000), ("30s", 30_000_000), ("15m", 900_000_000)),
        *(("7d", 604_800_000_000), ("1h30m", 5_400_000_000), (" 2W ", 1_209_600_000_000)),
        *(("0s", 0), ("250us", 250)),
    ],
)
def test_parse_duration_examples(text: str, micros: int) -> None:
    assert parse_duration(text) == micros


@pytest.mark.parametrize(
    ("micros", "text"),
    [(0, "0us"), (1, "1us"), (1_000, "1ms"), (90_000_000, "90s"), (604_800_000_000, "1w")],
)
def test_format_duration_examples(micros: int, text: str) -> None:
    assert format_duration(micros) == text


@pytest.mark.parametrize(
    "text",
    [
        *("", "   ", "5", "s", "5x", "-5s", "1.5s", "5 s", "1m30", "ms", "1h 30m", "5sec"),
        *("+5s", "٣s", "5s\x00"),
    ],
)
def test_parse_duration_refuses_bad_text_naming_it(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("value", [5, None, b"5s", 1.5])
def test_parse_duration_refuses_non_strings(value: object) -> None:
    with pytest.raises(InvalidInput, match=repr(value).replace("(", r"\(")):
        parse_duration(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------- properties

property_values = st.one_of(st.text(max_size=20), st.binary(max_size=20), st.integers())
property_lists = st.lists(
    st.tuples(st.sampled_from(["a", "key", "content-type", "ü", ""]), property_values),
    max_size=8,
)


@given(property_lists)
def test_properties_round_trip(pairs: list[tuple[str, str | bytes | int]]) -> None:
    props = tuple(pairs)
    blob = encode_properties(props)
    assert decode_properties(blob) == props
    # Types survive, not just equality (b"1" vs "1").
    assert [type(v) for _, v in decode_properties(blob)] == [type(v) for _, v in props]


def test_properties_keep_repeated_names_in_order() -> None:
    props = (("k", "1"), ("k", b"\x00\xff"), ("x", 3), ("k", "2"))
    assert decode_properties(encode_properties(props)) == props


def test_no_properties_encode_to_none() -> None:
    assert encode_properties(()) is None
    assert decode_properties(None) == ()
    assert decode_properties(b"") == ()


@pytest.mark.parametrize(
    "bad", [(("a", 1.5),), (("a", True),), (("a", None),), (("a", ["x"]),), ((1, "v"),)]
)
def test_properties_refuse_bad_types(bad: tuple[tuple[object, object], ...]) -> None:
    with pytest.raises(InvalidInput):
        encode_properties(bad)  # type: ignore[arg-type]


def test_message_validates_itself() -> None:
    with pytest.raises(InvalidInput, match="payload"):
        Message("text")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="qos"):
        Message(b"x", qos=3)
