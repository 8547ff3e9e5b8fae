"""A topic-filter trie: which subscribers does a published topic name reach?

The broker routes every committed message to the online sessions whose filters
match its topic name (DESIGN.md, "Sessions"), so `TopicTrie.match` is on the hot
path and is built for it:

- Filters without wildcards (the common case: `devices/42/cmd`) live in one
  dict keyed by the whole filter, so they cost a single hash lookup of the
  topic name, whatever their depth.
- Filters with `+` or `#` live in a trie of levels. A match walks it level by
  level, following the literal child, the `+` child and collecting the values
  of a `#` at each node it passes, so it touches only the branches that can
  match; nodes with nothing below them are removed when their last filter goes.

Semantics are those of `riverbed.topics.filters.matches`: `+` is one level, `#`
all remaining levels including none (`a/#` matches `a`), and a filter whose
first level is a wildcard does not match a topic name starting with `$`
[MQTT-4.7.2-1].

Shared subscriptions are not this module's concern: a caller subscribing
`$share/GROUP/FILTER` adds `FILTER` (a `$share/...` filter added as it is would
be taken literally).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from riverbed.topics.filters import is_wildcard, validate_filter

V = TypeVar("V", bound=Hashable)


class _Node(Generic[V]):
    """One level of the wildcard trie.

    `children` holds the literal next levels; the `+` child is kept apart (no
    topic level can be `+`, but a separate slot saves a dict lookup per node).
    `exact` are the values of filters that end at this node, `rest` those of
    filters that continue with `#` here. Empty collections are `None`, so the
    walk tests them with one truth check.
    """

    __slots__ = ("children", "exact", "plus", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] | None = None
        self.plus: _Node[V] | None = None
        self.exact: dict[V, None] | None = None
        self.rest: dict[V, None] | None = None

    def is_empty(self) -> bool:
        return not (self.children or self.plus or self.exact or self.rest)


class TopicTrie(Generic[V]):
    """Topic filters mapped to the subscribers (any hashable values) that hold them.

    One filter holds each value at most once (adding it again changes nothing);
    a value may hold many filters. Not thread-safe: one owner (the broker's
    event loop) adds, removes and matches.
    """

    __slots__ = ("_literal", "_root", "_size")

    def __init__(self) -> None:
        self._literal: dict[str, dict[V, None]] = {}
        self._root: _Node[V] = _Node()
        self._size = 0

    def __len__(self) -> int:
        """The number of (filter, value) pairs held."""
        return self._size

    def add(self, topic_filter: str, value: V) -> bool:
        """Hold `value` under `topic_filter`; False if it was already there.

        Raises `InvalidTopicFilter` for an invalid filter [MQTT-4.7].
        """
        validate_filter(topic_filter)
        if is_wildcard(topic_filter):
            node = self._root
            for level in topic_filter.split("/"):
                if level == "#":
                    if node.rest is None:
                        node.rest = {}
                    added = _put(node.rest, value)
                    break
                if level == "+":
                    if node.plus is None:
                        node.plus = _Node()
                    node = node.plus
                else:
                    if node.children is None:
                        node.children = {}
                    child = node.children.get(level)
                    if child is None:
                        child = node.children[level] = _Node()
                    node = child
            else:
                if node.exact is None:
                    node.exact = {}
                added = _put(node.exact, value)
        else:
            added = _put(self._literal.setdefault(topic_filter, {}), value)
        self._size += added
        return added

    def remove(self, topic_filter: str, value: V) -> bool:
        """Drop `value` from `topic_filter`; False if it was not there.

        Nodes left with nothing below them are removed, so a trie that held a
        million short-lived filters shrinks back once they are gone.
        """
        if not is_wildcard(topic_filter):
            values = self._literal.get(topic_filter)
            if values is None or value not in values:
                return False
            del values[value]
            if not values:
                del self._literal[topic_filter]
            self._size -= 1
            return True
        # The path from the root, as (parent, level, child), to prune bottom-up.
        path: list[tuple[_Node[V], str, _Node[V]]] = []
        node = self._root
        levels = topic_filter.split("/")
        for index, level in enumerate(levels):
            if level == "#" and index == len(levels) - 1:
                removed = _drop(node, "rest", value)
                break
            child = node.plus if level == "+" else (node.children or {}).get(level)
            if child is None:
                return False
            path.append((node, level, child))
            node = child
        else:
            removed = _drop(node, "exact", value)
        if not removed:
            return False
        self._size -= 1
        for parent, level, child in reversed(path):
            if not child.is_empty():
                break
            if level == "+":
                parent.plus = None
            else:
                assert parent.children is not None
                del parent.children[level]
                if not parent.children:
                    parent.children = None
        return True

    def match(self, topic_name: str) -> list[V]:
        """The values whose filters match the (valid) topic name.

        A value appears once per matching filter it holds: a session subscribed
        to both `a/+` and `a/#` is returned twice for `a/b`, and the caller
        decides whether that is one delivery or two (MQTT 5.0 §3.3.4 allows
        either; subscription identifiers need both). The order is unspecified.
        The name is not validated here: the broker checked it on the way in.
        """
        literal = self._literal.get(topic_name)
        out: list[V] = list(literal) if literal else []
        root = self._root
        if root.children is None and root.plus is None and root.rest is None:
            return out  # no wildcard filters at all
        levels = topic_name.split("/")
        last = len(levels) - 1
        if topic_name[:1] == "$":
            # [MQTT-4.7.2-1] a leading wildcard does not match a $-topic.
            first = root.children.get(levels[0]) if root.children else None
            if first is None:
                return out
            nodes = [first]
            start = 1
        else:
            nodes = [root]
            start = 0
        for index in range(start, last + 1):
            level = levels[index]
            following: list[_Node[V]] = []
            for node in nodes:
                if node.rest:
                    out.extend(node.rest)
                children = node.children
                if children:
                    child = children.get(level)
                    if child is not None:
                        following.append(child)
                if node.plus is not None:
                    following.append(node.plus)
            if not following:
                return out
            nodes = following
        for node in nodes:
            if node.exact:
                out.extend(node.exact)
            if node.rest:
                out.extend(node.rest)  # `a/#` also matches `a` [MQTT-4.7.1-2]
        return out

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (filter, value) pair held, in no particular order."""
        for topic_filter, values in self._literal.items():
            for value in values:
                yield topic_filter, value
        stack: list[tuple[str | None, _Node[V]]] = [(None, self._root)]
        while stack:
            prefix, node = stack.pop()
            if node.exact:
                assert prefix is not None  # a filter has at least one level
                for value in node.exact:
                    yield prefix, value
            if node.rest:
                hash_filter = "#" if prefix is None else f"{prefix}/#"
                for value in node.rest:
                    yield hash_filter, value
            for level, child in (node.children or {}).items():
                stack.append((level if prefix is None else f"{prefix}/{level}", child))
            if node.plus is not None:
                stack.append(("+" if prefix is None else f"{prefix}/+", node.plus))

    def node_count(self) -> int:
        """Trie nodes below the root plus filters in the literal table: 0 when
        empty. For diagnostics and for tests that check nothing leaks."""
        count = len(self._literal)
        stack = [self._root]
        while stack:
            node = stack.pop()
            below = [*(node.children or {}).values(), *([node.plus] if node.plus else [])]
            count += len(below)
            stack.extend(below)
        return count


def _put(values: dict[V, None], value: V) -> bool:
    if value in values:
        return False
    values[value] = None
    return True


def _drop(node: _Node[V], slot: str, value: V) -> bool:
    values: dict[V, None] | None = getattr(node, slot)
    if values is None or value not in values:
        return False
    del values[value]
    if not values:
        setattr(node, slot, None)
    return True
