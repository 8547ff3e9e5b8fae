"""A connection's durable shared subscriptions (seed 001; docs/shared-subscriptions.md).

`$share/GROUP/FILTER` and `$queue/FILTER` subscriptions do not follow topics
through the session's cursors: the group's Leader lends the filter's streams to
one member at a time. `Sharing` is the glue between the connection and the
sans-I/O `SharedSubscriptionHandler`:

- SUBSCRIBE / UNSUBSCRIBE of a shared filter go to the Handler, whose Borrowers
  talk to the Leader over the node's `SharedRuntime` (registered there by id);
- a grant (`StartFetching`) becomes a stream of the session under a key of its
  own (`Session.grant_key`): fetched from the fan-out like any stream but
  matched against the group's filter only, in the same in-flight window as the
  private subscriptions;
- what the session reports of a grant (`GrantMoved`: taken in, sent,
  acknowledged) goes back to the Handler, which reports progress to the Leader;
- `StopFetching` (revoke, unsubscribe) stops the grant's stream, `Forget` drops it;
- when the connection closes, every Borrower leaves with its progress.

QoS 2 exactly once to the group: a grant's QoS 2 message whose PUBREC came is
the client's (it is completed by this session, across restarts). The record
write that holds its PUBREL back also records it as released to the group
(`released`, `sharedsub.claims.RELEASED_NAMESPACE`); a grant of a group
subscribed with QoS 2 starts only after reading which of its offsets are
released already, and passes them over. So a Leader that died before saving
the progress past them (its successor resumes from the saved progress) does
not hand them to the group again. That read also fences the stream
(`sharedsub.claims.lend`): a member lent it before, whose client's PUBREC comes
only now (its grant was taken from it meanwhile: revoked and not drained in
time, fenced off, its Leader gone), cannot record the message as released any
more (`LentElsewhere`); its connection ends without the PUBREL, and the
message is the new member's. A PUBLISH not yet answered with PUBREC when the
member's connection breaks may go to another member (MQTT 5.0 §4.8.2).

Shared subscriptions are kept in the session record with the others (their
full `$share/...` text), so a resumed session shares again; while the session
is offline it is no member, and the group's other members (or, with none, the
group's persisted progress) carry on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, assert_never

from riverbed.errors import RiverbedError
from riverbed.mqtt.ports import Services
from riverbed.sessions.qos2 import Phase, WindowEntry
from riverbed.sessions.session import Effect, GrantMoved, Session, Subscription
from riverbed.sharedsub.borrower import Forget, Send, StartFetching, StopFetching
from riverbed.sharedsub.claims import (
    LENT_NAMESPACE,
    RELEASED_NAMESPACE,
    lend,
    lent_key,
    released_key,
)
from riverbed.sharedsub.handler import Grant, SessionEffect, SharedSubscriptionHandler
from riverbed.sharedsub.protocol import GroupId, Message, ToBorrower

log = logging.getLogger(__name__)

SHARED_PREFIXES = ("$share/", "$queue/")
READ_RETRY = 1.0
"""Seconds before a failed read of a grant's released offsets is tried again."""


def is_shared(topic_filter: str) -> bool:
    """Whether a subscription's filter is a shared one (`$share/` or `$queue/`)."""
    return topic_filter.startswith(SHARED_PREFIXES)


class SharingOwner(Protocol):
    """The connection a `Sharing` belongs to, as far as the Sharing uses it
    (`mqtt/connection.py`'s `Connection`, which this module does not import)."""

    @property
    def broker(self) -> Services: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on (its clock, its timers)."""
        ...

    @property
    def client_id(self) -> str: ...

    @property
    def closing(self) -> bool: ...

    @property
    def session(self) -> Session | None: ...

    def execute(self, effects: list[Effect]) -> None:
        """Carry out the session's effects."""
        ...

    def offer(self, stream: int, messages: object, upto: int) -> None:
        """The fan-out's answer to a fetch of one of the session's streams."""
        ...


@dataclass(frozen=True, slots=True)
class Released:
    """What a session record write adds for the shared grants' released messages."""

    also: tuple[tuple[str, str, bytes], ...]
    """The `sharedsub.released` entries to write."""
    holds: tuple[tuple[str, str, int], ...]
    """The lending keys to hold at their grants' versions (`LentElsewhere` if not)."""

    def __bool__(self) -> bool:
        return bool(self.also)


@dataclass(slots=True)
class _Held:
    """A grant the session fetches."""

    grant: Grant
    key: int
    """The session's key for it (below RETAINED)."""
    stream_key: int
    """The log's key of the stream."""
    topic_filter: str
    skip: frozenset[int] = frozenset()
    """Offsets released to a member's client already: passed over."""
    lent: int | None = None
    """The version of the stream's lending key this grant made (QoS 2 only)."""


class Sharing:
    """The shared subscriptions of one connection's session."""

    __slots__ = (
        "_by_grant",
        "_by_key",
        "_marked",
        "_options",
        "_reading",
        "_registered",
        "_registered_generation",
        "_sources",
        "_timer",
        "_timer_at",
        "conn",
        "handler",
        "refused",
        "subscriptions",
    )

    def __init__(self, conn: SharingOwner, session_id: str) -> None:
        self.conn = conn
        runtime = conn.broker.shared
        assert runtime is not None
        self.handler = SharedSubscriptionHandler(session_id, runtime.config)
        self.subscriptions: dict[str, Subscription] = {}
        """The session's shared subscriptions by their full text."""
        self._options: dict[GroupId, Subscription] = {}
        """The options each group was last subscribed with (kept after an
        unsubscribe: a Borrower handing its streams back may still get one)."""
        self._by_key: dict[int, _Held] = {}
        self._by_grant: dict[Grant, _Held] = {}
        self._sources: dict[int, tuple[GroupId, int, int | None]] = {}
        """Per grant key ever used by this connection, the group, the log's
        key of the stream and the lending key's version of the grant: a
        revoked grant's QoS 2 messages still in flight are released to that
        group, if the stream was not lent to a member since."""
        self._marked: set[tuple[int, int]] = set()
        """(grant key, offset) of window entries recorded as released."""
        self._reading: dict[Grant, object] = {}
        """Grants waiting for the read of their released offsets (a token each:
        a newer grant, a stop or a forget replaces or removes it)."""
        self._registered: set[str] = set()
        self._registered_generation = -1
        """The Agent's `generation` `_registered` follows."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.refused = False
        """A write of released messages was refused (`LentElsewhere`): the
        connection ends, and writes none of them any more."""

    # --- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------
    def subscribe(self, subscription: Subscription) -> bool:
        """Share the group `subscription.topic_filter` names (validated by the
        caller with `GroupId.parse`); True if the session shared it already (its
        options are replaced: grants granted from now on use them)."""
        text = subscription.topic_filter
        existed = text in self.subscriptions
        self.subscriptions[text] = subscription
        self._options[GroupId.parse(text)] = subscription
        if not existed:
            self._run(self.handler.subscribe(text, self._now()))
        return existed

    def unsubscribe(self, text: str) -> bool:
        """Leave the group; False if the session did not share it."""
        if self.subscriptions.pop(text, None) is None:
            return False
        self._run(self.handler.unsubscribe(text, self._now()))
        return True

    def close(self) -> None:
        """The session goes offline: every Borrower leaves with its progress."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        runtime = self.conn.broker.shared
        effects = self.handler.disconnect(self._now())
        for held in list(self._by_key.values()):
            self._drop(held)
        if runtime is not None:
            for effect in effects:
                if isinstance(effect, Send):
                    runtime.send(effect.to, effect.message)
            for address in self._registered:
                runtime.unregister(address)
        self._registered.clear()
        self._registered_generation = -1
        self._reading.clear()

    # --- the session's side ---------------------------------------------------------
    def fetch(self, key: int, offset: int, limit: int) -> None:
        """The session's `Fetch` of a grant's stream."""
        held = self._by_key.get(key)
        if held is None:
            return  # forgotten meanwhile: nothing to answer
        conn = self.conn

        skip = held.skip

        def sink(_stream: int, messages: object, upto: int) -> None:
            if skip:
                messages = [m for m in messages if m.offset not in skip]  # type: ignore[attr-defined]
            conn.offer(key, messages, upto)

        conn.broker.fanout.fetch(
            held.stream_key, offset, limit, (conn, key), sink, held.topic_filter
        )

    def moved(self, effect: GrantMoved) -> None:
        """The session's report of a grant's stream."""
        held = self._by_key.get(effect.stream)
        if held is None:
            return
        self._run(
            self.handler.report(held.grant, effect.taken, effect.sent, effect.acked, self._now())
        )

    def released(self, window: Sequence[WindowEntry]) -> Released:
        """What a write of `window` (the QoS 2 window about to be written) must
        add for the granted streams' messages released to their group's member
        (PUBREC came) that are not recorded yet: the KV entries recording them
        and the lending keys to hold at their grants' versions, for
        `SessionWriter.write(also=..., holds=...)`."""
        also: list[tuple[str, str, bytes]] = []
        holds: dict[tuple[str, int], tuple[str, str, int]] = {}
        value = self.conn.client_id.encode()
        for entry in window:
            if entry.phase is Phase.SENT or (entry.stream, entry.offset) in self._marked:
                continue
            source = self._sources.get(entry.stream)
            if source is not None:
                group, stream_key, lent = source
                entry_key = released_key(group, stream_key, entry.offset)
                also.append((RELEASED_NAMESPACE, entry_key, value))
                if lent is not None:
                    # By key and version: an older grant of the same stream here
                    # (lent to this member again since) holds its own, which
                    # fails, as it must (the stream's newer grant sends it too).
                    key = lent_key(group, stream_key)
                    holds[(key, lent)] = (LENT_NAMESPACE, key, lent)
        return Released(tuple(also), tuple(holds.values()))

    def as_recorded(self, window: Sequence[WindowEntry]) -> tuple[WindowEntry, ...]:
        """`window` as a write other than the one recording released messages
        (`released`) may store it: a granted stream's message whose PUBREC came
        and that is not recorded as released yet stays sent. Stored released
        without its group's entry, it would be completed after a restart while
        the group could lend it to another member."""
        marked = self._marked
        sources = self._sources
        if not sources:
            return tuple(window)
        return tuple(
            replace(e, phase=Phase.SENT)
            if e.phase is Phase.RELEASED
            and e.stream in sources
            and (e.stream, e.offset) not in marked
            else e
            for e in window
        )

    def recorded(self, window: Sequence[WindowEntry]) -> None:
        """The write of `window` (with its `released` entries) committed."""
        self._marked = {
            (e.stream, e.offset)
            for e in window
            if e.phase is not Phase.SENT and e.stream in self._sources
        }
        # Grants gone with nothing of theirs left in the window need no source.
        live = {e.stream for e in window}
        for key in [k for k in self._sources if k not in live and k not in self._by_key]:
            del self._sources[key]

    # --- the Handler's effects ------------------------------------------------------
    def _receive(self, message: Message) -> None:
        if isinstance(message, ToBorrower) and not self.conn.closing:
            self._run(self.handler.receive(message, self._now()))

    def _run(self, effects: list[SessionEffect]) -> None:
        conn = self.conn
        runtime = conn.broker.shared
        assert runtime is not None
        self._register()
        for effect in effects:
            match effect:
                case Send(to, message):
                    runtime.send(to, message)
                case StartFetching(borrower, stream, offset):
                    self._start(Grant(borrower, stream), offset)
                case StopFetching(borrower, stream):
                    self._reading.pop(Grant(borrower, stream), None)
                    held = self._by_grant.get(Grant(borrower, stream))
                    if held is not None and conn.session is not None:
                        conn.broker.fanout.cancel(held.stream_key, (conn, held.key))
                        conn.execute(conn.session.stop_grant(held.key, self._now()))
                case Forget(borrower, stream):
                    self._reading.pop(Grant(borrower, stream), None)
                    held = self._by_grant.get(Grant(borrower, stream))
                    if held is not None:
                        self._drop(held)
                case _:
                    assert_never(effect)
        self._register()
        self._arm_timer()

    def _register(self) -> None:
        """Keep the runtime's bus in step with the Handler's Borrowers (called
        before and after their effects run: new ones must be reachable before
        their first message goes out)."""
        agent = self.handler.agent
        if agent.generation == self._registered_generation:
            return  # the common case (a delivery step): no Borrower came or went
        self._registered_generation = agent.generation
        runtime = self.conn.broker.shared
        assert runtime is not None
        current = set(agent.borrowers)
        if current == self._registered:
            return
        for address in current - self._registered:
            runtime.register(address, self._receive)
        for address in self._registered - current:
            runtime.unregister(address)
        self._registered = current
        # A Borrower that ended (left after an unsubscribe, or was replaced) says
        # nothing more of its streams.
        for held in [h for h in self._by_key.values() if h.grant.borrower not in current]:
            self._drop(held)

    def _start(self, grant: Grant, offset: int) -> None:
        conn = self.conn
        session = conn.session
        group = self.handler.group_of(grant)
        if session is None or group is None:
            return
        self._reading.pop(grant, None)
        old = self._by_grant.get(grant)
        if old is not None:
            self._drop(old)  # granted again: a stream of its own, from the new offset
        stream_key = conn.broker.fanout.key_of(grant.stream)
        if stream_key is None:
            # A stream the fan-out has not seen yet (created a moment ago).
            conn.loop.create_task(self._start_later(grant, offset))
            return
        options = self._options.get(group) or Subscription(str(group), 0)
        if options.qos == 2:
            # Which of its QoS 2 messages went to a member's client already.
            token = self._reading[grant] = object()
            conn.loop.create_task(self._start_after_reading(grant, offset, stream_key, token))
            return
        self._begin(grant, offset, stream_key, frozenset())

    async def _start_after_reading(
        self, grant: Grant, offset: int, stream_key: int, token: object
    ) -> None:
        broker = self.conn.broker
        holder = self.conn.client_id.encode()
        while True:
            group = self.handler.group_of(grant)
            if group is None or self._reading.get(grant) is not token or self.conn.closing:
                return  # stopped, forgotten or granted again meanwhile
            try:
                lent = await asyncio.to_thread(
                    lend, broker.log.storage, group, stream_key, offset, holder
                )
                break
            except RiverbedError as exc:
                # Unknown: nothing of the grant goes out before it is known (that
                # could be a second delivery); try again while the grant lasts.
                log.warning(
                    "client %s: lending %s (reading its released offsets) failed (%s);"
                    " trying again",
                    self.conn.client_id,
                    grant,
                    exc,
                )
                await asyncio.sleep(READ_RETRY)
        if self._reading.get(grant) is not token or self.conn.closing:
            return
        del self._reading[grant]
        self._begin(grant, offset, stream_key, lent.skip, lent.version)

    def _begin(
        self,
        grant: Grant,
        offset: int,
        stream_key: int,
        skip: frozenset[int],
        lent: int | None = None,
    ) -> None:
        conn = self.conn
        session = conn.session
        group = self.handler.group_of(grant)
        if session is None or group is None:
            return
        options = self._options.get(group) or Subscription(str(group), 0)
        key = session.grant_key()
        topic_filter = group.topic_filter
        held = _Held(grant, key, stream_key, topic_filter, skip, lent)
        self._by_key[key] = held
        self._by_grant[grant] = held
        self._sources[key] = (group, stream_key, lent)
        sub = Subscription(
            topic_filter,
            options.qos,
            False,
            options.retain_as_published,
            0,
            options.identifier,
        )
        conn.execute(session.grant(key, offset, sub, self._now()))

    async def _start_later(self, grant: Grant, offset: int) -> None:
        try:
            await self.conn.broker.fanout.refresh()
        except RiverbedError:
            log.exception("client %s: looking for stream %s failed", self.conn.client_id, grant)
        if grant not in self.handler.grants or self.conn.closing:
            return
        if self.conn.broker.fanout.key_of(grant.stream) is None:
            log.warning("client %s: stream %s of a grant not found", self.conn.client_id, grant)
            return
        self._start(grant, offset)

    def _drop(self, held: _Held) -> None:
        conn = self.conn
        self._by_key.pop(held.key, None)
        self._by_grant.pop(held.grant, None)
        conn.broker.fanout.cancel(held.stream_key, (conn, held.key))
        if conn.session is not None:
            conn.session.forget_grant(held.key)

    # --- time -------------------------------------------------------------------------
    def _now(self) -> float:
        return self.conn.loop.time()

    def _arm_timer(self) -> None:
        deadline = self.handler.next_deadline()
        if self._timer is not None:
            if deadline == self._timer_at:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None and not self.conn.closing:
            self._timer_at = deadline
            loop = self.conn.loop
            self._timer = loop.call_at(max(deadline, loop.time()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        if not self.conn.closing:
            runtime = self.conn.broker.shared
            assert runtime is not None
            runtime.receive_arrived()  # the Leader's answers count before the fence
            if not self.conn.closing:
                self._run(self.handler.tick(self._now()))
