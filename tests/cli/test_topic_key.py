"""`riverbed topic create --key`, and the key shown by `topic describe` / `topic list`."""

from __future__ import annotations

import json

import pytest
from click.testing import Result

from harness.cli import rb


def ok(db: str, *args: str) -> Result:
    result = rb(db, *args)
    assert result.exit_code == 0, result.output
    return result


def listed(db: str) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(ok(db, "topic", "list", "--json").stdout)}


@pytest.mark.parametrize("key", ["client-topic", "client-id", "topic", "property:device", "none"])
def test_create_with_a_key_shows_it_in_describe_and_list(db: str, key: str) -> None:
    ok(db, "topic", "create", "jobs", "--partitions", "4", "--binding", "jobs/#", "--key", key)
    assert json.loads(ok(db, "topic", "describe", "jobs", "--json").stdout)["key"] == key
    assert listed(db)["jobs"]["key"] == key
    assert f"(key {key})" in ok(db, "topic", "describe", "jobs").stdout


def test_the_default_key_is_client_topic_and_mqtt_keeps_client_id(db: str) -> None:
    ok(db, "topic", "create", "jobs", "--partitions", "4", "--binding", "jobs/#")
    rows = listed(db)
    assert rows["jobs"]["key"] == "client-topic"
    assert rows["mqtt"]["key"] == "client-id"  # the built-in topic, as in every database
    assert "client-topic" in ok(db, "topic", "create", "--help").stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--binding", "jobs/#", "--key", "banana"], ["'banana'", "client-id", "property:NAME"]),
        (["--binding", "jobs/#", "--key", "property:"], ["'property:'", "names no user property"]),
        (["--binding", "jobs/#", "--key", ""], ["''", "is not one of"]),
        (["--key", "none"], ["'none'", "'jobs'", "no binding"]),
    ],
)
def test_a_bad_key_is_refused_and_changes_nothing(
    db: str, args: list[str], words: list[str]
) -> None:
    ok(db, "topic", "create", "other", "--partitions", "1")  # the database exists
    before = listed(db)
    result = rb(db, "topic", "create", "jobs", "--partitions", "4", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") or "Error:" in result.stderr, result.stderr
    assert all(w in result.stderr for w in words), result.stderr
    assert "Traceback" not in result.output
    assert listed(db) == before


def test_alter_changes_the_key_mode_and_refuses_one_without_a_binding(db: str) -> None:
    ok(db, "topic", "create", "jobs", "--partitions", "4", "--binding", "jobs/#")
    ok(db, "topic", "create", "loose", "--partitions", "1")

    result = rb(db, "topic", "alter", "jobs", "--key", "none")

    assert result.exit_code == 0, result.output
    assert result.output.endswith(", key none\n")
    assert listed(db)["jobs"]["key"] == "none"
    before = listed(db)
    refused = rb(db, "topic", "alter", "loose", "--key", "topic")
    assert refused.exit_code == 2
    assert "no binding" in refused.stderr
    assert listed(db) == before
