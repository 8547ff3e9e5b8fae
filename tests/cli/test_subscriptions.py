"""`riverbed subscription ...`: create, list, delete, start positions, lag and
reset; bad input changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from harness.cli import (
    as_json,
    committed,
    heads,
    jsonl,
    make_topic,
    ok,
    produce_n,
    rb,
)
from harness.clock import moment_between

# --------------------------------------------------------------------- subscriptions


def test_subscription_create_list_delete(db: str) -> None:
    make_topic(db)
    out = ok(db, "subscription", "create", "s1", "--topic", "orders", "--filter", "orders/eu/#")
    assert "created subscription 's1'" in out.stdout
    ok(db, "subscription", "create", "s2", "--topic", "orders", "--start", "2024-05-01T12:00:00")
    listed = as_json(ok(db, "subscription", "list", "--json"))
    assert [s["name"] for s in listed] == ["s1", "s2"]
    assert listed[0]["filter"] == "orders/eu/#" and listed[0]["start"] == "earliest"
    assert listed[1]["start"] == "time"
    assert listed[1]["start_time"] == "2024-05-01T12:00:00.000000Z"  # naive means UTC
    assert as_json(ok(db, "subscription", "list", "--topic", "mqtt", "--json")) == []
    assert "s2" in ok(db, "subscription", "list").stdout
    result = rb(db, "subscription", "create", "s1", "--topic", "orders")
    assert result.exit_code == 1 and "exists already" in result.stderr
    assert "deleted subscription 's1'" in ok(db, "subscription", "delete", "s1").stdout
    assert [s["name"] for s in as_json(ok(db, "subscription", "list", "--json"))] == ["s2"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--start", "yesterday"], ["'yesterday'", "ISO 8601"]),
        (["--start", "1960-01-01T00:00:00"], ["before 1970"]),
        (["--filter", "orders/#/eu"], ["'orders/#/eu'", "'#' must be"]),
    ],
)
def test_bad_subscription_create_changes_nothing(
    db: str, args: list[str], words: list[str]
) -> None:
    make_topic(db)
    result = rb(db, "subscription", "create", "s", "--topic", "orders", *args)
    assert result.exit_code == 2
    assert all(w in result.stderr for w in words), result.stderr
    assert as_json(ok(db, "subscription", "list", "--json")) == []
    result = rb(db, "subscription", "create", "bad name", "--topic", "orders")
    assert result.exit_code == 2 and "'bad name'" in result.stderr


def test_start_latest_and_time(db: str) -> None:
    make_topic(db)
    produce_n(db, 10)
    middle = datetime.fromtimestamp(moment_between() / 1e6, UTC)  # between two writes
    ok(db, "subscription", "create", "latest", "--topic", "orders", "--start", "latest")
    ok(db, "subscription", "create", "aware", "--topic", "orders", "--start", middle.isoformat())
    naive = middle.replace(tzinfo=None).isoformat()
    ok(db, "subscription", "create", "naive", "--topic", "orders", "--start", naive)
    produce_n(db, 4)
    assert len(jsonl(ok(db, "consume", "latest"))) == 4
    assert len(jsonl(ok(db, "consume", "aware"))) == 4
    assert len(jsonl(ok(db, "consume", "naive"))) == 4


def test_lag_before_and_after(db: str) -> None:
    make_topic(db)
    produce_n(db, 12)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    lag = as_json(ok(db, "subscription", "lag", "s", "--json"))
    assert lag["subscription"] == "s" and lag["total"] == 12
    for s in lag["streams"]:
        assert s["committed"] == 0 and s["lag"] == s["head"] and s["readable"] is True
    table = ok(db, "subscription", "lag", "s").stdout
    assert "orders/0/0" in table and "total" in table
    ok(db, "consume", "s", "--max", "5")
    assert as_json(ok(db, "subscription", "lag", "s", "--json"))["total"] == 7
    ok(db, "consume", "s")
    after = as_json(ok(db, "subscription", "lag", "s", "--json"))
    assert after["total"] == 0
    assert all(s["committed"] == s["head"] for s in after["streams"])


def test_lag_shows_streams_waiting_for_an_earlier_generation(db: str) -> None:
    make_topic(db)
    produce_n(db, 8)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    ok(db, "topic", "add-storage-topic", "orders", "--partitions", "8")
    ok(db, "topic", "switch-produce", "orders")
    produce_n(db, 8)
    streams = as_json(ok(db, "subscription", "lag", "s", "--json"))["streams"]
    waiting = {s["stream"] for s in streams if not s["readable"]}
    assert waiting and all(s.startswith("orders/1/") for s in waiting)
    got = jsonl(ok(db, "consume", "s"))
    assert len(got) == 16
    assert as_json(ok(db, "subscription", "lag", "s", "--json"))["total"] == 0


def test_reset_to_earliest_latest_time_and_offsets(db: str) -> None:
    make_topic(db, "orders", "2")
    produce_n(db, 10, keys=0)
    middle = datetime.fromtimestamp(moment_between() / 1e6, UTC).isoformat()  # between writes
    produce_n(db, 6, keys=0)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    ok(db, "consume", "s")
    ends = {s: end for s, (_, end) in heads(db, "orders").items()}
    assert committed(db, "s") == ends

    reset = as_json(ok(db, "subscription", "reset", "s", "--to", "earliest", "--json"))
    assert reset == {"subscription": "s", "offsets": {s: 0 for s in ends}}
    assert committed(db, "s") == {s: 0 for s in ends}
    assert len(jsonl(ok(db, "consume", "s"))) == 16

    ok(db, "subscription", "reset", "s", "--to", middle)
    assert len(jsonl(ok(db, "consume", "s"))) == 6

    ok(db, "subscription", "reset", "s", "--to", "earliest")
    ok(db, "subscription", "reset", "s", "--to", "latest")
    assert committed(db, "s") == ends
    assert jsonl(ok(db, "consume", "s")) == []

    a, b = sorted(ends)  # orders/0/0 and orders/0/1
    explicit = f"{b}={ends[b] // 2},{a}={ends[a] // 3}"
    table = ok(db, "subscription", "reset", "s", "--to", explicit).stdout
    assert b in table and "before" in table
    assert committed(db, "s") == {a: ends[a] // 3, b: ends[b] // 2}
    rest = ends[a] - ends[a] // 3 + ends[b] - ends[b] // 2
    assert len(jsonl(ok(db, "consume", "s"))) == rest
    ok(db, "subscription", "reset", "s", "--to", f"{b}=0")  # other streams keep theirs
    assert committed(db, "s") == {a: ends[a], b: 0}


@pytest.mark.parametrize(
    ("target", "code", "words"),
    [
        ("orders/0/1=99", 2, ["offset 99", "orders/0/1", "outside the retained range"]),
        ("orders/0/7=0", 2, ["orders/0/7", "not a stream of topic 'orders'"]),
        ("other/0/0=0", 2, ["other/0/0", "not a stream of topic 'orders'"]),
        ("orders/0/1=1,orders/0/0=x", 2, ["'x'", "integer >= 0"]),
        ("orders/0/1=-1", 2, ["'-1'", "integer >= 0"]),
        ("orders/1=3", 2, ["'orders/1'", "topic/generation/partition"]),
        ("orders/0/1=1,orders/0/1=2", 2, ["orders/0/1", "twice"]),
        ("someday", 2, ["'someday'", "ISO 8601"]),
    ],
)
def test_bad_reset_changes_nothing(db: str, target: str, code: int, words: list[str]) -> None:
    make_topic(db, "orders", "2")
    produce_n(db, 10, keys=2)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    ok(db, "consume", "s", "--max", "3")
    before = committed(db, "s")
    result = rb(db, "subscription", "reset", "s", "--to", target)
    assert result.exit_code == code
    assert all(w in result.stderr for w in words), result.stderr
    assert committed(db, "s") == before
