"""Messages to rows (`Appender` before the commit): each message keeps its own
properties and an id of its own, in order, however a batch mixes them; what
cannot be stored is refused by name and nothing of its batch is written."""

from __future__ import annotations

import pytest

from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.model import Message, Properties


def test_a_batch_mixing_properties_keeps_each_messages_own(storage_url: str) -> None:
    kinds: list[Properties] = [
        (("\x00client", "pub-1"),),
        (),
        (("\x00client", "pub-2"), ("colour", "red")),
        (("blob", b"\x00\xff"), ("n", 7)),
    ]
    # Equal properties built as separate tuples, as a broker builds them per message.
    wanted = [tuple((name, value) for name, value in kinds[n % 4]) for n in range(40)]
    messages = [
        Message(f"m{n}".encode(), key=f"k{n % 3}", properties=props)
        for n, props in enumerate(wanted)
    ]
    with Log.open(storage_url) as log:
        log.topics.create("mixed", 1)
        log.produce("mixed", messages)
        (head,) = log.storage.list_streams("mixed")
        stored = log.storage.read(head.key, 0, 100)
    assert [m.payload for m in stored] == [f"m{n}".encode() for n in range(40)]
    assert [m.properties for m in stored] == wanted
    assert [m.key for m in stored] == [f"k{n % 3}" for n in range(40)]
    ids = [m.message_id for m in stored]
    assert len(set(ids)) == 40 and ids == sorted(ids)


def test_a_property_that_cannot_be_stored_is_refused_and_nothing_is_written(
    storage_url: str,
) -> None:
    good = Message(b"fine", properties=(("a", "b"),))
    bad = Message(b"bad", properties=(("list", ["not", "hashable"]),))  # type: ignore[arg-type]
    with Log.open(storage_url) as log:
        log.topics.create("mixed", 1)
        with pytest.raises(InvalidInput, match="property 'list' has a value of type list"):
            log.appender.append("mixed", [good, bad])
        (head,) = log.storage.list_streams("mixed")
        assert head.next_offset == 0
