"""The `riverbed` command line: every command's happy path, and every bad input
refused with exit 2 (a bad value) or 1 (not found, exists, unreachable) and a
message that names the value and the rule, leaving the storage as it was.

Most tests drive the click command in process (CliRunner); `tests/cli/` runs the
installed `riverbed` script in real processes (pipes, signals, exit codes).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from riverbed import cli as cli_module
from riverbed.cli import cli
from riverbed.log.log import Log
from riverbed.model import Message, MessageId
from riverbed.storage import open_storage


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/x.db"


def rb(db: str, *args: str, input: str | bytes | None = None) -> Result:
    """Run `riverbed ARGS --db DB` in process."""
    return CliRunner().invoke(cli, [*args, "--db", db], input=input, catch_exceptions=False)


def ok(db: str, *args: str, input: str | bytes | None = None) -> Result:
    result = rb(db, *args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def jsonl(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def heads(db: str, topic: str) -> dict[str, tuple[int, int]]:
    """stream -> (start offset, next offset)."""
    storage = open_storage(db)
    try:
        return {str(h.stream): (h.start_offset, h.next_offset) for h in storage.list_streams(topic)}
    finally:
        storage.close()


def total(db: str, topic: str) -> int:
    return sum(end - start for start, end in heads(db, topic).values())


def committed(db: str, name: str) -> dict[str, int]:
    return {
        s["stream"]: s["committed"]
        for s in as_json(ok(db, "subscription", "lag", name, "--json"))["streams"]
    }


def lines(*messages: dict[str, Any]) -> str:
    return "".join(json.dumps(m) + "\n" for m in messages)


def make_topic(db: str, name: str = "orders", partitions: str = "4", *extra: str) -> None:
    ok(db, "topic", "create", name, "--partitions", partitions, "--binding", f"{name}/#", *extra)


def produce_n(db: str, n: int, topic: str = "orders", keys: int = 5) -> None:
    """n messages over `keys` keys (0: no key, spread over the partitions)."""
    messages = [
        {"key": f"k{i % keys}" if keys else None, "payload": f"m{i}", "mqtt_topic": f"{topic}/x"}
        for i in range(n)
    ]
    ok(db, "produce", topic, input=lines(*messages))


# --------------------------------------------------------------------- help and --db


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


ALL_COMMANDS = [path for path, _ in _commands(cli)]


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "riverbed")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0
    assert "Usage: " in result.stdout


NO_DATABASE = {
    ("passwd",),
    ("config", "example"),
    ("token", "add"),
    ("token", "list"),
    ("token", "revoke"),
}
"""Commands that never open the log (they manage files of their own)."""


def test_every_leaf_and_the_root_take_db() -> None:
    for path, command in _commands(cli):
        if (isinstance(command, click.Group) and path) or path in NO_DATABASE:
            continue
        assert "--db" in [o for p in command.params for o in p.opts], path


def test_db_resolution_leaf_then_root_then_env_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaf, root, env = (f"sqlite:///{tmp_path}/{n}.db" for n in ("leaf", "root", "env"))
    monkeypatch.setenv("RIVERBED_DB", env)
    runner = CliRunner()
    create = ["topic", "create", "t1", "--partitions", "1"]
    assert runner.invoke(cli, ["--db", root, *create, "--db", leaf]).exit_code == 0
    assert (
        runner.invoke(cli, ["--db", root, "topic", "create", "t2", "--partitions", "1"]).exit_code
        == 0
    )
    assert runner.invoke(cli, ["topic", "create", "t3", "--partitions", "1"]).exit_code == 0
    monkeypatch.delenv("RIVERBED_DB")
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(cli, ["topic", "create", "t4", "--partitions", "1"]).exit_code == 0

    def names(url: str) -> set[str]:
        return {t["name"] for t in as_json(ok(url, "topic", "list", "--json"))} - {"mqtt"}

    assert names(leaf) == {"t1"}
    assert names(root) == {"t2"}
    assert names(env) == {"t3"}
    assert (tmp_path / "riverbed-data" / "riverbed.db").exists()
    assert names("sqlite:///./riverbed-data/riverbed.db") == {"t4"}


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite://somehost/x.db", ["sqlite://somehost/x.db", "no host"]),
        ("mysql://localhost/x", ["mysql", "unsupported scheme"]),
        ("sqlite:///", ["names no database file"]),
        ("sqlite:///x.db?synchronous=sometimes", ["synchronous", "normal or full"]),
    ],
)
def test_malformed_db_url_is_a_usage_error(url: str, words: list[str]) -> None:
    result = CliRunner().invoke(cli, ["topic", "list", "--db", url])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert all(w in result.stderr for w in words), result.stderr
    assert "Traceback" not in result.output


def test_unreachable_postgres_is_a_runtime_error() -> None:
    result = CliRunner().invoke(cli, ["topic", "list", "--db", "postgresql://nobody@127.0.0.1:1/x"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot connect to PostgreSQL")


def test_click_usage_errors_exit_2(db: str) -> None:
    assert rb(db, "topic", "create", "t").exit_code == 2  # --partitions missing
    assert rb(db, "topic", "create", "t", "--partitions", "four").exit_code == 2
    assert rb(db, "no-such-command").exit_code == 2
    assert rb(db, "consume", "s", "--max", "0").exit_code == 2


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


# --------------------------------------------------------------------- produce and consume


def test_produce_consume_round_trip(db: str) -> None:
    make_topic(db)
    binary = bytes(range(256))
    sent = [
        {"key": "a", "payload": "héllo ✓", "mqtt_topic": "orders/eu/1"},
        {"key": "a", "payload_b64": base64.b64encode(binary).decode(), "qos": 2, "retain": True},
        {
            "payload": "",
            "properties": [
                ["content-type", "text/plain"],
                ["n", 7],
                ["n", "again"],
                ["raw", {"b64": "AAE="}],
            ],
        },
        {"key": None, "payload": "{}", "mqtt_topic": None, "properties": {"trace": "t-1"}},
    ]
    produced = ok(db, "produce", "orders", "--print-positions", input=lines(*sent))
    positions = jsonl(produced)
    assert len(positions) == 4
    assert positions[0]["stream"] == positions[1]["stream"]  # same key, same stream, in order
    assert positions[1]["offset"] == positions[0]["offset"] + 1
    assert "produced 4 messages" in produced.stderr

    ok(db, "subscription", "create", "s", "--topic", "orders")
    got = jsonl(ok(db, "consume", "s"))
    by_position = {(m["stream"], m["offset"]): m for m in got}
    assert set(by_position) == {(p["stream"], p["offset"]) for p in positions}
    first, second, third, fourth = (by_position[(p["stream"], p["offset"])] for p in positions)

    assert first["payload"] == "héllo ✓" and first["key"] == "a"
    assert first["mqtt_topic"] == "orders/eu/1"
    assert first["qos"] == 0 and first["retain"] is False and first["properties"] == []
    assert second["payload"] is None
    assert base64.b64decode(second["payload_b64"]) == binary
    assert second["qos"] == 2 and second["retain"] is True and second["mqtt_topic"] is None
    assert "payload_b64" not in first
    assert third["payload"] == "" and third["key"] is None
    assert third["properties"] == [
        ["content-type", "text/plain"],
        ["n", 7],
        ["n", "again"],
        ["raw", {"b64": "AAE="}],
    ]
    assert fourth["properties"] == [["trace", "t-1"]]
    for m in got:
        assert set(m) >= {
            "stream",
            "offset",
            "id",
            "timestamp",
            "mqtt_topic",
            "key",
            "payload",
            "properties",
            "qos",
            "retain",
        }
        assert str(MessageId.parse(m["id"])) == m["id"]
        stamp = datetime.fromisoformat(m["timestamp"])
        assert stamp.tzinfo is not None and stamp.utcoffset() == UTC.utcoffset(None)
        assert m["timestamp"].endswith("Z") and len(m["timestamp"].split(".")[1]) == 7
        assert abs(stamp.timestamp() - MessageId.parse(m["id"]).timestamp_us / 1e6) < 1e-6


def test_produce_blank_lines_summary_and_batches(db: str) -> None:
    make_topic(db, "orders", "4")
    n = 2 * cli_module.PRODUCE_BATCH + 500
    body = "\n".join(json.dumps({"key": f"k{i % 7}", "payload": str(i)}) for i in range(n))
    result = ok(db, "produce", "orders", "--print-positions", input="\n  \n" + body + "\n\n")
    assert f"produced {n} messages to topic 'orders'" in result.stderr
    per_stream = {stream: (0, end) for stream, (_, end) in heads(db, "orders").items()}
    for stream, (_, end) in per_stream.items():
        if end:
            assert f"  {stream}  {end}" in result.stderr
    positions = jsonl(result)
    assert len(positions) == n
    for stream, (_, end) in per_stream.items():
        assert sorted(p["offset"] for p in positions if p["stream"] == stream) == list(range(end))
    assert ok(db, "produce", "orders", input="").stderr.startswith("produced 0 messages")


GOOD = {"key": "k", "payload": "fine", "mqtt_topic": "orders/eu"}


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"payload": "x"', ["not valid JSON"]),
        ("[1, 2]", ["[1, 2]", "not a JSON object"]),
        ('{"payload": "x", "colour": "red"}', ["unknown field 'colour'", "known fields"]),
        ('{"payload": "x", "payload_b64": "AA=="}', ["exactly one of payload", "not both"]),
        ('{"key": "k"}', ["exactly one of payload", "neither"]),
        ('{"payload_b64": "not base64!"}', ['"not base64!"', "not valid base64"]),
        ('{"payload_b64": "AAA"}', ['"AAA"', "not valid base64"]),
        ('{"payload_b64": "é"}', ['"é"', "not valid base64"]),
        ('{"payload": 12}', ["payload 12", "not a string"]),
        ('{"payload": "x", "key": 5}', ["key 5", "not a string"]),
        ('{"payload": "x", "qos": 3}', ["qos 3", "0, 1 or 2"]),
        ('{"payload": "x", "qos": true}', ["qos true", "0, 1 or 2"]),
        ('{"payload": "x", "retain": "yes"}', ['retain "yes"', "true or false"]),
        ('{"payload": "x", "properties": "a=b"}', ['"a=b"', "[name, value] pairs"]),
        ('{"payload": "x", "properties": [["a"]]}', ['["a"]', "[name, value] pair"]),
        ('{"payload": "x", "properties": [["a", true]]}', ["'a'", "true", "a string, an integer"]),
        ('{"payload": "x", "properties": [["a", {"b64": "!"}]]}', ['"!"', "base64"]),
        ('{"payload": "\\ud800"}', ["payload", "lone surrogate"]),
        ('{"payload": "x", "mqtt_topic": "orders/+"}', ["'orders/+'", "wildcard"]),
        ('{"payload": "x", "mqtt_topic": "elsewhere/x"}', ["'elsewhere/x'", "binding 'orders/#'"]),
        ('{"payload": "x", "mqtt_topic": ""}', ["mqtt_topic", "empty"]),
        ('{"payload": "x", "mqtt_topic": 7}', ["mqtt_topic 7", "not a string"]),
    ],
)
def test_a_bad_line_writes_nothing(db: str, line: str, words: list[str]) -> None:
    make_topic(db)
    result = rb(db, "produce", "orders", input=lines(GOOD, GOOD) + line + "\n")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: line 3: ")
    assert all(w in result.stderr for w in words), result.stderr
    assert result.stdout == ""
    assert total(db, "orders") == 0


def test_invalid_utf8_line_writes_nothing(db: str) -> None:
    make_topic(db)
    result = rb(db, "produce", "orders", input=b'{"payload": "ok"}\n{"payload": "\xff"}\n')
    assert result.exit_code == 2
    assert result.stderr == "error: line 2: not valid UTF-8 at byte 13\n"
    assert total(db, "orders") == 0


def test_consume_commits_what_it_printed(db: str) -> None:
    make_topic(db)
    produce_n(db, 30)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    first = ok(db, "consume", "s", "--max", "10", "--batch", "3")
    assert len(jsonl(first)) == 10
    assert "consumed 10 messages" in first.stderr
    assert sum(committed(db, "s").values()) == 10
    rest = jsonl(ok(db, "consume", "s"))
    assert len(rest) == 20
    seen = {(m["stream"], m["offset"]) for m in jsonl(first) + rest}
    assert len(seen) == 30
    assert jsonl(ok(db, "consume", "s")) == []  # nothing new
    produce_n(db, 2)
    assert len(jsonl(ok(db, "consume", "s", "--max", "5"))) == 2


def test_consume_keeps_per_key_order(db: str) -> None:
    make_topic(db)
    produce_n(db, 200, keys=3)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    got = jsonl(ok(db, "consume", "s", "--batch", "7"))
    for key in ("k0", "k1", "k2"):
        numbers = [int(m["payload"][1:]) for m in got if m["key"] == key]
        assert numbers == sorted(numbers)


def test_consume_with_filter_reads_past_and_commits_what_it_skips(db: str) -> None:
    make_topic(db, "orders", "1")
    sent = [{"key": "k", "payload": str(i), "mqtt_topic": "orders/us"} for i in range(50)]
    sent.append({"key": "k", "payload": "eu", "mqtt_topic": "orders/eu"})
    ok(db, "produce", "orders", input=lines(*sent))
    ok(db, "subscription", "create", "eu", "--topic", "orders", "--filter", "orders/eu")
    got = jsonl(ok(db, "consume", "eu", "--batch", "10"))
    assert [m["payload"] for m in got] == ["eu"]
    assert committed(db, "eu") == {"orders/0/0": 51}


def test_consume_follow_stops_at_max(db: str) -> None:
    make_topic(db)
    produce_n(db, 5)
    ok(db, "subscription", "create", "s", "--topic", "orders")
    assert len(jsonl(ok(db, "consume", "s", "--follow", "--max", "5"))) == 5
    assert sum(committed(db, "s").values()) == 5


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
    time.sleep(0.01)  # the scenario: a moment strictly between two writes
    middle = datetime.now(UTC)
    time.sleep(0.01)
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
    time.sleep(0.01)  # the scenario: a moment strictly between two writes
    middle = datetime.now(UTC).isoformat()
    time.sleep(0.01)
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


def test_demo_runs_twice(db: str) -> None:
    first = ok(db, "demo")
    assert "try next" in first.stdout and "demo-reader" in first.stdout
    assert f"--db {db}" in first.stdout
    second = ok(db, "demo")
    assert "consumed 1000" in second.stdout
    assert total(db, "demo") == 2 * cli_module.DEMO_MESSAGES
    assert as_json(ok(db, "subscription", "lag", "demo-reader", "--json"))["total"] == 0
    assert as_json(ok(db, "topic", "describe", "demo", "--json"))["binding"] == "demo/#"


def test_library_produce_shows_up(db: str) -> None:
    """The CLI reads what the library wrote (same storage, same formats)."""
    make_topic(db)
    with Log.open(db) as log:
        log.produce("orders", [Message(b"\xffraw", key="k", properties=(("p", b"\x01"),))])
    ok(db, "subscription", "create", "s", "--topic", "orders")
    (got,) = jsonl(ok(db, "consume", "s"))
    assert got["payload"] is None and got["payload_b64"] == base64.b64encode(b"\xffraw").decode()
    assert got["properties"] == [["p", {"b64": "AQ=="}]]
