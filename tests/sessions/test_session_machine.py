"""The session state machine under random event sequences (hypothesis).

A model of the log (streams of messages) answers the session's fetches in any
order; the client acknowledges any message in flight, at any time; the router
may pass a waiting fetch by (messages that match none of the session's
subscriptions, `Session.passed`). Invariants: the window is never exceeded; a
followed stream is never left stalled (it has a fetch out, or a queue at least
half its share, or is done); a window held back for a batched refill has a
deadline that sends it anyway; each stream's messages are delivered once, in
offset order; the cursor never passes an unacknowledged message; what the
checkpoints carried (those lost in a failed write handed back with `unsaved`)
adds up to the session's cursors after each checkpoint; and at the end
everything matching is delivered. Streams start from a stored cursor or not,
with or without a DUP range: dormant streams (`FetchMany`) and streams with
their state from the start both take part.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from harness.session_effects import fetches
from riverbed.clock import Tick
from riverbed.model import StoredMessage
from riverbed.sessions.session import (
    REFILL_DELAY,
    Acked,
    Checkpoint,
    Deliver,
    Effect,
    Fetch,
    Follow,
    Offered,
    Session,
    Subscription,
)

STREAMS = 3
WINDOW = 4
REFILL = 2
QUEUE = 12


def _message(offset: int, matching: bool) -> StoredMessage:
    topic = "a/x" if matching else "b/x"
    return StoredMessage(offset, b"", 0, topic, "k", b"%d" % offset, None, 1, 0)


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.session = Session(
            "c",
            [Subscription("a/#", 1)],
            window=WINDOW,
            queue_limit=QUEUE,
            checkpoint_every=5,
            checkpoint_interval=1.0,
            refill=REFILL,
        )
        self.now = 0.0
        self.log: dict[int, list[StoredMessage]] = {k: [] for k in range(STREAMS)}
        self.fetches: dict[int, Fetch] = {}
        self.inflight: dict[int, tuple[int, int]] = {}
        self.delivered: dict[int, list[int]] = {k: [] for k in range(STREAMS)}
        self.stored: dict[int, int] = {}
        """What the checkpoints wrote, merged (the store's cursors)."""

    @initialize(
        stored=st.lists(st.booleans(), min_size=STREAMS, max_size=STREAMS),
        dup=st.lists(st.integers(0, 3), min_size=STREAMS, max_size=STREAMS),
    )
    def follow(self, stored: list[bool], dup: list[int]) -> None:
        """Every stream followed from offset 0 in one turn, its cursor stored or
        not, earlier sends below `dup` (above the cursor: not dormant)."""
        for key in range(STREAMS):
            if stored[key]:
                self.stored[key] = 0
        events = [Follow(key, 0, dup[key], stored[key]) for key in range(STREAMS)]
        self._apply(self.session.handle_all(events, self.now))

    def _apply(self, effects: list[Effect]) -> None:
        for fetch in fetches(effects):
            assert fetch.stream not in self.fetches, "two fetches out on one stream"
            assert fetch.limit > 0
            self.fetches[fetch.stream] = fetch
        for effect in effects:
            if isinstance(effect, Checkpoint):
                self.stored.update(effect.cursors)
            elif isinstance(effect, Deliver):
                assert effect.packet_id is not None
                self.inflight[effect.packet_id] = (effect.stream, effect.message.offset)
                self.delivered[effect.stream].append(effect.message.offset)

    @rule(stream=st.integers(0, STREAMS - 1), matching=st.lists(st.booleans(), max_size=8))
    def append(self, stream: int, matching: list[bool]) -> None:
        messages = self.log[stream]
        for m in matching:
            messages.append(_message(len(messages), m))

    @precondition(lambda self: bool(self.fetches))
    @rule(data=st.data())
    def answer_a_fetch(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(sorted(self.fetches)))
        fetch = self.fetches.pop(stream)
        available = self.log[stream][fetch.offset :]
        taken = available[: fetch.limit]
        upto = taken[-1].offset + 1 if taken else fetch.offset
        offered = [m for m in taken if m.mqtt_topic.startswith("a/")]
        self._apply(self.session.handle(Offered(stream, offered, upto), self.now))

    @precondition(lambda self: bool(self.fetches))
    @rule(data=st.data())
    def pass_a_fetch(self, data: st.DataObject) -> None:
        """The router passes a waiting fetch by: messages that match nothing of
        the session's, at its offset on; the fetch waits on from past them
        (`Fanout.passed`)."""
        stream = data.draw(st.sampled_from(sorted(self.fetches)))
        fetch = self.fetches[stream]
        upto = fetch.offset
        for message in self.log[stream][fetch.offset :]:
            if message.mqtt_topic.startswith("a/"):
                break
            upto = message.offset + 1
        if upto > fetch.offset:
            self.fetches[stream] = Fetch(stream, upto, fetch.limit)
            self.session.passed({stream: upto})
            self._apply(self.session.handle(Tick(), self.now))

    @precondition(lambda self: bool(self.inflight))
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        packet_id = data.draw(st.sampled_from(sorted(self.inflight)))
        del self.inflight[packet_id]
        self._apply(self.session.handle(Acked(packet_id), self.now))

    @rule(seconds=st.floats(0, 2))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._apply(self.session.handle(Tick(), self.now))

    @rule(written=st.booleans())
    def checkpoint(self, written: bool) -> None:
        """A checkpoint now (as at disconnect), written or its write failed."""
        checkpoint = self.session.checkpoint(self.now)
        if written:
            self.stored.update(checkpoint.cursors)
            assert self.stored == self.session.cursors()
        else:
            self.session.unsaved(checkpoint.cursors)

    @invariant()
    def window_is_respected(self) -> None:
        assert len(self.inflight) <= WINDOW
        assert self.session.inflight == len(self.inflight)

    @invariant()
    def delivered_once_in_order(self) -> None:
        for offsets in self.delivered.values():
            assert offsets == sorted(set(offsets))

    @invariant()
    def a_held_refill_goes_out_by_its_deadline(self) -> None:
        # Queued messages and a free slot: the window waits for REFILL free
        # slots, and a Tick at the deadline sends anyway.
        if self.session.queued and len(self.inflight) < WINDOW:
            assert WINDOW - len(self.inflight) < REFILL
            deadline = self.session.next_deadline()
            assert deadline is not None and deadline <= self.now + REFILL_DELAY

    @invariant()
    def cursor_never_passes_an_unacknowledged_message(self) -> None:
        cursors = self.session.cursors()
        for stream, offset in self.inflight.values():
            assert cursors[stream] <= offset

    @invariant()
    def no_stream_is_stalled(self) -> None:
        # Without a fetch out and with room in the queue, a stream must be waiting
        # for the window (its messages queued), never forgotten.
        if self.inflight and len(self.inflight) == WINDOW:
            return
        for stream in range(STREAMS):
            if stream in self.fetches:
                continue
            assert self.session.queued > 0, f"stream {stream} has no fetch out and nothing queued"

    def teardown(self) -> None:
        # Drain: answer the fetches that have messages to give, acknowledge all
        # that is in flight, until nothing moves; then everything matching is out.
        for _ in range(1_000):
            behind = [s for s, f in self.fetches.items() if f.offset < len(self.log[s])]
            if not behind and not self.inflight:
                break
            for stream in behind:
                fetch = self.fetches.pop(stream)
                taken = self.log[stream][fetch.offset :][: fetch.limit]
                offered = [m for m in taken if m.mqtt_topic.startswith("a/")]
                upto = taken[-1].offset + 1
                self._apply(self.session.handle(Offered(stream, offered, upto), self.now))
            for packet_id in sorted(self.inflight):
                del self.inflight[packet_id]
                self._apply(self.session.handle(Acked(packet_id), self.now))
        for stream, messages in self.log.items():
            wanted = [m.offset for m in messages if m.mqtt_topic.startswith("a/")]
            assert self.delivered[stream] == wanted, f"stream {stream}"
            assert self.session.cursors()[stream] == len(messages)


SessionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSessionMachine = SessionMachine.TestCase
