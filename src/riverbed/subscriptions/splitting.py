"""Which generations of its main topic a delivering subscription's shard count
must split (seed 003: every shard owns the same number of partitions of every
generation it reads).

One rule for `subscription create`, `reshard`, `reset --shards` and
`topic switch-produce`: the shard count divides the partition count of every
generation the subscription still reads (a stream with messages past its
cursor), of the one producers write to, and of every generation added after
that one (producers write there after the next SwitchProduce). Generations it
has read to the end no longer matter (seed 003's second case of
ChangeShardCount: a topic grown to a count the old shards cannot split).

A generation added with `add-storage-topic` that the shard count does not
divide is allowed: nothing is written there yet. Switching producers to it is
refused until the subscription is re-sharded to a count that divides it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from riverbed.log.topics import Topics
from riverbed.storage.base import Storage, TopicRecord
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition
from riverbed.subscriptions.shards import InvalidShardCount


def live_generations(
    storage: Storage, name: str, topic: str, cursors: Mapping[int, int] | None = None
) -> dict[int, str]:
    """{generation: why it counts} for the main topic's generations the
    subscription still reads (from its cursors, or from `cursors`), producers
    write to, or producers will write to after a SwitchProduce."""
    record = storage.get_topic(topic)
    generations = storage.list_storage_topics(topic)
    if cursors is None:
        cursors = storage.get_cursors(name)
    live: dict[int, str] = {}
    for head in storage.list_streams(topic):
        if cursors.get(head.key, head.start_offset) < head.next_offset:
            live[head.stream.generation] = f"which subscription {name!r} still reads"
    live[generations[record.produce_pointer].generation] = "which producers write to"
    for pending in generations[record.produce_pointer + 1 :]:
        live[pending.generation] = (
            "which producers will write to after `riverbed topic switch-produce`"
        )
    return dict(sorted(live.items()))


def check_shard_count(
    storage: Storage,
    definition: DeliveryDefinition,
    count: object,
    cursors: Mapping[int, int] | None = None,
) -> int:
    """`count` if it divides every live generation's partition count (live
    from the subscription's cursors, or from `cursors`), else
    `InvalidShardCount` naming the generation, its partitions and the counts
    that would do."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidShardCount(f"shard count {count!r} must be a positive integer")
    sizes = {st.generation: st.partitions for st in storage.list_storage_topics(definition.topic)}
    live = live_generations(storage, definition.name, definition.topic, cursors)
    for generation, why in live.items():
        if sizes[generation] % count:
            raise InvalidShardCount(
                f"shard count {count} does not divide the {sizes[generation]} partitions of"
                f" topic {definition.topic!r} generation {generation}, {why}: every shard"
                " must own the same number of partitions of every generation it reads;"
                f" choose one of {_fitting(sizes[g] for g in live)}"
            )
    return count


def check_switch_produce(storage: Storage, topic: str) -> None:
    """Refuse a SwitchProduce of `topic` to a generation the shard count of a
    subscription delivering it does not divide (`InvalidShardCount`);
    `TopicNotFound`."""
    record = storage.get_topic(topic)
    generations = storage.list_storage_topics(topic)
    if record.produce_pointer + 1 >= len(generations):
        return  # nothing to switch to
    target = generations[record.produce_pointer + 1]
    for definition in Definitions(storage).list():
        if definition.topic != topic or target.partitions % definition.shard_count == 0:
            continue
        sizes = {st.generation: st.partitions for st in generations}
        live = live_generations(storage, definition.name, topic)
        raise InvalidShardCount(
            f"not switching topic {topic!r} to generation {target.generation}: subscription"
            f" {definition.name!r} delivers with {definition.shard_count} shards, which do"
            f" not divide its {target.partitions} partitions (every shard must own the same"
            " number of partitions of every generation it reads); first run `riverbed"
            f" subscription reshard {definition.name} --shards N` with N one of"
            f" {_fitting(sizes[g] for g in live)}"
        )


def switch_produce(topics: Topics, topic: str) -> TopicRecord:
    """seed 003 SwitchProduce of `topic`, refused (`check_switch_produce`) when a
    subscription's shard count does not divide the generation producers would
    write to. What `riverbed topic switch-produce` and the HTTP API do."""
    check_switch_produce(topics.storage, topic)
    return topics.switch_produce(topic)


def _fitting(partition_counts: Iterable[int]) -> list[int]:
    """The shard counts dividing every one of `partition_counts`."""
    counts = list(partition_counts)
    return [n for n in range(1, min(counts) + 1) if all(p % n == 0 for p in counts)]
