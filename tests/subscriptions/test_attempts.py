"""`step.Attempts` (issue 7): the consumption policy's bounds on delivery
attempts — in flight at once, and the error-rate throttle that slows a shard
down while most attempts fail and lets it go once they succeed again."""

from __future__ import annotations

import asyncio
import time

from riverbed.model import MessageId, StoredMessage
from riverbed.subscriptions.definition import ConsumptionPolicy
from riverbed.subscriptions.endpoint import Attempt, Outcome
from riverbed.subscriptions.step import Attempts


class Flaky:
    """Fails while `failing`; records when each attempt started."""

    def __init__(self) -> None:
        self.failing = True
        self.started: list[float] = []
        self.running = 0
        self.most = 0

    async def deliver(self, message: StoredMessage, attempt: int) -> Attempt:
        self.started.append(time.monotonic())
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.001)  # the scenario: a delivery takes time (overlaps show)
        self.running -= 1
        return Attempt(Outcome.RETRY if self.failing else Outcome.DELIVERED, "x")

    async def close(self) -> None:
        pass


MESSAGE = StoredMessage(0, MessageId.compose(1, 1, 1).to_bytes(), 1, "t", "k", b"", None, 0, 0)


def test_mostly_failing_attempts_are_throttled_then_released() -> None:
    policy = ConsumptionPolicy(
        max_in_flight=4, error_rate_threshold=0.5, error_window=10, throttled_rate=50
    )
    target = Flaky()

    async def go() -> None:
        attempts = Attempts(target, policy)
        await asyncio.gather(*(attempts(MESSAGE, 1) for _ in range(10)))  # fill the window
        assert attempts.throttled
        before = len(target.started)
        await asyncio.gather(*(attempts(MESSAGE, 1) for _ in range(10)))
        throttled = target.started[before:]
        # At most 50 a second: 10 attempts spread over at least 9 intervals of 20 ms.
        assert throttled[-1] - throttled[0] >= 9 * 0.02 * 0.9
        target.failing = False
        await asyncio.gather(*(attempts(MESSAGE, 1) for _ in range(10)))
        assert not attempts.throttled  # the window is all successes again
        before = len(target.started)
        start = time.monotonic()
        await asyncio.gather(*(attempts(MESSAGE, 1) for _ in range(40)))
        assert time.monotonic() - start < 9 * 0.02 * 4  # not held to 50 a second any more

    asyncio.run(go())
    assert target.most <= 4
