"""`riverbed topic alter` and `--max-bytes`, in process: what changes, what a
bad value says, and that a refused command leaves the topic as it was."""

from __future__ import annotations

import json

import pytest

from harness.cli import rb
from riverbed.log.log import Log
from riverbed.model import Message


def described(url: str, name: str = "t") -> dict[str, object]:
    result = rb(url, "topic", "describe", name, "--json")
    assert result.exit_code == 0, result.output
    info: dict[str, object] = json.loads(result.output)
    return info


def settings(url: str, name: str = "t") -> dict[str, object]:
    info = described(url, name)
    keys = ("retention", "retention_policy", "max_age", "max_messages", "max_bytes")
    return {k: info[k] for k in keys}


@pytest.fixture
def url(storage_url: str) -> str:
    """A database with topic `t`: retention 1d, max age 30d, at most 1000
    messages and 10 MiB per stream."""
    created = rb(
        storage_url,
        "topic",
        "create",
        "t",
        "--partitions",
        "1",
        "--retention",
        "1d",
        "--max-age",
        "30d",
        "--max-messages",
        "1000",
        "--max-bytes",
        "10MiB",
    )
    assert created.exit_code == 0, created.output
    return storage_url


BEFORE = {
    "retention": "1d",
    "retention_policy": "consumed-and-expired",
    "max_age": "30d",
    "max_messages": 1000,
    "max_bytes": 10 * 1024 * 1024,
}


def test_create_takes_a_byte_limit(url: str) -> None:
    assert settings(url) == BEFORE
    described = rb(url, "topic", "describe", "t")
    assert "max age 30d, max messages 1000 per stream, max bytes 10MiB per stream" in (
        described.output
    )
    listed = json.loads(rb(url, "topic", "list", "--json").output)
    assert [t["max_bytes"] for t in listed if t["name"] == "t"] == [10 * 1024 * 1024]


def test_alter_changes_what_is_given_and_keeps_the_rest(url: str) -> None:
    result = rb(url, "topic", "alter", "t", "--retention", "12h", "--max-bytes", "1GB")

    assert result.exit_code == 0, result.output
    assert result.output == (
        "topic 't': retention 12h (consumed-and-expired), max age 30d,"
        " max messages 1000 per stream, max bytes 1GB per stream, key client-topic\n"
    )
    assert settings(url) == BEFORE | {"retention": "12h", "max_bytes": 1_000_000_000}


def test_none_removes_a_limit_or_keeps_messages_for_ever(url: str) -> None:
    result = rb(
        url,
        "topic",
        "alter",
        "t",
        "--retention",
        "none",
        "--max-age",
        "none",
        "--max-messages",
        "none",
        "--max-bytes",
        "NONE",
        "--retention-policy",
        "expired",
    )

    assert result.exit_code == 0, result.output
    assert settings(url) == {
        "retention": None,
        "retention_policy": "expired",
        "max_age": None,
        "max_messages": None,
        "max_bytes": None,
    }


@pytest.mark.parametrize(
    ("size", "expected"),
    [("500000", 500_000), ("10MiB", 10 * 1024**2), ("1GB", 10**9), ("2kb", 2000), ("1", 1)],
)
def test_sizes(url: str, size: str, expected: int) -> None:
    assert rb(url, "topic", "alter", "t", "--max-bytes", size).exit_code == 0
    assert described(url)["max_bytes"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-bytes", "12XB"], "maximum size '12XB' is not a size: use bytes or a number"),
        (["--max-bytes", "0"], "maximum size '0' must be at least 1 byte per stream"),
        (["--max-bytes", "-1"], "maximum size '-1' is not a size"),
        (["--max-bytes", "1.5GB"], "maximum size '1.5GB' is not a size"),
        (["--max-messages", "0"], "maximum of 0 messages per stream must be at least 1"),
        (["--max-messages", "many"], "maximum of messages 'many' is not a whole number"),
        (["--max-age", "0s"], "maximum age 0us must be a positive duration"),
        (["--retention", "soon"], "duration 'soon' is not a number followed by a unit"),
        (["--retention-policy", "never"], "'never' is not one of"),
        # A good value beside a bad one is not applied either.
        (["--retention", "2h", "--max-bytes", "12XB"], "maximum size '12XB' is not a size"),
        (["--max-age", "2h", "--max-messages", "0"], "maximum of 0 messages per stream"),
        ([], "nothing to change: give one or more of --retention, --retention-policy"),
    ],
)
def test_bad_values_are_refused_and_nothing_changes(
    url: str, args: list[str], message: str
) -> None:
    result = rb(url, "topic", "alter", "t", *args)

    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())  # click wraps long lines
    assert "Traceback" not in result.output
    assert settings(url) == BEFORE


def test_an_unknown_topic(url: str) -> None:
    result = rb(url, "topic", "alter", "x", "--max-bytes", "1MB")

    assert result.exit_code == 1
    assert result.output == "error: topic 'x' does not exist\n"
    assert [t["name"] for t in json.loads(rb(url, "topic", "list", "--json").output)] == [
        "mqtt",
        "t",
    ]


def test_set_limits_still_works_and_takes_max_bytes(url: str) -> None:
    result = rb(url, "topic", "set-limits", "t", "--max-bytes", "1MiB", "--max-age", "none")

    assert result.exit_code == 0, result.output
    assert settings(url) == BEFORE | {"max_age": None, "max_bytes": 1024**2}
    refused = rb(url, "topic", "set-limits", "t", "--retention", "1h")
    assert refused.exit_code == 2  # retention is alter's
    assert settings(url) == BEFORE | {"max_age": None, "max_bytes": 1024**2}


def test_create_refuses_a_bad_byte_limit_and_creates_nothing(storage_url: str) -> None:
    Log.open(storage_url).close()  # the database exists: only the topic is in question
    result = rb(storage_url, "topic", "create", "u", "--partitions", "1", "--max-bytes", "0")

    assert result.exit_code == 2
    assert "maximum size '0' must be at least 1 byte per stream" in result.output
    assert "error: topic 'u' does not exist" in rb(storage_url, "topic", "describe", "u").output


def test_retention_applies_the_altered_limit(url: str) -> None:
    with Log.open(url) as log:
        log.produce("t", [Message(b"x" * 100, key="k")] * 10)
    assert rb(url, "subscription", "create", "idle", "--topic", "t").exit_code == 0
    assert rb(url, "topic", "alter", "t", "--max-bytes", "250").exit_code == 0

    result = rb(url, "retention", "run", "t")

    assert result.exit_code == 0, result.output
    assert "t/0/0: deleted 8, first retained offset now 8" in result.output
