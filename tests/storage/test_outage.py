"""`ride_out`: a store that cannot be reached is waited for, a while; any
other error is not."""

from __future__ import annotations

import logging

import pytest

from riverbed.errors import InvalidInput, StorageUnavailable
from riverbed.storage.outage import LONGEST_PAUSE, ride_out


class Flaky:
    """Fails with `error` the first `failures` calls, then returns the call count."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or StorageUnavailable("cannot connect to PostgreSQL")
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


def test_an_unreachable_store_is_waited_for_with_growing_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pauses: list[float] = []
    with caplog.at_level(logging.WARNING, "riverbed.storage.outage"):
        assert ride_out(Flaky(6), "the test", sleep=pauses.append) == 7
    assert pauses == [0.5, 1.0, 2.0, 4.0, LONGEST_PAUSE, LONGEST_PAUSE]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # when the wait starts, when it ends
    assert lines[0].startswith("the test: the store cannot be reached")
    assert lines[1].startswith("the test: the store is back after")


def test_the_error_goes_up_once_patience_runs_out() -> None:
    flaky = Flaky(1)
    with pytest.raises(StorageUnavailable):
        ride_out(flaky, "the test", patience=0, sleep=lambda _: None)
    assert flaky.calls == 1


def test_other_errors_are_not_waited_for() -> None:
    flaky = Flaky(1, InvalidInput("bad"))
    with pytest.raises(InvalidInput):
        ride_out(flaky, "the test", sleep=lambda _: pytest.fail("waited"))
    assert flaky.calls == 1


def test_a_call_that_works_is_called_once_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "riverbed.storage.outage"):
        assert ride_out(Flaky(0), "the test") == 1
    assert not caplog.records
