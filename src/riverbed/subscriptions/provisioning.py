"""Creating and deleting a subscription that delivers to an endpoint.

Such a subscription is four things, made together or not at all:

- the named subscription (`cursors.Subscriptions`): its progress on the main topic;
- its retry queue `NAME.rq` and dead-letter queue `NAME.dlq`, composite topics
  of their own with partition counts that are multiples of the shard count
  (`shards.queue_partitions`); the dead-letter queue keeps its messages until
  they are replayed or purged (no time retention);
- its `DeliveryDefinition` (`definition.py`).

Everything is checked before anything is written (the name, the main topic,
the filter against its binding, the shard count against the generations it
will read (`splitting`), the queues' names and
partition counts, that none of the four exists yet); if a write still fails
(another process created one of them meanwhile), what was written is removed
again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import NamedTuple

from riverbed.errors import AlreadyExists, NotFound, RiverbedError
from riverbed.log.topics import Topics, validate_topic_name
from riverbed.storage.base import StartKind, Storage, SubscriptionRecord
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition, not_delivering
from riverbed.subscriptions.named import (
    Start,
    Subscriptions,
    check_filter,
    initial_positions,
    same_settings,
    validate_subscription_name,
)
from riverbed.subscriptions.shards import queue_partitions
from riverbed.subscriptions.shardstate import delete_states
from riverbed.subscriptions.splitting import check_shard_count


def _exists(get: Callable[[str], object], name: str) -> bool:
    try:
        get(name)
    except NotFound:
        return False
    return True


def queue_topics(name: str) -> tuple[str, str]:
    """The retry and dead-letter queue topics of subscription `name`."""
    return f"{name}.rq", f"{name}.dlq"


def create_delivering(
    storage: Storage,
    definition: DeliveryDefinition,
    *,
    topic_filter: str | None = None,
    start: Start = StartKind.EARLIEST,
    exist_ok: bool = False,
) -> DeliveryDefinition:
    """Create the subscription, its queues and its definition; return the
    definition as stored (queue partition counts filled in).

    With `exist_ok`, a subscription that exists already with these very
    settings (topic, filter, start and definition) is returned as it is; one
    with other settings raises `AlreadyExists` naming them."""
    name = definition.name
    validate_subscription_name(name)
    topics = Topics(storage)
    check_filter(storage, definition.topic, topic_filter)  # TopicNotFound
    stored = replace(
        definition,
        rq_partitions=queue_partitions(definition.shard_count, definition.rq_partitions),
        dlq_partitions=queue_partitions(definition.shard_count, definition.dlq_partitions),
    )
    subscriptions = Subscriptions(storage)
    if exist_ok and _exists(subscriptions.get, name):
        return _reuse(storage, stored, topic_filter, start)
    # The same rule as for a shard-count change, from where it starts.
    starts = initial_positions(storage, start, storage.list_streams(definition.topic))
    check_shard_count(storage, definition, definition.shard_count, starts)
    rq, dlq = queue_topics(name)
    for topic in (rq, dlq):
        validate_topic_name(topic)
    for topic in (rq, dlq):
        if _exists(storage.get_topic, topic):
            raise AlreadyExists(f"topic {topic!r} exists already: subscription {name!r} needs it")
    if _exists(subscriptions.get, name):
        raise AlreadyExists(f"subscription {name!r} exists already")
    definitions = Definitions(storage)
    if definitions.get(name) is not None:
        raise AlreadyExists(f"subscription {name!r} delivers to an endpoint already")

    undo: list[Callable[[], object]] = []
    try:
        subscriptions.create(name, definition.topic, topic_filter, start)
        undo.append(lambda: subscriptions.delete(name))
        assert stored.rq_partitions is not None and stored.dlq_partitions is not None
        topics.create(rq, stored.rq_partitions, retention_us=None)
        undo.append(lambda: topics.delete(rq))
        topics.create(dlq, stored.dlq_partitions, retention_us=None)
        undo.append(lambda: topics.delete(dlq))
        definitions.create(stored)
    except BaseException:
        for step in reversed(undo):
            with contextlib.suppress(RiverbedError):
                step()
        raise
    return stored


class Created(NamedTuple):
    """What `create_subscription` did."""

    existed: bool
    """It existed already with these very settings (`exist_ok`): nothing written."""
    delivery: DeliveryDefinition | None
    """As stored (queue partition counts filled in); None: it does not deliver."""


def create_subscription(
    storage: Storage,
    name: str,
    topic: str,
    *,
    topic_filter: str | None = None,
    start: Start = StartKind.EARLIEST,
    delivery: DeliveryDefinition | None = None,
    exist_ok: bool = False,
) -> Created:
    """Create subscription `name` on `topic`: a plain one (`cursors.Subscriptions`),
    or, with `delivery`, one that delivers (`create_delivering`). What
    `riverbed subscription create` and `POST /subscriptions` do.

    With `exist_ok`, one with these very settings is reused (`Created.existed`);
    a plain request never reuses one that delivers, nor the other way round."""
    existed = exist_ok and _exists(Subscriptions(storage).get, name)
    if delivery is not None:
        stored = create_delivering(
            storage, delivery, topic_filter=topic_filter, start=start, exist_ok=exist_ok
        )
        return Created(existed, stored)
    if existed and Definitions(storage).get(name) is not None:
        raise AlreadyExists(
            f"subscription {name!r} exists already and delivers to an endpoint; not reusing it"
        )
    Subscriptions(storage).create(name, topic, topic_filter, start, exist_ok=exist_ok)
    return Created(existed, None)


def _reuse(
    storage: Storage, wanted: DeliveryDefinition, topic_filter: str | None, start: Start
) -> DeliveryDefinition:
    """The existing definition of `wanted.name` if the subscription has
    `wanted`'s settings, else `AlreadyExists` naming what differs."""
    name = wanted.name
    kind, start_us = (start, None) if isinstance(start, StartKind) else (StartKind.TIME, start)
    existing = Definitions(storage).get(name)
    if existing is None:
        raise AlreadyExists(
            f"subscription {name!r} exists already and does not deliver to an endpoint;"
            " not reusing it"
        )
    same_settings(
        Subscriptions(storage).get(name),
        SubscriptionRecord(name, wanted.topic, topic_filter, kind, start_us, 0),
    )
    differ = _differences(existing, wanted)
    if differ:
        raise AlreadyExists(
            f"subscription {name!r} exists already with other settings: {', '.join(differ)};"
            " not reusing it"
        )
    return existing


def _differences(have: object, asked: object, prefix: str = "") -> list[str]:
    """`field value (asked value)` for each field of two dataclasses that
    differs, nested ones (the retry policy...) field by field."""
    out: list[str] = []
    for f in fields(have):  # type: ignore[arg-type]
        a, b = getattr(have, f.name), getattr(asked, f.name)
        if a == b:
            continue
        if is_dataclass(a) and type(a) is type(b):
            out += _differences(a, b, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name} {a!r} (asked {b!r})")
    return out


def delete_delivering(storage: Storage, name: str) -> None:
    """Delete the definition, the shards' state, the queues (with their
    messages) and the subscription."""
    definitions = Definitions(storage)
    if definitions.get(name) is None:
        raise not_delivering(storage, name)
    definitions.delete(name)
    delete_states(storage, name)
    storage.delete_markers_with_prefix(f"delivery/{name}/")
    topics = Topics(storage)
    for topic in queue_topics(name):
        with contextlib.suppress(NotFound):
            topics.delete(topic)
    with contextlib.suppress(NotFound):
        Subscriptions(storage).delete(name)


def delete_subscription(storage: Storage, name: str) -> None:
    """Delete subscription `name` with its offsets, and, if it delivers, its
    definition and queues (`delete_delivering`). `SubscriptionNotFound`."""
    if Definitions(storage).get(name) is not None:
        delete_delivering(storage, name)
    else:
        Subscriptions(storage).delete(name)
