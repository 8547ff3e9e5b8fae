"""What an operator sees of a shared subscription group, read from storage.

    overview = describe_group(storage, GroupId("g", "sensors/#"), now_us())
    overview.leader, overview.lag, overview.holder(stream), overview.members

One reading for `riverbed group list/describe` and the admin API's `/groups`:
the group record (`claims.GroupRecord`), its unexpired leader claim, and per
stream the group's position, head and lag (`claims.group_progress`). Who holds
which stream is what the Leader last saved (`GroupRecord.holdings`); a member
is a Borrower, whose id starts with its session's id, so its client and node
are those of the session record with that id (`sessions.store`).

A lag is exact when it counts only what the group's filter matches: when each
stream that lags is of a topic whose binding lets no message in that the
filter does not match. Otherwise it counts every message of the topic and is
an upper bound: counting only the matched ones would read every message behind
the group, on every call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from riverbed.errors import NotFound
from riverbed.model import StreamId
from riverbed.sessions.store import SessionStore
from riverbed.sharedsub.claims import GroupRecord, GroupStore, StreamProgress, group_progress
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage.base import Storage
from riverbed.storage.leases import Lease
from riverbed.topics.filters import filter_covers

LEADER_MARK = "/leader/"
"""A Leader's id is `NODE/leader/NONCE` (`host.LeaderHost.find_leader`)."""


@dataclass(frozen=True, slots=True)
class Member:
    """A Borrower of the group as the Leader last saved it."""

    borrower: str
    streams: tuple[StreamId, ...]
    client_id: str | None
    """The client whose session the Borrower belongs to (None: no such session now)."""
    node: str | None
    """The node whose connection holds that session (None: offline or unknown)."""


@dataclass(frozen=True, slots=True)
class GroupOverview:
    """A group, its Leader, members and progress per stream, read at one time."""

    record: GroupRecord
    leader: Lease | None
    """The unexpired leader claim (None: no Leader now)."""
    progress: tuple[StreamProgress, ...]
    exact: Mapping[StreamId, bool]
    """Per stream: whether its lag counts only what the filter matches (a lag
    of 0 is exact)."""
    members: tuple[Member, ...] = ()
    """Filled in by `describe_group` (empty in `list_groups`)."""

    @property
    def group(self) -> GroupId:
        return self.record.group

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.progress)

    @property
    def lag_exact(self) -> bool:
        return all(self.exact.values())

    @property
    def leader_node(self) -> str | None:
        """The node the Leader runs on (None: no Leader now)."""
        return None if self.leader is None else leader_node(self.leader.owner)

    @property
    def leader_since_us(self) -> int | None:
        """When the Leader took its claim (None: no Leader, or not recorded)."""
        record = self.record
        if self.leader is None or record.leader != self.leader.owner:
            return None
        return record.leader_since_us

    def holder(self, stream: StreamId) -> str | None:
        """The Borrower holding `stream` at the Leader's last save."""
        for borrower, held in self.record.holdings.items():
            if stream in held:
                return borrower
        return None


def leader_node(leader: str) -> str:
    """The node of a Leader id (the whole id if it is not `NODE/leader/...`)."""
    node, mark, _ = leader.partition(LEADER_MARK)
    return node if mark else leader


def _exact(
    record: GroupRecord, bindings: Mapping[str, str | None], progress: Sequence[StreamProgress]
) -> dict[StreamId, bool]:
    def covered(topic: str) -> bool:
        binding = bindings.get(topic)
        return binding is not None and filter_covers(record.group.topic_filter, binding)

    return {p.stream: not p.lag or covered(p.stream.topic) for p in progress}


def _overview(
    storage: Storage,
    store: GroupStore,
    record: GroupRecord,
    bindings: Mapping[str, str | None],
    at_us: int,
) -> GroupOverview:
    progress = tuple(group_progress(storage, record))
    return GroupOverview(
        record,
        store.leader_of(record.group, at_us),
        progress,
        _exact(record, bindings, progress),
    )


def _bindings(storage: Storage) -> dict[str, str | None]:
    return {t.name: t.binding for t in storage.list_topics()}


def list_groups(storage: Storage, at_us: int) -> list[GroupOverview]:
    """Every group with its Leader and progress, in group key order."""
    store = GroupStore(storage)
    bindings = _bindings(storage)
    return [
        _overview(storage, store, record, bindings, at_us)
        for record in sorted(store.list(), key=lambda r: r.group.key)
    ]


def describe_group(storage: Storage, group: GroupId, at_us: int) -> GroupOverview:
    """One group with its Leader, members and progress. Raises `NotFound`."""
    store = GroupStore(storage)
    record = store.get(group)
    if record is None:
        raise NotFound(f"shared subscription group {group} does not exist")
    overview = _overview(storage, store, record, _bindings(storage), at_us)
    sessions = {s.record.session_id: s.record for s in SessionStore(storage).all()}
    members = []
    for borrower, held in sorted(record.holdings.items()):
        # A Borrower's id is `SESSION_ID/NONCE/N` (`agent.Agent`).
        session = sessions.get(borrower.split("/", 1)[0])
        online = session is not None and session.connected
        members.append(
            Member(
                borrower,
                held,
                None if session is None else session.client_id,
                session.node if online and session is not None else None,
            )
        )
    return GroupOverview(
        overview.record, overview.leader, overview.progress, overview.exact, tuple(members)
    )
