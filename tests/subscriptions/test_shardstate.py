"""A delivering subscription's shard state (issue 7): its JSON round trip and
the done-interval bookkeeping of read-ahead queues, as hypothesis properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from riverbed.subscriptions.groups import GroupState, GroupStates, HeadRetry, MessageState
from riverbed.subscriptions.shardstate import ShardState, add_done, is_done

ints = st.integers(0, 10**12)
positions = st.builds(MessageState, ints, ints, ints, ints)
group_states = st.builds(GroupState, positions, st.none() | positions)
groups = st.text(min_size=1, max_size=8)
intervals = st.lists(st.tuples(ints, ints).map(sorted).map(tuple), max_size=4)  # type: ignore[arg-type]


@given(
    st.dictionaries(groups, group_states, max_size=4),
    st.dictionaries(groups, group_states, max_size=4),
    st.dictionaries(ints, ints, max_size=4),
    st.dictionaries(ints, intervals, max_size=3),
    st.dictionaries(
        groups,
        st.builds(HeadRetry, st.tuples(ints, ints), ints, ints, ints, st.text(max_size=20)),
        max_size=3,
    ),
    st.none() | ints,
)
def test_a_shard_state_reads_back_exactly(
    rq: dict[str, GroupState],
    dlq: dict[str, GroupState],
    read: dict[int, int],
    done: dict[int, list[tuple[int, int]]],
    retries: dict[str, HeadRetry],
    next_due: int | None,
) -> None:
    state = ShardState(GroupStates(rq, dlq), read, done, retries, dict(read), done, next_due)
    back = ShardState.from_json(state.to_json())
    assert back.groups.rq == rq and back.groups.dlq == dlq and back.retries == retries
    assert back.rq_read == read == back.dlq_read and back.next_due_us == next_due
    kept = {k: v for k, v in done.items() if v}
    assert back.rq_done == kept == back.dlq_done


@given(
    st.integers(0, 50),
    st.lists(st.sets(st.integers(0, 80), max_size=20), min_size=1, max_size=5),
)
def test_done_rows_keep_the_first_row_not_done_and_the_rest_as_intervals(
    start: int, rounds: list[set[int]]
) -> None:
    position, done = start, []
    marked: set[int] = set()
    for offsets in rounds:
        position, done = add_done(position, done, offsets)
        marked |= offsets
        # The first row not done: everything below it done, it not.
        assert position not in marked or position < start
        assert all(o in marked or o < start for o in range(start, position))
        for offset in range(0, 100):
            expected = offset < position or offset in marked
            assert is_done(offset, position, done) == expected
        assert all(a < b for a, b in done)
        assert all(done[i][1] < done[i + 1][0] for i in range(len(done) - 1))  # merged
