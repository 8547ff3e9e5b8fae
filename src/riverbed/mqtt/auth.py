"""Who may connect (a password file) and what they may do (an ACL), sans-I/O.

`Authenticator.authenticate` answers a CONNECT with the reason code to send;
`Authorizer.can_publish` / `can_subscribe` answer a PUBLISH or a SUBSCRIBE
with yes or no, which the broker sends as 0x87 Not authorized (PUBACK, PUBREC,
SUBACK; a 3.1.1 SUBACK says 0x80, a 3.1.1 QoS 0/1 PUBLISH is acknowledged and
dropped). Reading the files happens once, when the broker starts.

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

ACL file
--------
One rule per line; blank lines and lines starting with `#` are ignored:

    # DECISION  ACCESS     SUBJECT      FILTER
    allow       all        user admin   #
    deny        publish    anyone       $SYS/#
    allow       all        anyone       users/%u/#
    allow       publish    anyone       devices/%c/telemetry
    allow       subscribe  anonymous    public/#
    default allow

- DECISION is `allow` or `deny`; ACCESS is `publish`, `subscribe` or `all`.
- SUBJECT is `anyone`, `anonymous` (clients without a user name), `user NAME`
  or `client ID` (exact names, which cannot contain white space).
- FILTER is an MQTT topic filter: the rest of the line, white space around it
  left out (so `#` there is the wildcard, never a comment). `%u` stands for the
  client's user name, `%c` for its client id, `%%` for a `%`. As in a
  subscription, a leading `+` or `#` matches no `$` topic [MQTT-4.7.2-1]: `#`
  is not `$SYS/#`, which a rule grants by name.
- `default allow|deny`, at most once: what happens when no rule matches.
  Without it an ACL file denies; without an ACL file everything is allowed.

Rules are tried in order and the first that applies decides. A PUBLISH applies
its topic name. There is no separate read access: `subscribe` rules also decide
which messages a client receives, applied to each message's topic name
(`can_read`). `$share/GROUP/FILTER` and `$queue/FILTER` are checked as FILTER.

A SUBSCRIBE is checked in one of two ways (`auth.acl_wildcard`):

- `filter` (the default, what mosquitto does): the filter itself is checked.
  The first rule whose filter covers the whole requested filter
  (`filter_covers`) decides; rules that share only some topics with it are
  passed over. A granted wildcard subscription then gets only the messages
  whose topics the client may read: with `deny subscribe anyone secrets/#` and
  `default allow`, `#` is granted and delivers everything but `secrets/...`,
  while `secrets/#` or `secrets/a` is refused.
- `strict`: granted only if every topic the filter can match is readable: the
  first allow rule that covers the whole filter allows it, and a deny rule that
  shares any topic with it (`filters_overlap`) refuses it first. The example
  above refuses `#` and `+/+`.

In both, a subscription that only several allow rules together would cover is
refused: write one rule that covers it. Every message is checked against the
read rule on its way out in both modes (live, replayed, retained, a shared
group's), so a session resumed from before a change of the ACL file gets only
what the new rules let it read. A `TopicCheck` remembers each answer per
client and topic name, for reading and publishing alike, so a check costs a
dictionary look-up per message.

Substitution is literal. A user name or client id that holds `/`, `+` or `#`
would not name one topic level but several, or a wildcard, so no topic has the
level a rule builds from it: a rule that needs such a value (or `%u` for a
client without a user name) does not apply to that client, allow or deny. So a
client id `+` never widens `devices/%c/#` to every device, and a user name
`a/b` gets no `users/a/b/#` from `users/%u/#`. Keep `%u` and `%c` below a fixed
first level (`users/%u/#`, not `%u/#`): a client may pick any client id,
`$SYS` or another user's top level included.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import unicodedata
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from riverbed.errors import InvalidConfig, InvalidInput, InvalidTopicFilter, NotFound
from riverbed.mqtt.codec.reasons import CONNACK_REASONS_V311, ConnectReason
from riverbed.mqtt.config import ACL_WILDCARD_STRICT, AuthConfig
from riverbed.secretfiles import read_text, remove_entry, write_atomically
from riverbed.topics.filters import filters_overlap, matches, validate_filter

log = logging.getLogger(__name__)

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


# --------------------------------------------------------------------- authorisation


class Decision(Enum):
    ALLOW = "allow"
    DENY = "deny"


class Access(Enum):
    """What a rule is about."""

    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ALL = "all"


class Subject(Enum):
    """Whom a rule is about."""

    ANYONE = "anyone"
    ANONYMOUS = "anonymous"
    USER = "user"
    CLIENT = "client"


_PLACEHOLDER = re.compile(r"%(.?)")
_UNSAFE = frozenset("/+#")


@dataclass(frozen=True, slots=True)
class AclRule:
    """One ACL rule; `topic_filter` may hold `%u`, `%c` and `%%`."""

    decision: Decision
    access: Access
    subject: Subject
    name: str | None
    topic_filter: str
    line: int | None = None
    """Where the rule was read, for messages."""

    def __post_init__(self) -> None:
        if (self.subject in (Subject.USER, Subject.CLIENT)) != (self.name is not None):
            raise InvalidInput(f"subject {self.subject.value!r} and name {self.name!r} disagree")
        for found in _PLACEHOLDER.finditer(self.topic_filter):
            if found.group(1) not in ("u", "c", "%"):
                raise InvalidInput(
                    f"topic filter {self.topic_filter!r}: {found.group(0)!r} is not %u (user"
                    " name), %c (client id) or %% (a %)"
                )
        if "%" not in self.topic_filter:
            validate_filter(self.topic_filter)
            return
        try:
            validate_filter(_PLACEHOLDER.sub("x", self.topic_filter))
        except InvalidTopicFilter as exc:
            raise InvalidTopicFilter(
                f"topic filter {self.topic_filter!r} with %u and %c filled in: {exc}"
            ) from None

    def applies(self, access: Access, username: str | None, client_id: str) -> bool:
        if self.access is not Access.ALL and self.access is not access:
            return False
        match self.subject:
            case Subject.ANYONE:
                return True
            case Subject.ANONYMOUS:
                return username is None
            case Subject.USER:
                return username == self.name
            case Subject.CLIENT:
                return client_id == self.name

    def filter_for(self, username: str | None, client_id: str) -> str | None:
        """The filter with `%u` and `%c` filled in; None if a value would not be
        one literal level (the rule then applies to no topic of this client)."""
        if "%" not in self.topic_filter:
            return self.topic_filter
        values = {"u": username, "c": client_id, "%": "%"}
        pieces: list[str] = []
        end = 0
        for found in _PLACEHOLDER.finditer(self.topic_filter):
            value = values[found.group(1)]
            if value is None or not _UNSAFE.isdisjoint(value):
                return None
            pieces += (self.topic_filter[end : found.start()], value)
            end = found.end()
        pieces.append(self.topic_filter[end:])
        return "".join(pieces)


MAX_CLIENTS = 10_000
"""Clients whose publish rules `Authorizer.can_publish` keeps resolved (then it starts over)."""


@dataclass(frozen=True, slots=True)
class Authorizer:
    """ACL rules tried in order, the first that applies deciding; `default` when
    none does. `strict`: how a SUBSCRIBE is checked (`auth.acl_wildcard =
    "strict"`; the module docstring).

    `decide` evaluates the rules afresh; what a broker asks per message goes
    through a `TopicCheck` that remembers the answers: `can_publish` keeps one
    per client, a session asks its `read_check` before each delivery.
    """

    rules: tuple[AclRule, ...] = ()
    default: Decision = Decision.ALLOW
    strict: bool = False
    _checks: weakref.WeakValueDictionary[tuple[tuple[str, bool], ...], TopicCheck] = field(
        default_factory=weakref.WeakValueDictionary, init=False, compare=False, repr=False
    )
    """The `TopicCheck`s in use, by the rules they apply: clients under the same
    rules share one (and its answers)."""
    _publishers: dict[tuple[str | None, str], TopicCheck] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Per client (user name, client id), its publish rules' check."""

    @classmethod
    def parse(cls, text: str, source: str = "<acl>", *, strict: bool = False) -> Authorizer:
        """Read the ACL format of the module docstring; `InvalidConfig` names the line."""
        rules: list[AclRule] = []
        default: tuple[Decision, int] | None = None
        for number, line in enumerate(text.split("\n"), start=1):
            words = line.split(maxsplit=1)
            if not words or words[0].startswith("#"):
                continue
            where = f"{source}:{number}"
            try:
                if words[0] == "default":
                    if default is not None:
                        raise InvalidInput(f"a second default; the first is on line {default[1]}")
                    default = (_parse_decision(line.split()[1:]), number)
                else:
                    rules.append(_parse_rule(line, number))
            except InvalidInput as exc:
                raise InvalidConfig(f"{where}: {exc}") from None
        return cls(tuple(rules), Decision.DENY if default is None else default[0], strict)

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = False) -> Authorizer:
        """Read an ACL file (`InvalidConfig` if it is missing or bad)."""
        shown = str(path)
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError as exc:
            raise InvalidConfig(f"ACL file {shown!r} cannot be read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise InvalidConfig(f"ACL file {shown!r} is not UTF-8 (byte {exc.start})") from None
        return cls.parse(text, shown, strict=strict)

    def decide(self, access: Access, username: str | None, client_id: str, topic_name: str) -> bool:
        """Whether this client may publish (`Access.PUBLISH`) or read
        (`Access.SUBSCRIBE`) a message of `topic_name` (a valid topic name): the
        rules evaluated afresh, the first that applies and matches deciding."""
        for rule in self.rules:
            if rule.applies(access, username, client_id):
                topic_filter = rule.filter_for(username, client_id)
                if topic_filter is not None and matches(topic_filter, topic_name):
                    return rule.decision is Decision.ALLOW
        return self.default is Decision.ALLOW

    def allows_publish(self, username: str | None, client_id: str, topic_name: str) -> bool:
        """`can_publish`, logging a refusal (what a connection's core asks; the
        broker hands every core the same bound method, `Broker.may_publish`)."""
        if self.can_publish(username, client_id, topic_name):
            return True
        log.info("client %s: not authorized: refused PUBLISH to %r", client_id, topic_name)
        return False

    def can_publish(self, username: str | None, client_id: str, topic_name: str) -> bool:
        """Whether this client may publish to `topic_name` (a valid topic name);
        `decide`, remembered per client and topic name."""
        if not self.rules:
            return self.default is Decision.ALLOW
        key = (username, client_id)
        check = self._publishers.get(key)
        if check is None:
            check = self._resolve(Access.PUBLISH, username, client_id)
            if len(self._publishers) >= MAX_CLIENTS:
                self._publishers.clear()
            self._publishers[key] = check
        return check(topic_name)

    def can_read(self, username: str | None, client_id: str, topic_name: str) -> bool:
        """Whether this client may receive a message of `topic_name`: the
        `subscribe` rules applied to it (uncached: sessions ask a `read_check`)."""
        return self.decide(Access.SUBSCRIBE, username, client_id, topic_name)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        """Whether this client may subscribe to `topic_filter` (a valid filter):
        the first rule covering the whole filter decides; `strict`: only if it
        may also read every topic the filter can match."""
        requested = _unshared(topic_filter)
        if requested is None:
            return False
        refuses = filters_overlap if self.strict else filter_covers
        for rule in self.rules:
            if rule.applies(Access.SUBSCRIBE, username, client_id):
                rule_filter = rule.filter_for(username, client_id)
                if rule_filter is None:
                    continue
                if rule.decision is Decision.DENY:
                    if refuses(rule_filter, requested):
                        return False
                elif filter_covers(rule_filter, requested):
                    return True
        return self.default is Decision.ALLOW

    def read_check(self, username: str | None, client_id: str) -> TopicCheck | None:
        """What a session asks before it sends a message: `can_read` for this
        client, remembered per topic name. None when the rules let this client
        read every topic (no ACL file, or no deny that applies to it), so that
        delivery costs nothing then."""
        check = self._resolve(Access.SUBSCRIBE, username, client_id)
        return None if check.allows_all else check

    def _resolve(self, access: Access, username: str | None, client_id: str) -> TopicCheck:
        """The rules on `access` that apply to this client, `%u` and `%c` filled
        in, as a check (one shared by every client they resolve alike for)."""
        resolved: list[tuple[str, bool]] = []
        for rule in self.rules:
            if rule.applies(access, username, client_id):
                rule_filter = rule.filter_for(username, client_id)
                if rule_filter is not None:
                    resolved.append((rule_filter, rule.decision is Decision.ALLOW))
        allow = self.default is Decision.ALLOW
        key = (*resolved, ("", allow))  # "" is no filter: the default's place
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = TopicCheck(tuple(resolved), allow)
        return check


class TopicCheck:
    """Whether a client may publish or read a topic name: its rules on that
    access (filters with `%u` and `%c` filled in, allowing or not) tried in
    order, `default` when none matches, each answer remembered. Asked once per
    message, so the common case is one dictionary look-up; at most
    `max_topics` answers are kept (then they start over), so a client using
    many topic names holds bounded memory.
    """

    __slots__ = ("__weakref__", "_known", "allows_all", "default", "max_topics", "rules")

    def __init__(
        self, rules: tuple[tuple[str, bool], ...], default: bool, max_topics: int = 10_000
    ) -> None:
        self.rules = rules
        self.default = default
        self.max_topics = max_topics
        self.allows_all = default and all(allows for _, allows in rules)
        """No topic is refused: nothing to ask."""
        self._known: dict[str, bool] = {}

    def __call__(self, topic_name: str) -> bool:
        known = self._known
        allowed = known.get(topic_name)
        if allowed is None:
            allowed = self.default
            for rule_filter, allows in self.rules:
                if matches(rule_filter, topic_name):
                    allowed = allows
                    break
            if len(known) >= self.max_topics:
                known.clear()
            known[topic_name] = allowed
        return allowed


def _unshared(topic_filter: str) -> str | None:
    """The filter of a shared subscription, which is what the client receives."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        return parts[2] if len(parts) == 3 and parts[2] else None
    if topic_filter.startswith("$queue/"):
        return topic_filter.removeprefix("$queue/") or None
    return topic_filter


def _parse_decision(words: Sequence[str]) -> Decision:
    if len(words) != 1 or words[0] not in ("allow", "deny"):
        raise InvalidInput(f"'default {' '.join(words)}' is not 'default allow' or 'default deny'")
    return Decision(words[0])


_RULE_FORM = "DECISION ACCESS SUBJECT FILTER, e.g. 'allow publish user alice sensors/#'"


def _parse_rule(line: str, number: int) -> AclRule:
    words = line.split(maxsplit=3)
    if len(words) < 4:
        raise InvalidInput(f"the rule is not {_RULE_FORM}")
    decision, access, subject, rest = words
    if decision not in ("allow", "deny"):
        raise InvalidInput(f"{decision!r} is not allow or deny ({_RULE_FORM})")
    if access not in ("publish", "subscribe", "all"):
        raise InvalidInput(f"{access!r} is not publish, subscribe or all")
    name: str | None = None
    if subject in ("user", "client"):
        named = rest.split(maxsplit=1)
        if len(named) < 2:
            raise InvalidInput(f"'{subject} NAME' must be followed by a topic filter")
        name, rest = named
    elif subject not in ("anyone", "anonymous"):
        raise InvalidInput(f"{subject!r} is not anyone, anonymous, user NAME or client ID")
    return AclRule(Decision(decision), Access(access), Subject(subject), name, rest.strip(), number)


def filter_covers(rule: str, requested: str) -> bool:
    """Whether every topic name the (valid) `requested` filter matches is also
    matched by the (valid) `rule` filter: containment of the filters' languages,
    with [MQTT-4.7.2-1] and the empty string being no topic name [MQTT-4.7.3-1].
    """
    r, f = rule.split("/"), requested.split("/")
    if r[0] in ("+", "#") and f[0].startswith("$"):
        return False  # requested matches $-names, which a leading wildcard does not
    for index in range(len(f) + 1):
        if index == len(f):
            # requested matches exactly len(f) levels here: so must rule.
            return len(r) == index or r[index:] == ["#"]
        if index == len(r):
            return False  # requested matches longer names
        x, y = r[index], f[index]
        if x == "#":
            return True
        if y == "#":
            # requested matches this prefix alone and with any more levels. A
            # prefix that is "" (index 0, or one empty level) is no topic name, so
            # then a rule needing one more level ("+/#") covers it too.
            return "/".join(f[:index]) == "" and r[index:] == ["+", "#"]
        if x != "+" and x != y:
            return False  # y is another literal, or "+" (a literal cannot cover it)
    raise AssertionError("unreachable")


def load_auth(config: AuthConfig) -> tuple[Authenticator, Authorizer]:
    """The authenticator and authorizer a broker configuration asks for."""
    users = None if config.password_file is None else load_password_file(config.password_file)
    authorizer = Authorizer() if config.acl_file is None else Authorizer.load(config.acl_file)
    authorizer = replace(authorizer, strict=config.acl_wildcard == ACL_WILDCARD_STRICT)
    return Authenticator(users, allow_anonymous=config.allow_anonymous), authorizer
