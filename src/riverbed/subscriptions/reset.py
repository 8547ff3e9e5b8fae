"""Offset reset of a delivering subscription (seed 003 "Subscription's
Offset Reset").

- The main topic can be rewound or fast-forwarded (`reset_main`: to the
  earliest message, the heads, a time, or offsets, across storage topics).
  A rewind may bring back generations the shard count does not divide: that
  is a shard-count change (`shards=`: the cursors move, then
  `reshard.change_shard_count`); without one it is refused, naming the
  counts that fit. A running job's shards read from the cursors, so they
  follow at their next batch.
- The retry and dead-letter queues are only fast-forwarded
  (`fast_forward_queue`: to their heads or to a time): the rows passed over
  count as consumed without delivery, as a purge does — each group's
  GroupState moves over them (released when nothing of it is left), a head
  waiting to be retried that is passed over is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from riverbed.errors import InvalidInput, Superseded
from riverbed.model import StreamId
from riverbed.storage.base import StartKind, Storage
from riverbed.storage.transactions import kv_put_in, transaction
from riverbed.subscriptions.batch import QueueLayout, queue_rows
from riverbed.subscriptions.committed import refuse_broker_owned
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition, hold_definition
from riverbed.subscriptions.groups import Action, Queue
from riverbed.subscriptions.named import Start, Subscriptions
from riverbed.subscriptions.provisioning import queue_topics
from riverbed.subscriptions.reshard import Progress, change_shard_count
from riverbed.subscriptions.shardstate import NAMESPACE, add_done, is_done, load_state, state_key
from riverbed.subscriptions.splitting import check_shard_count

MAX_CONFLICTS = 10


@dataclass(frozen=True, slots=True)
class ResetDone:
    """What `reset_subscription` did: the main topic's new cursors, or how many
    rows of a queue were passed over."""

    name: str
    queue: Queue | None
    """None: the main topic."""
    offsets: dict[StreamId, int] = field(default_factory=dict)
    passed_over: int = 0

    def as_json(self) -> dict[str, object]:
        """What `subscription reset --json` prints and an API job's result is."""
        if self.queue is None:
            return {
                "subscription": self.name,
                "offsets": {str(k): v for k, v in self.offsets.items()},
            }
        return {
            "subscription": self.name,
            "queue": self.queue.value,
            "passed_over": self.passed_over,
        }


def check_reset(
    storage: Storage,
    name: str,
    to: Start | Mapping[StreamId, int],
    queue: Queue | None = None,
    shards: int | None = None,
) -> bool:
    """Refuse a reset `reset_subscription` would refuse, changing nothing:
    `SubscriptionNotFound`, `InvalidInput` (a bad target, a queue or shard
    count for a subscription that does not deliver, shards that cannot
    split what the target brings back, a cursor the broker owns). Returns
    whether it delivers."""
    refuse_broker_owned(name, "reset")
    delivering = Definitions(storage).get(name) is not None
    if not delivering:
        Subscriptions(storage).get(name)  # SubscriptionNotFound
        if queue is not None or shards is not None:
            raise InvalidInput(
                "a queue (rq, dlq) and a shard count are for a subscription that delivers;"
                f" {name!r} does not"
            )
    if queue is not None:
        if isinstance(to, Mapping):
            raise InvalidInput(
                f"the {queue.value} of {name!r} only moves forward: to latest or to a time"
            )
        return delivering
    planned = Subscriptions(storage).plan_reset(name, to)
    if delivering:
        definition = Definitions(storage).require(name)
        count = definition.shard_count if shards is None else shards
        check_shard_count(storage, definition, count, planned)
    return delivering


def reset_subscription(
    storage: Storage,
    name: str,
    to: Start | Mapping[StreamId, int],
    queue: Queue | None = None,
    shards: int | None = None,
    progress: Progress | None = None,
) -> ResetDone:
    """Move subscription `name`'s main-topic cursors (`reset_main` for one
    that delivers, with a shard-count change if `shards` differs), or move its
    retry or dead-letter `queue` forward (`fast_forward_queue`). What
    `riverbed subscription reset` and `POST /subscriptions/{name}/reset` do;
    `check_reset` says first what it refuses."""
    delivering = check_reset(storage, name, to, queue, shards)
    if queue is not None:
        assert not isinstance(to, Mapping)
        return ResetDone(name, queue, passed_over=fast_forward_queue(storage, name, queue, to))
    if delivering:
        return ResetDone(name, None, reset_main(storage, name, to, shards, progress))
    return ResetDone(name, None, Subscriptions(storage).reset(name, to))


def reset_main(
    storage: Storage,
    name: str,
    to: Start | Mapping[StreamId, int],
    shards: int | None = None,
    progress: Progress | None = None,
) -> dict[StreamId, int]:
    """Move the main-topic cursors (see the module docstring); returns them.
    `progress` hears of the shard-count change, if there is one."""
    definition = Definitions(storage).require(name)
    subscriptions = Subscriptions(storage)
    planned = subscriptions.plan_reset(name, to)  # bad targets raise here
    count = definition.shard_count if shards is None else shards
    check_shard_count(storage, definition, count, planned)
    after = subscriptions.reset(name, to)
    if count != definition.shard_count:
        change_shard_count(storage, name, count, progress)
    return after


def fast_forward_queue(storage: Storage, name: str, queue: Queue, to: Start) -> int:
    """Move every shard's reading of the retry (`Queue.RQ`) or dead-letter
    queue forward to its heads (`StartKind.LATEST`) or to the first row at or
    after a time (µs); returns how many rows were passed over."""
    if isinstance(to, StartKind) and to is not StartKind.LATEST:
        raise InvalidInput(
            f"the {queue.value} of {name!r} can only be fast-forwarded: to latest or to a time"
            " (seed 003: retry and dead-letter queues do not rewind)"
        )
    if isinstance(to, int) and not isinstance(to, bool) and to < 0:
        raise InvalidInput(f"time {to}us is before the epoch")
    definition, definition_version = Definitions(storage).require_versioned(name)
    rq_topic, dlq_topic = queue_topics(name)
    topic = rq_topic if queue is Queue.RQ else dlq_topic
    passed = 0
    for shard in range(definition.shard_count):
        for _attempt in range(MAX_CONFLICTS):
            try:
                passed += _forward_shard(
                    storage, definition, definition_version, shard, topic, queue, to
                )
                break
            except Superseded:
                continue
        else:
            raise Superseded(f"shard {shard} of {name!r} kept changing; stop its job and retry")
    return passed


def _forward_shard(
    storage: Storage,
    definition: DeliveryDefinition,
    definition_version: int,
    shard: int,
    topic: str,
    queue: Queue,
    to: Start,
) -> int:
    state, version = load_state(storage, definition.name, shard)
    owned = QueueLayout(storage, topic, definition.shard_count).owned(shard)
    reading = state.rq_read if queue is Queue.RQ else state.dlq_read
    done_sets = state.rq_done if queue is Queue.RQ else state.dlq_done
    groups = state.groups.rq if queue is Queue.RQ else state.groups.dlq
    passed = 0
    for head in owned:
        position = max(reading.get(head.key, head.start_offset), head.start_offset)
        if to is StartKind.LATEST:
            target = head.next_offset
        else:
            assert isinstance(to, int)
            target = max(head.start_offset, storage.first_offset_at(head.key, to))
        if target <= position:
            continue
        done = done_sets.get(head.key, [])
        for row in queue_rows(storage, head, position, target - 1):
            if is_done(row.offset, position, done):
                continue
            passed += 1
            group = row.queued.key
            if group is None or group not in groups:
                continue
            if queue is Queue.RQ and state.groups.read(group, row.at) is Action.SKIP:
                state.groups.skipped(group, row.at)  # a superseded copy
            else:
                state.groups.finished(queue, group, row.at)
            retry = state.retries.get(group)
            if queue is Queue.RQ and retry is not None and retry.internal == row.at.internal:
                del state.retries[group]
        reading[head.key], done_sets[head.key] = add_done(target, done, set())
    if not passed:
        return 0
    with transaction(storage) as tx:
        doing = f"fast-forwarding its {queue.value}"
        hold_definition(tx, definition.name, definition_version, shard, doing)
        if not kv_put_in(
            tx, NAMESPACE, state_key(definition.name, shard), state.to_json(), version
        ):
            raise Superseded("the shard's state moved")
    return passed
