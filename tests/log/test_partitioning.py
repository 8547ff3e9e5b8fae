"""seed 003's shard-consistent router and partition-count rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import InvalidInput, InvalidPartitionCount
from riverbed.log.partitioning import (
    MAX_PARTITIONS,
    key_hash,
    lineage,
    route,
    scale_factor,
    validate_partitions,
)

valid_partitions = st.one_of(
    st.sampled_from([1, 2, 3]),
    st.integers(1, 64).map(lambda n: 4 * n),
    st.integers(1, 64).map(lambda n: 6 * n),
)
hashes = st.integers(0, (1 << 32) - 1)


def allowed(n: int) -> bool:
    return n in (1, 2, 3) or (n > 0 and (n % 4 == 0 or n % 6 == 0))


# --------------------------------------------------------------------- partition counts


@given(st.integers(-1000, 10_000))
def test_validate_partitions_accepts_exactly_1_2_3_and_multiples_of_4_or_6(n: int) -> None:
    if allowed(n):
        assert validate_partitions(n) == n
    else:
        with pytest.raises(InvalidPartitionCount) as caught:
            validate_partitions(n)
        assert str(n) in str(caught.value)
        assert isinstance(caught.value, InvalidInput)


def test_validate_partitions_refuses_more_than_the_most() -> None:
    assert validate_partitions(MAX_PARTITIONS) == MAX_PARTITIONS
    for n in (MAX_PARTITIONS + 4, 4 * 10**9):
        with pytest.raises(InvalidPartitionCount, match=f"{n} is more than the 65,536 allowed"):
            validate_partitions(n)


@pytest.mark.parametrize("n", [0, -1, -4, 5, 7, 9, 10, 11, 13, 14])
def test_validate_partitions_refuses_examples(n: int) -> None:
    with pytest.raises(InvalidPartitionCount, match=str(n)):
        validate_partitions(n)


@pytest.mark.parametrize("bad", [True, False, 4.0, "4", None, [4], 2**0.5])
def test_validate_partitions_refuses_non_integers_naming_them(bad: object) -> None:
    with pytest.raises(InvalidPartitionCount) as caught:
        validate_partitions(bad)
    assert repr(bad) in str(caught.value)


# --------------------------------------------------------------------- scale factor


@pytest.mark.parametrize(
    ("prev_p", "prev_k", "new_p", "k"),
    [
        (2, 1, 10, 5),  # seed 003's own example
        (4, 1, 8, 2),
        (4, 1, 6, 1),  # 6 is no multiple of base 4: K=1 reset
        (4, 1, 4, 1),
        (8, 2, 12, 3),  # base stays 4
        (8, 2, 4, 1),  # scale down to the base count
        (8, 2, 2, 1),  # below the base: reset
        (12, 3, 24, 6),
        (6, 1, 12, 2),
        (1, 1, 12, 12),
    ],
)
def test_scale_factor_examples(prev_p: int, prev_k: int, new_p: int, k: int) -> None:
    assert scale_factor(prev_p, prev_k, new_p) == k


# --------------------------------------------------------------------- route


@st.composite
def partitions_and_k(draw: st.DrawFn) -> tuple[int, int]:
    p = draw(valid_partitions)
    k = draw(st.sampled_from([d for d in range(1, p + 1) if p % d == 0]))
    return p, k


@given(hashes, partitions_and_k())
def test_route_is_a_partition_of_the_lineage_of_h(h: int, pk: tuple[int, int]) -> None:
    p, k = pk
    j = route(h, p, k)
    assert 0 <= j < p
    assert lineage(j, k) == h % (p // k)


@given(partitions_and_k())
def test_route_spreads_every_block_of_hashes_evenly(pk: tuple[int, int]) -> None:
    p, k = pk
    counts = Counter(route(h, p, k) for h in range(p * k))
    assert counts == Counter({j: k for j in range(p)})


@given(hashes, valid_partitions)
def test_route_with_k_1_is_h_mod_p(h: int, p: int) -> None:
    assert route(h, p, 1) == h % p


@given(st.lists(valid_partitions, min_size=1, max_size=8), st.lists(hashes, max_size=50))
def test_shard_consistency_across_generations(counts: list[int], sample: list[int]) -> None:
    """seed 003: with K from AddStorageTopic's rule, each hash stays in one lineage
    while the base count P/K is unchanged; a K=1 reset starts lineages afresh."""
    sample = [*sample, 0, 1, 7, (1 << 32) - 1]
    p, k = counts[0], 1
    base = p
    lineages = {h: route(h, p, k) for h in sample}
    for new_p in counts[1:]:
        new_k = scale_factor(p, k, new_p)
        assert new_k >= 1 and new_p % new_k == 0
        new_base = new_p // new_k
        if new_base != base:
            assert new_k == 1, "the base count changes only on a K=1 reset"
            assert new_base == new_p
        for h in sample:
            j = route(h, new_p, new_k)
            assert 0 <= j < new_p
            assert lineage(j, new_k) == h % new_base
            if new_base == base:
                assert lineage(j, new_k) == lineages[h]
            lineages[h] = lineage(j, new_k)
        p, k, base = new_p, new_k, new_base


# --------------------------------------------------------------------- key hash


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("", 0),
        ("a", 3904355907),
        ("hello", 907060870),
        ("client-1", 4035764838),
        ("ü", 1675192789),
        ("orders/42", 370287966),
    ],
)
def test_key_hash_is_stable(key: str, expected: int) -> None:
    # Changing the hash function moves every key to another stream: stored data
    # would lose its per-key order. This test must fail if that happens.
    assert key_hash(key) == expected


@given(st.text())
def test_key_hash_is_32_bits(key: str) -> None:
    assert 0 <= key_hash(key) < 1 << 32
