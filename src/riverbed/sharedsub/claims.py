"""One Leader per group, cluster-wide, and the group's persisted state.

Two KV records per group, both guarded by the storage's preconditions:

- the leader claim: a lease (`riverbed.storage.leases`) named
  `sharedsub/GROUP/FILTER`, which the Leader renews well within
  `leader_claim_lease`; an expired claim may be taken by another candidate;
- the group record in namespace `sharedsub`, key `GROUP/FILTER`: the filter,
  the start time, when it was created, the progress of every stream, the
  streams known fully consumed (lineage progress), and which Leader wrote it.

Taking the claim rewrites the group record with compare-and-set (naming the new
Leader), and every later save is a compare-and-set on the version the Leader's
own last write left. So once a new Leader has claimed the group, a stale
Leader's save fails with `PreconditionFailed` whatever its clock says — the
record's version is the fencing token, like the lease's.

Retention: a group's progress lives in its record, which retention does not
read, so each group also holds a named subscription per topic its filter
reaches (`cursor_name`: `$share.<hash of GROUP/FILTER>.<topic>`), created with
the group at the group's start and moved with every save (in the save's
transaction). Retention keeps what any subscription has not consumed, so it
keeps what the group has not; a stream the group has no cursor on yet is kept
whole. Without them a group's unread messages went at the topic's retention
time, or at once with the `consumed` policy.

Released QoS 2 messages: a member's session writes, with the record write that
holds back its PUBREL (`mqtt/sharing.py`), a KV entry in namespace
`sharedsub.released` naming the group, the stream and the offset of a QoS 2
message its client has acknowledged with PUBREC — the client has it, and the
session completes it even across a restart. A member granted that stream later
reads them first (`released_offsets`) and passes those offsets over, so a new
Leader resuming from progress saved before that acknowledgement does not hand
the message to the group a second time. Each save deletes the entries below
the progress it writes (in its transaction): nothing below is lent again.

Lending is fenced (`lend`). A grant is read once, when it starts, and a member
that was lent a stream may be told to let go of it (revoked and not drained in
time, fenced off from a silent Leader, its Leader gone) while its client still
holds a QoS 2 message unanswered; its PUBREC may come after another member was
lent the same offset. So each QoS 2 grant, as it starts, bumps the version of
the stream's lending key (namespace `sharedsub.lent`, `lent_key`) in the
transaction that reads the released entries, and keeps that version; a
member's write of released entries holds the lending keys of their streams at
the versions its grants got (`kv_hold_in`, in the same transaction). Either the
write commits first, and the later grant reads its entries, or the grant
does, and the write is refused: the member's session ends its connection
without the PUBREL, its client never completes the message, and the member
lent it later delivers it.

Synchronous and small: the Leader's runtime calls it from a worker thread.
Times are µs since the epoch, passed in.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from riverbed.errors import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    TopicNotFound,
)
from riverbed.log.topics import reachable_topics
from riverbed.model import StreamId
from riverbed.sharedsub.protocol import GroupId, LeaderId, stream_order
from riverbed.storage.base import (
    KVEntry,
    StartKind,
    Storage,
    StorageTopicRecord,
    StreamHead,
    SubscriptionRecord,
)
from riverbed.storage.leases import Lease, Leases
from riverbed.storage.transactions import (
    commit_cursors_in,
    kv_bump_in,
    kv_delete_numbered_below_in,
    kv_keys_in,
    kv_put_in,
    transaction,
)

NAMESPACE = "sharedsub"
LEASE_PREFIX = "sharedsub/"


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's persisted state as last written (`version`: its fencing token)."""

    group: GroupId
    start_us: int | None
    """Messages from this time on belong to the group; None: from the earliest."""
    created_us: int
    progress: Mapping[StreamId, int]
    consumed: frozenset[StreamId]
    leader: LeaderId | None
    version: int
    holdings: Mapping[str, tuple[StreamId, ...]] = field(default_factory=dict)
    """Per Borrower, the streams it held or was being granted when the Leader
    last saved (for `riverbed group describe`; the Leader's memory is the truth)."""
    leader_since_us: int | None = None
    """When `leader` took the claim (None: before this was recorded)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What a Leader holds: its lease and the group record as it last wrote it."""

    lease: Lease
    record: GroupRecord

    @property
    def leader(self) -> LeaderId:
        return self.lease.owner


CURSOR_PREFIX = "$share."
"""Named subscriptions holding the groups' positions for retention."""


def cursor_name(group: GroupId, topic: str) -> str:
    """The named subscription holding `group`'s position on `topic` (the group
    key holds `/`, `+`, `#`: a hash of it names the group)."""
    return f"{CURSOR_PREFIX}{_digest(group)}.{topic}"


def _digest(group: GroupId) -> str:
    return hashlib.sha256(group.key.encode()).hexdigest()[:16]


RELEASED_NAMESPACE = "sharedsub.released"
"""QoS 2 messages of a group a member's client acknowledged (module docstring)."""


def released_prefix(group: GroupId, stream_key: int) -> str:
    """The start of the keys of `group`'s released messages on one stream (the
    log's key of the stream); an offset follows it."""
    return f"{_digest(group)}/{stream_key}/"


def released_key(group: GroupId, stream_key: int, offset: int) -> str:
    """The key recording that `group`'s message at `offset` of the stream was
    released to a member's client."""
    return f"{released_prefix(group, stream_key)}{offset}"


def released_offsets(
    storage: Storage, group: GroupId, stream_key: int, start: int
) -> frozenset[int]:
    """The offsets from `start` on of one stream that a member's client of
    `group` has acknowledged already (passed over when the stream is lent)."""
    prefix = released_prefix(group, stream_key)
    keys = (e.key for e in storage.kv_list(RELEASED_NAMESPACE, prefix))
    return _offsets_from(prefix, keys, start)


def _offsets_from(prefix: str, keys: Iterable[str], start: int) -> frozenset[int]:
    """The offsets from `start` on that the released entries' `keys` name."""
    offsets = (int(key[len(prefix) :]) for key in keys)
    return frozenset(o for o in offsets if o >= start)


LENT_NAMESPACE = "sharedsub.lent"
"""Per group and stream, a key whose version each QoS 2 grant bumps (`lend`)."""


def lent_key(group: GroupId, stream_key: int) -> str:
    """The lending key of `group`'s stream (the log's key of the stream)."""
    return f"{_digest(group)}/{stream_key}"


@dataclass(frozen=True, slots=True)
class Lent:
    """A QoS 2 grant as `lend` started it."""

    version: int
    """The version of the stream's lending key this grant made: a write of
    released entries holds it there (`kv_hold_in`)."""
    skip: frozenset[int]
    """The offsets from the grant's start on released to a member already."""


def lend(storage: Storage, group: GroupId, stream_key: int, start: int, holder: bytes) -> Lent:
    """Start a QoS 2 grant of one stream of `group` from `start`, for `holder`
    (the member's client id, for whoever reads the key): in one transaction, bump the
    stream's lending key, which refuses from then on the writes of members
    lent it before (module docstring), and read the released offsets."""
    prefix = released_prefix(group, stream_key)
    with transaction(storage) as tx:
        version = kv_bump_in(tx, LENT_NAMESPACE, lent_key(group, stream_key), holder)
        keys = kv_keys_in(tx, RELEASED_NAMESPACE, prefix)
    return Lent(version, _offsets_from(prefix, keys, start))


@dataclass(frozen=True, slots=True)
class Save:
    """One Leader's save for `GroupStore.save_many`."""

    claim: Claim
    progress: Mapping[StreamId, int]
    consumed: Iterable[StreamId]
    holdings: Mapping[str, Sequence[StreamId]] | None = None


class GroupStore:
    """Create, list, claim, save and delete shared subscription groups."""

    def __init__(self, storage: Storage, namespace: str = NAMESPACE) -> None:
        self.storage = storage
        self.namespace = namespace
        self.leases = Leases(storage)
        self._held: set[str] = set()
        """Named subscriptions known to exist (`_hold`)."""
        self._keys: dict[StreamId, int] = {}

    # ----------------------------------------------------------------- groups

    def create(self, group: GroupId, *, start_us: int | None, now_us: int) -> GroupRecord:
        """Create a group starting at `start_us` (None: the earliest retained
        message). Raises `AlreadyExists`."""
        if start_us is not None and (not isinstance(start_us, int) or start_us < 0):
            raise InvalidInput(f"group start {start_us!r} must be µs since the epoch (>= 0)")
        record = GroupRecord(group, start_us, now_us, {}, frozenset(), None, 0)
        # The cursors first: a group whose record exists is always pinned.
        # Not from `_held`: another process may have deleted an earlier group
        # of this name (and its subscriptions) since this store last looked.
        self._hold(
            record,
            [t for t in reachable_topics([group.topic_filter], self._bindings())],
            known=False,
        )
        try:
            entry = self.storage.kv_put_if_absent(self.namespace, group.key, _encode(record))
        except PreconditionFailed:
            raise AlreadyExists(f"shared subscription group {group} exists already") from None
        return _decode(entry)

    def ensure(self, group: GroupId, now_us: int) -> None:
        """Create the group starting now unless it exists (a member's SUBSCRIBE:
        whatever is published after its SUBACK belongs to the group)."""
        if self.get(group) is None:
            with contextlib.suppress(AlreadyExists):
                self.create(group, start_us=now_us, now_us=now_us)

    def get(self, group: GroupId) -> GroupRecord | None:
        entry = self.storage.kv_get(self.namespace, group.key)
        return None if entry is None else _decode(entry)

    def list(self) -> list[GroupRecord]:
        return [_decode(e) for e in self.storage.kv_list(self.namespace)]

    def delete(self, group: GroupId) -> None:
        """Delete the group record and its claim. Raises `NotFound`. A Leader still
        running finds its next save refused and stops."""
        entry = self.storage.kv_get(self.namespace, group.key)
        if entry is None:
            raise NotFound(f"shared subscription group {group} does not exist")
        self.storage.kv_delete_if_version(self.namespace, group.key, entry.version)
        prefix = cursor_name(group, "")
        for sub in self.storage.list_subscriptions():
            if sub.name.startswith(prefix):
                self._held.discard(sub.name)
                with contextlib.suppress(NotFound):
                    self.storage.delete_subscription(sub.name)
        for namespace in (RELEASED_NAMESPACE, LENT_NAMESPACE):
            for entry in self.storage.kv_list(namespace, f"{_digest(group)}/"):
                with contextlib.suppress(PreconditionFailed):  # deleted meanwhile
                    self.storage.kv_delete_if_version(namespace, entry.key, entry.version)
        lease = self.leases.get(LEASE_PREFIX + group.key)
        if lease is not None:
            # Renewed meanwhile: it expires, and its Leader is fenced off anyway.
            with contextlib.suppress(PreconditionFailed):
                self.leases.release(lease)

    def leader_of(self, group: GroupId, now_us: int) -> Lease | None:
        """The unexpired leader claim of a group, if any."""
        lease = self.leases.get(LEASE_PREFIX + group.key)
        return None if lease is None or lease.expired(now_us) else lease

    # ----------------------------------------------------------------- claims

    def claim(self, group: GroupId, leader: LeaderId, *, ttl_us: int, now_us: int) -> Claim:
        """Become the group's Leader: take the claim and fence off earlier Leaders.

        A group that does not exist yet is created starting now (a session's
        first `$share/...` subscription creates it). Raises `LeaseHeld` if another
        Leader's claim has not expired.
        """
        lease = self.leases.acquire(LEASE_PREFIX + group.key, leader, ttl_us, now_us)
        while True:
            entry = self.storage.kv_get(self.namespace, group.key)
            if entry is None:
                with contextlib.suppress(AlreadyExists):  # another candidate did
                    self.create(group, start_us=now_us, now_us=now_us)
                continue
            record = replace(_decode(entry), leader=leader, holdings={}, leader_since_us=now_us)
            try:
                written = self.storage.kv_compare_and_set(
                    self.namespace, group.key, entry.version, _encode(record)
                )
            except PreconditionFailed:
                continue  # a stale Leader saved in between: read again
            return Claim(lease, _decode(written))

    def renew(self, claim: Claim, *, ttl_us: int, now_us: int) -> Claim:
        """Extend the claim. Raises `PreconditionFailed` if it was lost."""
        return Claim(self.leases.renew(claim.lease, ttl_us, now_us), claim.record)

    def renew_many(
        self, claims: Sequence[Claim], *, ttl_us: int, now_us: int
    ) -> builtins.list[Claim | PreconditionFailed]:
        """`renew` for several claims in one transaction (a node's Leaders started
        together fall due together): per claim, its renewal or the
        `PreconditionFailed` `renew` would have raised."""
        renewed = self.leases.renew_many([c.lease for c in claims], ttl_us, now_us)
        return [
            lease if isinstance(lease, PreconditionFailed) else Claim(lease, claim.record)
            for claim, lease in zip(claims, renewed, strict=True)
        ]

    def save(
        self,
        claim: Claim,
        progress: Mapping[StreamId, int],
        consumed: Iterable[StreamId] = (),
        *,
        now_us: int,
        holdings: Mapping[str, Sequence[StreamId]] | None = None,
    ) -> Claim:
        """Persist progress. Raises `PreconditionFailed` if this Leader was fenced
        off (another claimed the group, or the group was deleted) or its own clock
        says its claim expired."""
        (result,) = self.save_many([Save(claim, progress, consumed, holdings)], now_us=now_us)
        if isinstance(result, PreconditionFailed):
            raise result
        return result

    def save_many(
        self, saves: Sequence[Save], *, now_us: int
    ) -> builtins.list[Claim | PreconditionFailed]:
        """`save` for several groups in one transaction (a node's Leaders after a
        burst of messages: one commit, not one per group). Each save succeeds or
        fails alone: the result per save is its new claim, or the
        `PreconditionFailed` `save` would have raised (nothing written of it)."""
        out: builtins.list[Claim | PreconditionFailed] = []
        writes: builtins.list[tuple[int, GroupRecord, bytes]] = []
        for save in saves:
            try:
                record = self._saved(
                    save.claim, save.progress, save.consumed, now_us, save.holdings
                )
            except PreconditionFailed as refused:
                out.append(refused)
                continue
            out.append(Claim(save.claim.lease, record))
            writes.append((len(out) - 1, record, _encode(record)))
        if not writes:
            return out
        positions = {i: self._positions(record) for i, record, _ in writes}
        passed = {i: self._passed(saves[i].claim.record, record) for i, record, _ in writes}
        with transaction(self.storage) as tx:
            for i, record, value in writes:
                expected = record.version
                if kv_put_in(tx, self.namespace, record.group.key, value, expected):
                    out[i] = Claim(saves[i].claim.lease, replace(record, version=expected + 1))
                    for name, offsets in positions[i].items():
                        commit_cursors_in(tx, name, offsets)
                    for prefix, below in passed[i]:
                        kv_delete_numbered_below_in(tx, RELEASED_NAMESPACE, prefix, below)
                else:
                    out[i] = PreconditionFailed(
                        f"key {self.namespace}/{record.group.key} is not at version {expected}"
                    )
        return out

    def _positions(self, record: GroupRecord) -> dict[str, dict[int, int]]:
        """The group's progress as cursors of its named subscriptions (created
        for topics that have none yet)."""
        by_topic: dict[str, dict[int, int]] = {}
        for stream, offset in record.progress.items():
            key = self._stream_key(stream)
            if key is not None:
                by_topic.setdefault(cursor_name(record.group, stream.topic), {})[key] = offset
        self._hold(record, [s.topic for s in record.progress])
        return by_topic

    def _passed(self, before: GroupRecord, after: GroupRecord) -> builtins.list[tuple[str, int]]:
        """Per stream whose progress moved, the prefix of its released entries
        and the progress: those below it are deleted with the save."""
        out = []
        for stream, offset in after.progress.items():
            if before.progress.get(stream, -1) >= offset:
                continue
            key = self._stream_key(stream)
            if key is not None:
                out.append((released_prefix(after.group, key), offset))
        return out

    def _hold(self, record: GroupRecord, topics: Iterable[str], known: bool = True) -> None:
        """Make sure the group has its named subscription on each of `topics`,
        starting where the group starts (`start_offsets`); `known`: skip the
        ones this store made or saw before."""
        for topic in topics:
            name = cursor_name(record.group, topic)
            if known and name in self._held:
                continue

            def initial(
                heads: list[StreamHead], start_us: int | None = record.start_us
            ) -> dict[int, int]:
                offsets = start_offsets(self.storage, heads, start_us)
                return {h.key: offsets[h.stream] for h in heads}

            sub = SubscriptionRecord(
                name,
                topic,
                None,
                StartKind.EARLIEST if record.start_us is None else StartKind.TIME,
                record.start_us,
                record.created_us,
            )
            try:
                self.storage.create_subscription(sub, initial)
            except TopicNotFound:
                continue  # nothing to hold (the built-in `mqtt` where not made yet)
            except AlreadyExists:
                pass
            self._held.add(name)

    def _stream_key(self, stream: StreamId) -> int | None:
        key = self._keys.get(stream)
        if key is None:
            for head in self.storage.list_streams(stream.topic):
                self._keys[head.stream] = head.key
            key = self._keys.get(stream)
        return key

    def _bindings(self) -> builtins.list[tuple[str, str | None]]:
        return [(t.name, t.binding) for t in self.storage.list_topics()]

    def _saved(
        self,
        claim: Claim,
        progress: Mapping[StreamId, int],
        consumed: Iterable[StreamId],
        now_us: int,
        holdings: Mapping[str, Sequence[StreamId]] | None,
    ) -> GroupRecord:
        """The record a save writes (at the version it replaces)."""
        if claim.lease.expired(now_us):
            raise PreconditionFailed(
                f"the claim of {claim.leader!r} on group {claim.record.group} expired"
            )
        record = replace(claim.record, progress=dict(progress), consumed=frozenset(consumed))
        if holdings is not None:
            record = replace(record, holdings={b: tuple(s) for b, s in holdings.items()})
        return record

    def release(self, claim: Claim) -> None:
        """Give the claim up (a Leader stopping when idle). Raises
        `PreconditionFailed` if it was no longer ours."""
        self.leases.release(claim.lease)


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """Where a group stands on one stream it may be lent."""

    stream: StreamId
    position: int
    """The first offset not yet done: saved progress, else where the group's
    start puts it (within what is retained)."""
    head: int
    consumed: bool
    """Known fully consumed (lineage progress)."""

    @property
    def lag(self) -> int:
        return max(0, self.head - self.position)


@dataclass(frozen=True, slots=True)
class ReachedTopic:
    """A topic the group's filter may reach, as read now."""

    name: str
    heads: Sequence[StreamHead]
    initial: Mapping[StreamId, int]
    """Where the group's start puts the streams it has no progress for."""


class TopicReads:
    """What Leaders read of the topics, read once however many Leaders ask: a
    node's Leaders renew their streams in the same round (`LeaderHost.tick`),
    and 50 groups on one topic would otherwise read its heads 50 times."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._bindings: list[tuple[str, str | None]] | None = None
        self._heads: dict[str, list[StreamHead]] = {}
        self._storage_topics: dict[str, list[StorageTopicRecord]] = {}

    def bindings(self) -> list[tuple[str, str | None]]:
        if self._bindings is None:
            self._bindings = [(t.name, t.binding) for t in self.storage.list_topics()]
        return self._bindings

    def heads(self, topic: str) -> list[StreamHead]:
        heads = self._heads.get(topic)
        if heads is None:
            heads = self._heads[topic] = self.storage.list_streams(topic)
        return heads

    def storage_topics(self, topic: str) -> list[StorageTopicRecord]:
        found = self._storage_topics.get(topic)
        if found is None:
            found = self._storage_topics[topic] = self.storage.list_storage_topics(topic)
        return found


def reached_topics(
    storage: Storage, record: GroupRecord, reads: TopicReads | None = None
) -> list[ReachedTopic]:
    """Every topic the group's filter may reach (`log.topics.reachable_topics`),
    with its heads and the start offsets of streams new to the group (`reads`:
    what other groups read this round)."""
    reads = TopicReads(storage) if reads is None else reads
    out: list[ReachedTopic] = []
    for topic in reachable_topics([record.group.topic_filter], reads.bindings()):
        heads = reads.heads(topic)
        new = [h for h in heads if h.stream not in record.progress]
        out.append(ReachedTopic(topic, heads, start_offsets(storage, new, record.start_us)))
    return out


def group_progress(storage: Storage, record: GroupRecord) -> list[StreamProgress]:
    """Per stream of every topic the group's filter may reach: position, head and lag."""
    out: list[StreamProgress] = []
    for topic in reached_topics(storage, record):
        for h in topic.heads:
            position = record.progress.get(h.stream, topic.initial.get(h.stream, h.start_offset))
            out.append(
                StreamProgress(
                    h.stream,
                    max(position, h.start_offset),
                    h.next_offset,
                    h.stream in record.consumed,
                )
            )
    return out


def start_offsets(
    storage: Storage, heads: Sequence[StreamHead], start_us: int | None
) -> dict[StreamId, int]:
    """Where a group starting at `start_us` begins each stream it has no progress
    for (the Leader's `TopicStreams.initial`)."""
    if start_us is None:
        return {h.stream: h.start_offset for h in heads}
    return {h.stream: storage.first_offset_at(h.key, start_us) for h in heads}


def _encode(record: GroupRecord) -> bytes:
    return json.dumps(
        {
            "group": record.group.name,
            "filter": record.group.topic_filter,
            "start_us": record.start_us,
            "created_us": record.created_us,
            "progress": {
                str(s): o
                for s, o in sorted(record.progress.items(), key=lambda p: stream_order(p[0]))
            },
            "consumed": sorted(str(s) for s in record.consumed),
            "leader": record.leader,
            "holdings": {b: [str(s) for s in held] for b, held in sorted(record.holdings.items())},
            "leader_since_us": record.leader_since_us,
        },
        separators=(",", ":"),
    ).encode()


def _decode(entry: KVEntry) -> GroupRecord:
    data = json.loads(entry.value)
    return GroupRecord(
        GroupId(data["group"], data["filter"]),
        data["start_us"],
        data["created_us"],
        {StreamId.parse(s): int(o) for s, o in data["progress"].items()},
        frozenset(StreamId.parse(s) for s in data["consumed"]),
        data["leader"],
        entry.version,
        {b: tuple(StreamId.parse(s) for s in held) for b, held in data.get("holdings", {}).items()},
        data.get("leader_since_us"),
    )
