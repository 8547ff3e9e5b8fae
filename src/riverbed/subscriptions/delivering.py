"""Creating and deleting a subscription that delivers to an endpoint (issue 7).

Such a subscription is four things, made together or not at all:

- the named subscription (`cursors.Subscriptions`): its progress on the main topic;
- its retry queue `NAME.rq` and dead-letter queue `NAME.dlq`, composite topics
  of their own with partition counts that are multiples of the shard count
  (`shards.queue_partitions`); the dead-letter queue keeps its messages until
  they are replayed or purged (no time retention);
- its `DeliveryDefinition` (`definition.py`).

Everything is checked before anything is written (the name, the main topic,
the shard count against every generation of it, the queues' names and
partition counts, that none of the four exists yet); if a write still fails
(another process created one of them meanwhile), what was written is removed
again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

from riverbed.errors import AlreadyExists, NotFound, RiverbedError
from riverbed.log.topics import Topics, validate_topic_name
from riverbed.storage.base import StartKind, Storage
from riverbed.subscriptions.cursors import Start, Subscriptions, validate_subscription_name
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition, not_delivering
from riverbed.subscriptions.shards import queue_partitions, validate_shard_count
from riverbed.subscriptions.shardstate import delete_states


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
) -> DeliveryDefinition:
    """Create the subscription, its queues and its definition; return the
    definition as stored (queue partition counts filled in)."""
    name = definition.name
    validate_subscription_name(name)
    topics = Topics(storage)
    validate_shard_count(
        definition.shard_count, storage.list_storage_topics(definition.topic)
    )  # TopicNotFound
    stored = replace(
        definition,
        rq_partitions=queue_partitions(definition.shard_count, definition.rq_partitions),
        dlq_partitions=queue_partitions(definition.shard_count, definition.dlq_partitions),
    )
    rq, dlq = queue_topics(name)
    for topic in (rq, dlq):
        validate_topic_name(topic)
    for topic in (rq, dlq):
        if _exists(storage.get_topic, topic):
            raise AlreadyExists(f"topic {topic!r} exists already: subscription {name!r} needs it")
    subscriptions = Subscriptions(storage)
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
