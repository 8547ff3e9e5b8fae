"""Authentication and authorisation: password hashes and files, the CONNACK
answer to every kind of credentials, the ACL format, and filter containment
checked against brute force over a small alphabet.

Hashes in most tests use a tiny scrypt cost (`FAST`) so the suite stays quick;
one test checks the defaults.
"""

from __future__ import annotations

import functools
import itertools
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.errors import InvalidConfig, InvalidInput, NotFound
from riverbed.mqtt.acl import (
    Access,
    AclRule,
    Authorizer,
    Decision,
    Subject,
    TopicCheck,
    filter_covers,
)
from riverbed.mqtt.auth import load_auth
from riverbed.mqtt.codec.reasons import ConnectReason
from riverbed.mqtt.config import AuthConfig
from riverbed.mqtt.passwords import (
    Authenticator,
    PasswordHash,
    delete_user,
    hash_password,
    load_password_file,
    save_password_file,
    set_password,
    validate_password,
    validate_username,
)
from riverbed.topics.filters import matches

FAST: dict[str, Any] = {"n": 16, "r": 1, "p": 1}


@functools.cache
def fast_hash(password: bytes) -> PasswordHash:
    return hash_password(password, **FAST)


# --------------------------------------------------------------------- hashes


def test_default_hash_is_scrypt_2_14_8_1_with_a_random_salt() -> None:
    first, second = hash_password(b"secret"), hash_password(b"secret")
    assert (first.n, first.r, first.p) == (2**14, 8, 1)
    assert len(first.salt) == 16 and len(first.digest) == 32
    assert first.salt != second.salt and first.digest != second.digest
    assert first.verify(b"secret") and not first.verify(b"Secret")
    assert str(first).startswith("$scrypt$n=16384,r=8,p=1$")


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_a_hash_verifies_its_password_only(password: bytes, other: bytes) -> None:
    hashed = hash_password(password, **FAST)
    assert hashed.verify(password)
    assert hashed.verify(other) is (other == password)
    assert PasswordHash.parse(str(hashed)) == hashed


def test_a_hash_reads_back_what_it_writes() -> None:
    hashed = hash_password(b"pw", n=16, r=2, p=3, salt=b"0123456789abcdef")
    assert str(hashed) == (
        "$scrypt$n=16,r=2,p=3$MDEyMzQ1Njc4OWFiY2RlZg==$" + str(hashed).rsplit("$", 1)[1]
    )
    assert PasswordHash.parse(str(hashed)) == hashed


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", r"\$scrypt\$n=N,r=R,p=P\$SALT\$HASH"),
        ("$bcrypt$n=16,r=1,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "SALT"),
        ("$scrypt$n=16,r=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "SALT"),
        ("$scrypt$n=16,r=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA==", "base64"),
        ("$scrypt$n=15,r=1,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "power of 2"),
        ("$scrypt$n=1,r=1,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "power of 2"),
        ("$scrypt$n=16,r=0,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "1..64"),
        ("$scrypt$n=16,r=1,p=65$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "1..64"),
        ("$scrypt$n=1048576,r=8,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==", "MiB"),
        ("$scrypt$n=16,r=1,p=1$c2FsdA==$aGFzaGhhc2hoYXNoaGFzaA==", "salt"),
        ("$scrypt$n=16,r=1,p=1$c2FsdHNhbHQ=$aGFzaA==", "hash 16 to 64"),
    ],
)
def test_bad_hashes_are_refused_with_the_rule(text: str, rule: str) -> None:
    with pytest.raises(InvalidInput, match=rule):
        PasswordHash.parse(text)


@pytest.mark.parametrize(
    "bad", ["", "a:b", ":", "a\nb", "a\rb", "tab\there", "nul\x00", "del\x7f", "c1\x85", "\ud800"]
)
def test_bad_user_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="user name"):
        validate_username(bad)


@pytest.mark.parametrize("good", ["alice", "a b", "é", "#admin", "$SYS", "+", "a/b", "x" * 1000])
def test_user_names(good: str) -> None:
    assert validate_username(good) == good


@pytest.mark.parametrize(
    ("bad", "rule"), [(b"", "empty"), (b"x" * 65536, "65535"), ("text", "bytes")]
)
def test_bad_passwords_are_refused(bad: Any, rule: str) -> None:
    with pytest.raises(InvalidInput, match=rule):
        validate_password(bad)
    with pytest.raises(InvalidInput, match=rule):
        hash_password(bad, **FAST)


# --------------------------------------------------------------------- password files


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_password_file_round_trip_keeps_order_and_mode_0600(tmp_path: Path) -> None:
    users = {name: fast_hash(name.encode()) for name in ("zoe", "alice", "a b", "é")}
    path = tmp_path / "passwd"
    save_password_file(path, users)
    assert list(load_password_file(path).items()) == list(users.items())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().splitlines()[0] == f"zoe:{users['zoe']}"
    assert os.listdir(tmp_path) == ["passwd"]  # no temporary file left behind


def test_saving_replaces_a_readable_file_with_a_private_one(tmp_path: Path) -> None:
    path = write(tmp_path / "passwd", "")
    path.chmod(0o644)
    save_password_file(path, {"alice": fast_hash(b"a")})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_saving_through_a_symlink_replaces_its_target(tmp_path: Path) -> None:
    target = write(tmp_path / "real", "")
    link = tmp_path / "passwd"
    link.symlink_to(target)
    save_password_file(link, {"alice": fast_hash(b"a")})
    assert link.is_symlink()
    assert list(load_password_file(target)) == ["alice"]


def test_blank_lines_and_crlf_are_read(tmp_path: Path) -> None:
    hashed = fast_hash(b"pw")
    path = write(tmp_path / "passwd", f"\nalice:{hashed}\r\n   \r\nbob:{hashed}\n")
    assert list(load_password_file(path)) == ["alice", "bob"]


@pytest.mark.parametrize(
    ("text", "line", "rule"),
    [
        ("alice:{h}\nbob\n", 2, "not USERNAME:HASH"),
        ("alice:{h}\n\n:{h}\n", 3, "must not be empty"),
        ("tab\tuser:{h}\n", 1, "control character"),
        ("alice:$scrypt$n=16\n", 1, r"\$scrypt\$"),
        ("alice:{h}\nbob:{h}\nalice:{h}\n", 3, "user 'alice' is already on line 1"),
        ("alice:{h} \n", 1, r"\$scrypt\$"),
    ],
)
def test_a_bad_line_names_the_file_and_line(
    tmp_path: Path, text: str, line: int, rule: str
) -> None:
    path = write(tmp_path / "passwd", text.format(h=fast_hash(b"pw")))
    with pytest.raises(InvalidConfig, match=rule) as caught:
        load_password_file(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")


def test_a_bad_file_never_shows_a_hash(tmp_path: Path) -> None:
    hashed = str(fast_hash(b"pw"))
    path = write(tmp_path / "passwd", f"alice:{hashed}\nalice:{hashed}\n")
    with pytest.raises(InvalidConfig) as caught:
        load_password_file(path)
    assert hashed.split("$")[-1] not in str(caught.value)


def test_missing_and_unreadable_password_files(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        load_password_file(tmp_path / "none")
    with pytest.raises(InvalidConfig, match="cannot be read"):
        load_password_file(tmp_path)
    (tmp_path / "latin1").write_bytes(b"j\xf6rg:x\n")
    with pytest.raises(InvalidConfig, match="not UTF-8"):
        load_password_file(tmp_path / "latin1")


def test_set_password_adds_changes_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert set_password(path, "alice", b"one") is True
    assert set_password(path, "bob", b"two") is True
    before_bob = load_password_file(path)["bob"]
    assert set_password(path, "alice", b"three") is False
    users = load_password_file(path)
    assert list(users) == ["alice", "bob"]
    assert users["alice"].verify(b"three") and not users["alice"].verify(b"one")
    assert users["bob"] == before_bob


@pytest.mark.parametrize(("username", "password"), [("a:b", b"pw"), ("alice", b""), ("", b"x")])
def test_set_password_with_bad_input_changes_nothing(
    tmp_path: Path, username: str, password: bytes
) -> None:
    path = tmp_path / "passwd"
    save_password_file(path, {"alice": fast_hash(b"pw")})
    before = path.read_bytes()
    with pytest.raises(InvalidInput):
        set_password(path, username, password)
    assert path.read_bytes() == before
    with pytest.raises(InvalidInput):
        set_password(tmp_path / "new", username, password)
    assert not (tmp_path / "new").exists()


def test_set_password_refuses_a_broken_file_and_leaves_it(tmp_path: Path) -> None:
    path = write(tmp_path / "passwd", "garbage\n")
    with pytest.raises(InvalidConfig, match=":1: "):
        set_password(path, "alice", b"pw")
    assert path.read_text() == "garbage\n"


def test_set_password_in_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="cannot write"):
        set_password(tmp_path / "no" / "passwd", "alice", b"pw")


def test_delete_user(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    save_password_file(path, {"alice": fast_hash(b"a"), "bob": fast_hash(b"b")})
    delete_user(path, "alice")
    assert list(load_password_file(path)) == ["bob"]
    before = path.read_bytes()
    with pytest.raises(NotFound, match="user 'alice' is not in"):
        delete_user(path, "alice")
    assert path.read_bytes() == before
    with pytest.raises(NotFound, match="does not exist"):
        delete_user(tmp_path / "none", "bob")


# --------------------------------------------------------------------- authentication

BAD = ConnectReason.BAD_USER_NAME_OR_PASSWORD
NOT_AUTHORIZED = ConnectReason.NOT_AUTHORIZED
OK = ConnectReason.SUCCESS
USERS = {"alice": hash_password(b"wonderland", **FAST)}


@pytest.mark.parametrize(
    ("users", "anonymous", "username", "password", "reason", "who", "v311"),
    [
        (USERS, False, "alice", b"wonderland", OK, "alice", 0),
        (USERS, True, "alice", b"wonderland", OK, "alice", 0),
        (USERS, False, "alice", b"looking-glass", BAD, None, 4),
        (USERS, True, "alice", b"looking-glass", BAD, None, 4),
        (USERS, False, "alice", None, BAD, None, 4),
        (USERS, False, "bob", b"wonderland", BAD, None, 4),
        (USERS, True, "bob", b"wonderland", BAD, None, 4),
        (USERS, False, "", b"wonderland", BAD, None, 4),
        (USERS, False, None, None, NOT_AUTHORIZED, None, 5),
        (USERS, True, None, None, OK, None, 0),
        (USERS, True, None, b"wonderland", BAD, None, 4),
        (None, True, None, None, OK, None, 0),
        (None, True, "alice", b"anything", OK, None, 0),  # unproven name: anonymous
        (None, False, "alice", b"wonderland", BAD, None, 4),
        (None, False, None, None, NOT_AUTHORIZED, None, 5),
    ],
)
def test_authenticate(
    users: dict[str, PasswordHash] | None,
    anonymous: bool,
    username: str | None,
    password: bytes | None,
    reason: ConnectReason,
    who: str | None,
    v311: int,
) -> None:
    result = Authenticator(users, allow_anonymous=anonymous).authenticate("c1", username, password)
    assert result.reason is reason
    assert result.accepted is (reason is OK)
    assert result.username == who
    assert result.return_code_v311 == v311


def test_an_unknown_user_costs_one_scrypt_like_a_known_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    original = PasswordHash.verify

    def counting(self: PasswordHash, password: bytes) -> bool:
        calls.append(password)
        return original(self, password)

    monkeypatch.setattr(PasswordHash, "verify", counting)
    authenticator = Authenticator(USERS)
    for username, password in [("alice", b"x"), ("bob", b"x"), ("alice", None)]:
        calls.clear()
        assert authenticator.authenticate("c", username, password).reason is BAD
        assert len(calls) == 1


def test_load_auth_reads_the_configured_files(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    save_password_file(passwd, USERS)
    acl = write(tmp_path / "acl", "allow all user alice alice/#\n")
    authenticator, authorizer = load_auth(AuthConfig(password_file=passwd, acl_file=acl))
    assert authenticator.authenticate("c", "alice", b"wonderland").username == "alice"
    assert authenticator.authenticate("c", None, None).reason is NOT_AUTHORIZED
    assert authorizer.can_publish("alice", "c", "alice/x")
    assert not authorizer.can_publish("alice", "c", "bob/x")
    anonymous, everything = load_auth(AuthConfig(allow_anonymous=True))
    assert anonymous.authenticate("c", None, None).accepted
    assert everything == Authorizer() and everything.can_subscribe(None, "c", "#")


# --------------------------------------------------------------------- ACL format

EXAMPLE = """\
# DECISION  ACCESS     SUBJECT      FILTER
allow       all        user admin   #
deny        publish    anyone       $SYS/#
allow       all        anyone       users/%u/#
allow       publish    anyone       devices/%c/telemetry
allow       subscribe  anonymous    public/#
allow       subscribe  client probe  with space/+
default allow
"""


def test_the_documented_example_parses() -> None:
    acl = Authorizer.parse(EXAMPLE, "acl")
    assert acl.default is Decision.ALLOW
    assert [(r.decision.value, r.access.value, r.subject.value, r.name) for r in acl.rules] == [
        ("allow", "all", "user", "admin"),
        ("deny", "publish", "anyone", None),
        ("allow", "all", "anyone", None),
        ("allow", "publish", "anyone", None),
        ("allow", "subscribe", "anonymous", None),
        ("allow", "subscribe", "client", "probe"),
    ]
    assert acl.rules[5].topic_filter == "with space/+"
    assert [r.line for r in acl.rules] == [2, 3, 4, 5, 6, 7]


def test_an_acl_file_without_a_default_denies() -> None:
    acl = Authorizer.parse("allow publish anyone a\r\n")
    assert acl.default is Decision.DENY
    assert acl.can_publish(None, "c", "a") and not acl.can_publish(None, "c", "b")
    assert Authorizer().can_publish(None, "c", "anything")  # no ACL file: allowed


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("allow publish anyone", "DECISION ACCESS SUBJECT FILTER"),
        ("permit publish anyone #", "'permit' is not allow or deny"),
        ("allow pub anyone #", "'pub' is not publish, subscribe or all"),
        ("allow all someone #", "'someone' is not anyone, anonymous, user NAME or client ID"),
        ("allow all user alice", "'user NAME' must be followed by a topic filter"),
        ("allow all anyone a/#/b", r"MQTT-4\.7\.1-1"),
        ("allow all anyone a+", r"MQTT-4\.7\.1-2"),
        ("allow all anyone %u/#/x", r"'%u/#/x' with %u and %c filled in"),
        ("allow all anyone a/%x", "'%x' is not %u"),
        ("allow all anyone a/%", "'%' is not %u"),
        ("default", "is not 'default allow' or 'default deny'"),
        ("default maybe", "is not 'default allow' or 'default deny'"),
        ("default allow please", "is not 'default allow' or 'default deny'"),
    ],
)
def test_bad_acl_lines_name_the_line_and_the_rule(text: str, rule: str) -> None:
    with pytest.raises(InvalidConfig, match=rule) as caught:
        Authorizer.parse(f"# a comment\n\n{text}\n", "acl.txt")
    assert str(caught.value).startswith("acl.txt:3: ")


def test_a_second_default_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="acl:3: a second default; the first is on line 1"):
        Authorizer.parse("default deny\nallow all anyone #\ndefault allow\n", "acl")


def test_acl_files(tmp_path: Path) -> None:
    acl = Authorizer.load(write(tmp_path / "acl", EXAMPLE))
    assert acl == Authorizer.parse(EXAMPLE, str(tmp_path / "acl"))
    with pytest.raises(InvalidConfig, match="cannot be read"):
        Authorizer.load(tmp_path / "missing")
    (tmp_path / "latin1").write_bytes(b"allow all user j\xf6rg #\n")
    with pytest.raises(InvalidConfig, match="not UTF-8"):
        Authorizer.load(tmp_path / "latin1")


def test_a_rule_checks_itself() -> None:
    with pytest.raises(InvalidInput, match="disagree"):
        AclRule(Decision.ALLOW, Access.ALL, Subject.USER, None, "#")
    with pytest.raises(InvalidInput, match="disagree"):
        AclRule(Decision.ALLOW, Access.ALL, Subject.ANYONE, "alice", "#")
    with pytest.raises(InvalidInput, match=r"MQTT-4\.7\.1-1"):
        AclRule(Decision.ALLOW, Access.ALL, Subject.ANYONE, None, "#/a")


# --------------------------------------------------------------------- ACL decisions


def test_first_matching_rule_wins() -> None:
    acl = Authorizer.parse(EXAMPLE)
    assert acl.can_publish("admin", "c", "users/alice/x")  # admin's rule comes first
    assert not acl.can_publish("admin", "c", "$SYS/broker")  # "#" is no $-topic [MQTT-4.7.2-1]
    assert not acl.can_publish("alice", "c", "$SYS/broker")
    assert acl.can_publish("alice", "c", "users/alice/x")
    assert acl.can_publish("alice", "c", "anything")  # default allow
    assert acl.can_publish(None, "dev1", "devices/dev1/telemetry")


def test_subjects() -> None:
    acl = Authorizer.parse(
        "allow all user alice a\nallow all client c1 b\nallow all anonymous c\nallow all anyone d\n"
    )
    assert acl.can_publish("alice", "x", "a") and not acl.can_publish("bob", "x", "a")
    assert not acl.can_publish(None, "alice", "a")  # a client id is not a user name
    assert acl.can_publish("bob", "c1", "b") and not acl.can_publish("c1", "c2", "b")
    assert acl.can_publish(None, "x", "c") and not acl.can_publish("alice", "x", "c")
    assert acl.can_publish("alice", "x", "d") and acl.can_publish(None, "y", "d")


def test_access_kinds() -> None:
    acl = Authorizer.parse("allow publish anyone p/#\nallow subscribe anyone s/#\n")
    assert acl.can_publish(None, "c", "p/1") and not acl.can_subscribe(None, "c", "p/1")
    assert acl.can_subscribe(None, "c", "s/1") and not acl.can_publish(None, "c", "s/1")


def test_substitution() -> None:
    acl = Authorizer.parse(
        "allow all anyone users/%u/#\nallow all anyone dev/%c/in\nallow all anyone pct/%%u/x-%c\n"
    )
    assert acl.can_publish("alice", "c1", "users/alice/inbox")
    assert not acl.can_publish("alice", "c1", "users/bob/inbox")
    assert acl.can_subscribe("alice", "c1", "users/alice/#")
    assert not acl.can_subscribe("alice", "c1", "users/+/#")
    assert acl.can_publish(None, "c1", "dev/c1/in") and not acl.can_publish(None, "c1", "dev/c2/in")
    assert acl.can_publish(None, "c1", "pct/%u/x-c1")
    assert acl.can_publish("", "", "users//x")  # empty values are literal empty levels


@pytest.mark.parametrize("value", ["+", "#", "a/b", "a+", "x#", "/", "a/+/b"])
def test_a_value_with_wildcards_or_slashes_never_widens_a_rule(value: str) -> None:
    acl = Authorizer.parse("allow all anyone users/%u/#\nallow all anyone dev/%c/#\n")
    for topic in ("users/bob/x", "users/a/b", "users/+/x", "dev/d1/x", "dev/a/b"):
        assert not acl.can_publish(value, value, topic)
    for requested in ("users/+/x", "users/#", "dev/+/#", "#", "users/a/b/#", "dev/a/b"):
        assert not acl.can_subscribe(value, value, requested)


def test_rules_with_unusable_values_do_not_apply_allow_or_deny() -> None:
    acl = Authorizer.parse("deny all anyone users/%u/secret\nallow all anyone users/#\n")
    assert not acl.can_publish("alice", "c", "users/alice/secret")
    assert acl.can_publish("alice", "c", "users/bob/secret")
    assert acl.can_publish(None, "c", "users/alice/secret")  # no %u for an anonymous client
    assert acl.can_publish("a/b", "c", "users/a/b/secret")  # "a/b" names no one level


def test_a_deny_that_covers_the_filter_refuses_it_one_that_overlaps_does_not() -> None:
    """Filter mode (the default, as mosquitto): the filter itself is checked;
    the messages of topics it may not read are withheld on delivery."""
    acl = Authorizer.parse("deny subscribe anyone secrets/#\ndefault allow\n")
    assert not acl.strict
    for granted in ("#", "+/+", "+/#", "public/#", "secretsx/#"):
        assert acl.can_subscribe(None, "c", granted), granted
    for refused in ("secrets/#", "secrets", "secrets/a", "secrets/+/b", "secrets/+"):
        assert not acl.can_subscribe(None, "c", refused), refused
    assert acl.can_read(None, "c", "public/a") and not acl.can_read(None, "c", "secrets/a")


def test_filter_mode_first_rule_covering_the_filter_decides() -> None:
    acl = Authorizer.parse(
        "deny subscribe anyone secret/#\nallow subscribe anyone a/+\nallow subscribe anyone #\n"
        "default deny\n"
    )
    assert acl.can_subscribe(None, "c", "a/b")
    assert acl.can_subscribe(None, "c", "#")  # reads everything but secret/...
    assert acl.can_subscribe(None, "c", "+/x")
    assert not acl.can_subscribe(None, "c", "secret/x")
    assert not acl.can_subscribe(None, "c", "$SYS/#")  # "#" does not cover $-topics
    split = Authorizer.parse("allow subscribe anyone a\nallow subscribe anyone a/+/#\n")
    assert not split.can_subscribe(None, "c", "a/#")  # covered only by both together
    narrow = Authorizer.parse("allow subscribe anyone a/#\n")
    assert not narrow.can_subscribe(None, "c", "#")  # no rule covers it: the default


def test_strict_mode_refuses_a_filter_that_reaches_a_denied_topic() -> None:
    acl = Authorizer.parse(
        "deny subscribe anyone secret/#\nallow subscribe anyone a/+\nallow subscribe anyone #\n"
        "default deny\n",
        strict=True,
    )
    assert acl.can_subscribe(None, "c", "a/b")
    assert acl.can_subscribe(None, "c", "public/#")
    assert not acl.can_subscribe(None, "c", "#")  # would include secret/...
    assert not acl.can_subscribe(None, "c", "+/x")  # would include secret/x
    assert not acl.can_subscribe(None, "c", "secret/x")
    assert not acl.can_subscribe(None, "c", "$SYS/#")
    split = Authorizer.parse(
        "allow subscribe anyone a\nallow subscribe anyone a/+/#\n", strict=True
    )
    assert not split.can_subscribe(None, "c", "a/#")


@pytest.mark.parametrize("strict", [False, True], ids=["filter", "strict"])
def test_shared_subscriptions_are_checked_by_their_filter(strict: bool) -> None:
    acl = Authorizer.parse(
        "deny subscribe anyone secret/#\nallow subscribe anyone #\n", strict=strict
    )
    assert acl.can_subscribe(None, "c", "$share/g/public/x")
    assert acl.can_subscribe(None, "c", "$queue/public/x")
    assert not acl.can_subscribe(None, "c", "$share/g/secret/x")
    assert acl.can_subscribe(None, "c", "$share/g/#") is not strict
    assert not acl.can_subscribe(None, "c", "$queue/secret/#")
    assert not acl.can_subscribe(None, "c", "$share/g")
    assert not acl.can_subscribe(None, "c", "$share/g/")
    assert not acl.can_subscribe(None, "c", "$queue/")


def test_load_auth_reads_the_wildcard_mode(tmp_path: Path) -> None:
    acl = write(tmp_path / "acl", "deny subscribe anyone secrets/#\ndefault allow\n")
    _, default = load_auth(AuthConfig(allow_anonymous=True, acl_file=acl))
    _, strict = load_auth(AuthConfig(allow_anonymous=True, acl_file=acl, acl_wildcard="strict"))
    assert default.can_subscribe(None, "c", "#") and not strict.can_subscribe(None, "c", "#")
    _, no_file = load_auth(AuthConfig(allow_anonymous=True, acl_wildcard="strict"))
    assert no_file.can_subscribe(None, "c", "#")


@pytest.mark.parametrize("value", ["loose", "", 1, "filter strict"])
def test_a_bad_wildcard_mode_names_the_value_and_the_choices(value: object) -> None:
    with pytest.raises(InvalidConfig) as caught:
        AuthConfig(acl_wildcard=value)  # type: ignore[arg-type]
    assert str(caught.value) == f"auth.acl_wildcard = {value!r}: must be one of filter, strict"


# --------------------------------------------------------------------- containment

NAME_LEVELS = ["a", "b", "$s", ""]
FILTER_LEVELS = [*NAME_LEVELS, "+", "#"]


def all_names(max_depth: int) -> list[str]:
    return [
        name
        for depth in range(1, max_depth + 1)
        for levels in itertools.product(NAME_LEVELS, repeat=depth)
        if (name := "/".join(levels))  # "" is no topic name [MQTT-4.7.3-1]
    ]


def all_filters(max_depth: int) -> list[str]:
    return [
        "/".join(levels)
        for depth in range(1, max_depth + 1)
        for levels in itertools.product(FILTER_LEVELS, repeat=depth)
        if "#" not in levels[:-1] and "/".join(levels)
    ]


NAMES_5 = all_names(5)


@functools.cache
def matched(topic_filter: str) -> frozenset[str]:
    """The names of up to 5 levels the filter matches: enough witnesses for
    filters of up to 4 levels (one level more than either has)."""
    return frozenset(n for n in NAMES_5 if matches(topic_filter, n))


def test_filter_covers_is_containment_exhaustively() -> None:
    every = all_filters(3)
    for rule, requested in itertools.product(every, repeat=2):
        expected = matched(requested) <= matched(rule)
        assert filter_covers(rule, requested) is expected, (rule, requested)


@st.composite
def filters(draw: st.DrawFn, max_levels: int = 4) -> str:
    levels = draw(st.lists(st.sampled_from([*NAME_LEVELS, "+"]), max_size=max_levels))
    if not levels or (len(levels) < max_levels and draw(st.booleans())):
        levels.append("#")
    return "/".join(levels) or "#"


@settings(max_examples=500)
@given(filters(), filters())
def test_filter_covers_is_containment(rule: str, requested: str) -> None:
    assert filter_covers(rule, requested) is (matched(requested) <= matched(rule))


@given(filters())
def test_a_filter_covers_itself_and_hash_covers_every_non_dollar_filter(f: str) -> None:
    assert filter_covers(f, f)
    assert filter_covers("#", f) is (not f.startswith("$"))


@pytest.mark.parametrize(
    ("rule", "requested", "expected"),
    [
        ("a/#", "a", True),
        ("a/#", "a/b/+", True),
        ("a/+", "a/#", False),
        ("+/#", "#", True),  # every name has at least one level
        ("/+/#", "/#", True),  # "/#" matches "" too, which is no topic name
        ("#", "$SYS/#", False),
        ("$SYS/#", "$SYS/+", True),
        ("+/+", "a/b", True),
        ("a/b", "a/+", False),
        ("a", "a/#", False),
    ],
)
def test_filter_covers_examples(rule: str, requested: str, expected: bool) -> None:
    assert filter_covers(rule, requested) is expected


ACL_FILTERS = st.one_of(filters(max_levels=3), st.sampled_from(["#", "+/#", "a/#", "$s/#"]))


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["allow", "deny"]), ACL_FILTERS), max_size=5),
    st.sampled_from(["allow", "deny"]),
    filters(max_levels=3),
)
def test_strict_mode_allows_a_subscription_only_if_every_topic_it_matches_is(
    rules: list[tuple[str, str]], default: str, requested: str
) -> None:
    """Soundness against brute force: decide every name the requested filter
    matches by first match; a granted subscription must have all of them allowed."""
    text = "".join(f"{d} all anyone {f}\n" for d, f in rules) + f"default {default}\n"
    acl = Authorizer.parse(text, strict=True)
    if acl.can_subscribe(None, "c", requested):
        assert all(acl.can_read(None, "c", name) for name in matched(requested))
    elif all(d == "allow" for d, _ in rules) and default == "deny":
        # Only allows: refused exactly when no single rule covers it.
        assert not any(filter_covers(f, requested) for _, f in rules)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["allow", "deny"]), ACL_FILTERS), max_size=5),
    st.sampled_from(["allow", "deny"]),
    filters(max_levels=3),
)
def test_filter_mode_decides_by_the_first_rule_covering_the_filter(
    rules: list[tuple[str, str]], default: str, requested: str
) -> None:
    """Against brute force: the first rule whose topics include all of the
    requested filter's decides, else the default; and the strict answer is
    never more generous."""
    text = "".join(f"{d} all anyone {f}\n" for d, f in rules) + f"default {default}\n"
    acl = Authorizer.parse(text)
    covering = [d for d, f in rules if matched(requested) <= matched(f)]
    expected = (covering[0] if covering else default) == "allow"
    assert acl.can_subscribe(None, "c", requested) is expected
    if Authorizer.parse(text, strict=True).can_subscribe(None, "c", requested):
        assert expected


# --------------------------------------------------------------------- reading


def test_no_read_check_when_nothing_can_be_withheld() -> None:
    assert Authorizer().read_check(None, "c") is None  # no ACL file
    allows = Authorizer.parse("allow all anyone a/#\ndeny publish anyone b\ndefault allow\n")
    assert allows.read_check("alice", "c") is None
    someone = Authorizer.parse("deny subscribe user bob #\ndefault allow\n")
    assert someone.read_check("alice", "c") is None
    check = someone.read_check("bob", "c")
    assert check is not None and not check("a")
    denies = Authorizer.parse("allow all anyone #\n")  # default deny: $-topics
    check = denies.read_check(None, "c")
    assert check is not None and check("a/b") and not check("$SYS/x")


def test_clients_under_the_same_rules_share_a_read_check() -> None:
    acl = Authorizer.parse("deny subscribe anyone secrets/#\nallow all anyone users/%u/#\n")
    first, second = acl.read_check("alice", "c1"), acl.read_check("alice", "c2")
    assert acl.can_publish("alice", "c1", "users/alice/x")  # publishing resolves its own
    assert first is not None and first is second
    other = acl.read_check("bob", "c1")
    assert other is not None and other is not first
    assert first("users/alice/x") and not other("users/alice/x")


def test_a_read_check_keeps_a_bounded_number_of_answers() -> None:
    check = TopicCheck((("secrets/#", False),), True, max_topics=3)
    for n in range(10):
        assert check(f"t/{n}") and not check(f"secrets/{n}")
        assert len(check._known) <= 3


SUBJECTS = ["anyone", "anonymous", "user alice", "user bob", "client c1", "client +"]
READ_FILTERS = st.one_of(
    filters(max_levels=3), st.sampled_from(["#", "u/%u/#", "c/%c/+", "%u", "a/%c", "$s/#"])
)
USERS_OR_NONE = st.sampled_from([None, "alice", "bob", "a/b", "+", ""])
CLIENT_IDS = st.sampled_from(["c1", "c2", "+", "a/b", "#"])
TOPIC_NAMES = st.sampled_from(
    [*all_names(3), "u/alice/x", "u/bob/y", "c/c1/x", "c/c2/x", "alice", "a/c1", "u/a/b/x"]
)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["allow", "deny"]),
            st.sampled_from(["publish", "subscribe", "all"]),
            st.sampled_from(SUBJECTS),
            READ_FILTERS,
        ),
        max_size=6,
    ),
    st.sampled_from(["allow", "deny"]),
    USERS_OR_NONE,
    CLIENT_IDS,
    st.lists(TOPIC_NAMES, min_size=1, max_size=30),
    st.integers(min_value=1, max_value=5),
)
def test_the_cached_checks_agree_with_the_rules(
    rules: list[tuple[str, str, str, str]],
    default: str,
    username: str | None,
    client_id: str,
    topics: list[str],
    max_topics: int,
) -> None:
    """Every answer of the cached checks (reading: the session's `read_check`;
    publishing: `can_publish`), asked in any order and again (with a small cache
    that starts over), is `decide`'s: the rules evaluated afresh."""
    text = "".join(f"{' '.join(rule)}\n" for rule in rules) + f"default {default}\n"
    acl = Authorizer.parse(text)
    check = acl.read_check(username, client_id)
    if check is None:
        assert all(acl.decide(Access.SUBSCRIBE, username, client_id, t) for t in all_names(3))
    else:
        check.max_topics = max_topics
    for topic in [*topics, *reversed(topics)]:
        expected = acl.decide(Access.SUBSCRIBE, username, client_id, topic)
        assert (check is None or check(topic)) is expected, topic
        assert acl.can_read(username, client_id, topic) is expected
        published = acl.decide(Access.PUBLISH, username, client_id, topic)
        assert acl.can_publish(username, client_id, topic) is published, topic


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["allow", "deny"]), ACL_FILTERS), max_size=5),
    st.sampled_from(["allow", "deny"]),
    st.sampled_from(all_names(3)),
    st.booleans(),
)
def test_a_topic_name_may_be_subscribed_exactly_when_it_may_be_read(
    rules: list[tuple[str, str]], default: str, name: str, strict: bool
) -> None:
    text = "".join(f"{d} all anyone {f}\n" for d, f in rules) + f"default {default}\n"
    acl = Authorizer.parse(text, strict=strict)
    assert acl.can_subscribe(None, "c", name) is acl.can_read(None, "c", name)
