"""`riverbed produce` names where a line's JSON is broken: the line of stdin
and the column on that line (also when the error is at the end of the line),
and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness.cli import rb
from riverbed.cli import cli

GOOD = '{"key": "k", "payload": "fine"}\n'


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/x.db"
    assert rb(url, "topic", "create", "orders", "--partitions", "2").exit_code == 0
    return url


def produce(db: str, text: str) -> Result:
    return CliRunner().invoke(cli, ["produce", "orders", "--db", db], input=text)


def _messages(db: str) -> int:
    info = json.loads(rb(db, "topic", "describe", "orders", "--json").stdout)
    return sum(s["next_offset"] - s["start_offset"] for s in info["streams"])


@pytest.mark.parametrize(
    ("line", "ending", "message"),
    [
        # Cut off after the colon: the value is missing at column 13, the end.
        ('{"payload": ', "\n", "line 2: not valid JSON: Expecting value at column 13"),
        ('{"payload": ', "\r\n", "line 2: not valid JSON: Expecting value at column 13"),
        ('{"payload": "x"', "\n", "line 2: not valid JSON: Expecting ',' delimiter at column 16"),
        (
            '{"payload": "abc',
            "\n",
            "line 2: not valid JSON: Unterminated string starting at column 13",
        ),
        ('{"payload": x}', "\n", "line 2: not valid JSON: Expecting value at column 13"),
        (
            '{"payload": "a\tb"}',
            "\n",
            "line 2: not valid JSON: Invalid control character at column 15",
        ),
        ('{"payload": "x"} y', "", "line 2: not valid JSON: Extra data at column 18"),
    ],
)
def test_a_json_error_names_its_line_and_column(
    db: str, line: str, ending: str, message: str
) -> None:
    result = produce(db, GOOD + line + ending)
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"
    assert _messages(db) == 0


def test_crlf_lines_are_accepted(db: str) -> None:
    result = produce(db, GOOD.replace("\n", "\r\n") * 3)
    assert result.exit_code == 0, result.output
    assert _messages(db) == 3
