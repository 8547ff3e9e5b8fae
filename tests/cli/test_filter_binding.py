"""A subscription whose filter can never match its topic's binding is refused,
like `produce` refuses a message its binding does not match: with the binding
in the message, and nothing created (no queues for one that delivers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import rb
from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.subscriptions.named import Subscriptions


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/x.db"
    for args in (
        ["topic", "create", "orders", "--partitions", "2", "--binding", "orders/#"],
        ["topic", "create", "loose", "--partitions", "1"],
    ):
        assert rb(url, *args).exit_code == 0
    return url


def _state(db: str) -> tuple[object, object]:
    topics = json.loads(rb(db, "topic", "list", "--json").stdout)
    subscriptions = json.loads(rb(db, "subscription", "list", "--json").stdout)
    return topics, subscriptions


@pytest.mark.parametrize("topic_filter", ["shipping/#", "order", "shipping", "$SYS/#", "x/#x"])
@pytest.mark.parametrize("delivering", [[], ["--endpoint", "m:f"]], ids=["plain", "delivering"])
def test_a_filter_the_binding_never_matches_is_refused(
    db: str, topic_filter: str, delivering: list[str]
) -> None:
    before = _state(db)
    result = rb(
        db,
        "subscription",
        "create",
        "z",
        "--topic",
        "orders",
        "--filter",
        topic_filter,
        *delivering,
    )
    assert result.exit_code == 2, result.output
    if topic_filter.endswith("x/#x"):
        assert "'#' must be" in result.stderr  # not a filter at all
    else:
        assert result.stderr == (
            f"error: filter {topic_filter!r} can never match: topic 'orders' stores only MQTT"
            " topics its binding 'orders/#' matches, and no topic name matches both\n"
        )
    assert _state(db) == before


@pytest.mark.parametrize("topic_filter", ["orders/eu/#", "+/eu", "#", "orders", "+/#"])
def test_a_filter_sharing_a_topic_with_the_binding_is_accepted(db: str, topic_filter: str) -> None:
    # "orders" is matched by "orders/#" (# matches the parent level too).
    result = rb(db, "subscription", "create", "z", "--topic", "orders", "--filter", topic_filter)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("topic_filter", ["shipping/#", "a/b"])
def test_a_topic_without_binding_takes_any_filter(db: str, topic_filter: str) -> None:
    result = rb(db, "subscription", "create", "z", "--topic", "loose", "--filter", topic_filter)
    assert result.exit_code == 0, result.output


def test_the_library_refuses_it_too(db: str) -> None:
    with Log.open(db) as log:
        with pytest.raises(InvalidInput, match="binding 'orders/#'"):
            Subscriptions(log.storage).create("z", "orders", "shipping/#")
        assert Subscriptions(log.storage).list() == []
