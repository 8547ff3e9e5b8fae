"""What a client may do: the ACL language and its checks, sans-I/O.

`Authorizer.can_publish` / `can_subscribe` answer a PUBLISH or a SUBSCRIBE
with yes or no, which the broker sends as 0x87 Not authorized (PUBACK, PUBREC,
SUBACK; a 3.1.1 SUBACK says 0x80, a 3.1.1 QoS 0/1 PUBLISH is acknowledged and
dropped). Who may connect is the password file's (`passwords.py`); `auth.py`
joins the two.

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

import logging
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from riverbed.errors import InvalidConfig, InvalidInput, InvalidTopicFilter
from riverbed.topics.filters import filters_overlap, matches, validate_filter

log = logging.getLogger(__name__)


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
