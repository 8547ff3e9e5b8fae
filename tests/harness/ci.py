"""CI strictness: in CI (`CI=true`) no test of a backend may be skipped.

Locally a test that needs PostgreSQL or Spark is skipped when its server cannot
start; in CI that skip would hide that a whole backend went untested, so it
fails instead. Two ways a skip happens:

- a test marked `postgres` / `spark` skips (a fixture or the test calls
  `pytest.skip`): `pytest_runtest_makereport` turns the report into a failure;
- a module, class or directory skips while being collected, before any marker is
  known (`pytest.importorskip("pyspark")` at import time, or
  `pytest.skip(..., allow_module_level=True)`): `pytest_make_collect_report`
  turns it into a collection error when the collector's name or the skip reason
  mentions one of `MUST_RUN_WORDS`.

A conftest enables these by importing the two hooks.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

MUST_RUN_IN_CI = ("postgres", "spark")
"""Markers whose tests fail instead of skipping in CI."""

MUST_RUN_WORDS = ("postgres", "psycopg", "spark", "pyspark")
"""A collection-time skip whose node id or reason mentions one of these fails in CI."""

__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]


def in_ci() -> bool:
    """CI sets `CI=true`; read at each call, so a test can set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _reason(longrepr: object) -> str:
    return str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        needed = [m for m in MUST_RUN_IN_CI if item.get_closest_marker(m) is not None]
        if needed:
            report.outcome = "failed"
            report.longrepr = (
                f"a test marked {'/'.join(needed)} was skipped in CI, where it must run:"
                f" {_reason(report.longrepr)}"
            )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if in_ci() and report.skipped:
        reason = _reason(report.longrepr)
        text = f"{collector.nodeid} {reason}".lower()
        words = [w for w in MUST_RUN_WORDS if w in text]
        if words:
            report.outcome = "failed"
            report.longrepr = (
                f"{collector.nodeid or collector.name} was skipped while being collected in CI,"
                f" where tests of {'/'.join(words)} must run: {reason}"
            )
    return report
