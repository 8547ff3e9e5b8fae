"""MQTT topic names and filters [MQTT-4.7]: validation, matching, overlap."""

from __future__ import annotations

import functools
import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.topic_examples import MATCH_EXAMPLES
from riverbed.errors import InvalidInput, InvalidTopicFilter, InvalidTopicName
from riverbed.topics.filters import (
    filter_covers,
    filters_overlap,
    is_wildcard,
    matches,
    validate_filter,
    validate_topic_name,
)

NAME_LEVELS = ["a", "b", "$s", ""]
FILTER_LEVELS = [*NAME_LEVELS, "+", "#"]


def all_names(max_depth: int) -> list[str]:
    """Every valid topic name of up to `max_depth` levels from NAME_LEVELS."""
    names = []
    for depth in range(1, max_depth + 1):
        for levels in itertools.product(NAME_LEVELS, repeat=depth):
            name = "/".join(levels)
            if name:  # "" is no topic name [MQTT-4.7.3-1]
                names.append(name)
    return names


def all_filters(max_depth: int) -> list[str]:
    """Every valid filter of up to `max_depth` levels from FILTER_LEVELS."""
    out = []
    for depth in range(1, max_depth + 1):
        for levels in itertools.product(FILTER_LEVELS, repeat=depth):
            if "#" in levels[:-1]:
                continue
            text = "/".join(levels)
            if text:
                out.append(text)
    return out


NAMES_4 = all_names(4)


# --------------------------------------------------------------------- references


def reference_matches(topic_filter: str, name: str) -> bool:
    """A regex translation of [MQTT-4.7.1] and [MQTT-4.7.2-1]."""
    if name.startswith("$") and topic_filter[0] in "+#":
        return False
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    if multi:
        levels = levels[:-1]
    pattern = "/".join("[^/]*" if level == "+" else re.escape(level) for level in levels)
    if multi:
        # '#' also matches the parent level: "a/#" matches "a" [MQTT-4.7.1-2].
        pattern = ".*" if not levels else pattern + "(/.*)?"
    return re.fullmatch(pattern, name, re.DOTALL) is not None


def reference_filter_ok(text: str) -> bool:
    if not text or "\x00" in text:
        return False
    levels = text.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def reference_name_ok(text: str) -> bool:
    return bool(text) and not any(c in text for c in "\x00+#")


@functools.cache
def matched_set(topic_filter: str) -> frozenset[str]:
    return frozenset(n for n in NAMES_4 if reference_matches(topic_filter, n))


# --------------------------------------------------------------------- strategies

names = st.lists(st.sampled_from(NAME_LEVELS), min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn, max_levels: int = 4) -> str:
    levels = draw(st.lists(st.sampled_from([*NAME_LEVELS, "+"]), min_size=0, max_size=max_levels))
    if not levels or (len(levels) < max_levels and draw(st.booleans())):
        levels.append("#")
    text = "/".join(levels)
    return text or "#"


raw_text = st.lists(
    st.sampled_from(["a", "b", "/", "+", "#", "$", "\x00", "a+", "#a", " ", "é"]), max_size=8
).map("".join)


# --------------------------------------------------------------------- validation


@given(raw_text)
def test_validate_filter_agrees_with_the_rules(text: str) -> None:
    if reference_filter_ok(text):
        assert validate_filter(text) == text
    else:
        with pytest.raises(InvalidTopicFilter) as caught:
            validate_filter(text)
        assert isinstance(caught.value, InvalidInput)
        assert isinstance(caught.value, ValueError)


@given(raw_text)
def test_validate_topic_name_agrees_with_the_rules(text: str) -> None:
    if reference_name_ok(text):
        assert validate_topic_name(text) == text
    else:
        with pytest.raises(InvalidTopicName):
            validate_topic_name(text)


@pytest.mark.parametrize(
    "good", ["#", "+", "+/+", "/+", "a/#", "a/+/b", "$SYS/#", "$share", "/", "a//b", "+/#", "é/+"]
)
def test_valid_filters(good: str) -> None:
    assert validate_filter(good) == good


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "MQTT-4.7.3-1"),
        ("a/\x00", "MQTT-4.7.3-2"),
        ("a#", "MQTT-4.7.1-1"),
        ("a/#/b", "MQTT-4.7.1-1"),
        ("#/a", "MQTT-4.7.1-1"),
        ("##", "MQTT-4.7.1-1"),
        ("a+", "MQTT-4.7.1-2"),
        ("a/+b/c", "MQTT-4.7.1-2"),
        ("++", "MQTT-4.7.1-2"),
        ("a/\ud800", "MQTT-1.5.4-1"),
        ("a" * 65536, "MQTT-4.7.3-3"),
    ],
)
def test_invalid_filters_cite_the_rule(bad: str, rule: str) -> None:
    with pytest.raises(InvalidTopicFilter, match=rule):
        validate_filter(bad)


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "MQTT-4.7.3-1"),
        ("a/+", "MQTT-3.3.2-2"),
        ("a/#", "MQTT-3.3.2-2"),
        ("x\x00", "MQTT-4.7.3-2"),
        ("é" * 32768, "MQTT-4.7.3-3"),  # 65536 bytes of UTF-8
    ],
)
def test_invalid_topic_names_cite_the_rule(bad: str, rule: str) -> None:
    with pytest.raises(InvalidTopicName, match=rule):
        validate_topic_name(bad)


def test_length_limit_counts_utf8_bytes() -> None:
    assert validate_topic_name("a" * 65535)
    assert validate_filter("é" * 32767 + "a")  # 65535 bytes


def test_dollar_topics_are_valid_names() -> None:
    assert validate_topic_name("$SYS/broker/load") == "$SYS/broker/load"
    assert validate_topic_name("/") == "/"


def test_is_wildcard() -> None:
    assert is_wildcard("a/+") and is_wildcard("#") and not is_wildcard("a/b")


# --------------------------------------------------------------------- matching


@given(filters(), names)
def test_matches_agrees_with_reference(topic_filter: str, name: str) -> None:
    assert matches(topic_filter, name) == reference_matches(topic_filter, name)


def test_matches_agrees_with_reference_exhaustively() -> None:
    for topic_filter in all_filters(3):
        for name in all_names(3):
            assert matches(topic_filter, name) == reference_matches(topic_filter, name), (
                topic_filter,
                name,
            )


@pytest.mark.parametrize(("topic_filter", "name", "expected"), MATCH_EXAMPLES)
def test_matches_spec_examples(topic_filter: str, name: str, expected: bool) -> None:
    assert matches(topic_filter, name) is expected


# --------------------------------------------------------------------- overlap


def test_filters_overlap_iff_some_name_matches_both_exhaustively() -> None:
    """Every pair of filters of up to 3 levels, against every name of up to 4
    levels (a witness needs at most as many levels as the longer filter)."""
    every = all_filters(3)
    for a in every:
        for b in every:
            expected = bool(matched_set(a) & matched_set(b))
            assert filters_overlap(a, b) is expected, (a, b)


@settings(max_examples=400)
@given(filters(max_levels=4), filters(max_levels=4))
def test_filters_overlap_iff_some_name_matches_both(a: str, b: str) -> None:
    expected = bool(matched_set(a) & matched_set(b))
    assert filters_overlap(a, b) is expected
    assert filters_overlap(b, a) is expected  # symmetric


@given(filters())
def test_a_filter_overlaps_itself(a: str) -> None:
    assert filters_overlap(a, a)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a/#", "a/b", True),
        ("a/#", "a", True),
        ("+/x", "y/+", True),
        ("$sys/#", "#", False),
        ("$sys/#", "+/+", False),
        ("$sys/#", "$sys/+", True),
        ("a/+", "a/b/c", False),
        ("a/b", "a/c", False),
        ("#", "+", True),
        ("a/+/c", "a/b/#", True),
    ],
)
def test_filters_overlap_examples(a: str, b: str, expected: bool) -> None:
    assert filters_overlap(a, b) is expected
    assert filters_overlap(b, a) is expected


# --------------------------------------------------------------------- covering


def test_filter_covers_iff_every_name_of_one_matches_the_other_exhaustively() -> None:
    """Every pair of filters of up to 3 levels, against every name of up to 4
    levels (a name one matches and the other does not needs at most one level
    more than the filters)."""
    every = all_filters(3)
    for outer in every:
        for inner in every:
            expected = matched_set(inner) <= matched_set(outer)
            assert filter_covers(outer, inner) is expected, (outer, inner)


@settings(max_examples=400)
@given(filters(max_levels=4), filters(max_levels=4))
def test_filter_covers_iff_every_name_of_one_matches_the_other(outer: str, inner: str) -> None:
    assert filter_covers(outer, inner) is (matched_set(inner) <= matched_set(outer))


@given(filters(), filters())
def test_covering_both_ways_is_matching_the_same_names(a: str, b: str) -> None:
    if filter_covers(a, b) and filter_covers(b, a):
        assert matched_set(a) == matched_set(b)
    if filter_covers(a, b):
        assert filters_overlap(a, b)  # b matches some name, and a matches it


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("#", "sensors/#", True),
        ("sensors/#", "sensors", True),
        ("sensors/#", "sensors/+/t", True),
        ("sensors/+", "sensors/#", False),
        ("sensors/#", "#", False),
        ("#", "$SYS/#", False),
        ("+/#", "$SYS/x", False),
        ("$SYS/#", "$SYS/+", True),
        ("a/+", "a/b", True),
        ("a/b", "a/+", False),
        ("+/+", "+", False),
    ],
)
def test_filter_covers_examples(outer: str, inner: str, expected: bool) -> None:
    assert filter_covers(outer, inner) is expected
