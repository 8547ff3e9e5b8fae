"""The shared wait (`harness.waiting.eventually`): what it says when it fails,
and how `progress` stretches a wait that keeps moving."""

from __future__ import annotations

import itertools

import pytest

from harness.waiting import eventually


def test_a_failure_says_what_explain_says() -> None:
    with pytest.raises(AssertionError, match=r"waiting for 2 payloads \(last: 'missing 1'\)"):
        eventually(lambda: False, 0.01, "2 payloads", explain=lambda: "missing 1")


def test_a_wait_that_keeps_progressing_outlasts_its_timeout() -> None:
    calls = itertools.count()
    done_at = 40  # checks, each up to 2 ms apart: well past the 5 ms timeout

    def check() -> bool:
        return next(calls) >= done_at

    moved = itertools.count()
    assert eventually(check, 0.005, "the end", interval=0.002, progress=lambda: next(moved))


def test_a_stalled_wait_fails_saying_so() -> None:
    with pytest.raises(AssertionError, match="without progress waiting for the end"):
        eventually(lambda: False, 0.01, "the end", progress=lambda: 7)
