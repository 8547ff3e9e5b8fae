"""Bearer tokens of the admin HTTP API: a token file, and who a request is.

Token file
----------
One token per line, `NAME:ROLE:$scrypt$n=N,r=R,p=P$SALT$HASH` (the hash form of
the MQTT password file, `riverbed.mqtt.passwords.PasswordHash`). ROLE is `read`
(GET only) or `admin` (everything). `riverbed token add FILE NAME --role ROLE`
makes a token, prints it once and stores only its hash; `token revoke` removes
one. The file is written atomically with mode 0600.

A token is `NAME.SECRET`: the name says which hash to check, so a request
costs one scrypt, not one per token in the file. A token that checked out is
remembered (by its SHA-256) until the file changes, so only a token's first
request pays for scrypt; the file is read again when its modification time or
size changes, so a revoked token stops working at its next request.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from riverbed.errors import AlreadyExists, InvalidConfig, InvalidInput, NotFound
from riverbed.mqtt.passwords import PasswordHash, hash_password
from riverbed.secretfiles import read_text, remove_entry, write_atomically


class Role(enum.Enum):
    """What a token may do: `read` only GETs, `admin` anything."""

    READ = "read"
    ADMIN = "admin"


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_RULE = "1 to 64 letters, digits, '-' or '_'"
SECRET_BYTES = 32


def validate_token_name(name: str) -> str:
    """Return `name` if a token file can hold it, else raise `InvalidInput`."""
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"token name {name!r} must be {NAME_RULE}")
    return name


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One line of a token file."""

    name: str
    role: Role
    hashed: PasswordHash


def load_token_file(path: str | Path) -> dict[str, TokenEntry]:
    """The tokens of a token file, by name, in file order.

    Raises `InvalidConfig` naming the file and line of the first bad line, and
    `NotFound` when there is no such file."""
    shown = str(path)
    text = read_text(path, "token")
    tokens: dict[str, TokenEntry] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{shown}:{number}"
        name, _, rest = line.partition(":")
        role, _, hashed = rest.partition(":")
        try:
            validate_token_name(name)
            entry = TokenEntry(name, _role(role), PasswordHash.parse(hashed))
        except InvalidInput as exc:
            raise InvalidConfig(f"{where}: {exc} (a line is NAME:ROLE:HASH)") from None
        if name in tokens:
            raise InvalidConfig(f"{where}: token {name!r} is there twice")
        tokens[name] = entry
    return tokens


def _role(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise InvalidInput(f"role {text!r} is not read or admin") from None


def save_token_file(path: str | Path, tokens: dict[str, TokenEntry]) -> None:
    data = "".join(f"{t.name}:{t.role.value}:{t.hashed}\n" for t in tokens.values())
    write_atomically(path, data.encode("utf-8"))


def add_token(path: str | Path, name: str, role: Role) -> str:
    """Add a new token to the file (created if missing) and return it: the only
    time it is seen, as only its hash is kept. `AlreadyExists` if the name is
    taken (revoke it first)."""
    validate_token_name(name)
    try:
        tokens = load_token_file(path)
    except NotFound:
        tokens = {}
    if name in tokens:
        raise AlreadyExists(
            f"token {name!r} is already in {str(path)!r}: revoke it first to replace it"
        )
    secret = secrets.token_urlsafe(SECRET_BYTES)
    token = f"{name}.{secret}"
    tokens[name] = TokenEntry(name, role, hash_password(token.encode("ascii")))
    save_token_file(path, tokens)
    return token


def revoke_token(path: str | Path, name: str) -> None:
    """Remove token `name`; `NotFound` if it is not in the file."""
    remove_entry(path, name, load_token_file, save_token_file, entry="token", kind="token")


class TokenFile:
    """The tokens a running server accepts: `check(token)` is the role, or None.

    Thread-safe (handlers run on worker threads); reads the file again when it
    changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._tokens: dict[str, TokenEntry] = {}
        self._known: dict[bytes, TokenEntry] = {}
        self._reload()

    def _reload(self) -> None:
        try:
            status = os.stat(self.path)
        except OSError:
            stamp = None
        else:
            stamp = (status.st_mtime_ns, status.st_size)
        with self._lock:
            if stamp is not None and stamp == self._stamp:
                return
        tokens = load_token_file(self.path) if stamp is not None else {}
        with self._lock:
            self._stamp, self._tokens, self._known = stamp, tokens, {}

    def check(self, token: str) -> TokenEntry | None:
        """The entry `token` belongs to, or None for a wrong token. Costs one scrypt
        the first time a token is seen (call it off the event loop)."""
        # A file broken while being edited by hand: keep what it said before.
        with contextlib.suppress(InvalidConfig):
            self._reload()
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        with self._lock:
            known = self._known.get(digest)
            if known is not None:
                return known
            name = token.rpartition(".")[0]
            entry = self._tokens.get(name)
        if entry is None or not entry.hashed.verify(token.encode("utf-8", "surrogateescape")):
            return None
        with self._lock:
            if self._tokens.get(name) is entry:
                self._known[digest] = entry
        return entry
