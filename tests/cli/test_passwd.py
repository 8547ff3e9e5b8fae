"""`riverbed passwd FILE USERNAME [--delete] [--stdin]`: adds, changes and deletes
users of an MQTT password file; every bad input exits non-zero with a message
naming the value and the rule, and leaves the file as it was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from riverbed.cli import cli
from riverbed.mqtt.passwords import load_password_file


def passwd(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["passwd", *args], input=input, catch_exceptions=False)


def ok(*args: str, input: str | bytes | None = None) -> Result:
    result = passwd(*args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


@pytest.fixture
def file(tmp_path: Path) -> Path:
    return tmp_path / "passwd"


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt's input as if typed at a terminal (CliRunner's is not one)."""
    monkeypatch.setattr("riverbed.cli.broker.stdin_is_terminal", lambda: True)


def verifies(file: Path, username: str, password: bytes) -> bool:
    return load_password_file(file)[username].verify(password)


def test_stdin_creates_the_file_private(file: Path) -> None:
    result = ok(str(file), "alice", "--stdin", input="wonderland\n")
    assert result.stdout == f"added user 'alice' to {file}\n"
    assert verifies(file, "alice", b"wonderland")
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert "wonderland" not in file.read_text()


def test_stdin_without_a_newline_and_with_crlf(file: Path) -> None:
    ok(str(file), "alice", "--stdin", input="pw")
    assert verifies(file, "alice", b"pw")
    ok(str(file), "bob", "--stdin", input=b"p w\xc3\xa9\r\n")
    assert verifies(file, "bob", "p wé".encode())


@pytest.mark.usefixtures("terminal")
def test_the_prompt_asks_twice(file: Path) -> None:
    result = ok(str(file), "alice", input="secret\nsecret\n")
    assert "Password" in result.stderr and "Repeat for confirmation" in result.stderr
    assert "secret" not in result.stdout + result.stderr
    assert verifies(file, "alice", b"secret")


@pytest.mark.usefixtures("terminal")
def test_the_prompt_asks_again_when_the_two_differ(file: Path) -> None:
    ok(str(file), "alice", input="one\ntwo\nthree\nthree\n")
    assert verifies(file, "alice", b"three")


@pytest.mark.usefixtures("terminal")
def test_the_prompt_ending_unanswered_changes_nothing(file: Path) -> None:
    result = passwd(str(file), "alice", input="one\ntwo\n")
    assert result.exit_code == 1  # click's Abort at the end of input
    assert not file.exists()


def test_changing_a_password_keeps_the_other_users(file: Path) -> None:
    ok(str(file), "alice", "--stdin", input="one\n")
    ok(str(file), "bob", "--stdin", input="two\n")
    bob = load_password_file(file)["bob"]
    result = ok(str(file), "alice", "--stdin", input="three\n")
    assert result.stdout == f"changed the password of user 'alice' in {file}\n"
    assert verifies(file, "alice", b"three") and not verifies(file, "alice", b"one")
    assert load_password_file(file)["bob"] == bob
    assert list(load_password_file(file)) == ["alice", "bob"]


def test_delete(file: Path) -> None:
    ok(str(file), "alice", "--stdin", input="one\n")
    ok(str(file), "bob", "--stdin", input="two\n")
    result = ok(str(file), "alice", "--delete")
    assert result.stdout == f"deleted user 'alice' from {file}\n"
    assert list(load_password_file(file)) == ["bob"]
    assert os.listdir(file.parent) == ["passwd"]  # no temporary files left


def test_deleting_who_is_not_there_exits_1_and_changes_nothing(file: Path) -> None:
    ok(str(file), "bob", "--stdin", input="two\n")
    before = file.read_bytes()
    result = passwd(str(file), "alice", "--delete")
    assert result.exit_code == 1
    assert result.stderr == f"error: user 'alice' is not in password file '{file}'\n"
    assert file.read_bytes() == before
    missing = passwd(str(file.parent / "none"), "alice", "--delete")
    assert missing.exit_code == 1
    assert "does not exist" in missing.stderr
    assert not (file.parent / "none").exists()


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["a:b", "--stdin"], "pw\n", "user name 'a:b' contains ':'"),
        (["a\tb", "--stdin"], "pw\n", "user name 'a\\tb' contains a control character"),
        (["", "--stdin"], "pw\n", "user name must not be empty"),
        (["alice", "--stdin"], "\n", "password must not be empty"),
        (["alice", "--stdin"], "", "password must not be empty"),
        (["alice", "--stdin"], "one\ntwo\n", "the password on stdin must be one line"),
        (["alice", "--stdin"], "x" * 65536, "password is 65536 bytes long; MQTT allows 65535"),
        (["a:b"], "pw\npw\n", "user name 'a:b' contains ':'"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(
    file: Path, args: list[str], stdin: str, message: str
) -> None:
    ok(str(file), "bob", "--stdin", input="two\n")
    before = file.read_bytes()
    result = passwd(str(file), *args, input=stdin)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Password" not in result.stderr  # refused before asking
    assert file.read_bytes() == before
    assert os.listdir(file.parent) == ["passwd"]


def test_bad_input_does_not_create_the_file(file: Path) -> None:
    assert passwd(str(file), "alice", "--stdin", input="\n").exit_code == 2
    assert not file.exists()


def test_a_broken_file_is_refused_before_the_prompt(file: Path) -> None:
    file.write_text("alice:not-a-hash\n")
    result = passwd(str(file), "bob", input="pw\npw\n")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {file}:1: ")
    assert "Password" not in result.stderr
    assert file.read_text() == "alice:not-a-hash\n"


def test_a_missing_directory(tmp_path: Path) -> None:
    result = passwd(str(tmp_path / "no" / "passwd"), "alice", "--stdin", input="pw\n")
    assert result.exit_code == 2
    assert "cannot write" in result.stderr and "No such file or directory" in result.stderr


def test_usage_errors(file: Path, tmp_path: Path) -> None:
    both = passwd(str(file), "alice", "--delete", "--stdin")
    assert both.exit_code == 2 and "--delete takes no password" in both.stderr
    assert passwd(str(file)).exit_code == 2  # USERNAME missing
    directory = passwd(str(tmp_path), "alice", "--stdin", input="pw\n")
    assert directory.exit_code == 2 and "is a directory" in directory.stderr
    assert not file.exists()
