"""MQTT topic names and topic filters ([MQTT-4.7]).

A topic name is what a message is published to; a filter is what a subscription
or a Riverbed topic binding asks for, with `+` (one level) and `#` (all the
remaining levels, including none). Names starting with `$` are not matched by a
filter whose first level is a wildcard [MQTT-4.7.2-1].
"""

from __future__ import annotations

from riverbed.errors import InvalidTopicFilter, InvalidTopicName

MAX_TOPIC_BYTES = 65535


def _check_common(text: str, what: str, error: type[ValueError]) -> None:
    if not text:
        # [MQTT-4.7.3-1] topic names and filters are at least one character long.
        raise error(f"{what} must not be empty [MQTT-4.7.3-1]")
    if "\x00" in text:
        # [MQTT-4.7.3-2] no null character.
        raise error(f"{what} {text!r} contains U+0000 [MQTT-4.7.3-2]")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate cannot be well-formed UTF-8 [MQTT-1.5.4-1].
        raise error(f"{what} {text!r} is not well-formed UTF-8 [MQTT-1.5.4-1]") from None
    if size > MAX_TOPIC_BYTES:
        # [MQTT-4.7.3-3] at most 65535 bytes of UTF-8.
        raise error(f"{what} is {size} bytes long; the limit is 65535 [MQTT-4.7.3-3]")


def validate_topic_name(name: str) -> str:
    """Return `name` if it is a valid topic name, else raise `InvalidTopicName`."""
    _check_common(name, "topic name", InvalidTopicName)
    if "+" in name or "#" in name:
        # [MQTT-3.3.2-2] the topic name in a PUBLISH must not contain wildcards.
        raise InvalidTopicName(
            f"topic name {name!r} contains a wildcard (+ or #); names may not [MQTT-3.3.2-2]"
        )
    return name


def validate_filter(topic_filter: str) -> str:
    """Return the filter if valid, else raise `InvalidTopicFilter`."""
    _check_common(topic_filter, "topic filter", InvalidTopicFilter)
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            # [MQTT-4.7.1-1] '#' stands alone and last.
            raise InvalidTopicFilter(
                f"topic filter {topic_filter!r}: '#' must be a whole level and the last one"
                " [MQTT-4.7.1-1]"
            )
        if "+" in level and level != "+":
            # [MQTT-4.7.1-2] '+' occupies an entire level.
            raise InvalidTopicFilter(
                f"topic filter {topic_filter!r}: '+' must be a whole level [MQTT-4.7.1-2]"
            )
    return topic_filter


def is_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def matches(topic_filter: str, name: str) -> bool:
    """Whether the (valid) filter matches the (valid) topic name."""
    if name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False  # [MQTT-4.7.2-1]
    f_levels = topic_filter.split("/")
    n_levels = name.split("/")
    for index, f in enumerate(f_levels):
        if f == "#":
            return True
        if index >= len(n_levels):
            return False
        if f != "+" and f != n_levels[index]:
            return False
    return len(f_levels) == len(n_levels)


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name is matched by both (valid) filters."""
    a_levels = a.split("/")
    b_levels = b.split("/")
    if a_levels[0] in ("+", "#") and b_levels[0].startswith("$"):
        return False
    if b_levels[0] in ("+", "#") and a_levels[0].startswith("$"):
        return False
    if {a, b} == {"+", "/#"}:
        # Both match the empty name and nothing else in common, but "" is no topic
        # name [MQTT-4.7.3-1]. No other pair has "" as its only common name: only
        # "+", "#", "/#" and "+/#" match "", and the other pairs share "a" or "/".
        return False
    return _levels_overlap(a_levels, b_levels)


def _levels_overlap(a: list[str], b: list[str]) -> bool:
    for index in range(max(len(a), len(b))):
        if index >= len(a):
            # a is used up: it matches only names of exactly its length, which b
            # matches only if what is left of b is a lone '#'.
            return b[index:] == ["#"]
        if index >= len(b):
            return a[index:] == ["#"]
        x, y = a[index], b[index]
        if x == "#" or y == "#":
            return True
        if x != "+" and y != "+" and x != y:
            return False
    return True


def filter_covers(outer: str, inner: str) -> bool:
    """Whether every topic name the (valid) filter `inner` matches is matched by
    the (valid) filter `outer` too (`a/#` covers `a/+/c`; `a/+` does not cover
    `a/#`, which matches `a`)."""
    o_levels = outer.split("/")
    i_levels = inner.split("/")
    if o_levels[0] in ("+", "#") and i_levels[0].startswith("$"):
        return False  # inner matches $-names, which outer does not [MQTT-4.7.2-1]
    for index, x in enumerate(i_levels):
        if index >= len(o_levels):
            return False  # inner matches names longer than outer's
        y = o_levels[index]
        if y == "#":
            return True
        if x == "#":
            # inner also matches the name that ends here, which outer (not '#')
            # does not, unless that name would be "" (no topic name
            # [MQTT-4.7.3-1]): then outer "+/#" from here still covers it
            # ("+/#" covers "#", "/+/#" covers "/#").
            ends_empty = index == 0 or (index == 1 and i_levels[0] == "")
            return ends_empty and y == "+" and o_levels[index + 1 :] == ["#"]
        if y != "+" and x != y:
            return False  # x is '+' or another level: it matches names y does not
    # inner matches names of exactly its length: outer must end here too, or
    # with a '#', which matches the parent level [MQTT-4.7.1-2].
    return o_levels[len(i_levels) :] in ([], ["#"])
