"""Holds: where subscriptions being made start, kept from retention (log/retention.py)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from riverbed.log.log import Log
from riverbed.log.retention import Holds, RetentionResult, apply_retention
from riverbed.storage.base import RetentionPolicy
from riverbed.subscriptions.named import Subscriptions

from .test_retention import S0, commit_up_to, make_topic, produce_spaced


def test_a_hold_keeps_what_every_cursor_consumed(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED)
    subs = Subscriptions(log.storage)
    subs.create("s", "t")
    stored = produce_spaced(log, 10)
    commit_up_to(subs, "s", 8)
    holds = Holds()
    token = holds.hold({log.storage.list_streams("t")[0].key: 3})
    now = stored[-1].timestamp_us
    assert apply_retention(log.storage, now_us=now, holds=holds).results == [
        RetentionResult(S0, 3, 3)
    ]
    holds.release(token)
    assert apply_retention(log.storage, now_us=now, holds=holds).results == [
        RetentionResult(S0, 5, 8)
    ]
    assert len(holds) == 0


def test_a_hold_keeps_a_topic_nobody_subscribes_to_yet(log: Log) -> None:
    make_topic(log, RetentionPolicy.CONSUMED)
    stored = produce_spaced(log, 6)
    holds = Holds()
    holds.hold({log.storage.list_streams("t")[0].key: 4})
    now = stored[-1].timestamp_us
    assert apply_retention(log.storage, now_us=now, holds=holds).results == [
        RetentionResult(S0, 4, 4)
    ]


def test_a_hold_released_during_a_pass_is_kept_until_the_pass_ends() -> None:
    holds = Holds()
    token = holds.hold({7: 10})
    running = holds.begin_pass()
    holds.release(token)  # its cursors committed after the pass read the cursors
    assert holds.lowest() == {7: 10}
    later = holds.begin_pass()  # reads the cursors after that commit
    holds.end_pass(running)
    assert holds.lowest() == {}
    holds.end_pass(later)
    holds.release(token)  # twice: nothing
    assert len(holds) == 0 and holds.lowest() == {}


def test_a_hold_released_with_no_pass_running_is_let_go_at_once() -> None:
    holds = Holds()
    holds.release(holds.hold({1: 5}))
    running = holds.begin_pass()
    assert holds.lowest() == {}
    holds.end_pass(running)


class HoldsMachine(RuleBasedStateMachine):
    """Against a model: what `lowest` answers is the minimum, per stream, over
    the holds not released and those released after the start of a pass still
    running, and nothing else is kept."""

    tokens = Bundle("tokens")
    passes = Bundle("passes")

    def __init__(self) -> None:
        super().__init__()
        self.holds = Holds()
        self.clock = 0
        self.active: dict[int, dict[int, int]] = {}
        self.released: list[tuple[int, dict[int, int]]] = []
        self.running: dict[int, int] = {}

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    @rule(
        target=tokens,
        positions=st.dictionaries(st.integers(0, 3), st.integers(0, 50), max_size=3),
    )
    def hold(self, positions: dict[int, int]) -> int:
        token = self.holds.hold(positions)
        self.active[token] = positions
        return token

    @rule(token=tokens)
    def release(self, token: int) -> None:
        self.holds.release(token)
        positions = self.active.pop(token, None)
        if positions is not None:
            self.released.append((self._tick(), positions))

    @rule(target=passes)
    def begin_pass(self) -> int:
        pass_id = self.holds.begin_pass()
        self.running[pass_id] = self._tick()
        return pass_id

    @rule(pass_id=passes)
    def end_pass(self, pass_id: int) -> None:
        self.holds.end_pass(pass_id)
        self.running.pop(pass_id, None)

    @invariant()
    def lowest_is_the_models(self) -> None:
        oldest = min(self.running.values(), default=None)
        kept = list(self.active.values())
        if oldest is not None:
            kept += [p for at, p in self.released if at > oldest]
        expected: dict[int, int] = {}
        for positions in kept:
            for key, offset in positions.items():
                expected[key] = min(offset, expected.get(key, offset))
        assert self.holds.lowest() == expected
        assert len(self.holds) == len(self.active)


TestHoldsMachine = HoldsMachine.TestCase
