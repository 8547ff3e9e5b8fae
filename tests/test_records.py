"""`quick_init`: a frozen, slotted dataclass built through its slots' setters is
the same record the dataclass's own `__init__` builds, and refuses what it did."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.model import Message, StreamId
from riverbed.records import quick_init
from riverbed.sessions.session import Deliver, Fetch, Follow, Offered
from riverbed.storage.base import StreamHead


def _record_class() -> type[Any]:
    """A new frozen, slotted dataclass with defaults and a check (each call its own)."""

    @dataclass(frozen=True, slots=True)
    class Record:
        name: str
        count: int = 0
        tags: tuple[str, ...] = ()

        def __post_init__(self) -> None:
            if self.count < 0:
                raise ValueError(f"count {self.count!r} must be 0 or more")

    return Record


Plain = _record_class()
Quick = quick_init(_record_class())


@given(
    name=st.text(max_size=5),
    count=st.integers(min_value=0, max_value=10),
    tags=st.lists(st.text(max_size=3), max_size=3).map(tuple),
)
def test_the_same_record_as_the_dataclass_builds(
    name: str, count: int, tags: tuple[str, ...]
) -> None:
    for args, kwargs in [
        ((name,), {}),
        ((name, count), {}),
        ((name, count, tags), {}),
        ((), {"name": name, "tags": tags}),
        ((name,), {"count": count}),
    ]:
        quick, plain = Quick(*args, **kwargs), Plain(*args, **kwargs)
        assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
        assert repr(quick) == repr(plain)
        assert quick == Quick(*args, **kwargs) and hash(quick) == hash(Quick(*args, **kwargs))
        assert dataclasses.replace(quick, count=count + 1).count == count + 1


def test_it_stays_frozen_and_checks_its_arguments() -> None:
    quick = Quick("a", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.count = 2
    with pytest.raises(ValueError, match="count -1 must be 0 or more"):
        Quick("a", -1)
    with pytest.raises(TypeError, match="name"):
        Quick()
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Quick("a", colour=1)
    with pytest.raises(TypeError, match="multiple values"):
        Quick("a", name="b")
    assert Quick.__init__.__qualname__ == "_record_class.<locals>.Record.__init__"


def test_what_it_cannot_build_is_refused() -> None:
    @dataclass(slots=True)
    class Mutable:
        name: str

    @dataclass(frozen=True)
    class NoSlots:
        name: str

    @dataclass(frozen=True, slots=True)
    class Factory:
        tags: list[str] = field(default_factory=list)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        name: str

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        name: str
        seed: InitVar[int] = 0

    for cls, says in [
        (Mutable, "not a frozen, slotted dataclass"),
        (NoSlots, "not a frozen, slotted dataclass"),
        (Factory, "tags is not a plain field"),
        (KeywordOnly, "name is not a plain field"),
        (WithInitVar, "InitVar"),
    ]:
        with pytest.raises(TypeError, match=says):
            quick_init(cls)
    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        quick_init(int)


def test_the_records_built_per_message_keep_their_rules() -> None:
    """The classes it is used on: defaults and validation as declared."""
    from riverbed.errors import InvalidInput

    assert Message(b"x") == Message(b"x", None, "", (), 0, False)
    message = Message(b"x", "k", "a/b", (("n", "v"),), 1, True)
    assert pickle.loads(pickle.dumps(message)) == message
    with pytest.raises(InvalidInput, match="payload must be bytes, got str"):
        Message("x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="qos 3 is not 0, 1 or 2"):
        Message(b"x", qos=3)
    assert Follow(1, 5) == Follow(stream=1, cursor=5, dup_below=0, stored=True)
    assert Fetch(1, 2, 3).limit == 3 and Offered(1, (), 7).upto == 7
    assert Deliver(1, None, 1, 5, False, False, ()).packet_id == 5  # type: ignore[arg-type]
    head = StreamHead(3, StreamId("t", 0, 1), 0, 9, False)
    assert str(head.stream) == "t/0/1" and head == StreamHead(3, StreamId("t", 0, 1), 0, 9, False)
