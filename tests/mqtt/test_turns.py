"""The end of a turn (mqtt/turns.py): the sessions' offers are handled after the
callback that made them, then every connection written to is flushed once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from riverbed.mqtt.turns import EndOfTurn


class FakeWriter:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events

    def flush_writes(self) -> None:
        self.events.append(f"flush {self.name}")


def test_offers_wait_for_the_end_of_the_turn_then_writes_are_flushed() -> None:
    async def go() -> list[str]:
        events: list[str] = []
        turns = EndOfTurn()
        a, b = FakeWriter("a", events), FakeWriter("b", events)

        def handle(event: object) -> None:
            events.append(f"offer {event}")
            if event == 1:
                turns.written(b)  # the session delivers: b's first bytes of the turn

        turns.written(a)
        turns.offer(handle, 1)
        turns.offer(handle, 2)
        events.append("callback done")  # nothing ran inside the callback
        await asyncio.sleep(0)
        return events

    assert asyncio.run(go()) == [
        "callback done",
        "offer 1",
        "offer 2",
        "flush a",
        "flush b",
    ]


def test_an_offer_made_while_finishing_waits_for_the_next_turn() -> None:
    """A session's next fetch answered from memory is handled a turn later: one
    end of turn never hands out more than a round of offers."""

    async def go() -> list[str]:
        events: list[str] = []
        turns = EndOfTurn()

        def handle(event: object) -> None:
            events.append(f"offer {event}")
            if event == 1:
                turns.offer(handle, 2)

        turns.offer(handle, 1)
        turns.finish()  # as a commit ends it
        events.append("finished")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return events

    assert asyncio.run(go()) == ["offer 1", "finished", "offer 2"]


def test_finishing_with_nothing_to_do_does_nothing() -> None:
    async def go() -> None:
        turns = EndOfTurn()
        turns.finish()
        turns.finish()

    asyncio.run(go())


def test_one_failing_answer_leaves_the_others_handled_and_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An answer whose session fails is logged; the answers after it are still
    handled and every connection is still written (a session left without its
    answer would wait for it forever)."""

    async def go() -> list[str]:
        events: list[str] = []
        turns = EndOfTurn()

        def handle(event: object) -> None:
            if event == "bad":
                raise RuntimeError("the session broke")
            events.append(f"offer {event}")

        turns.written(FakeWriter("a", events))
        turns.offer(handle, "bad")
        turns.offer(handle, "good")
        await asyncio.sleep(0)
        return events

    with caplog.at_level(logging.ERROR, logger="riverbed.mqtt.turns"):
        assert asyncio.run(go()) == ["offer good", "flush a"]
    assert "the session broke" in caplog.text
