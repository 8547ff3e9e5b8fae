"""`mqtt/deadlines.py`: connections' deadlines on one timer, with a fake loop."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.mqtt.deadlines import Deadlines


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """A clock that moves when told, running timers at their time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, FakeHandle, Callable[[], object]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> FakeHandle:
        handle = FakeHandle()
        heapq.heappush(self._timers, (when, next(self._order), handle, callback))
        return handle

    def pending(self) -> int:
        return sum(not handle.cancelled for _, _, handle, _ in self._timers)

    def advance(self, to: float) -> None:
        while self._timers and self._timers[0][0] <= to:
            when, _, handle, callback = heapq.heappop(self._timers)
            if not handle.cancelled:
                self.now = max(self.now, when)
                callback()
        self.now = to


class Owner:
    """A connection: told when its deadline comes, arming again if asked."""

    def __init__(self, deadlines: Deadlines, loop: FakeLoop, name: str) -> None:
        self.deadlines = deadlines
        self.loop = loop
        self.name = name
        self.tick: int | None = None
        self.deadline: float | None = None
        self.told: list[float] = []
        self.then: float | None = None
        """Its next deadline, armed when told (a keep alive moved on)."""

    def arm(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.tick = self.deadlines.arm(self, self.tick, deadline)

    def disarm(self) -> None:
        self.deadlines.disarm(self, self.tick)
        self.tick = None
        self.deadline = None

    def deadline_due(self) -> None:
        self.tick = None
        self.told.append(self.loop.now)
        assert self.deadline is not None and self.loop.now >= self.deadline, (
            f"{self.name} told at {self.loop.now} before its deadline {self.deadline}"
        )
        self.deadline = None
        if self.then is not None:
            then, self.then = self.then, None
            self.arm(then)


def test_an_owner_is_told_at_its_deadline_not_before() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    owner = Owner(deadlines, loop, "a")
    owner.arm(1.05)
    loop.advance(1.0)
    assert owner.told == []
    loop.advance(1.2)
    assert owner.told == [pytest.approx(1.1)]
    assert len(deadlines) == 0 and loop.pending() == 0


def test_one_timer_serves_many_owners_in_one_bucket() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.5)
    owners = [Owner(deadlines, loop, str(i)) for i in range(100)]
    for i, owner in enumerate(owners):
        owner.arm(10.1 + i / 1000)
    assert loop.pending() == 1
    loop.advance(11.0)
    assert all(owner.told == [10.5] for owner in owners)


def test_a_disarmed_or_moved_owner_is_not_told_at_its_old_deadline() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    gone, moved = Owner(deadlines, loop, "gone"), Owner(deadlines, loop, "moved")
    gone.arm(1.0)
    moved.arm(1.0)
    gone.disarm()
    moved.arm(5.0)
    loop.advance(4.0)
    assert gone.told == [] and moved.told == []
    loop.advance(6.0)
    assert moved.told == [pytest.approx(5.0)]
    moved.arm(None)  # no deadline: nothing armed
    assert moved.tick is None and len(deadlines) == 0


def test_an_earlier_deadline_moves_the_timer_forward() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    late, early = Owner(deadlines, loop, "late"), Owner(deadlines, loop, "early")
    late.arm(60.0)
    early.arm(2.0)
    loop.advance(3.0)
    assert early.told == [pytest.approx(2.0)] and late.told == []


def test_an_owner_told_may_arm_again() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    owner = Owner(deadlines, loop, "keep-alive")
    owner.arm(1.5)
    owner.then = 3.0  # something was read meanwhile
    loop.advance(10.0)
    assert owner.told == [pytest.approx(1.5), pytest.approx(3.0)]


def test_close_forgets_everything() -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    owner = Owner(deadlines, loop, "a")
    owner.arm(1.0)
    deadlines.close()
    loop.advance(2.0)
    assert owner.told == [] and loop.pending() == 0


@pytest.mark.parametrize("resolution", [0.0, -1.0, float("nan")])
def test_a_resolution_that_is_not_positive_is_refused(resolution: float) -> None:
    with pytest.raises(ValueError, match="resolution"):
        Deadlines(FakeLoop(), resolution=resolution)


_steps = st.lists(
    st.tuples(
        st.sampled_from(["arm", "disarm", "advance"]),
        st.integers(min_value=0, max_value=7),
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=_steps, resolution=st.sampled_from([0.05, 0.25, 1.0]))
def test_every_owner_is_told_once_per_deadline_within_the_resolution(
    steps: list[tuple[str, int, float]], resolution: float
) -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=resolution)
    owners = [Owner(deadlines, loop, str(i)) for i in range(8)]
    for action, which, amount in steps:
        owner = owners[which]
        if action == "arm":
            owner.arm(loop.now + amount)
        elif action == "disarm":
            owner.disarm()
        else:
            loop.advance(loop.now + amount)
            # Whoever is still armed has a deadline yet to come (or less than
            # a bucket ago: its bucket's time is still ahead).
            for other in owners:
                if other.deadline is not None:
                    assert other.deadline > loop.now - resolution - 1e-9
    armed = {owner.name: owner.deadline for owner in owners if owner.deadline is not None}
    told_before = {owner.name: len(owner.told) for owner in owners}
    last = max([d for d in armed.values() if d is not None], default=loop.now)
    loop.advance(last + resolution + 1e-6)
    for owner in owners:
        assert len(owner.told) == told_before[owner.name] + (owner.name in armed)
        if owner.name in armed:
            deadline = armed[owner.name]
            assert deadline is not None
            assert deadline <= owner.told[-1] <= deadline + resolution + 1e-9
    assert len(deadlines) == 0


class Failing(Owner):
    def deadline_due(self) -> None:
        super().deadline_due()
        raise RuntimeError(f"{self.name} failed")


def test_an_owner_that_fails_is_logged_and_the_others_are_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = FakeLoop()
    deadlines = Deadlines(loop, resolution=0.1)
    failing = Failing(deadlines, loop, "failing")
    same, later = Owner(deadlines, loop, "same"), Owner(deadlines, loop, "later")
    failing.arm(1.0)
    same.arm(1.0)
    later.arm(2.0)
    loop.advance(3.0)
    assert failing.told and same.told == [pytest.approx(1.0)]
    assert later.told == [pytest.approx(2.0)]  # the timer went on
    assert "failing failed" in caplog.text
