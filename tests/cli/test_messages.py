"""`riverbed produce` and `riverbed consume`: JSON lines in and out, what is
committed, per-key order, and bad lines writing nothing."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from harness.cli import (
    committed,
    heads,
    jsonl,
    lines,
    make_topic,
    ok,
    produce_n,
    rb,
    total,
)
from riverbed import cli as cli_module
from riverbed.log.log import Log
from riverbed.model import Message, MessageId

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


def test_library_produce_shows_up(db: str) -> None:
    """The CLI reads what the library wrote (same storage, same formats)."""
    make_topic(db)
    with Log.open(db) as log:
        log.produce("orders", [Message(b"\xffraw", key="k", properties=(("p", b"\x01"),))])
    ok(db, "subscription", "create", "s", "--topic", "orders")
    (got,) = jsonl(ok(db, "consume", "s"))
    assert got["payload"] is None and got["payload_b64"] == base64.b64encode(b"\xffraw").decode()
    assert got["properties"] == [["p", {"b64": "AQ=="}]]
