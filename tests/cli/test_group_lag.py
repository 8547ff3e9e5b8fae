"""`group list` and `group describe` label a lag that counts messages the
group's filter may not match as an upper bound (≤, `lag_exact: false`), and
show it plainly when the topic's binding lets in only what the filter
matches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import rb
from riverbed.cli import cli

NOTE = (
    "≤: an upper bound, counting every message of the group's topics, also those its"
    " filter does not match"
)


def produce(db: str, topic: str, *mqtt_topics: str) -> None:
    text = "".join(json.dumps({"payload": "x", "mqtt_topic": t}) + "\n" for t in mqtt_topics)
    result = CliRunner().invoke(cli, ["produce", topic, "--db", db], input=text)
    assert result.exit_code == 0, result.output


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/x.db"
    assert (
        rb(url, "topic", "create", "orders", "--partitions", "2", "--binding", "orders/#").exit_code
        == 0
    )
    for name, topic_filter in (("s", "sensors/#"), ("o", "orders/#"), ("e", "orders/eu")):
        assert rb(url, "group", "create", name, topic_filter, "--start", "earliest").exit_code == 0
    return url


def listed(db: str) -> dict[str, Any]:
    return {g["group"]: g for g in json.loads(rb(db, "group", "list", "--json").stdout)}


def test_only_bound_messages_of_a_covering_filter_are_exact(db: str) -> None:
    produce(db, "orders", "orders/eu", "orders/us", "orders/us")
    groups = listed(db)
    assert (groups["o"]["lag"], groups["o"]["lag_exact"]) == (3, True)  # orders/# covers it
    assert (groups["e"]["lag"], groups["e"]["lag_exact"]) == (3, False)  # 1 of the 3 matches
    assert (groups["s"]["lag"], groups["s"]["lag_exact"]) == (0, True)  # nothing behind it
    table = rb(db, "group", "list").stdout
    rows = {
        line.split()[0]: line.split()
        for line in table.splitlines()
        if line.strip()[:2] in ("e ", "o ", "s ")
    }
    assert rows["o"][-1] == "3" and rows["e"][-2:] == ["≤", "3"] and rows["s"][-1] == "0"
    assert NOTE in table


def test_messages_on_the_catch_all_topic_are_an_upper_bound(db: str) -> None:
    """The case that was reported: a sensors/# group with no sensors/ message
    at all showed the catch-all topic's messages as its lag."""
    produce(db, "mqtt", "other/a", "other/b")
    groups = listed(db)
    assert (groups["s"]["lag"], groups["s"]["lag_exact"]) == (2, False)
    described = json.loads(rb(db, "group", "describe", "s", "sensors/#", "--json").stdout)
    assert (described["lag"], described["lag_exact"]) == (2, False)
    behind = [s for s in described["streams"] if s["lag"]]
    assert len(behind) == 2 and not any(s["lag_exact"] for s in behind)
    text = rb(db, "group", "describe", "s", "sensors/#").stdout
    assert "≤ 2" in text and NOTE in text


def test_no_note_when_every_lag_is_exact(db: str) -> None:
    produce(db, "orders", "orders/eu")
    assert rb(db, "group", "delete", "e", "orders/eu").exit_code == 0
    assert NOTE not in rb(db, "group", "list").stdout
    text = rb(db, "group", "describe", "o", "orders/#").stdout
    assert "≤" not in text and NOTE not in text
