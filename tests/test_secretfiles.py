"""The two files of hashed secrets, the MQTT password file and the HTTP token
file, read and written the one way (`riverbed.secretfiles`): the same checks
run against both."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from riverbed.errors import InvalidConfig, NotFound
from riverbed.http.auth import (
    Role,
    TokenEntry,
    load_token_file,
    revoke_token,
    save_token_file,
)
from riverbed.mqtt.passwords import (
    delete_user,
    hash_password,
    load_password_file,
    save_password_file,
)

HASHED = hash_password(b"secret", n=16, r=1, p=1)  # cheap parameters: no login checks here


@dataclass(frozen=True)
class Kind:
    name: str
    entry: str
    load: Callable[[Path], dict[str, Any]]
    save: Callable[[Path, dict[str, Any]], None]
    remove: Callable[[Path, str], None]
    make: Callable[[str], object]


KINDS = [
    Kind("password", "user", load_password_file, save_password_file, delete_user, lambda _: HASHED),
    Kind(
        "token",
        "token",
        load_token_file,
        save_token_file,
        revoke_token,
        lambda name: TokenEntry(name, Role.READ, HASHED),
    ),
]


def exactly(text: str) -> str:
    return f"^{re.escape(text)}$"


def starting(text: str) -> str:
    return f"^{re.escape(text)}"


@pytest.fixture(params=KINDS, ids=[k.name for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    chosen: Kind = request.param
    return chosen


def test_a_missing_unreadable_or_non_utf8_file_is_named(kind: Kind, tmp_path: Path) -> None:
    missing = tmp_path / "none"
    with pytest.raises(NotFound, match=exactly(f"{kind.name} file '{missing}' does not exist")):
        kind.load(missing)
    unreadable = starting(f"{kind.name} file '{tmp_path}' cannot be read: ")
    with pytest.raises(InvalidConfig, match=unreadable):
        kind.load(tmp_path)
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"j\xf6rg:x\n")
    not_utf8 = exactly(f"{kind.name} file '{latin1}' is not UTF-8 at byte 1")
    with pytest.raises(InvalidConfig, match=not_utf8):
        kind.load(latin1)


def test_a_save_through_a_symlink_privately_replaces_its_target(kind: Kind, tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_text("")
    target.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    kind.save(link, {"alice": kind.make("alice"), "bob": kind.make("bob")})
    assert link.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert list(kind.load(target)) == ["alice", "bob"]
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]  # no temporary file left


def test_a_save_into_a_missing_directory_is_refused(kind: Kind, tmp_path: Path) -> None:
    path = tmp_path / "no" / "file"
    with pytest.raises(InvalidConfig, match=starting(f"cannot write '{path}': ")):
        kind.save(path, {"alice": kind.make("alice")})


def test_removing_names_what_is_missing_and_changes_nothing(kind: Kind, tmp_path: Path) -> None:
    path = tmp_path / "file"
    kind.save(path, {"alice": kind.make("alice"), "bob": kind.make("bob")})
    kind.remove(path, "alice")
    assert list(kind.load(path)) == ["bob"]
    before = path.read_bytes()
    missing = exactly(f"{kind.entry} 'zoe' is not in {kind.name} file '{path}'")
    with pytest.raises(NotFound, match=missing):
        kind.remove(path, "zoe")
    assert path.read_bytes() == before
