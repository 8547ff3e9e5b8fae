"""The driver's decisions without Spark: offsets, admission control, partitions,
MQTT filters as Arrow regexes."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from riverbed.model import StreamId
from riverbed.spark.options import Ordering
from riverbed.spark.planning import Range, filter_regex, next_offsets, ranges, share, split
from riverbed.storage.base import StorageTopicRecord, StreamHead
from riverbed.topics.filters import matches


def heads_of(*specs: tuple[int, int, int, bool]) -> list[StreamHead]:
    """(generation, partition, next_offset, sealed) -> heads of topic `t`, keys 1..n."""
    return [
        StreamHead(i, StreamId("t", g, p), 0, n, sealed)
        for i, (g, p, n, sealed) in enumerate(specs, start=1)
    ]


GEN0 = StorageTopicRecord("t", 0, 2, 1)
GEN1 = StorageTopicRecord("t", 1, 4, 2)  # scale-up: lineage j // 2


def test_share_is_fair_and_never_exceeds_budget_or_wants() -> None:
    assert share({"a": 10, "b": 10}, 6) == {"a": 3, "b": 3}
    assert share({"a": 1, "b": 10}, 6) == {"a": 1, "b": 5}
    assert share({"a": 10, "b": 10, "c": 10}, 4) == {"a": 2, "b": 1, "c": 1}
    assert share({"a": 2, "b": 3}, 100) == {"a": 2, "b": 3}
    assert share({"a": 0}, 5) == {}


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 50)), st.integers(1, 200))
def test_share_properties(wanted: dict[str, int], budget: int) -> None:
    granted = share(wanted, budget)
    assert sum(granted.values()) == min(budget, sum(wanted.values()))
    assert all(0 < granted[n] <= wanted[n] for n in granted)


def test_new_streams_join_at_their_initial_position_and_move_only_later() -> None:
    heads = heads_of((0, 0, 5, False), (0, 1, 7, False))
    end = next_offsets({"t/0/0": 0}, heads, [GEN0], {2: 3}, Ordering.STRICT)
    assert end == {"t/0/0": 5, "t/0/1": 3}
    assert next_offsets(end, heads, [GEN0], {}, Ordering.STRICT) == {"t/0/0": 5, "t/0/1": 7}


def test_strict_ordering_plans_a_generation_after_its_lineage_is_consumed() -> None:
    heads = heads_of(
        (0, 0, 5, True), (0, 1, 4, True),
        (1, 0, 2, False), (1, 1, 2, False), (1, 2, 2, False), (1, 3, 2, False),
    )  # fmt: skip
    start = {"t/0/0": 0, "t/0/1": 4, "t/1/0": 0, "t/1/1": 0, "t/1/2": 0, "t/1/3": 0}
    end = next_offsets(start, heads, [GEN0, GEN1], {}, Ordering.STRICT)
    # Lineage 1 (gen-1 partitions 2, 3) waited for gen-0 partition 1 only: done.
    assert end == {**start, "t/0/0": 5, "t/1/2": 2, "t/1/3": 2}
    # Once gen-0 partition 0 is consumed, lineage 0 of gen 1 follows.
    assert next_offsets(end, heads, [GEN0, GEN1], {}, Ordering.STRICT) == {
        **end,
        "t/1/0": 2,
        "t/1/1": 2,
    }
    relaxed = next_offsets(start, heads, [GEN0, GEN1], {}, Ordering.RELAXED)
    assert relaxed == {"t/0/0": 5, "t/0/1": 4, "t/1/0": 2, "t/1/1": 2, "t/1/2": 2, "t/1/3": 2}


def test_admission_control_and_available_now_target() -> None:
    heads = heads_of((0, 0, 100, False), (0, 1, 100, False))
    start = {"t/0/0": 0, "t/0/1": 90}
    assert next_offsets(start, heads, [GEN0], {}, Ordering.STRICT, 30) == {
        "t/0/0": 20,
        "t/0/1": 100,
    }
    target = {"t/0/0": 50, "t/0/1": 95}
    assert next_offsets(start, heads, [GEN0], {}, Ordering.STRICT, None, target) == target
    # A stream that appeared after the target was taken stays out.
    more = heads_of((0, 0, 100, False), (0, 1, 100, False), (0, 2, 10, False))
    assert next_offsets(target, more, [GEN0], {}, Ordering.STRICT, None, target) == target


def test_ranges_and_split_are_deterministic_and_bounded() -> None:
    heads = heads_of((0, 0, 100, False), (0, 1, 100, False), (0, 2, 100, False))
    found = ranges({"t/0/0": 10, "t/0/1": 100}, {"t/0/0": 95, "t/0/1": 100, "t/0/2": 5}, heads)
    assert found == [Range(1, "t", 0, 0, 10, 95)]  # t/0/2 only joined; t/0/1 is empty
    items = [Range(1, "t", 0, 0, 0, 95), Range(2, "t", 0, 1, 0, 3), Range(3, "t", 0, 2, 0, 2)]
    groups = split(items, 40, 1)
    assert all(sum(r.size for r in g) <= 40 for g in groups)
    assert sum(r.size for g in groups for r in g) == 100
    assert groups == split(items, 40, 1)
    assert len(split(items, 1000, 4)) == 4  # every core gets work
    assert split([Range(1, "t", 0, 0, 0, 1), Range(2, "t", 0, 1, 0, 1)], 1000, 2) != []


LEVELS = st.sampled_from(["a", "b", "", "$s", "x.y", "+", "#", "ü"])


@given(st.lists(LEVELS, min_size=1, max_size=4), st.lists(LEVELS, min_size=1, max_size=4))
def test_filter_regex_matches_what_matches_matches(
    f_levels: list[str], n_levels: list[str]
) -> None:
    # Valid filters: '#' last only; names without wildcards.
    if "#" in f_levels[:-1]:
        f_levels = [lv for lv in f_levels if lv != "#"] or ["a"]
    names = [lv for lv in n_levels if lv not in ("+", "#")] or ["a"]
    topic_filter, name = "/".join(f_levels), "/".join(names)
    regex = re.fullmatch(filter_regex(topic_filter).replace("(?s)", ""), name, re.S) is not None
    if topic_filter[:1] in ("+", "#") and name.startswith("$"):
        regex = False  # the caller's separate check
    assert regex == matches(topic_filter, name)
