"""What a session follows: its subscriptions, the topics they reach, the streams
it reads and the cursors it holds.

Each subscription of a session reads the log through the session's cursors
(named subscriptions `$session.<id>.<topic>`, `sessions/store.py`) on every
topic its filters can reach. `Following` keeps that set in step:

- a SUBSCRIBE takes effect when it is read (`take`, before any await): its
  subscriptions join the session and the trie, and the start positions of the
  streams the session does not follow yet are taken then, so a message
  committed after the SUBSCRIBE was read is delivered even if its publisher did
  not wait for the SUBACK; the cursors at those positions and the
  subscriptions are durable before the SUBACK (`subscribe`), then the new
  streams are followed and the retained messages sent per Retain Handling;
- UNSUBSCRIBE drops the cursors of topics no subscription reaches any more, so
  they do not hold messages back from retention;
- a stream of a later generation (a topic scaled up) is followed only once its
  lineage's streams of the generation before are fully consumed
  (`log.lineage.readable_streams`): per-key order across a scale-up. While some
  stream waits, the check runs again after every checkpoint and at least every
  LINEAGE_RECHECK seconds, with the session's cursors moved past what the
  fan-out routed that matched none of its subscriptions (`Fanout.passed`: the
  last messages of a generation may be none of its own); streams that appear
  while the session is online are picked up when the fan-out sees them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from riverbed.clock import now_us
from riverbed.errors import InvalidTopicFilter, ProtocolError, RiverbedError
from riverbed.log.lineage import readable_streams
from riverbed.log.retention import Holds
from riverbed.log.topics import reachable_topics
from riverbed.mqtt.codec import (
    MQTT_5,
    DisconnectReason,
    Packet,
    Suback,
    SubackReason,
    Subscribe,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
)
from riverbed.mqtt.shapes import Shape
from riverbed.mqtt.sharing import Sharing, SharingOwner, is_shared
from riverbed.sessions.session import Event, FollowAll, Session, Subscription
from riverbed.sessions.store import MadeCursors, SessionRecord, Stored, start_positions
from riverbed.sessions.writer import NewCursors, outcome_of
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.protocol import GroupId

log = logging.getLogger(__name__)

LINEAGE_RECHECK = 1.0
"""Seconds between two looks for streams to follow while some stream of the
session's topics waits for its lineage."""


class FollowingOwner(SharingOwner, Protocol):
    """The connection a `Following` belongs to, as far as the Following uses
    it (`mqtt/connection.py`'s `Connection`, which this module does not import)."""

    stored: Stored | None
    """The session's record as last written (None before the session is open)."""

    @property
    def record_lock(self) -> asyncio.Lock:
        """Held while a new record is written (one write of it at a time)."""
        ...

    @property
    def level(self) -> int: ...

    @property
    def username(self) -> str | None: ...

    @property
    def sharing(self) -> Sharing | None: ...

    def share(self) -> Sharing: ...

    def require_session(self) -> Session: ...

    def record(self) -> SessionRecord: ...

    def subscriptions(self) -> tuple[Subscription, ...]: ...

    def handle(self, event: Event) -> None:
        """An event for the session."""
        ...

    def handle_all(self, events: Sequence[Event]) -> None:
        """Events for the session, handled as one."""
        ...

    def take_passed(self) -> None:
        """Move the session's waiting fetches, and its cursors, past what the
        fan-out routed that matched none of its subscriptions."""
        ...

    async def retained_room(self, most: int) -> None:
        """Return once at most `most` retained messages wait in the session's
        queue (at once if so, or if the connection is closing)."""
        ...

    def send(self, packet: Packet, level: int | None = None) -> None: ...

    def send_now(self, packet: Packet) -> None:
        """An answer the client waits for: written now, with what is queued."""
        ...

    def __hash__(self) -> int:
        """Its subscriptions' subscriber in the broker's topic trie."""
        ...


@dataclass(frozen=True, slots=True)
class Readable:
    """Streams a session may read now, with their cursors; `unstored`: those
    of them with no cursor of the session stored yet (`Follow.stored`)."""

    cursors: dict[int, int]
    unstored: frozenset[int] = frozenset()

    def follow(self, dup_below: Mapping[int, int], skip: frozenset[int] = frozenset()) -> FollowAll:
        """The event that has the session follow these streams, but `skip`."""
        cursors = self.cursors
        if skip:
            cursors = {key: cursor for key, cursor in cursors.items() if key not in skip}
        return FollowAll(cursors, dup_below, self.unstored)


NOTHING_TO_READ = Readable({})


class _HeldStart:
    """A SUBSCRIBE's hold on its start positions (`Services.holds`): released
    once its cursors are committed, or once it is sure none will be."""

    __slots__ = ("holds", "token", "written")

    def __init__(self, holds: Holds, token: int) -> None:
        self.holds = holds
        self.token = token
        self.written: Future[Stored] | None = None

    def until_written(self, written: Future[Stored]) -> None:
        """Kept until this write of the cursors is done, whatever its waiter does
        (a connection closing stops waiting; the write goes on)."""
        self.written = written
        written.add_done_callback(self._done)

    def _done(self, _written: object) -> None:
        self.holds.release(self.token)

    def release(self) -> None:
        """No write of its cursors was made: let go now (a no-op once one was)."""
        if self.written is None:
            self.holds.release(self.token)


@dataclass(frozen=True, slots=True)
class _Taken:
    """A SUBSCRIBE as `Following.take` left it for `Following.subscribe`."""

    packet: Subscribe
    codes: tuple[SubackReason, ...]
    added: list[Subscription]
    """Its private subscriptions, in effect since it was read."""
    shared: list[Subscription]
    wants_retained: list[Subscription]
    positions: dict[int, int]
    """Stream key -> where the subscription starts on it, taken when read."""
    at_us: int
    """When it was read (a message id's time): where streams not in
    `positions` start."""
    hold: _HeldStart | None = None
    """Retention keeps what it starts at until its cursors are committed
    (`Services.holds`); None with no private subscription."""


class Following:
    """The subscriptions and followed streams of one connection's session."""

    __slots__ = (
        "_again",
        "_recheck",
        "_retain_queue",
        "_retaining",
        "_taken",
        "_task",
        "conn",
        "lineage_wait",
    )

    def __init__(self, conn: FollowingOwner) -> None:
        self.conn = conn
        self.lineage_wait = False
        """Some stream of the session's topics waits for its lineage."""
        self._task: asyncio.Task[None] | None = None
        self._again = False
        """Another look for new streams was asked for while one ran."""
        self._recheck: asyncio.TimerHandle | None = None
        """The next look while some stream waits for its lineage."""
        self._taken: _Taken | None = None
        """The SUBSCRIBE `take` took and `subscribe` has yet to finish."""
        self._retaining: asyncio.Task[None] | None = None
        """Sends the retained messages new subscriptions asked for, one
        subscription after another (made on first use: most connections never
        need one)."""
        self._retain_queue: deque[Subscription] | None = None
        """Subscriptions whose retained messages are still to be sent."""

    def cancel(self) -> None:
        taken, self._taken = self._taken, None
        if taken is not None and taken.hold is not None:
            taken.hold.release()  # unless its cursors' write is on its way
        if self._task is not None:
            self._task.cancel()
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self._retaining is not None:
            self._retaining.cancel()

    def bindings(self) -> list[tuple[str, str | None]]:
        return self.conn.broker.shapes.bindings()

    def reachable_topics(
        self, subscriptions: tuple[Subscription, ...], bindings: list[tuple[str, str | None]]
    ) -> list[str]:
        """The topics these subscriptions' filters may reach."""
        return reachable_topics([s.topic_filter for s in subscriptions], bindings)

    async def follow(
        self,
        topics: list[str],
        *,
        start_us: int | None,
        dup: Mapping[int, int],
        crashed: bool,
        cursors: Mapping[str, dict[int, int] | None] | None = None,
    ) -> list[Event]:
        """Make sure the session has cursors on `topics`; return Follow events for
        their streams, and record the topics. `cursors`: its committed cursors
        per topic as read with the record it resumed (`SessionStore.load_resuming`),
        not read again."""
        conn = self.conn
        assert conn.stored is not None
        stored = conn.stored
        known = set(stored.record.topics)
        new = [t for t in topics if t not in known]
        all_topics = [*stored.record.topics, *new]
        if not all_topics:
            return []
        # Topics the session had before keep their cursors; a topic it reaches for
        # the first time starts where the session was last seen (resume) or now.
        if new:
            async with conn.record_lock:
                record = replace(conn.record(), topics=tuple(all_topics))
                written = await outcome_of(
                    conn.broker.writer.write(
                        record, conn.stored.version, NewCursors(tuple(new), start_us)
                    )
                )
                conn.stored = written.without_made()
        # After a crash, what may have been sent reaches the heads as they are
        # now for streams this broker did not know at its start (read now).
        # Otherwise no heads are needed: a stream the fan-out has not seen is
        # read when the session fetches from it, and what other processes
        # appended reaches the fan-out at its next look, as for every session.
        heads = await conn.broker.fanout.refresh() if crashed else {}
        start_heads = conn.broker.fanout.start_heads
        # The cursors of the topics it had are made if missing (a crash between
        # making them and writing the record that names them).
        readable = await self.readable(all_topics, ensure=stored.record.topics, known=cursors)
        if not readable.cursors:
            return []
        if crashed:
            dup = {
                key: max(dup.get(key, 0), start_heads.get(key, heads.get(key, 0)))
                for key in readable.cursors
            }
        return [readable.follow(dup)]

    async def readable(
        self,
        topics: list[str],
        ensure: tuple[str, ...] = (),
        known: Mapping[str, dict[int, int] | None] | None = None,
    ) -> Readable:
        """The streams of `topics` the session may read now, with their cursors:
        a stream of a later generation only once its lineage's streams of the
        generation before are fully consumed (`log.lineage`, per-key order across
        a scale-up). Sets `lineage_wait` when some stream has to wait.
        `ensure`: topics whose cursors are made first if missing (at the heads;
        most resumes find them all, and only a missing one takes the write lock)."""
        conn = self.conn
        assert conn.stored is not None
        session_id = conn.stored.record.session_id
        in_memory: dict[int, int] = {}
        if conn.session is not None:
            conn.take_passed()
            in_memory = conn.session.cursors()
        out, waiting = await self._streams_of(session_id, topics, in_memory, ensure, known=known)
        self.lineage_wait = waiting
        self.recheck_lineage()
        return out

    async def _streams_of(
        self,
        session_id: str,
        topics: list[str],
        in_memory: dict[int, int],
        ensure: tuple[str, ...] = (),
        made: Mapping[str, MadeCursors] = MappingProxyType({}),
        known: Mapping[str, dict[int, int] | None] | None = None,
    ) -> tuple[Readable, bool]:
        """`readable`, without setting `lineage_wait`: the streams and cursors,
        and whether some stream has to wait for its lineage. `in_memory`: the
        session's cursors, newer than the stored ones. `made`: cursors the
        session's write has just made, with their topics' shape as that write
        read it (nothing of those topics is read again). `known`: the
        session's committed cursors per topic as a resume read them with its
        record (None: missing), not read again.

        A topic's generations and heads are the same for every session:
        `Services.shapes` reads them once for all (a fleet resuming at once
        read them once per session). The session's own cursors, and whether
        those of `ensure` exist, in one read."""
        broker = self.conn.broker
        store = broker.store
        shapes = broker.shapes
        found: dict[str, Shape] = {}
        stored: dict[str, dict[int, int]] = {}
        for topic in topics:
            shape: Shape | None
            if topic in made:
                shape = made[topic].generations, made[topic].heads
                stored[topic] = made[topic].committed
            else:
                shape = await shapes.get(topic)
            if shape is not None:  # else deleted since: nothing to follow there
                found[topic] = shape
        missing: list[str] = []
        unread = [t for t in found if t not in made]
        if known:
            # Read with the record, or kept since the session's save here
            # (`follow`'s `cursors`): None is a topic whose cursors are
            # missing. Cursors on streams the topic does not have are of a
            # topic deleted and made again since (stream keys are never used
            # twice): read, and made if missing.
            known = {
                t: c
                for t, c in known.items()
                if c is None or t not in found or c.keys() <= {h.key for h in found[t][1]}
            }
            missing = [t for t in ensure if t in known and known[t] is None]
            stored.update({t: known[t] or {} for t in unread if t in known})
            unread = [t for t in unread if t not in known]
            ensure = tuple(t for t in ensure if t not in known)
        if unread or ensure:
            absent, read = await broker.read(store.cursors_of, session_id, unread, ensure)
            missing += absent
            stored.update(read)
        if missing:
            await asyncio.to_thread(store.ensure_cursors, session_id, missing, None)
            _, ensured = await broker.read(store.cursors_of, session_id, missing, ())
            stored.update(ensured)
        out: dict[int, int] = {}
        unstored: list[int] = []
        waiting = False
        for topic, (generations, topic_heads) in found.items():
            rows = stored.get(topic, {})
            positions = start_positions(rows, topic_heads)
            cursors = {k: in_memory.get(k, v) for k, v in positions.items()}
            readable, _ = readable_streams(generations, topic_heads, cursors)
            waiting = waiting or len(readable) < len(topic_heads)
            for head in readable:
                out[head.key] = positions[head.key]
                if head.key not in rows:
                    unstored.append(head.key)
        return Readable(out, frozenset(unstored)), waiting

    def streams_changed(self) -> None:
        """The fan-out saw new streams (a topic scaled up, or was created): follow
        those the session may read now."""
        conn = self.conn
        if conn.session is not None and conn.stored is not None and not conn.closing:
            self.check_soon()

    def recheck_lineage(self) -> None:
        """While some stream waits for its lineage, look again in
        LINEAGE_RECHECK seconds: the streams it waits for may be consumed by
        then with no checkpoint to say so (their last messages passed the
        session by)."""
        if self.lineage_wait and self._recheck is None:
            self._recheck = self.conn.loop.call_later(LINEAGE_RECHECK, self._recheck_due)

    def _recheck_due(self) -> None:
        self._recheck = None
        self.check_soon()

    def check_soon(self) -> None:
        """Look for streams to follow soon; a look asked for while one runs
        runs again after it (what changed meanwhile may be past its reads)."""
        conn = self.conn
        if self._task is None or self._task.done():
            self._task = conn.loop.create_task(self._follow_new())
        else:
            self._again = True

    async def _follow_new(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            conn = self.conn
            session = conn.session
            if session is None or conn.stored is None or conn.closing:
                return
            try:
                await self._reach_new_topics(session)
                stored = conn.stored
                if stored is None or conn.session is not session or conn.closing:
                    return
                readable = await self.readable(list(stored.record.topics))
            except RiverbedError:
                log.exception("client %s: looking for new streams failed", conn.client_id)
                return
            if conn.session is not session or conn.closing:
                return
            self._follow_new_streams(readable)

    async def _reach_new_topics(self, session: Session) -> None:
        """Topics the session's filters reach now and did not when they were
        subscribed (a topic created, or bound, since): the session gets cursors
        there from the start of their streams (all of it was published after the
        topic took those names from `mqtt`, while the filters were in place) and
        the record names them, so the streams are followed. Without this, what
        a new topic's binding took over was never delivered to the sessions
        subscribed before it."""
        conn = self.conn
        if all(is_shared(s.topic_filter) for s in session.subscriptions):
            return  # no filter of its own (a publisher): no read of the bindings
        bindings = self.bindings()
        async with conn.record_lock:
            stored = conn.stored
            if stored is None or conn.session is not session or conn.closing:
                return
            # Only the filters both stored and in effect: a SUBSCRIBE taken and not
            # yet stored makes its own cursors, at the positions it took (from the
            # start here, it got what was published before it); one an UNSUBSCRIBE
            # took away is its to drop.
            kept = {s.topic_filter for s in stored.record.subscriptions}
            private = tuple(
                s
                for s in session.subscriptions
                if s.topic_filter in kept and not is_shared(s.topic_filter)
            )
            reached = self.reachable_topics(private, bindings)
            new = [t for t in reached if t not in stored.record.topics]
            if not new:
                return
            record = replace(conn.record(), topics=(*stored.record.topics, *new))
            written = await outcome_of(
                conn.broker.writer.write(record, stored.version, NewCursors(tuple(new), 0))
            )
            conn.stored = written.without_made()
        # At debug level: a topic bound under a common filter is news for every
        # session subscribed to it, one line each.
        log.debug("client %s: its subscriptions now reach topics %s", conn.client_id, new)

    def _follow_new_streams(self, readable: Readable) -> None:
        """Have the session follow those of `readable`'s streams it does not
        follow yet, all in one turn of the session."""
        conn = self.conn
        session = conn.session
        if session is None or conn.closing:
            return
        known = session.streams
        if any(key not in known for key in readable.cursors):
            conn.handle(readable.follow({}, known))

    # --- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------
    def take(self, packet: Subscribe) -> None:
        """The part of a SUBSCRIBE that happens when it is read, before any
        await: checks, and the session's new subscriptions take effect (in the
        session and the trie: messages of streams it follows match them from
        now on) with the start positions for the streams it does not follow yet
        (`Fanout.start_positions`). So whatever is committed after the SUBSCRIBE
        was read is delivered, even if its publisher did not wait for the
        SUBACK. `subscribe` does the rest; nothing else of this connection runs
        in between."""
        conn = self.conn
        session = conn.require_session()
        broker = conn.broker
        v5 = conn.level == MQTT_5
        identifier = packet.properties.subscription_identifier
        codes: list[SubackReason] = []
        added: list[Subscription] = []
        shared: list[Subscription] = []
        for topic in packet.topics:
            name = topic.topic_filter
            group: GroupId | None = None
            if is_shared(name):
                if broker.shared is None:
                    codes.append(
                        SubackReason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                        if v5
                        else SubackReason.UNSPECIFIED_ERROR
                    )
                    continue
                try:
                    group = GroupId.parse(name)
                except InvalidTopicFilter as exc:
                    log.info("client %s: %s", conn.client_id, exc)
                    codes.append(
                        SubackReason.TOPIC_FILTER_INVALID if v5 else SubackReason.UNSPECIFIED_ERROR
                    )
                    continue
                if topic.no_local:
                    raise ProtocolError(
                        DisconnectReason.PROTOCOL_ERROR,
                        f"No Local on the shared subscription {name!r} [MQTT-3.8.3-4]",
                    )
            inner = name if group is None else group.topic_filter
            if not broker.authorizer.can_subscribe(conn.username, conn.client_id, inner):
                codes.append(SubackReason.NOT_AUTHORIZED if v5 else SubackReason.UNSPECIFIED_ERROR)
                continue
            granted = min(topic.qos, 2)
            sub = Subscription(
                name,
                granted,
                topic.no_local,
                topic.retain_as_published,
                int(topic.retain_handling),
                identifier,
            )
            (added if group is None else shared).append(sub)
            codes.append(SubackReason(granted))
        wants_retained: list[Subscription] = []
        positions: dict[int, int] = {}
        current = True
        at_us = 0
        hold: _HeldStart | None = None
        if added:
            # The server may send matching PUBLISHes before the SUBACK (MQTT 5.0
            # §3.8.4); what must wait for it is only that they survive a crash.
            for sub in added:
                existed = session.subscribe(sub)
                broker.trie.add(sub.topic_filter, conn)
                # Retain Handling 0: always; 1: only for a new subscription; 2: never.
                if sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed):
                    wants_retained.append(sub)
            # Only the topics the session reaches for the first time need start
            # positions: on those it follows already, its cursors are where
            # what comes next is read from.
            positions, current = broker.fanout.start_positions(self._new_topics(added))
            # Streams the fan-out has not seen, or all of them when its view may be
            # old: from the first message stamped from now on (this node's ids
            # only grow, so every message it commits after this is).
            at_us = broker.log.appender.ids.next_raw()[1]
            if not current:
                positions = {}
            # What is committed from now on must be there for the new cursors
            # (retention must not delete it before they exist). Where the view
            # may be old, it is older: it holds more.
            holds = broker.holds
            hold = _HeldStart(holds, holds.hold(positions or broker.fanout.heads()))
        assert self._taken is None, "a SUBSCRIBE taken and not finished"
        self._taken = _Taken(
            packet, tuple(codes), added, shared, wants_retained, positions, at_us, hold
        )

    def _new_topics(self, added: list[Subscription]) -> list[str]:
        """The topics `added`'s filters reach that the session has no cursors on."""
        stored = self.conn.stored
        known = () if stored is None else stored.record.topics
        reached = reachable_topics([s.topic_filter for s in added], self.bindings())
        return [t for t in reached if t not in known]

    async def subscribe(self, packet: Subscribe) -> None:
        """The rest of a SUBSCRIBE `take` took: the subscriptions and the cursors
        of the topics they newly reach are durable before the SUBACK (a broker
        restarted after it resumes the session from there); then the streams
        of those topics are followed, and the retained messages sent."""
        taken = self._taken
        assert taken is not None and taken.packet is packet
        try:
            await self._subscribe(taken)
        finally:
            self._taken = None
            if taken.hold is not None:
                taken.hold.release()

    async def _subscribe(self, taken: _Taken) -> None:
        packet = taken.packet
        conn = self.conn
        broker = conn.broker
        follow = NOTHING_TO_READ
        made: tuple[list[str], Mapping[str, MadeCursors]] | None = None
        if taken.shared:
            # A group member: the group's Leader lends it streams. No retained
            # messages for a shared subscription (MQTT 5.0 §4.8.2). The group
            # exists before the SUBACK (its Leader, which would create it,
            # starts later): what is published after the SUBACK is the group's.
            groups = GroupStore(broker.log.storage)
            at = now_us()
            for sub in taken.shared:
                await asyncio.to_thread(groups.ensure, GroupId.parse(sub.topic_filter), at)
            sharing = conn.share()
            for sub in taken.shared:
                sharing.subscribe(sub)
        if taken.added or taken.shared:
            async with conn.record_lock:
                session = conn.session
                if conn.stored is None or session is None:
                    return  # closing: the session is being saved or discarded
                record = replace(conn.record(), subscriptions=conn.subscriptions())
                filters = [s.topic_filter for s in session.subscriptions]
                conn.stored, made = await self._store_subscriptions(
                    record, conn.stored.version, filters, taken
                )
        conn.send_now(Suback(packet.packet_id, taken.codes))
        if made is not None:
            # The new topics' streams, followed from the cursors just made (the
            # client need not wait for this: what is published meanwhile waits
            # at the positions the SUBSCRIBE holds).
            new, cursors = made
            follow, waiting = await self._streams_of(record.session_id, new, {}, made=cursors)
            self.lineage_wait = self.lineage_wait or waiting
            self.recheck_lineage()
        self._follow_new_streams(follow)
        wanted = taken.wants_retained
        if wanted and broker.config.limits.retain_available:
            if broker.log.storage.appends_inline:
                # On an embedded database, whether there is any is looked up
                # here, on the loop (an indexed row or two: most SUBSCRIBEs find
                # none, and need neither a task nor a hand-over to a thread).
                wanted = self._with_retained(wanted)
            if wanted:
                self._queue_retained(wanted)

    def _with_retained(self, subscriptions: list[Subscription]) -> list[Subscription]:
        """Those of `subscriptions` whose filters may match a retained message
        (`RetainedStore.any_under`)."""
        conn = self.conn
        retained = conn.broker.retained
        try:
            return [sub for sub in subscriptions if retained.any_under(sub.topic_filter)]
        except RiverbedError:
            log.exception("client %s: reading retained messages failed", conn.client_id)
            return []

    def _queue_retained(self, subscriptions: list[Subscription]) -> None:
        """Have the retained messages of `subscriptions` sent after what is
        queued (by the task that sends them, not this connection's worker: the
        packets after the SUBSCRIBE need not wait for them). One still queued
        for the same filter is superseded: a client that SUBSCRIBEs to `#`
        again and again has them sent once more, not once per SUBSCRIBE."""
        queue = self._retain_queue
        if queue is None:
            queue = self._retain_queue = deque()
        for sub in subscriptions:
            for queued in queue:
                if queued.topic_filter == sub.topic_filter:
                    queue.remove(queued)
                    break
            queue.append(sub)
        if self._retaining is None or self._retaining.done():
            self._retaining = self.conn.loop.create_task(self._send_retained(queue))

    async def _send_retained(self, queue: deque[Subscription]) -> None:
        """After the SUBACK: the retained messages new subscriptions asked for
        (Retain Handling), through the session's window, unless the
        subscription has gone (UNSUBSCRIBE) or changed (a SUBSCRIBE replaced it)
        since. They are read a page at a time in a worker thread, and the next
        page only once the session has sent most of the last one: a `#` over
        many retained messages holds at most `queue_limit` of them in memory."""
        conn = self.conn
        retained = conn.broker.retained
        while queue:
            sub = queue.popleft()
            after: str | None = None
            while self._still_wants(sub):
                session = conn.require_session()
                size = max(1, session.queue_limit // 2)
                try:
                    found, after = await asyncio.to_thread(
                        retained.page, sub.topic_filter, after, size
                    )
                except RiverbedError:
                    log.exception("client %s: reading retained messages failed", conn.client_id)
                    break
                if not self._still_wants(sub):
                    break
                if found:
                    conn.execute(session.retained(sub, found, conn.loop.time()))
                if after is None:
                    break
                await conn.retained_room(size // 2)

    def _still_wants(self, sub: Subscription) -> bool:
        """Whether the session is open and `sub` still one of its subscriptions."""
        conn = self.conn
        session = conn.session
        return session is not None and not conn.closing and sub in session.subscriptions

    async def _store_subscriptions(
        self, record: SessionRecord, version: int | None, filters: list[str], taken: _Taken
    ) -> tuple[Stored, tuple[list[str], Mapping[str, MadeCursors]] | None]:
        """Cursors on the topics `filters` newly reach, at the positions `taken`
        holds, and the record with those topics and its subscriptions
        (compare-and-set on `version`; None: create it): one write of the session writer, in a
        transaction it shares with other connections' writes. Returns what was
        written, and the new topics with the cursors the write made (None: no
        new topic)."""
        broker = self.conn.broker
        new: list[str] = []
        if taken.added:
            known = set(record.topics)
            new = [t for t in reachable_topics(filters, self.bindings()) if t not in known]
            if new:
                record = replace(record, topics=(*record.topics, *new))
        cursors = NewCursors(tuple(new), taken.at_us, taken.positions) if new else None
        written = broker.writer.write(record, version, cursors)
        if taken.hold is not None:
            taken.hold.until_written(written)
        stored = await outcome_of(written)
        made = (new, stored.made or {}) if new else None
        return stored.without_made(), made

    async def unsubscribe(self, packet: Unsubscribe) -> None:
        conn = self.conn
        session = conn.require_session()
        codes: list[UnsubackReason] = []
        for name in packet.topic_filters:
            if is_shared(name):
                sharing = conn.sharing
                if sharing is not None and sharing.unsubscribe(name):
                    codes.append(UnsubackReason.SUCCESS)
                else:
                    codes.append(UnsubackReason.NO_SUBSCRIPTION_EXISTED)
                continue
            if session.unsubscribe(name):
                conn.broker.trie.remove(name, conn)
                codes.append(UnsubackReason.SUCCESS)
            else:
                codes.append(UnsubackReason.NO_SUBSCRIPTION_EXISTED)
        await self.save_subscriptions()
        await self._drop_unreached_topics()
        conn.send_now(Unsuback(packet.packet_id, tuple(codes) if conn.level == MQTT_5 else ()))

    async def _drop_unreached_topics(self) -> None:
        """Topics no subscription of the session reaches any more lose its cursor,
        so they no longer hold their messages back from retention."""
        conn = self.conn
        session = conn.session
        if session is None or conn.stored is None:
            return
        reached = set(self.reachable_topics(session.subscriptions, self.bindings()))
        gone = [t for t in conn.stored.record.topics if t not in reached]
        if not gone:
            return
        fanout = conn.broker.fanout
        unfollowed = [key for key, topic in fanout.topic_of().items() if topic in gone]
        session.unfollow(unfollowed)
        for key in unfollowed:
            fanout.cancel(key, conn)  # its fetch waits for nothing now
        async with conn.record_lock:
            if conn.stored is None:
                return
            kept = tuple(t for t in conn.stored.record.topics if t not in gone)
            record = replace(conn.record(), topics=kept)
            conn.stored = await outcome_of(conn.broker.writer.write(record, conn.stored.version))
        await asyncio.to_thread(conn.broker.store.drop_cursors, conn.stored.record.session_id, gone)

    async def save_subscriptions(self) -> None:
        conn = self.conn
        assert conn.session is not None
        async with conn.record_lock:
            if conn.stored is None:
                return
            record = replace(conn.record(), subscriptions=conn.subscriptions())
            conn.stored = await outcome_of(conn.broker.writer.write(record, conn.stored.version))
