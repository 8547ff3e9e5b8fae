"""One online session's delivery, as a sans-I/O state machine.

A session follows streams of the log (docs/broker.md, "Where a session's
messages come from"). For each stream it keeps

- `fetched`: the next offset it has not taken in yet;
- `pending`: messages taken in that match a subscription and wait for room in
  the in-flight window;
- `outstanding`: offsets sent with QoS 1 and not yet acknowledged;
- `committed`: the cursor last handed out in a `Checkpoint`, or the stored one
  it started from (`UNSTORED` if none is stored): a checkpoint, at disconnect
  too, carries only the cursors that differ from it.

The cursor of a stream is the first offset not yet done: the first outstanding
offset, else the first pending one, else `fetched`. Only that contiguous
acknowledged prefix is ever committed (DESIGN.md, data flow), so a crash
redelivers the window since the last checkpoint and loses nothing.

The session never reads anything itself. It asks for messages with a `Fetch`
effect (stream, offset, how many it has room for) and the runtime answers with
an `Offered` event, from the broker's fanout when the session is live or from
storage when it is replaying: the session does not need to know which. One
fetch per stream is outstanding at a time, so a stream's messages arrive in
offset order and per-key order holds. Memory is bounded: a stream asks for at
most its share of `queue_limit`.

Dormant streams: a stream followed from a stored cursor with nothing to send
again (no DUP range past the cursor, no QoS 2 window) is only a cursor until
its first answer comes: no per-stream state, and the fetches of all the
streams followed in one turn go out as one `FetchMany`. A resumed session
follows every partition its filters reach (16 for `mqtt`), and most of them
have nothing for it for a long while: a fleet resuming at once, or idle
subscribers, pay a dict entry per stream, not a stream's state and a fetch
effect. Everything that reads cursors (`cursors`, `passed`, checkpoints,
`unfollow`) counts them; `sent` leaves them out (nothing was sent on them).

Read access: `readable(topic_name)`, when given, says whether the client may
receive a message of that topic (the ACL's read rule, `mqtt.acl.TopicCheck`).
A message it may not read is passed over like one that matches no subscription,
on every path: the session's own streams (live or replayed), a grant's, and
retained messages. So a withheld QoS 1/2 message takes no place in the window
and does not hold the cursor back.

Overlapping subscriptions: one copy per message, with the highest QoS granted
by any matching subscription and the identifiers of all of them
([MQTT-3.3.4-2], [MQTT-3.3.4-3]); the message's own QoS caps it. No Local
subscriptions [MQTT-3.8.3-3] do not match messages their own client published.

DUP: a message goes out with DUP=1 when its offset is below the stream's
`dup_below`, the offset up to which an earlier connection of this session may
have sent it (docs/broker.md, "DUP after a restart"). Within one connection a
message is sent once.

QoS 2 out (`sessions/qos2.py`): a new PUBLISH and a PUBREL are held back until
the window that names them is persisted (`Persist` answered by `Persisted`); a
window restored from the record resends its PUBRELs at once, sends its PUBLISHes
again with the same packet ids and DUP=1, and skips messages it completed. A
QoS 2 message holds the cursor until its PUBCOMP, like a QoS 1 one until PUBACK.
Messages after a held PUBLISH wait behind it, whatever their QoS: the client gets
them in log order (MQTT orders only within a QoS level; per-key order does not).

Grants (shared subscriptions, `sharedsub/`): a stream lent to one of the
session's Borrowers is a stream of its own in the session, under a key below
RETAINED (`grant_key`), matched against that one subscription only, sharing the
in-flight window with everything else. It is never checkpointed here: the
session reports what it took in, sent and had acknowledged (`GrantMoved`) and
the group's Leader keeps the progress. `stop_grant` stops fetching and drops
what was not sent (the stream is revoked; acknowledgements still come),
`forget_grant` drops it.

Events: `Follow` (`FollowAll`: many at once), `Offered`, `Acked`, `Received`,
`Completed`, `Persisted`, `Tick`. Effects: `Deliver`, `Release`, `Fetch`,
`FetchMany`, `Checkpoint`, `Persist`, `GrantMoved`.
Subscriptions change through `subscribe` / `unsubscribe`, which answer directly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, assert_never

from riverbed.clock import Tick
from riverbed.model import StoredMessage
from riverbed.records import quick_init
from riverbed.sessions.qos2 import Phase, WindowEntry
from riverbed.topics.filters import matches

MAX_PACKET_ID = 0xFFFF
REFILL_DELAY = 0.005
"""Seconds a freed slot of a full window waits at most for `refill` slots."""
RETAINED = -1
"""The pseudo stream of retained messages sent for a new subscription: in the
window like any other, never fetched, never checkpointed, not replayed."""
UNSTORED = -1
"""`_Stream.committed` of a stream whose cursor is not stored (or whose last
checkpoint was not written): no offset, so the next checkpoint writes it."""
_NO_IDS: set[int] = set()
"""The `_reserved` packet ids of every session that restored none (never added
to): an idle session holds no containers it does not use."""


class _NoEntries(dict[Any, Any]):
    """The empty mapping every session shares for what it has none of yet
    (subscriptions, streams, packet ids in flight, a QoS 2 window, grants): a
    session makes a dict of its own before its first entry. Writing into the
    shared one would be a bug, so it raises."""

    __slots__ = ()

    def __setitem__(self, key: object, value: object) -> NoReturn:
        raise TypeError("the shared empty mapping of sessions is never written to")


_NONE = _NoEntries()

MATCHED_MAX = 1024
"""Topic names a session remembers its grant for (`Session._match`); past
that it starts again (a subscriber of `#` on a broker with many topics)."""
_NO_MATCH = -1
_EACH = -2


class _NoQueue(deque[Any]):
    """The empty queue every stream shares until it has messages waiting (an
    empty deque costs 760 bytes, and a subscriber follows a stream per
    partition); like `_NoEntries`, adding to it raises."""

    __slots__ = ()

    def append(self, item: object) -> NoReturn:
        raise TypeError("the shared empty queue of streams is never added to")

    appendleft = extend = extendleft = append


_NO_QUEUE: deque[Any] = _NoQueue()


class _NoOffsets(list[int]):
    """The lists `sent_new` / `acked_new` of a stream that is not a grant."""

    __slots__ = ()

    def append(self, item: int) -> NoReturn:
        raise TypeError("only a grant's stream reports what it sent")


_NO_OFFSETS: list[int] = _NoOffsets()


@dataclass(frozen=True, slots=True)
class Subscription:
    """One subscription of a session, with the QoS the broker granted."""

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None


# --------------------------------------------------------------------- events


@quick_init
@dataclass(frozen=True, slots=True)
class Follow:
    """Start following a stream from `cursor`; offsets below `dup_below` may
    have been sent to the client before. `stored` False: no cursor of the
    session is stored for the stream (it appeared since, or was never
    checkpointed): the next checkpoint writes it, moved or not, so that
    retention keeps the stream's messages for the session."""

    stream: int
    cursor: int
    dup_below: int = 0
    stored: bool = True


@dataclass(frozen=True, slots=True)
class FollowAll:
    """A `Follow` of each of these streams (stream -> cursor), as one event: a
    stream's `dup_below` is in `dup_below` (0 if not), `unstored` are those
    with no cursor stored."""

    cursors: Mapping[int, int]
    dup_below: Mapping[int, int] = field(default_factory=dict)
    unstored: AbstractSet[int] = frozenset()


@quick_init
@dataclass(frozen=True, slots=True)
class Offered:
    """The answer to a `Fetch`: the stream has been looked at up to `upto`
    (exclusive), and `messages` are the ones in that range that may match
    (others may be left out). `upto` equal to the fetch's offset means nothing new."""

    stream: int
    messages: Sequence[StoredMessage]
    upto: int


@dataclass(frozen=True, slots=True)
class Acked:
    """The client acknowledged a QoS 1 message (PUBACK)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class Received:
    """The client answered a QoS 2 PUBLISH with PUBREC (`accepted`: a reason
    code below 0x80; otherwise the exchange ends here [MQTT-4.3.3])."""

    packet_id: int
    accepted: bool = True


@dataclass(frozen=True, slots=True)
class Completed:
    """The client answered a PUBREL with PUBCOMP."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class Persisted:
    """The `Persist` with this number is durable (the session record written)."""

    seq: int


Event = Follow | FollowAll | Offered | Acked | Received | Completed | Persisted | Tick


# --------------------------------------------------------------------- effects


@quick_init
@dataclass(frozen=True, slots=True)
class Deliver:
    """Send this message to the client (a PUBLISH)."""

    stream: int
    message: StoredMessage
    qos: int
    packet_id: int | None
    dup: bool
    retain: bool
    subscription_identifiers: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Fetch:
    """Offer this stream's messages from `offset` on, at most `limit` of them."""

    stream: int
    offset: int
    limit: int


@dataclass(frozen=True, slots=True)
class FetchMany:
    """A `Fetch` of each of these streams from its offset (stream -> offset),
    at most `limit` messages each: the dormant streams followed in one turn."""

    positions: Mapping[int, int]
    limit: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Persist these cursors (only those changed since the last checkpoint) and
    `sent`, per stream the offset below which messages may have been sent."""

    cursors: dict[int, int]
    sent: dict[int, int]


@dataclass(frozen=True, slots=True)
class Release:
    """Send PUBREL for this packet id."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class Persist:
    """Write the session record with `Session.window_entries()` now, then answer
    `Persisted(seq)`: held PUBLISHes and PUBRELs wait for it."""

    seq: int


@dataclass(frozen=True, slots=True)
class GrantMoved:
    """A grant's stream moved: taken in up to `taken` (exclusive: the first
    offset not sent yet), `sent` offsets now expect an acknowledgement, `acked`
    ones got it (`sharedsub.handler.SharedSubscriptionHandler.report`)."""

    stream: int
    taken: int
    sent: tuple[int, ...]
    acked: tuple[int, ...]


Effect = Deliver | Release | Fetch | FetchMany | Checkpoint | Persist | GrantMoved


# --------------------------------------------------------------------- state


@dataclass(slots=True)
class _Queued:
    offset: int
    message: StoredMessage
    qos: int
    retain: bool
    identifiers: tuple[int, ...]


@dataclass(slots=True)
class _Stream:
    key: int
    fetched: int
    committed: int
    dup_below: int
    sent: int
    # The containers are the shared empty ones (`_NO_QUEUE`, `_NONE`) until
    # used, and again once emptied: a caught-up stream holds none of its own.
    pending: deque[_Queued] = field(default_factory=lambda: _NO_QUEUE)
    outstanding: dict[int, None] = field(default_factory=lambda: _NONE)
    released: dict[int, None] = field(default_factory=lambda: _NONE)
    """Offsets of restored QoS 2 messages waiting for PUBCOMP (not re-sent)."""
    fetching: bool = False
    dropped: bool = False
    """No longer followed (its topic is no longer reached, or a grant was
    revoked): what was sent is completed, nothing more is fetched, queued or
    checkpointed."""
    grant: Subscription | None = None
    """A grant's stream: the one subscription its messages are matched against."""
    reported: int = -1
    """A grant: the `taken` of its last `GrantMoved`."""
    sent_new: list[int] = field(default_factory=lambda: _NO_OFFSETS)
    """A grant: offsets sent since its last `GrantMoved` (a list of its own)."""
    acked_new: list[int] = field(default_factory=lambda: _NO_OFFSETS)
    """A grant: offsets acknowledged since its last `GrantMoved`."""

    def cursor(self) -> int:
        if self.outstanding:
            cursor = next(iter(self.outstanding))
        elif self.pending:
            cursor = self.pending[0].offset
        else:
            cursor = self.fetched
        if self.released:
            cursor = min(cursor, min(self.released))
        return cursor


class Session:
    """The delivery state of one online session (sans-I/O; `now` in seconds).

    `window`: how many QoS 1 messages may be unacknowledged (the client's
    Receive Maximum, capped by the broker). `queue_limit`: messages held in
    memory waiting for the window, over all streams. A window that filled up is
    refilled once `refill` slots are free (default: an eighth of it), or
    REFILL_DELAY after the first: the client then gets many PUBLISHes per write
    and answers with many PUBACKs per read, where one slot at a time would cost
    a write, a read and two wake-ups per message. Cursors are checkpointed
    every `checkpoint_every` acknowledgements or `checkpoint_interval` seconds
    after they changed, whichever comes first. `publisher(message)` names the
    client that published a message, for No Local. `readable(topic_name)`:
    whether the client may receive a message of that topic (None: every topic).
    """

    __slots__ = (
        "_acks",
        "_check",
        "_check_all",
        "_dirty",
        "_dormant",
        "_dormant_unsaved",
        "_grants",
        "_held",
        "_inflight",
        "_last_checkpoint",
        "_matched",
        "_moved",
        "_next_grant_key",
        "_next_packet_id",
        "_persist_seq",
        "_persisting",
        "_publisher",
        "_readable",
        "_ready",
        "_refill_at",
        "_resend",
        "_reserved",
        "_streams",
        "_subscriptions",
        "_to_fetch",
        "_window",
        "checkpoint_every",
        "checkpoint_interval",
        "client_id",
        "queue_limit",
        "refill",
        "window",
    )

    def __init__(
        self,
        client_id: str,
        subscriptions: Sequence[Subscription] = (),
        *,
        window: int = 100,
        queue_limit: int = 1000,
        checkpoint_every: int = 100,
        checkpoint_interval: float = 1.0,
        publisher: Callable[[StoredMessage], str | None] | None = None,
        qos2_window: Sequence[WindowEntry] = (),
        now: float = 0.0,
        refill: int | None = None,
        readable: Callable[[str], bool] | None = None,
    ) -> None:
        if window < 1 or queue_limit < 1 or checkpoint_every < 1 or checkpoint_interval <= 0:
            raise ValueError("window, queue_limit, checkpoint_every and the interval must be > 0")
        if refill is not None and not 1 <= refill <= window:
            raise ValueError(f"refill = {refill}: must be from 1 to the window ({window})")
        self.client_id = client_id
        self.window = window
        self.refill = max(1, window // 8) if refill is None else refill
        self._refill_at: float | None = None
        """When a held refill goes out anyway (see `refill`)."""
        self.queue_limit = queue_limit
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self._publisher = publisher
        self._readable = readable
        # Dicts of their own once they have entries (`_NONE` until then).
        self._subscriptions: dict[str, Subscription] = {
            s.topic_filter: s for s in subscriptions
        } or _NONE
        self._matched: dict[str, tuple[int, bool, tuple[int, ...]]] = _NONE
        """Topic name -> what the subscriptions grant a message of that topic
        (`_grant`), remembered until they change."""
        self._streams: dict[int, _Stream] = _NONE
        self._dormant: dict[int, int] = _NONE
        """Dormant streams (see the module's docstring): stream -> cursor, its
        fetch from there out or in `_to_fetch`. Not in `_streams`."""
        self._dormant_unsaved: set[int] = _NO_IDS
        """Dormant streams whose cursor is not committed (`UNSTORED`, moved)."""
        self._to_fetch: dict[int, int] | None = None
        """Dormant streams followed in this turn: their `FetchMany`."""
        self._ready: deque[int] | None = None
        """Streams with pending messages, in turn order (made on the first)."""
        self._inflight: dict[int, tuple[int, int]] = _NONE
        """packet id -> (stream, offset) of QoS 1 messages sent, not acknowledged."""
        self._next_packet_id = 1
        self._acks = 0
        self._last_checkpoint = now
        self._moved = False
        """A cursor may have moved since the last checkpoint."""
        self._check: set[int] | None = None
        """Streams that may have become ready to fetch since the last look (made
        on the first)."""
        self._check_all = True
        """The set of streams changed: look at them all."""
        # QoS 2 out (sessions/qos2.py).
        self._window: dict[tuple[int, int], WindowEntry] = _NONE
        self._reserved: set[int] = _NO_IDS
        """Packet ids of restored SENT entries not yet sent again."""
        self._held: list[tuple[int, Deliver | Release]] | None = None
        """Effects waiting for the `Persist` with that number (a list only while
        there are)."""
        self._persist_seq = 0
        self._persisting = False
        self._dirty = False
        self._resend: tuple[Release, ...] = ()
        self._grants: dict[int, _Stream] = _NONE
        """The grants' streams (also in `_streams`)."""
        self._next_grant_key = min((e.stream for e in qos2_window), default=0)
        self._next_grant_key = min(self._next_grant_key, RETAINED) - 1
        restored: dict[tuple[int, int], WindowEntry] = {}
        inflight: dict[int, tuple[int, int]] = {}
        reserved: set[int] = set()
        resend: list[Release] = []
        for entry in qos2_window:
            if entry.stream <= RETAINED and entry.phase is not Phase.RELEASED:
                # Neither a retained message nor a grant's (its stream is the
                # group's now) is sent again after a restart.
                continue
            restored[(entry.stream, entry.offset)] = entry
            if entry.phase is Phase.SENT:
                reserved.add(entry.packet_id)
            elif entry.phase is Phase.RELEASED:
                # [MQTT-4.4.0-1]: PUBRELs go again on the new connection.
                inflight[entry.packet_id] = (entry.stream, entry.offset)
                resend.append(Release(entry.packet_id))
        if restored:
            self._window = restored
        if inflight:
            self._inflight = inflight
        if reserved:
            self._reserved = reserved
        self._resend = tuple(resend)

    # --- subscriptions ---------------------------------------------------------
    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(self._subscriptions.values())

    def subscribe(self, subscription: Subscription) -> bool:
        """Add or replace the subscription with this filter; True if it existed
        (MQTT 5.0 §3.8.4: a SUBSCRIBE with an existing filter replaces it)."""
        existed = subscription.topic_filter in self._subscriptions
        if self._subscriptions is _NONE:
            self._subscriptions = {}
        self._subscriptions[subscription.topic_filter] = subscription
        self._matched = _NONE
        return existed

    def unsubscribe(self, topic_filter: str) -> bool:
        """Drop the subscription with this filter; False if there was none.
        Messages already taken in are still delivered [MQTT-3.10.4-3]."""
        self._matched = _NONE
        return self._subscriptions.pop(topic_filter, None) is not None

    def unfollow(self, streams: Iterable[int]) -> None:
        """Stop following these streams (no subscription reaches their topic any
        more): messages queued for them are dropped, those sent are still
        completed [MQTT-3.10.4-3], and their cursors leave the checkpoints."""
        for key in streams:
            state = self._streams.get(key)
            if state is None and key in self._dormant:
                # Its fetch may still be out: an answer finds no stream (ignored).
                del self._dormant[key]
                self._dormant_unsaved.discard(key)
                if self._to_fetch:
                    self._to_fetch.pop(key, None)
                self._check_all = True
                continue
            if state is None or key == RETAINED:
                continue
            state.dropped = True
            state.pending.clear()
            self._not_ready(key)
            if not state.outstanding and not state.released:
                del self._streams[key]
                self._check_all = True

    def passed(self, positions: Mapping[int, int]) -> None:
        """The router's messages of these streams up to these offsets passed the
        session by (none matched its subscriptions), and its fetches of them
        wait on from there (`Fanout.passed`): what was taken in moves there,
        and with it the cursor of a stream with nothing in flight or queued.
        A caught-up session's idle subscription so does not pin retention.
        The next checkpoint (due or at disconnect) carries them."""
        dormant = self._dormant
        for key, upto in positions.items():
            state = self._streams.get(key)
            if state is not None:
                if state.fetching and upto > state.fetched:
                    state.fetched = upto
                    self._moved = True
            elif upto > dormant.get(key, upto):
                dormant[key] = upto
                self._unsave(key)
                self._moved = True

    # --- grants -------------------------------------------------------------------
    def grant_key(self) -> int:
        """A key for a new grant's stream: below RETAINED, never used before in
        this session (nor by a restored QoS 2 window entry)."""
        key = self._next_grant_key
        self._next_grant_key -= 1
        return key

    def grant(self, key: int, offset: int, subscription: Subscription, now: float) -> list[Effect]:
        """Start fetching a grant's stream (key from `grant_key`) from `offset`,
        matching `subscription` only."""
        state = _Stream(
            key,
            offset,
            offset,
            0,
            offset,
            grant=subscription,
            reported=offset,
            sent_new=[],
            acked_new=[],
        )
        if self._streams is _NONE:
            self._streams = {}
        if self._grants is _NONE:
            self._grants = {}
        self._streams[key] = state
        self._grants[key] = state
        self._check_all = True
        return self.handle(Tick(), now)

    def stop_grant(self, key: int, now: float) -> list[Effect]:
        """Fetch and send no more of the grant (revoked); what was taken in and
        not sent is dropped, so `taken` goes back to the first of it. What was
        sent is still reported as it is acknowledged."""
        state = self._grants.get(key)
        if state is None or state.dropped:
            return []
        state.dropped = True
        if state.pending:
            state.fetched = state.pending[0].offset
            state.pending.clear()
        self._not_ready(key)
        return self.handle(Tick(), now)

    def forget_grant(self, key: int) -> None:
        """Drop the grant's stream. Messages of it still in flight keep their
        packet ids until the client answers; nothing more is reported."""
        state = self._grants.pop(key, None)
        if state is None:
            return
        del self._streams[key]
        self._not_ready(key)
        self._check_all = True

    @property
    def grants(self) -> frozenset[int]:
        return frozenset(self._grants)

    # --- inspection --------------------------------------------------------------
    @property
    def streams(self) -> frozenset[int]:
        """The streams followed (grants and dormant ones included)."""
        if self._dormant:
            return frozenset((*self._streams, *self._dormant))
        return frozenset(self._streams)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def queued(self) -> int:
        return sum(len(s.pending) for s in self._streams.values())

    @property
    def retained_queued(self) -> int:
        """Retained messages waiting for the window (`retained`)."""
        state = self._streams.get(RETAINED)
        return 0 if state is None else len(state.pending)

    def cursors(self) -> dict[int, int]:
        """Every followed stream's cursor: the first offset not yet done (not
        grants': their progress is the group's)."""
        cursors = {
            key: s.cursor() for key, s in self._streams.items() if not s.dropped and s.grant is None
        }
        if self._dormant:
            cursors.update(self._dormant)
        return cursors

    def sent(self) -> dict[int, int]:
        """Per stream, the offset below which messages may have been sent (not
        dormant streams': nothing was, and their stored cursors are past any
        earlier connection's `dup_below`)."""
        return {key: max(s.sent, s.dup_below) for key, s in self._streams.items() if key >= 0}

    def window_entries(self) -> tuple[WindowEntry, ...]:
        """The outgoing QoS 2 window, for the session record."""
        return tuple(self._window.values())

    def forget_completed(self, cursors: Mapping[int, int]) -> None:
        """Cursors up to `cursors` are committed: drop the window's entries below
        them (no replay can reach them any more; retained messages: never)."""
        if not self._window:
            return
        below = [
            k
            for k, e in self._window.items()
            if e.offset < cursors.get(e.stream, -1) or e.stream <= RETAINED
        ]
        for key in below:
            entry = self._window[key]
            if self._inflight.get(entry.packet_id) != key:
                del self._window[key]
                self._reserved.discard(entry.packet_id)

    def next_deadline(self) -> float | None:
        """When a `Tick` would checkpoint changed cursors or refill the window
        anyway; None if neither waits."""
        deadline = self._last_checkpoint + self.checkpoint_interval if self._moved else None
        refill_at = self._refill_at
        if refill_at is not None and (deadline is None or refill_at < deadline):
            return refill_at
        return deadline

    # --- events ------------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Effect]:
        return self.handle_all((event,), now)

    def handle_all(self, events: Sequence[Event], now: float) -> list[Effect]:
        """Handle several events (e.g. the acknowledgements of one read) as one:
        the effects are those of handling them one by one, gathered."""
        effects: list[Effect] = []
        if self._resend:
            effects.extend(self._resend)
            self._resend = ()
        for event in events:
            self._apply(event, effects)
        self._pump(effects, now)
        self._fetch(effects)
        if self._grants:
            self._report_grants(effects)
        if self._dirty and not self._persisting:
            self._dirty = False
            self._persisting = True
            self._persist_seq += 1
            effects.append(Persist(self._persist_seq))
        if self._acks >= self.checkpoint_every or now >= (
            self._last_checkpoint + self.checkpoint_interval
        ):
            self._checkpoint(effects, now)
        return effects

    def _apply(self, event: Event, effects: list[Effect]) -> None:
        match event:
            case Acked(packet_id):
                found = self._inflight.pop(packet_id, None)
                if found is not None:
                    key, offset = found
                    state = self._streams.get(key)
                    if state is not None:
                        outstanding = state.outstanding
                        outstanding.pop(offset, None)
                        if not outstanding:
                            state.outstanding = _NONE
                        if state.grant is not None:
                            state.acked_new.append(offset)
                        elif state.dropped and not state.outstanding and not state.released:
                            del self._streams[key]
                            self._check_all = True
                    self._acks += 1
                    self._moved = True
            case Offered(stream, messages, upto):
                self._offered(stream, messages, upto)
            case Follow(stream, cursor, dup_below, stored):
                self._follow(stream, cursor, dup_below, stored)
            case FollowAll(cursors, dup_below, unstored):
                follow = self._follow
                dup = dup_below.get
                for stream, cursor in cursors.items():
                    follow(stream, cursor, dup(stream, 0), stream not in unstored)
            case Received(packet_id, accepted):
                self._received(packet_id, accepted)
            case Completed(packet_id):
                self._completed(packet_id)
            case Persisted(seq):
                self._persisting = False
                if self._held:
                    keep: list[tuple[int, Deliver | Release]] = []
                    for needs, effect in self._held:
                        if needs <= seq:
                            effects.append(effect)
                        else:
                            keep.append((needs, effect))
                    self._held = keep or None
            case Tick():
                pass
            case _:
                assert_never(event)

    def retained(
        self, subscription: Subscription, messages: Sequence[StoredMessage], now: float
    ) -> list[Effect]:
        """Send the retained messages a new subscription matched, with the retain
        flag [MQTT-3.3.1-9] and the lower of the two QoS, after what is queued."""
        state = self._streams.get(RETAINED)
        if state is None:
            if self._streams is _NONE:
                self._streams = {}
            state = self._streams[RETAINED] = _Stream(RETAINED, 0, 0, 0, 0, fetching=True)
            self._check_all = True
        was_empty = not state.pending
        identifiers = () if subscription.identifier is None else (subscription.identifier,)
        readable = self._readable
        for message in messages:
            if readable is not None and not readable(message.mqtt_topic):
                continue  # the same read rule as live messages
            if (
                subscription.no_local
                and self._publisher is not None
                and self._publisher(message) == self.client_id
            ):
                continue  # [MQTT-3.8.3-3] retained messages too
            offset = state.fetched
            state.fetched += 1
            qos = min(subscription.qos, message.qos)
            queued = _Queued(offset, message._replace(offset=offset), qos, True, identifiers)
            if state.pending is _NO_QUEUE:
                state.pending = deque()
            state.pending.append(queued)
        if was_empty and state.pending:
            self._make_ready(RETAINED)
        return self.handle(Tick(), now)

    def checkpoint(self, now: float) -> Checkpoint:
        """A checkpoint now, due or not (at disconnect): the cursors that moved
        since the last one (or were never stored), and what was sent."""
        return self._take_checkpoint(now)

    def unsaved(self, cursors: Mapping[int, int]) -> None:
        """The checkpoint of `cursors` was not written: the next one writes
        them again, moved since or not."""
        for key in cursors:
            state = self._streams.get(key)
            if state is not None:
                state.committed = UNSTORED
            elif key in self._dormant:
                self._unsave(key)

    # --- internals -------------------------------------------------------------
    def _follow(self, stream: int, cursor: int, dup_below: int, stored: bool) -> None:
        if stream in self._streams or stream in self._dormant:
            return
        self._check_all = True
        if dup_below <= cursor and not self._window:
            # Nothing to send again from the cursor on: dormant.
            if self._dormant is _NONE:
                self._dormant = {}
            self._dormant[stream] = cursor
            if not stored:
                self._unsave(stream)
            to_fetch = self._to_fetch
            if to_fetch is None:
                to_fetch = self._to_fetch = {}
            to_fetch[stream] = cursor
            return
        if self._streams is _NONE:
            self._streams = {}
        committed = cursor if stored else UNSTORED
        self._streams[stream] = _Stream(stream, cursor, committed, dup_below, cursor)
        if self._window:
            self._restore_released(stream)

    def _unsave(self, key: int) -> None:
        """The dormant stream's cursor is not committed: the next checkpoint
        writes it."""
        if self._dormant_unsaved is _NO_IDS:
            self._dormant_unsaved = set()
        self._dormant_unsaved.add(key)

    def _wake(self, key: int) -> _Stream | None:
        """The first answer to a dormant stream's fetch: it becomes a stream with
        its state, fetching from its cursor (None: not dormant)."""
        cursor = self._dormant.pop(key, None)
        if cursor is None:
            return None
        committed = cursor
        if key in self._dormant_unsaved:
            self._dormant_unsaved.discard(key)
            committed = UNSTORED
        if self._streams is _NONE:
            self._streams = {}
        state = self._streams[key] = _Stream(key, cursor, committed, 0, cursor, fetching=True)
        return state

    def _make_ready(self, key: int) -> None:
        """The stream has pending messages now: its turn comes."""
        ready = self._ready
        if ready is None:
            ready = self._ready = deque()
        ready.append(key)

    def _not_ready(self, key: int) -> None:
        ready = self._ready
        if ready and key in ready:
            ready.remove(key)

    def _look_at(self, key: int) -> None:
        """The stream may have become ready to fetch (`_fetch` looks)."""
        check = self._check
        if check is None:
            check = self._check = set()
        check.add(key)

    def _hold(self, effect: Deliver | Release) -> None:
        """Send `effect` once the window as it is now is persisted."""
        self._dirty = True
        held = self._held
        if held is None:
            held = self._held = []
        held.append((self._persist_seq + 1, effect))

    def _restore_released(self, key: int) -> None:
        state = self._streams[key]
        for entry in self._window.values():
            if entry.stream == key and entry.phase is Phase.RELEASED:
                if state.released is _NONE:
                    state.released = {}
                state.released[entry.offset] = None

    def _completed(self, packet_id: int) -> None:
        found = self._inflight.get(packet_id)
        entry = None if found is None else self._window.get(found)
        if entry is not None and entry.phase is Phase.RELEASED:
            self._complete(entry)

    def _received(self, packet_id: int, accepted: bool) -> None:
        found = self._inflight.get(packet_id)
        entry = None if found is None else self._window.get(found)
        if entry is None or entry.phase is not Phase.SENT:
            return
        if not accepted:
            self._complete(entry)
            return
        self._window[(entry.stream, entry.offset)] = replace(entry, phase=Phase.RELEASED)
        self._hold(Release(packet_id))

    def _complete(self, entry: WindowEntry) -> None:
        # Kept as COMPLETE until a checkpoint passes it (forget_completed). Persisted
        # lazily (with the next write; nothing waits for it): a crash before that
        # resends the PUBREL, which a client answers with PUBCOMP 0x92.
        self._window[(entry.stream, entry.offset)] = replace(entry, phase=Phase.COMPLETE)
        self._dirty = True
        del self._inflight[entry.packet_id]
        state = self._streams.get(entry.stream)
        if state is not None:
            state.outstanding.pop(entry.offset, None)
            state.released.pop(entry.offset, None)
            if not state.outstanding:
                state.outstanding = _NONE
            if not state.released:
                state.released = _NONE
            if state.grant is not None:
                state.acked_new.append(entry.offset)
            elif state.dropped and not state.outstanding and not state.released:
                del self._streams[entry.stream]
                self._check_all = True
        self._acks += 1
        self._moved = True

    def _offered(self, key: int, messages: Sequence[StoredMessage], upto: int) -> None:
        state = self._streams.get(key)
        if state is None:
            state = self._wake(key)
            if state is None:
                return
        state.fetching = False
        self._look_at(key)
        if state.dropped:
            return
        if upto <= state.fetched:
            return
        was_empty = not state.pending
        window = self._window if state.grant is None else None
        grant = state.grant
        readable = self._readable
        for message in messages:
            offset = message.offset
            if offset < state.fetched or offset >= upto:
                continue
            if window:
                entry = window.get((key, offset))
                if entry is not None and entry.phase is not Phase.SENT:
                    continue  # its PUBLISH went through before the restart
            queued = self._match(message) if grant is None else _match_grant(grant, message)
            if queued is not None and (readable is None or readable(message.mqtt_topic)):
                if state.pending is _NO_QUEUE:
                    state.pending = deque()
                state.pending.append(queued)
        state.fetched = upto
        self._moved = True
        if was_empty and state.pending:
            self._make_ready(key)

    def _match(self, message: StoredMessage) -> _Queued | None:
        topic = message.mqtt_topic
        matched = self._matched
        grant = matched.get(topic)
        if grant is None:
            grant = self._grant(topic)
            if matched is _NONE:
                matched = self._matched = {}
            elif len(matched) >= MATCHED_MAX:
                matched.clear()
            matched[topic] = grant
        qos, retain, identifiers = grant
        if qos < 0:
            return None if qos == _NO_MATCH else self._match_each(message)
        return _Queued(
            message.offset,
            message,
            min(qos, message.qos),
            retain and bool(message.retain),
            identifiers,
        )

    def _grant(self, topic: str) -> tuple[int, bool, tuple[int, ...]]:
        """What the subscriptions matching `topic` grant its messages: the
        highest QoS, whether one keeps the retain flag (Retain As Published),
        their identifiers; QoS `_NO_MATCH` if none matches, `_EACH` if one has
        No Local (the answer depends on each message's publisher)."""
        qos = _NO_MATCH
        retain = False
        identifiers: list[int] = []
        for sub in self._subscriptions.values():
            if not matches(sub.topic_filter, topic):
                continue
            if sub.no_local:
                return _EACH, False, ()
            qos = max(qos, sub.qos)
            retain = retain or sub.retain_as_published
            if sub.identifier is not None:
                identifiers.append(sub.identifier)
        return qos, retain, tuple(identifiers)

    def _match_each(self, message: StoredMessage) -> _Queued | None:
        """`_match` of a message one of whose subscriptions has No Local."""
        topic = message.mqtt_topic
        qos = -1
        retain = False
        identifiers: list[int] = []
        publisher: str | None = None
        looked_up = False
        for sub in self._subscriptions.values():
            if not matches(sub.topic_filter, topic):
                continue
            if sub.no_local:
                if not looked_up:
                    publisher = self._publisher(message) if self._publisher else None
                    looked_up = True
                if publisher == self.client_id:
                    continue
            qos = max(qos, sub.qos)
            retain = retain or (sub.retain_as_published and bool(message.retain))
            if sub.identifier is not None:
                identifiers.append(sub.identifier)
        if qos < 0:
            return None
        return _Queued(message.offset, message, min(qos, message.qos), retain, tuple(identifiers))

    def _pump(self, effects: list[Effect], now: float) -> None:
        ready = self._ready
        inflight = len(self._inflight)
        if ready and inflight and self.window - inflight < self.refill:
            if inflight >= self.window:
                self._refill_at = None  # full: the first slot freed starts the wait
                return
            refill_at = self._refill_at
            if refill_at is None:
                refill_at = self._refill_at = now + REFILL_DELAY
            if now < refill_at:
                return
        self._refill_at = None
        if not ready:
            return
        check = self._check
        if check is None:
            check = self._check = set()
        while ready and len(self._inflight) < self.window:
            key = ready.popleft()
            state = self._streams[key]
            item = state.pending.popleft()
            check.add(key)
            packet_id: int | None = None
            dup = item.offset < state.dup_below
            hold = False
            if item.qos > 0:
                restored = (
                    self._window.get((key, item.offset))
                    if self._window and state.grant is None
                    else None
                )
                if restored is not None and restored.phase is Phase.SENT:
                    # Sent before a restart: same packet id, DUP=1 [MQTT-3.3.1-1] [MQTT-4.4.0-1].
                    packet_id = restored.packet_id
                    self._reserved.discard(packet_id)
                    dup = True
                else:
                    packet_id = self._packet_id()
                    if item.qos == 2:
                        entry = WindowEntry(key, item.offset, packet_id, Phase.SENT)
                        if self._window is _NONE:
                            self._window = {}
                        self._window[(key, item.offset)] = entry
                        hold = True
                if self._inflight is _NONE:
                    self._inflight = {}
                self._inflight[packet_id] = (key, item.offset)
                if state.outstanding is _NONE:
                    state.outstanding = {}
                state.outstanding[item.offset] = None
                if state.grant is not None:
                    state.sent_new.append(item.offset)
            deliver = Deliver(
                key, item.message, item.qos, packet_id, dup, item.retain, item.identifiers
            )
            if hold:
                self._hold(deliver)
            elif self._held:
                # Behind a held QoS 2 PUBLISH: goes out after it, in log order
                # (per-key order across QoS levels), with the same persist.
                self._held.append((self._held[-1][0], deliver))
            else:
                effects.append(deliver)
            state.sent = max(state.sent, item.offset + 1)
            if state.pending:
                ready.append(key)
            else:
                state.pending = _NO_QUEUE

    def _packet_id(self) -> int:
        # At most `window` (< 65535) ids are in use, so a free one is near.
        while True:
            packet_id = self._next_packet_id
            self._next_packet_id = packet_id % MAX_PACKET_ID + 1
            if packet_id not in self._inflight and packet_id not in self._reserved:
                return packet_id

    def _fetch(self, effects: list[Effect]) -> None:
        check = self._check
        followed = len(self._streams) + len(self._dormant)
        if not followed:
            if check:
                check.clear()
            return
        share = max(1, self.queue_limit // followed)
        to_fetch = self._to_fetch
        if to_fetch:
            effects.append(FetchMany(to_fetch, share))
            self._to_fetch = None
        # Only streams whose pending queue shrank or whose fetch was answered can
        # have become ready to fetch, unless the set of streams (the share) changed.
        if self._check_all:
            self._check_all = False
            candidates = list(self._streams.values())
        elif check:
            streams = self._streams
            candidates = [streams[k] for k in check if k in streams]
        else:
            candidates = []
        if check:
            check.clear()
        for state in candidates:
            if state.fetching or state.dropped or len(state.pending) * 2 > share:
                continue
            state.fetching = True
            effects.append(Fetch(state.key, state.fetched, share - len(state.pending)))

    def _checkpoint(self, effects: list[Effect], now: float) -> None:
        checkpoint = self._take_checkpoint(now)
        if checkpoint.cursors:
            effects.append(checkpoint)

    def _take_checkpoint(self, now: float) -> Checkpoint:
        """The cursors that moved since the last checkpoint (or were never
        stored), counted as committed from now on."""
        changed = {
            key: offset
            for key, state in self._streams.items()
            if not state.dropped
            and state.grant is None
            and (offset := state.cursor()) != state.committed
        }
        self._acks = 0
        self._last_checkpoint = now
        self._moved = False
        for key, offset in changed.items():
            self._streams[key].committed = offset
        changed.pop(RETAINED, None)
        if self._dormant_unsaved:
            dormant = self._dormant
            changed.update((key, dormant[key]) for key in self._dormant_unsaved)
            self._dormant_unsaved = _NO_IDS
        return Checkpoint(changed, self.sent())

    def _report_grants(self, effects: list[Effect]) -> None:
        for key, state in self._grants.items():
            taken = state.reported
            if not state.dropped:
                taken = state.pending[0].offset if state.pending else state.fetched
            sent, acked = state.sent_new, state.acked_new
            if taken == state.reported and not sent and not acked:
                continue
            state.reported = taken
            effects.append(GrantMoved(key, taken, tuple(sent), tuple(acked)))
            sent.clear()
            acked.clear()


def _match_grant(sub: Subscription, message: StoredMessage) -> _Queued | None:
    """A grant's message: for its one subscription (No Local is not allowed on a
    shared subscription [MQTT-3.8.3-4]), or not at all."""
    if not matches(sub.topic_filter, message.mqtt_topic):
        return None
    retain = sub.retain_as_published and bool(message.retain)
    identifiers = () if sub.identifier is None else (sub.identifier,)
    return _Queued(message.offset, message, min(sub.qos, message.qos), retain, identifiers)


def cursors_by_topic(
    cursors: Mapping[int, int], topic_of: Mapping[int, str]
) -> dict[str, dict[int, int]]:
    """Group stream cursors by the topic each stream belongs to."""
    out: dict[str, dict[int, int]] = {}
    for key, offset in cursors.items():
        topic = topic_of.get(key)
        if topic is not None:
            out.setdefault(topic, {})[key] = offset
    return out
