"""`riverbed group create|list|describe|delete` (issue 5), in process, on both
backends: a group starting in the past, its Leader, progress and lag; bad input
refused with exit 2 (a bad value) or 1 (exists, not found), changing nothing."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.cli import rb
from harness.clock import moment_between
from riverbed.log.log import Log
from riverbed.model import Message, StreamId
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.protocol import GroupId


def ok(url: str, *args: str) -> Any:
    result = rb(url, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout) if "--json" in args else result.stdout


def iso(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, UTC).isoformat()


@pytest.fixture
def before_and_after(storage_url: str) -> int:
    """Topic `sensors` (one partition, bound to sensors/#): 3 messages, then a
    moment (returned, µs), then 2 more."""
    with Log.open(storage_url) as log:
        log.topics.create("sensors", 1, binding="sensors/#")
        log.produce("sensors", [Message(b"old", key="k", mqtt_topic="sensors/a")] * 3)
        moment = moment_between()  # the scenario: a moment between two writes
        log.produce("sensors", [Message(b"new", key="k", mqtt_topic="sensors/a")] * 2)
    return moment


def _sensors(described: dict[str, Any]) -> dict[str, Any]:
    (stream,) = [s for s in described["streams"] if s["stream"].startswith("sensors/")]
    return stream  # type: ignore[no-any-return]


def test_a_group_may_start_in_the_past(storage_url: str, before_and_after: int) -> None:
    out = ok(storage_url, "group", "create", "since", "sensors/#", "--start", iso(before_and_after))
    assert "created group 'since' sharing 'sensors/#'" in out
    ok(storage_url, "group", "create", "all", "sensors/#", "--start", "earliest")
    ok(storage_url, "group", "create", "now", "sensors/#")  # default: from now

    since = ok(storage_url, "group", "describe", "since", "sensors/#", "--json")
    assert _sensors(since) == {
        "stream": "sensors/0/0",
        "position": 3,
        "head": 5,
        "lag": 2,
        "lag_exact": True,  # the binding sensors/# lets in only what the filter matches
        "consumed": False,
        "borrower": None,
    }
    assert since["leader"] is None
    # The built-in `mqtt` topic is reachable by any filter, empty here.
    assert {s["stream"].split("/")[0] for s in since["streams"]} == {"sensors", "mqtt"}
    listed = {row["group"]: row for row in ok(storage_url, "group", "list", "--json")}
    assert {name: row["lag"] for name, row in listed.items()} == {"since": 2, "all": 5, "now": 0}
    assert listed["all"]["start"] is None and listed["since"]["filter"] == "sensors/#"
    table = ok(storage_url, "group", "describe", "all", "sensors/#")
    assert "sensors/0/0" in table and "leader: -" in table


def test_describe_shows_the_leader_and_saved_progress(
    storage_url: str, before_and_after: int
) -> None:
    ok(storage_url, "group", "create", "g", "sensors/#", "--start", "earliest")
    with Log.open(storage_url) as log:
        store = GroupStore(log.storage)
        now = time.time_ns() // 1000
        claim = store.claim(GroupId("g", "sensors/#"), "leader-1", ttl_us=60_000_000, now_us=now)
        sensors = StreamId("sensors", 0, 0)
        store.save(claim, {sensors: 4}, now_us=now, holdings={"borrower-1": [sensors]})
    described = ok(storage_url, "group", "describe", "g", "sensors/#", "--json")
    assert described["leader"] == "leader-1" and "leader_claim_expires" in described
    assert _sensors(described)["position"] == 4 and described["lag"] == 1
    assert described["borrowers"] == {"borrower-1": ["sensors/0/0"]}
    assert _sensors(described)["borrower"] == "borrower-1"
    assert "borrower: borrower-1 (1 stream)" in ok(
        storage_url, "group", "describe", "g", "sensors/#"
    )
    assert "leader-1" in ok(storage_url, "group", "list")

    assert "deleted group $share/g/sensors/#" in ok(
        storage_url, "group", "delete", "g", "sensors/#"
    )
    assert ok(storage_url, "group", "list", "--json") == []
    with Log.open(storage_url) as log:
        assert GroupStore(log.storage).leader_of(GroupId("g", "sensors/#"), now) is None


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("create", "a/b", "x"), 2, "must not contain '/', '+' or '#'"),
        (("create", "", "x"), 2, "must not be empty"),
        (("create", "g", "bad/#/x"), 2, "'#' must be a whole level"),
        (("create", "g", "x", "--start", "yesterday"), 2, "'yesterday' is not a position"),
        (("describe", "missing", "x"), 1, "group $share/missing/x does not exist"),
        (("delete", "missing", "x"), 1, "group $share/missing/x does not exist"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    storage_url: str, args: tuple[str, ...], code: int, words: str
) -> None:
    Log.open(storage_url).close()  # a database without groups
    result = rb(storage_url, "group", *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert words in result.stderr
    assert ok(storage_url, "group", "list", "--json") == []


def test_creating_a_group_twice_is_refused(storage_url: str) -> None:
    ok(storage_url, "group", "create", "g", "x", "--start", "earliest")
    result = rb(storage_url, "group", "create", "g", "x")
    assert result.exit_code == 1
    assert "group $share/g/x exists already" in result.stderr
    (row,) = ok(storage_url, "group", "list", "--json")
    assert row["start"] is None  # the first one, unchanged
