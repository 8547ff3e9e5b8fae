"""The topic trie: `match` returns exactly what a scan of every filter with
`matches` returns, through any sequence of adds and removes, and removing
everything leaves no node behind.

`bench/trie.py` measures its speed against that scan.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from harness.topic_examples import MATCH_EXAMPLES
from riverbed.errors import InvalidTopicFilter
from riverbed.topics.filters import matches
from riverbed.topics.trie import TopicTrie

NAME_LEVELS = ["a", "b", "$s", ""]

names = st.lists(st.sampled_from(NAME_LEVELS), min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn, max_levels: int = 4) -> str:
    """Valid filters over NAME_LEVELS, with and without wildcards."""
    levels = draw(st.lists(st.sampled_from([*NAME_LEVELS, "+"]), min_size=0, max_size=max_levels))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "#"


def all_names(max_depth: int) -> list[str]:
    out = []
    for depth in range(1, max_depth + 1):
        for levels in itertools.product(NAME_LEVELS, repeat=depth):
            if name := "/".join(levels):
                out.append(name)
    return out


NAMES_4 = all_names(4)


def scan(pairs: Counter[tuple[str, int]] | set[tuple[str, int]], name: str) -> Counter[int]:
    """What `match` must return, by brute force."""
    return Counter(value for topic_filter, value in pairs if matches(topic_filter, name))


# --------------------------------------------------------------------- examples


@pytest.mark.parametrize(("topic_filter", "name", "expected"), MATCH_EXAMPLES)
def test_spec_examples(topic_filter: str, name: str, expected: bool) -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add(topic_filter, "s")
    assert trie.match(name) == (["s"] if expected else [])


def test_a_value_is_returned_once_per_matching_filter() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for topic_filter in ("a/+", "a/#", "a/b", "#", "b/#"):
        trie.add(topic_filter, "s1")
    trie.add("a/b", "s2")
    assert Counter(trie.match("a/b")) == Counter({"s1": 4, "s2": 1})
    assert trie.match("$a/b") == []


def test_add_and_remove_report_whether_anything_changed() -> None:
    trie: TopicTrie[int] = TopicTrie()
    assert trie.add("a/+", 1) is True
    assert trie.add("a/+", 1) is False
    assert trie.add("a/b", 1) is True
    assert trie.add("a/b", 1) is False
    assert len(trie) == 2
    assert trie.remove("a/+", 2) is False
    assert trie.remove("a/#", 1) is False
    assert trie.remove("x/y", 1) is False
    assert trie.remove("a/+", 1) is True
    assert trie.remove("a/+", 1) is False
    assert trie.remove("a/b", 1) is True
    assert len(trie) == 0
    assert trie.node_count() == 0


@pytest.mark.parametrize("bad", ["", "a/#/b", "a+", "#/a", "a\x00"])
def test_an_invalid_filter_is_refused_and_changes_nothing(bad: str) -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a/b", 1)
    with pytest.raises(InvalidTopicFilter, match="topic filter"):
        trie.add(bad, 2)
    assert sorted(trie.items()) == [("a/b", 1)]
    assert trie.node_count() == 1
    assert trie.remove(bad, 2) is False


def test_removing_a_filter_prunes_only_its_own_branch() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a/b/+/d", 1)
    trie.add("a/b/#", 2)
    nodes = trie.node_count()
    trie.add("a/b/+/e/#", 3)
    assert trie.node_count() == nodes + 1
    trie.remove("a/b/+/e/#", 3)
    assert trie.node_count() == nodes
    assert Counter(trie.match("a/b/c/d")) == Counter({1: 1, 2: 1})


def test_items_lists_every_pair() -> None:
    pairs = {("#", 1), ("+", 2), ("/+", 3), ("a/#", 4), ("a", 5), ("+/+/#", 6), ("$s/+", 7)}
    trie: TopicTrie[int] = TopicTrie()
    for topic_filter, value in pairs:
        trie.add(topic_filter, value)
    assert set(trie.items()) == pairs


# --------------------------------------------------------------------- properties


@settings(max_examples=300)
@given(st.lists(st.tuples(filters(), st.integers(0, 3)), max_size=20), names)
def test_match_equals_a_scan_of_every_filter(pairs: list[tuple[str, int]], name: str) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for topic_filter, value in pairs:
        trie.add(topic_filter, value)
    assert Counter(trie.match(name)) == scan(set(pairs), name)


@given(st.lists(st.tuples(filters(), st.integers(0, 3)), max_size=30), st.randoms())
def test_removing_everything_leaves_no_node(
    pairs: list[tuple[str, int]], rng: random.Random
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for topic_filter, value in pairs:
        trie.add(topic_filter, value)
    unique = sorted(set(pairs))
    rng.shuffle(unique)
    for topic_filter, value in unique:
        assert trie.remove(topic_filter, value)
    assert len(trie) == 0
    assert trie.node_count() == 0
    assert list(trie.items()) == []
    assert all(trie.match(name) == [] for name in ("a", "a/b", "$s/a", "/"))


class TrieMachine(RuleBasedStateMachine):
    """Adds and removes in any order keep the trie equal to a reference set of
    (filter, value) pairs; whatever is left can be removed without a trace."""

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.trie: TopicTrie[int] = TopicTrie()
        self.reference: set[tuple[str, int]] = set()

    @rule(target=held, topic_filter=filters(), value=st.integers(0, 3))
    def add(self, topic_filter: str, value: int) -> tuple[str, int]:
        pair = (topic_filter, value)
        assert self.trie.add(topic_filter, value) is (pair not in self.reference)
        self.reference.add(pair)
        return pair

    @rule(pair=held)
    def remove_held(self, pair: tuple[str, int]) -> None:
        assert self.trie.remove(*pair) is (pair in self.reference)
        self.reference.discard(pair)

    @rule(topic_filter=filters(), value=st.integers(0, 3))
    def remove_any(self, topic_filter: str, value: int) -> None:
        pair = (topic_filter, value)
        assert self.trie.remove(topic_filter, value) is (pair in self.reference)
        self.reference.discard(pair)

    @rule(name=names)
    def match(self, name: str) -> None:
        assert Counter(self.trie.match(name)) == scan(self.reference, name)

    @invariant()
    def same_pairs(self) -> None:
        assert len(self.trie) == len(self.reference)
        assert sorted(self.trie.items()) == sorted(self.reference)

    def teardown(self) -> None:
        for pair in list(self.reference):
            assert self.trie.remove(*pair)
        assert self.trie.node_count() == 0


TestTrieMachine = TrieMachine.TestCase
TestTrieMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_match_equals_a_scan_exhaustively_for_a_fixed_set() -> None:
    """Every name of up to 4 levels against one trie of many filters."""
    pairs = {
        (f, v)
        for v, f in enumerate(
            ["#", "+", "+/#", "/#", "a", "a/#", "a/+", "+/b", "$s/#", "$s/+/a", "a//b", "+/+/+/+"]
        )
    }
    trie: TopicTrie[int] = TopicTrie()
    for topic_filter, value in pairs:
        trie.add(topic_filter, value)
    for name in NAMES_4:
        assert Counter(trie.match(name)) == scan(pairs, name), name
