"""Who may connect: a password file and its authenticator, sans-I/O.

`Authenticator.authenticate` answers a CONNECT with the reason code to send.
What a client may then do is the ACL's (`acl.py`); `auth.py` joins the two.

Password file
-------------
One user per line, `USERNAME:$scrypt$n=N,r=R,p=P$SALT$HASH`, SALT and HASH in
standard base64. A user name is not empty and holds no `:` and no control
character. `riverbed passwd FILE USER` adds, changes and deletes users; the
file is rewritten atomically (a temporary file renamed over it) with mode 0600.
New hashes use scrypt with n=2**14, r=8, p=1 (16 MiB, about 30 ms here: the
parameters of RFC 7914's interactive-login example), a 16-byte salt and a
32-byte hash. Stored parameters are read back as written, up to 256 MiB of
memory per check. An unknown user name costs the same scrypt as a known one,
so the time taken does not tell which names exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from riverbed.errors import InvalidConfig, InvalidInput, NotFound
from riverbed.mqtt.codec.reasons import CONNACK_REASONS_V311, ConnectReason
from riverbed.secretfiles import read_text, remove_entry, write_atomically

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
MAX_SCRYPT_MEMORY = 256 * 1024 * 1024
"""The most memory (128·n·r bytes) a stored hash may make one check use."""
MAX_PASSWORD_BYTES = 0xFFFF
"""MQTT Binary Data is at most 65,535 bytes [MQTT-1.5.6]: no client can send more."""


# --------------------------------------------------------------------- passwords


def validate_username(username: str) -> str:
    """Return `username` if a password file can hold it, else raise `InvalidInput`."""
    if not username:
        raise InvalidInput("user name must not be empty")
    if ":" in username:
        raise InvalidInput(
            f"user name {username!r} contains ':', which separates the name from the hash"
            " in a password file"
        )
    if any(unicodedata.category(c) == "Cc" for c in username):
        raise InvalidInput(f"user name {username!r} contains a control character")
    try:
        size = len(username.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"user name {username!r} is not well-formed UTF-8") from None
    if size > 0xFFFF:
        raise InvalidInput(f"user name is {size} bytes long; MQTT allows 65535 [MQTT-1.5.4]")
    return username


def validate_password(password: bytes) -> bytes:
    """Return `password` if a client could send it, else raise `InvalidInput`."""
    if not isinstance(password, bytes):
        raise InvalidInput(f"a password is bytes, not {type(password).__name__}")
    if not password:
        raise InvalidInput("password must not be empty")
    if len(password) > MAX_PASSWORD_BYTES:
        raise InvalidInput(
            f"password is {len(password)} bytes long; MQTT allows 65535 [MQTT-1.5.6]"
        )
    return password


_HASH = re.compile(
    r"\$scrypt\$n=([0-9]{1,10}),r=([0-9]{1,4}),p=([0-9]{1,4})"
    r"\$([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2})"
)


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """An scrypt hash of a password, as a password file stores it."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def __post_init__(self) -> None:
        if self.n < 2 or self.n & (self.n - 1):
            raise InvalidInput(f"scrypt n={self.n} is not a power of 2 of at least 2")
        if not 1 <= self.r <= 64 or not 1 <= self.p <= 64:
            raise InvalidInput(f"scrypt r={self.r}, p={self.p}: each must be 1..64")
        if 128 * self.n * self.r > MAX_SCRYPT_MEMORY:
            raise InvalidInput(
                f"scrypt n={self.n}, r={self.r} needs {128 * self.n * self.r >> 20} MiB per"
                f" check; the limit is {MAX_SCRYPT_MEMORY >> 20} MiB"
            )
        if len(self.salt) < 8 or not 16 <= len(self.digest) <= 64:
            raise InvalidInput("an scrypt salt is at least 8 bytes and a hash 16 to 64 bytes")

    @classmethod
    def parse(cls, text: str) -> PasswordHash:
        """Read `$scrypt$n=N,r=R,p=P$SALT$HASH`."""
        found = _HASH.fullmatch(text)
        if found is None:
            raise InvalidInput("the hash is not $scrypt$n=N,r=R,p=P$SALT$HASH")
        n, r, p, salt, digest = found.groups()
        try:
            raw_salt = base64.b64decode(salt, validate=True)
            raw_digest = base64.b64decode(digest, validate=True)
        except binascii.Error:
            raise InvalidInput("the salt or the hash is not valid base64") from None
        return cls(int(n), int(r), int(p), raw_salt, raw_digest)

    def __str__(self) -> str:
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        return f"$scrypt$n={self.n},r={self.r},p={self.p}${salt}${digest}"

    def verify(self, password: bytes) -> bool:
        """Whether `password` hashes to this (compared in constant time)."""
        computed = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(computed, self.digest)


def hash_password(
    password: bytes,
    *,
    n: int = SCRYPT_N,
    r: int = SCRYPT_R,
    p: int = SCRYPT_P,
    salt: bytes | None = None,
) -> PasswordHash:
    """A fresh scrypt hash of `password` (with a random salt unless given)."""
    validate_password(password)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    PasswordHash(n, r, p, salt, bytes(HASH_BYTES))  # checks the parameters first
    return PasswordHash(n, r, p, salt, _scrypt(password, salt, n, r, p, HASH_BYTES))


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
    memory = 128 * r * (n + p + 2)  # OpenSSL's own estimate, with room to spare
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=memory + (1 << 20), dklen=size)


def load_password_file(path: str | Path) -> dict[str, PasswordHash]:
    """The users of a password file, in file order.

    Raises `InvalidConfig` naming the file and line of the first bad line, and
    `NotFound` when there is no such file.
    """
    shown = str(path)
    text = read_text(path, "password")
    users: dict[str, PasswordHash] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        username, colon, hashed = line.partition(":")
        where = f"{shown}:{number}"
        if not colon:
            raise InvalidConfig(f"{where}: the line is not USERNAME:HASH")
        try:
            validate_username(username)
            parsed = PasswordHash.parse(hashed)
        except InvalidInput as exc:
            raise InvalidConfig(f"{where}: {exc}") from None
        if username in lines:
            raise InvalidConfig(f"{where}: user {username!r} is already on line {lines[username]}")
        users[username], lines[username] = parsed, number
    return users


def save_password_file(path: str | Path, users: Mapping[str, PasswordHash]) -> None:
    """Write the users to `path` atomically, mode 0600: readers see the old file
    or the new one, never part of either, also after a crash."""
    for username, hashed in users.items():
        validate_username(username)
        if not isinstance(hashed, PasswordHash):
            raise InvalidInput(f"user {username!r}: {hashed!r} is not a PasswordHash")
    data = "".join(f"{username}:{hashed}\n" for username, hashed in users.items())
    write_atomically(path, data.encode("utf-8"))


def set_password(path: str | Path, username: str, password: bytes) -> bool:
    """Add `username` to the password file (created if missing) or change its
    password; True if the user was added. Nothing changes on bad input."""
    validate_username(username)
    validate_password(password)
    try:
        users = load_password_file(path)
    except NotFound:
        users = {}
    added = username not in users
    users[username] = hash_password(password)
    save_password_file(path, users)
    return added


def delete_user(path: str | Path, username: str) -> None:
    """Remove `username` from the password file; `NotFound` if it is not there."""
    remove_entry(
        path, username, load_password_file, save_password_file, entry="user", kind="password"
    )


# --------------------------------------------------------------------- authentication


@dataclass(frozen=True, slots=True)
class AuthResult:
    """What to answer a CONNECT: `reason` for an MQTT 5 CONNACK,
    `return_code_v311` for an MQTT 3.1.1 one; `username` is the authenticated
    user (None: anonymous, or refused)."""

    reason: ConnectReason
    username: str | None = None

    @property
    def accepted(self) -> bool:
        return self.reason is ConnectReason.SUCCESS

    @property
    def return_code_v311(self) -> int:
        """0 accepted, 4 bad user name or password, 5 not authorized (3.1.1 §3.2.2.3)."""
        return CONNACK_REASONS_V311[self.reason]


_REFUSED = AuthResult(ConnectReason.BAD_USER_NAME_OR_PASSWORD)
_NOT_AUTHORIZED = AuthResult(ConnectReason.NOT_AUTHORIZED)


class Authenticator:
    """Checks CONNECT credentials against a password file's users.

    - user name and password matching a user: accepted as that user;
    - any other user name or password: 0x86 Bad User Name or Password (3.1.1: 4);
    - neither: anonymous, accepted only with `allow_anonymous`, else 0x87 Not
      Authorized (3.1.1: 5).

    Without a password file (`users=None`) nobody can prove a user name: with
    `allow_anonymous` a client that sends one is accepted as anonymous (the name
    is not used for ACL rules), otherwise refused with 0x86.

    Each check runs scrypt (~30 ms, GIL released): the runtime calls
    `authenticate` from a worker thread, not on the event loop.
    """

    __slots__ = ("_allow_anonymous", "_decoy", "_users")

    def __init__(
        self, users: Mapping[str, PasswordHash] | None = None, *, allow_anonymous: bool = False
    ) -> None:
        self._users = None if users is None else dict(users)
        self._allow_anonymous = allow_anonymous
        # Checked for unknown user names, so they take as long as known ones.
        self._decoy = PasswordHash(
            SCRYPT_N, SCRYPT_R, SCRYPT_P, os.urandom(SALT_BYTES), os.urandom(HASH_BYTES)
        )

    def authenticate(
        self, client_id: str, username: str | None, password: bytes | None
    ) -> AuthResult:
        """The answer to a CONNECT from `client_id` with these credentials.

        `client_id` does not matter to password authentication; it is here so
        that other checks (client certificates, bans) fit the same call.
        """
        if username is None:
            if password is not None:
                return _REFUSED  # a password with no user to check it against
            return AuthResult(ConnectReason.SUCCESS) if self._allow_anonymous else _NOT_AUTHORIZED
        if self._users is None:
            return AuthResult(ConnectReason.SUCCESS) if self._allow_anonymous else _REFUSED
        stored = self._users.get(username)
        ok = (self._decoy if stored is None else stored).verify(password or b"")
        if stored is None or password is None or not ok:
            return _REFUSED
        return AuthResult(ConnectReason.SUCCESS, username)
