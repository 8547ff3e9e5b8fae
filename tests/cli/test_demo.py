"""`riverbed demo`: runs, and runs again on the same database."""

from __future__ import annotations

from harness.cli import (
    as_json,
    ok,
    total,
)
from riverbed.cli.demo import DEMO_MESSAGES


def test_demo_runs_twice(db: str) -> None:
    first = ok(db, "demo")
    assert "try next" in first.stdout and "demo-reader" in first.stdout
    assert f"--db {db}" in first.stdout
    second = ok(db, "demo")
    assert "consumed 1000" in second.stdout
    assert total(db, "demo") == 2 * DEMO_MESSAGES
    assert as_json(ok(db, "subscription", "lag", "demo-reader", "--json"))["total"] == 0
    assert as_json(ok(db, "topic", "describe", "demo", "--json"))["binding"] == "demo/#"
