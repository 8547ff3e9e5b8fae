"""`riverbed topic ...` and `riverbed retention run`: the happy paths, and bad
input refused naming the value and the rule, leaving storage as it was."""

from __future__ import annotations

import pytest

from harness.cli import (
    as_json,
    committed,
    heads,
    make_topic,
    ok,
    produce_n,
    rb,
    total,
)
from riverbed import cli as cli_module
from riverbed.storage import open_storage

# --------------------------------------------------------------------- topics


def test_topic_create_list_describe(db: str) -> None:
    out = ok(
        db,
        "topic",
        "create",
        "orders",
        "--partitions",
        "4",
        "--binding",
        "orders/#",
        "--retention",
        "12h",
        "--retention-policy",
        "expired",
    )
    assert "orders" in out.stdout
    ok(db, "topic", "create", "forever", "--partitions", "1", "--retention", "none")
    listed = {t["name"]: t for t in as_json(ok(db, "topic", "list", "--json"))}
    assert listed["orders"] == {
        "name": "orders",
        "binding": "orders/#",
        "key": "client-topic",
        "partitions": 4,
        "generations": 1,
        "retention": "12h",
        "retention_policy": "expired",
        "max_age": None,
        "max_messages": None,
        "max_bytes": None,
        "messages": 0,
        "subscriptions": 0,
    }
    assert listed["forever"]["retention"] is None
    assert listed["forever"]["retention_policy"] == "consumed-and-expired"
    assert "mqtt" in listed  # the built-in catch-all topic
    table = ok(db, "topic", "list").stdout
    assert "orders/#" in table and "12h (expired)" in table and "none" in table

    info = as_json(ok(db, "topic", "describe", "orders", "--json"))
    assert info["produce_pointer"] == 0
    assert info["storage_topics"] == [{"generation": 0, "partitions": 4, "k": 1}]
    assert [s["stream"] for s in info["streams"]] == [f"orders/0/{p}" for p in range(4)]
    assert info["streams"][0] == {
        "stream": "orders/0/0",
        "start_offset": 0,
        "next_offset": 0,
        "sealed": False,
    }
    assert info["subscriptions"] == []
    text = ok(db, "topic", "describe", "orders").stdout
    assert "orders/0/3" in text and "produces to generation 0" in text


def test_add_storage_topic_and_switch_produce_show_in_describe(db: str) -> None:
    make_topic(db)
    produce_n(db, 20)
    added = ok(db, "topic", "add-storage-topic", "orders", "--partitions", "8").stdout
    assert "generation 1" in added and "K=2" in added
    info = as_json(ok(db, "topic", "describe", "orders", "--json"))
    assert info["storage_topics"][1] == {"generation": 1, "partitions": 8, "k": 2}
    assert info["produce_pointer"] == 0
    assert not any(s["sealed"] for s in info["streams"])

    assert "now produces to generation 1" in ok(db, "topic", "switch-produce", "orders").stdout
    info = as_json(ok(db, "topic", "describe", "orders", "--json"))
    assert info["produce_pointer"] == 1
    sealed = {s["stream"]: s["sealed"] for s in info["streams"]}
    assert sealed == {f"orders/0/{p}": True for p in range(4)} | {
        f"orders/1/{p}": False for p in range(8)
    }
    assert "already produces" in ok(db, "topic", "switch-produce", "orders").stdout

    produce_n(db, 10)
    assert (
        sum(end for s, (_, end) in heads(db, "orders").items() if s.startswith("orders/1/")) == 10
    )
    # A K=1 reset: 6 is not a multiple of the base count 4.
    assert "K=1" in ok(db, "topic", "add-storage-topic", "orders", "--partitions", "6").stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--partitions", "5"], ["partition count 5", "1, 2, 3 or a multiple of 4 or 6"]),
        (["--partitions", "0"], ["partition count 0", "at least 1"]),
        (["--partitions", "4", "--binding", "orders/#/x"], ["orders/#/x", "'#' must be"]),
        (["--partitions", "4", "--binding", "orders/eu"], ["'orders/eu' overlaps", "'orders/#'"]),
        (["--partitions", "4", "--retention", "3 days"], ["'3 days'", "unit"]),
        (["--partitions", "4", "--retention-policy", "never"], ["'never'", "consumed"]),
    ],
)
def test_bad_topic_create_changes_nothing(db: str, args: list[str], words: list[str]) -> None:
    make_topic(db)
    before = as_json(ok(db, "topic", "list", "--json"))
    result = rb(db, "topic", "create", "new", *args)
    assert result.exit_code == 2
    assert all(w in result.stderr for w in words), result.stderr
    assert as_json(ok(db, "topic", "list", "--json")) == before


def test_bad_topic_name_and_duplicates(db: str) -> None:
    result = rb(db, "topic", "create", "no/slash", "--partitions", "1")
    assert result.exit_code == 2 and "'no/slash'" in result.stderr
    make_topic(db)
    result = rb(db, "topic", "create", "orders", "--partitions", "1")
    assert result.exit_code == 1 and result.stderr == "error: topic 'orders' exists already\n"


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["topic", "describe", "nope"], "topic"),
        (["topic", "add-storage-topic", "nope", "--partitions", "2"], "topic"),
        (["topic", "switch-produce", "nope"], "topic"),
        (["topic", "delete", "nope", "--yes"], "topic"),
        (["produce", "nope"], "topic"),
        (["subscription", "create", "s", "--topic", "nope"], "topic"),
        (["subscription", "lag", "nope"], "subscription"),
        (["subscription", "reset", "nope", "--to", "earliest"], "subscription"),
        (["subscription", "delete", "nope"], "subscription"),
        (["consume", "nope"], "subscription"),
        (["retention", "run", "nope"], "topic"),
    ],
)
def test_unknown_names_exit_1(db: str, args: list[str], kind: str) -> None:
    open_storage(db).close()  # a database without topics or subscriptions
    result = rb(db, *args, input="")
    assert result.exit_code == 1
    assert result.stderr == f"error: {kind} 'nope' does not exist\n"


def test_bad_add_storage_topic_changes_nothing(db: str) -> None:
    make_topic(db)
    result = rb(db, "topic", "add-storage-topic", "orders", "--partitions", "7")
    assert result.exit_code == 2 and "partition count 7" in result.stderr
    assert len(as_json(ok(db, "topic", "describe", "orders", "--json"))["storage_topics"]) == 1


def test_topic_delete_needs_confirmation(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_topic(db)
    produce_n(db, 3)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    result = rb(db, "topic", "delete", "orders")
    assert result.exit_code == 2
    assert "--yes" in result.stderr and "messages: 3, subscriptions: 1" in result.stderr
    assert total(db, "orders") == 3

    monkeypatch.setattr(cli_module.topics, "_interactive", lambda: True)
    result = rb(db, "topic", "delete", "orders", input="n\n")
    assert result.exit_code == 1 and total(db, "orders") == 3  # Aborted!
    ok(db, "topic", "delete", "orders", input="y\n")
    assert rb(db, "topic", "describe", "orders").exit_code == 1
    assert as_json(ok(db, "subscription", "list", "--json")) == []

    make_topic(db)
    assert "deleted topic 'orders'" in ok(db, "topic", "delete", "orders", "--yes").stdout
    result = rb(db, "topic", "delete", "mqtt", "--yes")
    assert result.exit_code == 2 and "built in" in result.stderr


# --------------------------------------------------------------------- retention and demo


def test_retention_run(db: str) -> None:
    make_topic(db, "orders", "2", "--retention-policy", "consumed")
    make_topic(db, "kept", "1")
    produce_n(db, 10, keys=2)
    produce_n(db, 3, topic="kept")
    ok(db, "subscription", "create", "s", "--topic", "orders")
    ok(db, "consume", "s", "--max", "4")
    ends = committed(db, "s")
    result = ok(db, "retention", "run")
    for stream, offset in ends.items():
        if offset:
            assert (
                f"{stream}: deleted {offset}, first retained offset now {offset}" in result.stdout
            )
    emptied = sum(1 for o in ends.values() if o)
    streams = "1 stream" if emptied == 1 else f"{emptied} streams"
    assert result.stdout.splitlines()[-1] == f"deleted 4 messages from {streams}"
    assert {s: start for s, (start, _) in heads(db, "orders").items()} == ends
    assert total(db, "kept") == 3  # its default policy keeps a week
    assert ok(db, "retention", "run", "orders").stdout == "deleted 0 messages from 0 streams\n"
