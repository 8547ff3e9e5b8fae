"""Browsing a delivering subscription's dead-letter queue.

`parked(storage, name, ...)` reads every stream of `NAME.dlq` (all its
generations) and returns the parked messages that match the selectors — failed
at or after `since_us` (and before `until_us`), of the given group ids, with the
given message ids — oldest failure first (then by stream and offset), a page
at a time. Each comes with where it is parked (stream, offset). Messages
replayed or purged are not parked any more: the shards' state says which.

`replay` writes selected parked messages back into the flow: into the retry
queue of their shard, due now, as a first attempt; `purge` drops them. Both
act shard by shard, each in one transaction with the shard's state
(compare-and-set: a batch of a running job that commits first makes it read
again; the batch that loses runs again). In a grouped subscription a group's
parked messages leave the DLQ in order: selecting one takes the group's
earlier parked messages with it (`DlqChange.along`); the group's later ones
stay parked, and its new messages keep joining them, while the replayed ones
are delivered (they come first in the group's order).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from riverbed.clock import now_us as current_us
from riverbed.errors import InvalidInput, NotFound, Superseded
from riverbed.model import MessageId, MessageIdGenerator, StreamId
from riverbed.storage.base import Storage, StreamHead
from riverbed.storage.transactions import (
    append_once_in,
    delete_marker_in,
    kv_put_in,
    transaction,
)
from riverbed.subscriptions.batch import QueueLayout, open_rows
from riverbed.subscriptions.definition import Definitions, hold_definition
from riverbed.subscriptions.groups import MessageState, Queue
from riverbed.subscriptions.provisioning import queue_topics
from riverbed.subscriptions.queues import QueuedMessage
from riverbed.subscriptions.shardstate import (
    NAMESPACE,
    ShardState,
    add_done,
    load_state,
    load_states,
    state_key,
)
from riverbed.subscriptions.step import QueueRow


@dataclass(frozen=True, slots=True)
class Parked:
    stream: StreamId
    offset: int
    message: QueuedMessage

    def payload_fields(self) -> dict[str, object]:
        """Its payload (`payload` if UTF-8 text, else `payload_b64`) and its MQTT
        properties (bytes values in base64), for `dlq show` and the HTTP API."""
        m = self.message
        out: dict[str, object] = {}
        try:
            out["payload"] = m.payload.decode("utf-8")
        except UnicodeDecodeError:
            out["payload_b64"] = base64.b64encode(m.payload).decode()
        out["properties"] = [
            [k, v if not isinstance(v, bytes) else base64.b64encode(v).decode()]
            for k, v in m.properties
        ]
        return out


def parse_message_id(text: str) -> MessageId:
    """A message id as `dlq` commands and the HTTP API take it (32 hex digits)."""
    try:
        return MessageId.parse(text)
    except (InvalidInput, ValueError):
        raise InvalidInput(f"message id {text!r} is not a Riverbed message id") from None


def parked(
    storage: Storage,
    name: str,
    *,
    since_us: int | None = None,
    until_us: int | None = None,
    groups: Collection[str] = (),
    message_ids: Collection[MessageId] = (),
    limit: int = 50,
    page: int = 1,
) -> list[Parked]:
    """The parked messages of subscription `name` that match, page `page` of
    `limit` each (1-based). Raises `NotFound` if `name` does not deliver."""
    return parked_page(
        storage,
        name,
        since_us=since_us,
        until_us=until_us,
        groups=groups,
        message_ids=message_ids,
        limit=limit,
        page=page,
    )[0]


def parked_page(
    storage: Storage,
    name: str,
    *,
    since_us: int | None = None,
    until_us: int | None = None,
    groups: Collection[str] = (),
    message_ids: Collection[MessageId] = (),
    limit: int = 50,
    page: int = 1,
) -> tuple[list[Parked], int]:
    """`parked`'s page, and how many parked messages match in all."""
    if limit < 1 or page < 1:
        raise InvalidInput(f"limit {limit} and page {page} must be at least 1")
    Definitions(storage).require(name)
    _, dlq = queue_topics(name)
    given = since_us is not None or until_us is not None or bool(groups) or bool(message_ids)
    selection = Selection(not given, since_us, until_us, frozenset(groups), frozenset(message_ids))
    positions: dict[int, int] = {}
    done: dict[int, list[tuple[int, int]]] = {}
    for state in load_states(storage, name).values():
        positions.update(state.dlq_read)
        done.update(state.dlq_done)
    heads = storage.list_streams(dlq)
    streams = {head.key: head.stream for head in heads}
    rows, _ = open_rows(storage, heads, positions, done)  # not replayed or purged
    found = [
        Parked(streams[r.stream_key], r.offset, r.queued)
        for r in rows
        if selection.matches(r.queued)
    ]
    found.sort(key=_failure_order)
    start = (page - 1) * limit
    return found[start : start + limit], len(found)


def _failure_order(p: Parked) -> tuple[int, int, int, int]:
    return (p.message.failed_us, p.stream.generation, p.stream.partition, p.offset)


# --------------------------------------------------------------------- replay and purge


@dataclass(frozen=True, slots=True)
class Selection:
    """Which parked messages: everything, or those matching every criterion given."""

    everything: bool = False
    since_us: int | None = None
    until_us: int | None = None
    groups: frozenset[str] = frozenset()
    message_ids: frozenset[MessageId] = frozenset()

    def __post_init__(self) -> None:
        criteria = (self.since_us, self.until_us, self.groups or None, self.message_ids or None)
        given = any(c is not None for c in criteria)
        if self.everything == given:
            raise InvalidInput(
                "select the parked messages either with all (--all) or with since, until,"
                " groups or message ids (--since/--until/--group/--message-id), not both and"
                " not neither"
            )

    def matches(self, message: QueuedMessage) -> bool:
        if self.everything:
            return True
        if self.since_us is not None and message.failed_us < self.since_us:
            return False
        if self.until_us is not None and message.failed_us >= self.until_us:
            return False
        if self.groups and message.key not in self.groups:
            return False
        return not self.message_ids or message.message_id in self.message_ids


@dataclass(slots=True)
class DlqChange:
    """What a replay or a purge did."""

    selected: int = 0
    along: int = 0
    """Earlier parked messages of the selected ones' groups taken with them
    (grouped order: a group's parked messages leave the DLQ in order)."""
    message_ids: list[MessageId] = field(default_factory=list)

    def as_json(self, name: str, verb: str) -> dict[str, object]:
        """What `dlq replay|purge --json` print (`verb`: replayed, purged) and
        the HTTP API answers."""
        return {
            "subscription": name,
            verb: self.selected + self.along,
            "selected": self.selected,
            "earlier_of_their_groups": self.along,
            "message_ids": [str(m) for m in self.message_ids],
        }


MAX_CONFLICTS = 10


Progress = Callable[[int, int], None]
"""`(done, total)` shards replayed or purged so far."""


def replay(
    storage: Storage,
    name: str,
    selection: Selection,
    now_us: int | None = None,
    progress: Progress | None = None,
) -> DlqChange:
    """Write the selected parked messages back into the flow (the retry queue,
    first attempt, due now), in group order; see `DlqChange.along`."""
    return _change(storage, name, selection, replaying=True, now_us=now_us, progress=progress)


def purge(
    storage: Storage, name: str, selection: Selection, progress: Progress | None = None
) -> DlqChange:
    """Drop the selected parked messages (with `DlqChange.along`)."""
    return _change(storage, name, selection, replaying=False, now_us=None, progress=progress)


def check_change(storage: Storage, name: str, selection: Selection) -> None:
    """Refuse what `replay` and `purge` refuse before changing anything:
    `NotFound` if `name` does not deliver or a named message is not parked."""
    definition = Definitions(storage).require(name)
    if selection.message_ids:
        _, dlq_topic = queue_topics(name)
        count = definition.shard_count
        layout = QueueLayout(storage, dlq_topic, count)
        found = {
            r.queued.message_id
            for shard in range(count)
            for r in _open_rows(storage, layout.owned(shard), load_state(storage, name, shard)[0])
        }
        missing = sorted(str(m) for m in selection.message_ids - found)
        if missing:
            raise NotFound(f"message(s) {', '.join(missing)} are not parked in the DLQ of {name!r}")


def _open_rows(storage: Storage, owned: list[StreamHead], state: ShardState) -> list[QueueRow]:
    """The shard's parked rows not replayed or purged yet, in stream then offset order."""
    return open_rows(storage, owned, state.dlq_read, state.dlq_done)[0]


def _chosen(
    rows: list[QueueRow], selection: Selection, grouped: bool
) -> tuple[list[QueueRow], int]:
    """The selected rows and, grouped, each group's earlier rows (in DLQ order)."""
    selected = [r for r in rows if selection.matches(r.queued)]
    if not grouped:
        return selected, 0
    last: dict[str, tuple[int, int]] = {}
    for r in selected:
        if r.queued.key is not None:
            last[r.queued.key] = (r.generation, r.offset)
    picked = {id(r) for r in selected}
    chosen = [
        r
        for r in rows
        if id(r) in picked
        or (r.queued.key in last and (r.generation, r.offset) <= last[r.queued.key])
    ]
    return chosen, len(chosen) - len(selected)


def _change(
    storage: Storage,
    name: str,
    selection: Selection,
    *,
    replaying: bool,
    now_us: int | None,
    progress: Progress | None,
) -> DlqChange:
    check_change(storage, name, selection)  # every named message must be parked
    definition, definition_version = Definitions(storage).require_versioned(name)
    rq_topic, dlq_topic = queue_topics(name)
    count = definition.shard_count
    if progress is not None:
        progress(0, count)
    out = DlqChange()
    ids = MessageIdGenerator()
    for shard in range(count):
        for _attempt in range(MAX_CONFLICTS):
            now = current_us() if now_us is None else now_us
            state, version = load_state(storage, name, shard)
            owned = QueueLayout(storage, dlq_topic, count).owned(shard)
            rows = _open_rows(storage, owned, state)
            chosen, along = _chosen(rows, selection, definition.grouped)
            if not chosen:
                break
            writer = QueueLayout(storage, rq_topic, count).writer(shard, ids, now)
            states = state.groups
            for r in chosen:
                q = r.queued
                if replaying:
                    again = replace(q, attempt=1, due_us=now, reason=f"replayed ({q.reason})")
                    generation, offset = writer.write(again)
                    if definition.grouped and q.key is not None:
                        at = MessageState(q.main_topic_idx, q.main_offset, generation, offset)
                        states.queued(Queue.RQ, q.key, at)
                if definition.grouped and q.key is not None:
                    states.finished(Queue.DLQ, q.key, r.at)
            done: dict[int, set[int]] = {}
            for r in chosen:
                done.setdefault(r.stream_key, set()).add(r.offset)
            for head in owned:
                if head.key in done:
                    start = max(state.dlq_read.get(head.key, head.start_offset), head.start_offset)
                    state.dlq_read[head.key], state.dlq_done[head.key] = add_done(
                        start, state.dlq_done.get(head.key, []), done[head.key]
                    )
            if replaying:
                state.next_due_us = now
            try:
                with transaction(storage) as tx:
                    doing = "replaying its DLQ" if replaying else "purging its DLQ"
                    hold_definition(tx, name, definition_version, shard, doing)
                    marker = f"dlq/{name}/{shard}/{uuid.uuid4().hex}"
                    firsts = append_once_in(tx, marker, writer.batches)
                    if firsts != writer.expected_firsts():
                        raise Superseded("the retry queue moved")
                    if not kv_put_in(
                        tx, NAMESPACE, state_key(name, shard), state.to_json(), version
                    ):
                        raise Superseded("the shard's state moved")
                    delete_marker_in(tx, marker)
            except Superseded:
                continue  # a running batch committed meanwhile: read again
            out.selected += len(chosen) - along
            out.along += along
            out.message_ids.extend(r.queued.message_id for r in chosen)
            break
        else:
            raise Superseded(
                f"shard {shard} of {name!r} kept changing: {MAX_CONFLICTS} attempts failed"
            )
        if progress is not None:
            progress(shard + 1, count)
    return out
