"""The durable part of sessions: a KV record per client id, cursors per topic.

Record (KV namespace `sessions`, key = client id, JSON): session id, protocol
level, expiry interval, whether a connection holds it, when it was last
disconnected or seen, its subscriptions, the topics it has cursors on, and per
stream the offset below which messages may have been sent (for DUP), and the
outgoing QoS 2 window (`sessions/qos2.py`), and its epoch. Every write is a
compare-and-set on the version the writer read (`PreconditionFailed`
otherwise), so a connection that was taken over cannot write over its
successor (DESIGN.md, Sessions): its checkpoint, its QoS 2 window, its save at
disconnect all fail, and it gives up the session rather than try again. The
epoch counts the connections that took the session: each one writes the
epoch it found plus one, so a node asked to let go of the session can tell
the connection that was asked about (`mqtt/broker.py`, takeover across nodes)
from a newer one.

Incoming QoS 2 markers: `mqtt.qos2/<session id>/<packet id>` in the storage's
marker table, written with the message (`Storage.append_once`), deleted at
PUBREL or with the session, so they never outlive it.

Cursors: one named subscription per (session id, topic), named
`$session.<session id>.<topic>`, its offsets packed in its row (one row
written for all the topic's streams; `SubscriptionRecord.packed`).
`Subscriptions.create` refuses names starting with `$`, so the prefix is
reserved for sessions; retention sees these cursors like any other
subscription's. A clean start mints a new session id, so nothing
the old session left behind can be mistaken for the new one's. Only the
session moves its cursors: resets, deletes and consumers by name refuse a
`$`-named subscription (`subscriptions.committed.refuse_broker_owned`).

Resuming without reading: a session saved at its disconnect by this process
is kept, record, bytes and cursors, as the transaction that saved it left
them (`keep_resumable`, at most `RESUMABLE_MAX`). Its client's next resume
takes them (`take_resumable`) instead of reading, and writes its record with
a compare-and-set on those very bytes: it succeeds only if nobody has written
the record since, and so (cursors move only with their record) nobody has
moved the cursors either. Any other write or delete of the record forgets
the entry; a compare-and-set that fails sends the resume back to reading.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import orjson

from riverbed.clock import now_us
from riverbed.errors import AlreadyExists, NotFound, PreconditionFailed, SubscriptionNotFound
from riverbed.sessions.qos2 import WindowEntry
from riverbed.sessions.session import Subscription
from riverbed.storage.base import (
    KVEntry,
    StartKind,
    Storage,
    StorageTopicRecord,
    StreamHead,
    SubscriptionRecord,
)
from riverbed.storage.leases import Lease, Leases
from riverbed.topics.filters import filter_covers

NAMESPACE = "sessions"
PAGE = 500
"""Records `SessionStore.all` reads per query."""
CURSOR_PREFIX = "$session."
RESUMABLE_MAX = 50_000
"""Sessions saved at disconnect whose record and cursors are kept for their
resume (`SessionStore.keep_resumable`; about 1 KiB each with 16 streams), the
oldest let go first."""
NEVER_EXPIRES = 0xFFFF_FFFF
"""Session Expiry Interval meaning "never" (MQTT 5.0 §3.1.2.11.2)."""


def cursor_name(session_id: str, topic: str) -> str:
    """The named subscription holding a session's cursors on one topic."""
    return f"{CURSOR_PREFIX}{session_id}.{topic}"


def qos2_marker(session_id: str, packet_id: int) -> str:
    """The idempotency marker of an incoming QoS 2 PUBLISH: recorded with the
    message in one transaction (`Storage.append_once`), deleted at PUBREL."""
    return f"{QOS2_MARKER_PREFIX}{session_id}/{packet_id}"


def will_marker(session_id: str, epoch: int) -> str:
    """The marker of a published Will (`mqtt/wills.py`): that of the connection
    of `session_id` at `epoch`, recorded with the Will's message so that it is
    appended once whoever publishes it; deleted with the session."""
    return f"{WILL_MARKER_PREFIX}{session_id}/{epoch}"


QOS2_MARKER_PREFIX = "mqtt.qos2/"
WILL_MARKER_PREFIX = "mqtt.will/"
NODE_LEASE_PREFIX = "broker-node/"
"""A running broker node holds the lease `broker-node/NODE` (`riverbed.storage.leases`)
and renews it; sessions connected to it do not expire while it runs."""


WILL_GRACE = 60.0
"""Seconds past its expiry that a session whose Will was not published yet is
kept for it (`SessionStore.expire`)."""
FULL_SWEEP_EVERY = 60.0
"""Seconds between two reads of every record by a `sparse` expiry sweep at
most, whatever it knows to be due."""


def node_lease(node: str) -> str:
    """The name of a broker node's liveness lease."""
    return NODE_LEASE_PREFIX + node


NOTHING_SENT: Mapping[int, int] = MappingProxyType({})
"""`SessionRecord.sent` of a record that has sent nothing: one shared empty
mapping, not an empty dict per session."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What survives a session's connection and the broker."""

    client_id: str
    session_id: str
    protocol_level: int
    expiry_interval: int
    """Seconds the session outlives its connection; `NEVER_EXPIRES` for ever."""
    connected: bool
    seen_us: int
    """When a connection last wrote the record (connect, checkpoint, disconnect)."""
    disconnected_us: int | None = None
    subscriptions: tuple[Subscription, ...] = ()
    topics: tuple[str, ...] = ()
    """Topics the session has cursors on (named subscriptions)."""
    sent: Mapping[int, int] = field(default_factory=lambda: NOTHING_SENT)
    """Per stream key, the offset below which messages may have been sent
    (never changed in place: a new record gets a new mapping)."""
    qos2: tuple[WindowEntry, ...] = ()
    """The outgoing QoS 2 window (`sessions/qos2.py`)."""
    will: str | None = None
    """The connection's Will, opaque here (`mqtt/wills.py`): kept while it may
    still have to be published, so a broker restart does not lose it."""
    node: str | None = None
    """The broker node whose connection holds the session (while connected)."""
    epoch: int = 0
    """How many connections took the session before the one that wrote this
    (0 in records written before there was an epoch)."""

    def expires_us(self) -> int | None:
        """When the session expires if no connection resumes it; None for never.

        A record still marked connected that no live connection holds (its
        broker crashed) counts from when it was last seen. (One connected to a
        node that still runs does not expire: `SessionStore.held_elsewhere`.)
        """
        if self.expiry_interval == NEVER_EXPIRES:
            return None
        since = self.disconnected_us if self.disconnected_us is not None else self.seen_us
        return since + self.expiry_interval * 1_000_000

    def expired(self, at_us: int) -> bool:
        """[MQTT-4.1.0-2]: discarded once the connection is closed and the interval passed."""
        expires = self.expires_us()
        return expires is not None and at_us >= expires

    def to_json(self) -> bytes:
        """The record as stored: compact JSON, UTF-8 (orjson: a fifth of the
        stdlib's time, and a session writes its record three times)."""
        return orjson.dumps(
            {
                "client_id": self.client_id,
                "session_id": self.session_id,
                "protocol_level": self.protocol_level,
                "expiry_interval": self.expiry_interval,
                "connected": self.connected,
                "seen_us": self.seen_us,
                "disconnected_us": self.disconnected_us,
                "subscriptions": [
                    [
                        s.topic_filter,
                        s.qos,
                        s.no_local,
                        s.retain_as_published,
                        s.retain_handling,
                        s.identifier,
                    ]
                    for s in self.subscriptions
                ],
                "topics": list(self.topics),
                "sent": {str(k): v for k, v in self.sent.items()},
                "qos2": [e.to_json() for e in self.qos2],
                "will": self.will,
                "node": self.node,
                "epoch": self.epoch,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> SessionRecord:
        data = orjson.loads(raw)
        return cls(
            client_id=data["client_id"],
            session_id=data["session_id"],
            protocol_level=data["protocol_level"],
            expiry_interval=data["expiry_interval"],
            connected=data["connected"],
            seen_us=data["seen_us"],
            disconnected_us=data["disconnected_us"],
            subscriptions=tuple(
                Subscription(f, q, bool(nl), bool(rap), rh, ident)
                for f, q, nl, rap, rh, ident in data["subscriptions"]
            ),
            topics=tuple(data["topics"]),
            sent={int(k): int(v) for k, v in data["sent"].items()},
            qos2=tuple(WindowEntry.from_json(e) for e in data.get("qos2", ())),
            will=data.get("will"),
            node=data.get("node"),
            epoch=data.get("epoch", 0),
        )


@dataclass(frozen=True, slots=True)
class Backlog:
    """Messages a session is owed (`SessionStore.backlog`)."""

    messages: int
    exact: bool
    """False: an upper bound (it counts messages no filter of the session matches)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A record with the KV version it was read or written at (its incarnation).
    Version None: not written yet (a session that ends with its connection is
    stored only once it needs to be, `Broker.defers_ephemeral`); its first write
    creates it."""

    record: SessionRecord
    version: int | None
    made: Mapping[str, MadeCursors] | None = None
    """Topic -> the cursors this write made there, with the topic's shape as the
    write's transaction read it (`SessionWriter.write` with cursors): what the
    connection would otherwise read back to follow those streams. Dropped once
    used (`without_made`): a connection keeps only the record and version."""

    def without_made(self) -> Stored:
        return self if self.made is None else Stored(self.record, self.version)


Resuming = tuple[Stored | None, dict[str, dict[int, int] | None]]
"""A session's record (None: there is none) and its committed cursors on each
topic the record names (None: none there): `SessionStore.load_resuming`."""


@dataclass(frozen=True, slots=True)
class Resumable:
    """A session as the transaction that saved it at its disconnect left it
    (`SessionStore.keep_resumable`): its record, the record's bytes (what the
    resume's compare-and-set expects), and its cursors per topic, each packed
    as stream key, offset, stream key, ... (a dict of ints is four times the
    size)."""

    stored: Stored
    raw: bytes
    packed: tuple[tuple[str, array[int]], ...]

    def cursors(self) -> dict[str, dict[int, int] | None]:
        """Its committed cursors per topic, as `SessionStore.load_resuming` reads them."""
        return {topic: dict(zip(a[::2], a[1::2], strict=True)) for topic, a in self.packed}


@dataclass(frozen=True, slots=True)
class MadeCursors:
    """A session's new cursors on one topic, and the topic's generations and
    stream heads they were placed by, all read in the transaction that made
    them."""

    generations: list[StorageTopicRecord]
    heads: list[StreamHead]
    committed: dict[int, int]


@dataclass(frozen=True, slots=True)
class Census:
    """What one read of every session record counted (`SessionStore.census`)."""

    sessions: int
    disconnected: int
    """Records not marked connected."""
    subscriptions: int
    """Their subscriptions, all records together."""
    at: float
    """When (`time.monotonic`)."""


class SessionStore:
    """Session records and session cursors in one storage. Blocking: the broker
    calls it from worker threads."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.leases = Leases(storage)
        self._decoded: dict[str, tuple[int, int, Stored]] = {}
        """What `all` decoded last time, by client id: the version and the hash
        of the stored bytes, and the record they are (as handed out)."""
        self._census: Census | None = None
        """What the last `all` counted."""
        self._due_us = 0
        """A `sparse` expiry sweep reads the records once this has come: the
        first expiry among those it read last time and those written since."""
        self._due_lock = threading.Lock()
        self.resumable_max = RESUMABLE_MAX
        self._resumable: dict[str, Resumable] = {}
        self._resumable_lock = threading.Lock()
        """Kept by the session writer's thread, taken on the event loop's."""
        self.held_here: Callable[[str], Stored | None] | None = None
        """The broker's own view of a session connected to it (its connection's
        last written record), if any: `all` hands that out while the stored
        version is the same, instead of decoding and keeping a copy."""

    # --- broker nodes --------------------------------------------------------------
    def held_elsewhere(self, record: SessionRecord, here: str, at_us: int) -> bool:
        """Whether `record` is marked connected on another broker node than
        `here` whose liveness lease (`node_lease`) runs at `at_us`: its session
        is in use there, whatever its age."""
        if not record.connected or record.node is None or record.node == here:
            return False
        lease = self.leases.get(node_lease(record.node))
        return lease is not None and not lease.expired(at_us)

    def node_lease(self, node: str) -> Lease | None:
        """The liveness lease of broker node `node` (None: it holds none)."""
        return self.leases.get(node_lease(node))

    def node_leases(self) -> dict[str, Lease]:
        """The liveness lease of every broker node that holds one, by node
        name, expired or not (a node that stopped cleanly released its own)."""
        out: dict[str, Lease] = {}
        for entry in self.storage.kv_list(self.leases.namespace, NODE_LEASE_PREFIX):
            lease = self.leases.get(entry.key)
            if lease is not None:
                out[entry.key.removeprefix(NODE_LEASE_PREFIX)] = lease
        return out

    @staticmethod
    def connected_elsewhere(record: SessionRecord, here: str) -> bool:
        """Whether `record` is marked connected on another broker node than
        `here` (read from the record alone: whether that node runs is its
        lease's to say)."""
        return record.connected and record.node is not None and record.node != here

    def online(self, record: SessionRecord, live_nodes: Container[str]) -> bool:
        """Whether a connection holds the session: marked connected on a node
        whose liveness lease runs (`live_nodes`). One marked connected on a node
        that crashed is offline (and expires counting from when it was last seen)."""
        return record.connected and record.node is not None and record.node in live_nodes

    def taken_over(self, mine: Mapping[str, int | None], here: str) -> list[str]:
        """Of the sessions this node holds (`mine`: client id -> the version of
        our last write, None for a record not written yet), those another node
        has taken over since: their record written by a connection elsewhere,
        or gone."""
        # Only these records (not every stored one: a node holds a few of them).
        current = self.storage.kv_get_many(NAMESPACE, list(mine))
        out: list[str] = []
        for client_id, version in mine.items():
            entry = current.get(client_id)
            gone = entry is None and version is not None
            rewritten = (
                entry is not None
                and (version is None or entry.version > version)
                and SessionRecord.from_json(entry.value).node != here
            )
            if gone or rewritten:
                out.append(client_id)
        return out

    # --- records -----------------------------------------------------------------
    def load(self, client_id: str) -> Stored | None:
        """The session's record, if any. One that is still as it was last
        written or read by `all` (the same version and bytes) is not decoded
        again: a fleet resuming at once decoded every record it had just
        written at its disconnect."""
        entry = self.storage.kv_get(NAMESPACE, client_id)
        return None if entry is None else self._stored_of(entry)

    def _stored_of(self, entry: KVEntry) -> Stored:
        hit = self._decoded.get(entry.key)
        if hit is not None and hit[0] == entry.version and hit[1] == hash(entry.value):
            return hit[2]
        return Stored(SessionRecord.from_json(entry.value), entry.version)

    def load_resuming(self, client_id: str) -> Resuming:
        """`load`, and the session's committed cursors on each topic its record
        names (None: none there), in one call: a resume needs both, and on a
        database in another process each call is a hand-over to a thread and
        a round trip. A checkpoint writes a session's cursors and its record in
        one transaction, and nothing else moves them (resets, deletes and
        consumers by name refuse them: `refuse_broker_owned`), so while the
        record stays at this version (a compare-and-set on it succeeds) these
        are its cursors."""
        return self.load_resuming_many([client_id])[client_id]

    def load_resuming_many(self, client_ids: Sequence[str]) -> dict[str, Resuming]:
        """`load_resuming` of many sessions in two reads in all (their records,
        then all their cursors): a storm of resumes on a database in another
        process makes a round trip per read, and a read per session kept the
        worker threads busy with the same small statements."""
        entries = self.storage.kv_get_many(NAMESPACE, client_ids)
        found = {client_id: self._stored_of(entry) for client_id, entry in entries.items()}
        names = {
            (client_id, topic): cursor_name(stored.record.session_id, topic)
            for client_id, stored in found.items()
            for topic in stored.record.topics
        }
        cursors = self.storage.find_cursors_many(list(names.values())) if names else {}
        out: dict[str, Resuming] = {client_id: (None, {}) for client_id in client_ids}
        for client_id, stored in found.items():
            out[client_id] = (
                stored,
                {t: cursors.get(names[client_id, t]) for t in stored.record.topics},
            )
        return out

    def _committed_cursors(
        self, session_id: str, topics: Iterable[str]
    ) -> dict[str, dict[int, int] | None]:
        """The session's committed cursors on each of `topics` (None: none there)."""
        return {t: self.storage.find_cursors(cursor_name(session_id, t)) for t in topics}

    def all(self) -> list[Stored]:
        """Every session record. The periodic readers (the expiry sweep, the
        orphan sweep, the metrics) call it every few seconds, and with many
        sessions decoding them was most of a node's work: a record whose bytes
        are the same as last time is not decoded again. (Known by their hash
        and the record's version, not kept: a connection's share of the
        broker's memory is a few KiB, and the bytes were a tenth of it.)"""
        known = self._decoded
        held_here = self.held_here
        decoded: dict[str, tuple[int, int, Stored]] = {}
        out: list[Stored] = []
        disconnected = subscriptions = 0
        for entry in self._entries():
            stored: Stored | None = None
            if held_here is not None:
                mine = held_here(entry.key)
                if mine is not None and mine.version == entry.version:
                    stored = mine
            if stored is None:
                seen = hash(entry.value)
                hit = known.get(entry.key)
                if hit is not None and hit[0] == entry.version and hit[1] == seen:
                    stored = hit[2]
                else:
                    stored = Stored(SessionRecord.from_json(entry.value), entry.version)
                decoded[entry.key] = (entry.version, seen, stored)
            out.append(stored)
            record = stored.record
            if not record.connected:
                disconnected += 1
            subscriptions += len(record.subscriptions)
        self._decoded = decoded  # one assignment: another thread sees old or new
        self._census = Census(len(out), disconnected, subscriptions, time.monotonic())
        return out

    def census(self, max_age: float) -> Census:
        """Counts of the session records, from the last `all` if it is at most
        `max_age` seconds old (the expiry sweep reads them all every few
        seconds: the `$SYS` topics and the metrics count from that), else
        from a read of them all now."""
        last = self._census
        if last is not None and time.monotonic() - last.at <= max_age:
            return last
        self.all()
        assert self._census is not None
        return self._census

    def write(self, record: SessionRecord, version: int | None) -> Stored:
        """Create (`version` None) or compare-and-set the record. Raises
        `PreconditionFailed` if another writer got there first."""
        raw = record.to_json()
        if version is None:
            entry = self.storage.kv_put_if_absent(NAMESPACE, record.client_id, raw)
        else:
            entry = self.storage.kv_compare_and_set(NAMESPACE, record.client_id, version, raw)
        self.remember(record, raw, entry.version)
        return Stored(record, entry.version)

    def _entries(self) -> Iterator[KVEntry]:
        """Every stored record, read `PAGE` at a time: the periodic readers ran
        every few seconds, and all the rows, their bytes and entries at once
        grew a broker's memory for good (the allocator keeps what it was given)."""
        after: str | None = None
        while page := self.storage.kv_page(NAMESPACE, after, PAGE):
            yield from page
            after = page[-1].key

    def known(self, client_id: str) -> bool:
        """Whether this store has seen a record of `client_id`: read by the last
        `all`, written here since as disconnected (`remember`), or held by a
        connection here. (A record made since by another process is not known
        until the next `all`: a write that creates one finds it, by its
        compare-and-set.)"""
        held_here = self.held_here
        return client_id in self._decoded or (
            held_here is not None and held_here(client_id) is not None
        )

    def remember(self, record: SessionRecord, raw: bytes, version: int) -> None:
        """`record` was written as `raw` at `version`: `all` hands out this very
        object while the stored record stays so (not decoded again after a
        session goes offline). A write that does not commit after all leaves
        an entry that never matches."""
        if not record.connected:  # an online one is the broker's to tell (`held_here`)
            self._decoded[record.client_id] = (version, hash(raw), Stored(record, version))
            due = _due_us(record)
            if due is not None:
                self._earlier_due(due)
        if self._resumable:
            self.forget_resumable(record.client_id)

    def keep_resumable(
        self, stored: Stored, raw: bytes, cursors: Mapping[str, Mapping[int, int]]
    ) -> None:
        """`stored` (saved as `raw`, disconnected) and its committed `cursors`
        by cursor name, as the transaction that saved it left them, now that it
        has committed: for its client's next resume (`take_resumable`). Not
        kept if a topic it names has no cursor or an empty one (a resume reads
        those, and makes a missing one)."""
        record = stored.record
        if stored.version is None or record.connected or self.resumable_max < 1:
            return
        packed: list[tuple[str, array[int]]] = []
        for topic in record.topics:
            offsets = cursors.get(cursor_name(record.session_id, topic))
            if not offsets:
                return
            packed.append((topic, array("q", itertools.chain.from_iterable(offsets.items()))))
        kept = Resumable(stored, raw, tuple(packed))
        with self._resumable_lock:
            entries = self._resumable
            entries.pop(record.client_id, None)
            while len(entries) >= self.resumable_max:
                del entries[next(iter(entries))]
            entries[record.client_id] = kept

    def take_resumable(self, client_id: str) -> Resumable | None:
        """What `keep_resumable` kept of `client_id`'s session, if anything,
        no longer kept (one resume uses it)."""
        if not self._resumable:
            return None
        with self._resumable_lock:
            return self._resumable.pop(client_id, None)

    def forget_resumable(self, client_id: str) -> None:
        with self._resumable_lock:
            self._resumable.pop(client_id, None)

    def discard(self, stored: Stored) -> None:
        """Delete the session: its record (if still at this version;
        `PreconditionFailed` otherwise, and everything stays), then its cursors
        and QoS 2 markers. A crash in between leaves those behind, without a
        record: `drop_orphans` finds them. A record never written has nothing
        stored."""
        if stored.version is None:
            return
        self.forget_resumable(stored.record.client_id)
        self.storage.kv_delete_if_version(NAMESPACE, stored.record.client_id, stored.version)
        self.drop_state(stored.record)

    def drop_state(self, record: SessionRecord) -> None:
        """Delete what is stored in the session's name beside its record (its
        cursors and markers): once the record is deleted (`discard`,
        `SessionWriter.discard`)."""
        self.drop_cursors(record.session_id, record.topics)
        self.drop_markers(record.session_id)

    def drop_orphans(self) -> list[str]:
        """Delete the cursors and QoS 2 markers of sessions that have no record
        any more (left by a crash in the middle of `discard`, or of a clean
        start dropping the session it replaces): nothing would ever delete
        them, and their cursors would hold their topics' messages back from
        retention for good. Returns the session ids cleaned up.

        The cursors are listed before the records: a session's record is
        written before its first cursor, so a cursor listed has its record
        listed too unless the session is being discarded."""
        cursors = [
            sub.name
            for sub in self.storage.list_subscriptions()
            if sub.name.startswith(CURSOR_PREFIX)
        ]
        live = {stored.record.session_id for stored in self.all()}
        orphans: dict[str, list[str]] = {}
        for name in cursors:
            session_id = name[len(CURSOR_PREFIX) :].split(".", 1)[0]
            if session_id not in live:
                orphans.setdefault(session_id, []).append(name)
        for session_id, names in orphans.items():
            for name in names:
                with contextlib.suppress(SubscriptionNotFound, NotFound):
                    self.storage.delete_subscription(name)
            self.drop_markers(session_id)
        return list(orphans)

    def drop_markers(self, session_id: str) -> None:
        """Forget the session's incoming QoS 2 markers (packet ids never
        released) and its Wills' markers."""
        self.storage.delete_markers_with_prefix(f"{QOS2_MARKER_PREFIX}{session_id}/")
        self.storage.delete_markers_with_prefix(f"{WILL_MARKER_PREFIX}{session_id}/")

    def drop_cursors(self, session_id: str, topics: Iterable[str]) -> None:
        for topic in topics:
            with contextlib.suppress(SubscriptionNotFound, NotFound):
                self.storage.delete_subscription(cursor_name(session_id, topic))

    # --- cursors -----------------------------------------------------------------
    def ensure_cursors(
        self,
        session_id: str,
        topics: Iterable[str],
        start_us: int | None,
        offsets: Mapping[int, int] | None = None,
    ) -> None:
        """Create the session's cursors on `topics` that do not exist yet: at the
        streams' heads (`start_us` None), or at the first message at or after
        `start_us` (a topic that appeared while the session was away). A stream
        in `offsets` starts there instead (within what it holds): the positions
        a SUBSCRIBE took when it was read (`mqtt/following.py`)."""
        for topic in topics:
            record, initial = self.new_cursor(session_id, topic, start_us, offsets)
            with contextlib.suppress(AlreadyExists):
                self.storage.create_subscription(record, initial)

    def missing_cursors(self, session_id: str, topics: Iterable[str]) -> list[str]:
        """Of `topics`, those the session has no cursor on (a read: making a
        cursor that exists would take the write lock for nothing)."""
        out: list[str] = []
        for topic in topics:
            try:
                self.storage.get_subscription(cursor_name(session_id, topic))
            except SubscriptionNotFound:
                out.append(topic)
        return out

    def new_cursor(
        self,
        session_id: str,
        topic: str,
        start_us: int | None,
        offsets: Mapping[int, int] | None = None,
    ) -> tuple[SubscriptionRecord, Callable[[list[StreamHead]], dict[int, int]]]:
        """The named subscription holding the session's cursor on `topic`, and
        its initial positions given the topic's heads (`ensure_cursors`)."""

        def initial(heads: list[StreamHead]) -> dict[int, int]:
            out: dict[int, int] = {}
            for h in heads:
                given = None if offsets is None else offsets.get(h.key)
                if given is not None:
                    offset = min(given, h.next_offset)
                elif start_us is None:
                    offset = h.next_offset
                else:
                    offset = self.storage.first_offset_at(h.key, start_us)
                out[h.key] = max(h.start_offset, offset)
            return out

        record = SubscriptionRecord(
            cursor_name(session_id, topic),
            topic,
            None,
            StartKind.LATEST if start_us is None else StartKind.TIME,
            start_us,
            now_us(),
            packed=True,
        )
        return record, initial

    def positions(self, session_id: str, topic: str, heads: Iterable[StreamHead]) -> dict[int, int]:
        """The committed cursor of every stream of `topic` (streams that appeared
        since, new generations, start at their first retained offset)."""
        return start_positions(self.storage.get_cursors(cursor_name(session_id, topic)), heads)

    def cursors_of(
        self, session_id: str, topics: Iterable[str], ensure: Iterable[str] = ()
    ) -> tuple[list[str], dict[str, dict[int, int]]]:
        """In one call (one hand-over to a thread): which of `ensure` the session
        has no cursor on (`missing_cursors`), and its committed cursors on each
        of `topics` (`start_positions` makes positions of them)."""
        read = self._committed_cursors(session_id, topics)
        ensure = list(ensure)
        absent = set(self.missing_cursors(session_id, [t for t in ensure if t not in read]))
        missing = [t for t in ensure if (read[t] is None if t in read else t in absent)]
        return missing, {t: cursors or {} for t, cursors in read.items()}

    def commit(
        self,
        stored: Stored,
        cursors: Mapping[str, Mapping[int, int]],
        sent: Mapping[int, int],
        at_us: int | None = None,
    ) -> Stored:
        """A checkpoint: fence on the record's version (raising `PreconditionFailed`
        if the session was taken over), then commit the cursors per topic. The
        record is written as given (with its QoS 2 window), `seen_us` and `sent` set."""
        record = replace(stored.record, seen_us=at_us or now_us(), sent=dict(sent))
        written = self.write(record, stored.version)
        for topic, offsets in cursors.items():
            if offsets:
                # A topic the session stopped reaching may have lost its cursor
                # since this checkpoint was taken: nothing to keep there.
                with contextlib.suppress(SubscriptionNotFound):
                    self.storage.commit_cursors(cursor_name(record.session_id, topic), offsets)
        return written

    def backlog(self, record: SessionRecord) -> Backlog:
        """What the session's cursors have not passed yet: per topic it has
        cursors on, the messages between its committed cursors and the heads.
        Exact when every topic that has some is bound to MQTT topic names that
        one of its (private) subscriptions covers; otherwise an upper bound,
        counting messages no filter of the session matches (counting only
        the matched ones would read all of them). Shared subscriptions are the
        groups' (`sharedsub`), not counted here."""
        # A shared subscription's `$share/...` text covers no binding: only the
        # private filters can make a topic's count exact.
        filters = [s.topic_filter for s in record.subscriptions]
        bindings = {t.name: t.binding for t in self.storage.list_topics()}
        total = 0
        exact = True
        for topic in record.topics:
            heads = self.storage.list_streams(topic)
            positions = self.positions(record.session_id, topic, heads)
            lag = sum(max(0, h.next_offset - positions[h.key]) for h in heads)
            total += lag
            binding = bindings.get(topic)
            covered = binding is not None and any(filter_covers(f, binding) for f in filters)
            exact = exact and (covered or not lag)
        return Backlog(total, exact)

    def expire(
        self, at_us: int, live: set[str], here: str | None = None, *, sparse: bool = False
    ) -> list[str]:
        """Discard every session whose expiry has passed at `at_us`, except those
        of client ids in `live` (connected here) and those held by another
        running node (`held_elsewhere`; `here`: this node); return their client
        ids. A session whose record still holds a Will (due when it expires at
        the latest) is kept until the Will is published, for at most
        `WILL_GRACE` seconds: it is the record that fences it (`mqtt/wills.py`).

        `sparse`: every record is written through this store (one broker alone
        on its database), so it knows when the first session is due: the
        records are read only once that has come (and at least every
        `FULL_SWEEP_EVERY` seconds), not at every sweep. A broker with many
        stored sessions read them all every few seconds for this."""
        if sparse and at_us < self._due_us:
            return []
        with self._due_lock:
            self._due_us = at_us + int(FULL_SWEEP_EVERY * 1_000_000)
        first: int | None = None
        gone: list[str] = []
        for stored in self.all():
            record = stored.record
            if record.client_id in live:
                continue  # its save at the disconnect makes it due (`remember`)
            due = _due_us(record)
            if due is None or at_us < due:
                if due is not None and (first is None or due < first):
                    first = due
                continue
            if here is not None and self.held_elsewhere(record, here, at_us):
                continue
            try:
                self.discard(stored)
            except PreconditionFailed:
                continue  # resumed meanwhile
            gone.append(record.client_id)
        if first is not None:
            self._earlier_due(first)
        return gone

    def _earlier_due(self, due_us: int) -> None:
        with self._due_lock:
            if due_us < self._due_us:
                self._due_us = due_us


def _due_us(record: SessionRecord) -> int | None:
    """When the expiry sweep may discard `record` (None: never): at its
    expiry, or `WILL_GRACE` after it while it holds a Will."""
    expires = record.expires_us()
    if expires is None or record.will is None:
        return expires
    return expires + int(WILL_GRACE * 1_000_000)


def start_positions(stored: Mapping[int, int], heads: Iterable[StreamHead]) -> dict[int, int]:
    """Where a session reads each of `heads`' streams from: its committed
    cursor (`stored`), but never below the first retained offset (a stream
    that appeared since, a new generation, starts there)."""
    return {h.key: max(stored.get(h.key, h.start_offset), h.start_offset) for h in heads}
