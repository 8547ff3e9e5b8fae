"""A start or reset position that is none of the accepted forms is refused
with every form listed, each with an example, and nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import rb

START_WORDS = ["earliest", "latest", "ISO 8601", "2024-05-01T12:00:00Z"]
RESET_WORDS = [*START_WORDS, "STREAM=OFFSET", "orders/0/1=42"]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/x.db"
    assert rb(url, "topic", "create", "orders", "--partitions", "2").exit_code == 0
    assert rb(url, "subscription", "create", "s", "--topic", "orders").exit_code == 0
    return url


def _state(db: str) -> tuple[object, object, object]:
    lag = json.loads(rb(db, "subscription", "lag", "s", "--json").stdout)
    subscriptions = json.loads(rb(db, "subscription", "list", "--json").stdout)
    groups = json.loads(rb(db, "group", "list", "--json").stdout)
    return lag, subscriptions, groups


@pytest.mark.parametrize("target", ["banana", '{"orders/0/0": 5}', "2024-13-01", "-1"])
def test_a_malformed_reset_target_lists_every_form(db: str, target: str) -> None:
    before = _state(db)
    result = rb(db, "subscription", "reset", "s", "--to", target)
    assert result.exit_code == 2
    assert f"{target!r} is not a position" in result.stderr
    assert all(w in result.stderr for w in RESET_WORDS), result.stderr
    assert _state(db) == before


def test_a_bad_item_in_offsets_says_which(db: str) -> None:
    before = _state(db)
    result = rb(db, "subscription", "reset", "s", "--to", "orders/0/0=1,latest")
    assert result.exit_code == 2
    assert "'latest' is not STREAM=OFFSET" in result.stderr
    assert _state(db) == before


@pytest.mark.parametrize(
    "args",
    [
        ["subscription", "create", "t", "--topic", "orders", "--start", "banana"],
        ["group", "create", "g", "orders/#", "--start", "banana"],
    ],
)
def test_a_malformed_start_lists_every_form(db: str, args: list[str]) -> None:
    before = _state(db)
    result = rb(db, *args)
    assert result.exit_code == 2
    assert "'banana' is not a position" in result.stderr
    assert all(w in result.stderr for w in START_WORDS), result.stderr
    assert "STREAM=OFFSET" not in result.stderr  # not a form --start takes
    assert _state(db) == before
