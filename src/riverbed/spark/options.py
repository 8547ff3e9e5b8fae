"""The `riverbed` data source's options: strings in, checked once, frozen out.

Spark hands a data source its options as strings (case-insensitive names). We
check every one when the source is created, on the driver, so a typo fails the
query before it starts with a message that names the option; readers and
writers get the frozen result (picklable, so workers receive it as is).

- `db` (all): database URL; default `$RIVERBED_DB`, else the embedded default.
- `topic` (batch read, write; required): the topic to read or write.
- `subscription` (streaming read; required): the named subscription to read.
- `filter`, `key` (batch read): only messages whose MQTT topic the filter
  matches / with this key (a streaming read uses the subscription's filter).
- `startTime`, `endTime` (batch read): only messages with a timestamp in
  `[start, end)`; ISO 8601 (UTC when no zone is given) or µs since the epoch.
- `startingOffsets`, `endingOffsets` (batch read): JSON
  `{"topic/generation/partition": offset}`; streams left out read from the
  earliest retained / up to the latest message.
- `ordering` (streaming read): `strict` (default): lineage order across
  generations; `relaxed`: every stream at once, order within a stream only.
- `maxMessagesPerTrigger` (streaming read): admission control, at most this many
  messages per micro-batch.
- `maxMessagesPerPartition` (reads): at most this many messages per Spark task
  (default 250000).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from riverbed.errors import InvalidConfig, InvalidInput
from riverbed.model import StreamId
from riverbed.storage import StorageUrl, default_url
from riverbed.topics.filters import validate_filter

DEFAULT_PARTITION_MESSAGES = 250_000

MASTER_ENV = "RIVERBED_SPARK_MASTER"
"""Set by `session()` before Spark's JVM starts, so the processes that plan the
`riverbed` source's reads and writes (children of that JVM) know whether the
tasks may run on other machines (`check_shared_storage`)."""


def is_local(master: str | None) -> bool:
    """Whether every task of a session with this master runs on this machine."""
    return master is None or master == "local" or master.startswith("local[")


def check_shared_storage(db: str | StorageUrl, where: str | None) -> None:
    """Refuse a SQLite database for Spark tasks that may run on other machines.

    `where` is the master (`spark://...`) or Connect URL (`sc://...`) the tasks
    run under; `None` or `local[...]` is this machine, where a SQLite file is
    fine. A Connect server on loopback is this machine too: its own master
    decides (the delivery job asks it).
    """
    url = db if isinstance(db, StorageUrl) else StorageUrl.parse(db)
    if is_local(where) or not url.is_sqlite:
        return
    raise InvalidInput(
        f"the database {url.shown!r} is a SQLite file, which the machines of the Spark cluster at"
        f" {where} cannot share: use PostgreSQL (postgresql://...) with a master other than"
        " local[...]"
    )


def _db(options: Mapping[str, str]) -> str:
    """The `db` option (or the default), refused for a cluster if it is SQLite."""
    db = options.get("db") or default_url()
    check_shared_storage(db, os.environ.get(MASTER_ENV))
    return db


_KNOWN = {
    "db",
    "topic",
    "subscription",
    "filter",
    "key",
    "starttime",
    "endtime",
    "startingoffsets",
    "endingoffsets",
    "ordering",
    "maxmessagespertrigger",
    "maxmessagesperpartition",
    # Spark adds these itself to a writer's options.
    "path",
    "checkpointlocation",
}


class Ordering(Enum):
    STRICT = "strict"
    """A stream of generation g+1 is planned only once the streams of generation g
    it waits for (`riverbed.log.lineage`) are consumed: per-key order across
    micro-batches survives AddStorageTopic + SwitchProduce."""
    RELAXED = "relaxed"
    """Every stream is read at once; order holds within a stream only."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """A batch read's options."""

    db: str
    topic: str
    topic_filter: str | None
    key: str | None
    since_us: int | None
    until_us: int | None
    starting: Mapping[str, int]
    ending: Mapping[str, int]
    partition_messages: int


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """A streaming read's options."""

    db: str
    subscription: str
    ordering: Ordering
    max_per_trigger: int | None
    partition_messages: int


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """A write's options."""

    db: str
    topic: str


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    out = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    unknown = sorted(set(out) - _KNOWN)
    if unknown:
        raise InvalidConfig(
            f"riverbed data source: unknown option(s) {unknown}; known: db, topic,"
            " subscription, filter, key, startTime, endTime, startingOffsets, endingOffsets,"
            " ordering, maxMessagesPerTrigger, maxMessagesPerPartition"
        )
    return out


def _required(options: Mapping[str, str], name: str, spelled: str) -> str:
    value = options.get(name, "").strip()
    if not value:
        raise InvalidConfig(f"riverbed data source: option {spelled!r} is required")
    return value


def _positive(options: Mapping[str, str], name: str, spelled: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise InvalidConfig(f"option {spelled}={text!r} must be a whole number of at least 1")
    return int(text)


def parse_time(text: str, spelled: str) -> int:
    """ISO 8601 (a time without zone is UTC) or an integer of µs since the epoch."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidConfig(
            f"option {spelled}={text!r} is neither an ISO 8601 time nor µs since the epoch"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def parse_offsets(text: str, spelled: str) -> dict[str, int]:
    """`{"topic/generation/partition": offset}` with offsets >= 0; keys normalised."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise InvalidConfig(f"option {spelled} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidConfig(
            f'option {spelled} must be a JSON object {{"topic/generation/partition": offset}}'
        )
    out: dict[str, int] = {}
    for name, offset in raw.items():
        try:
            stream = StreamId.parse(name)
        except ValueError as exc:
            raise InvalidConfig(f"option {spelled}: {exc}") from None
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidConfig(f"option {spelled}: offset {offset!r} for {name} must be >= 0")
        out[str(stream)] = offset
    return out


def read_options(options: Mapping[str, str]) -> ReadOptions:
    o = _lower(options)
    for name, spelled in (
        ("subscription", "subscription"),
        ("ordering", "ordering"),
        ("maxmessagespertrigger", "maxMessagesPerTrigger"),
    ):
        if name in o:
            raise InvalidConfig(
                f"option {spelled!r} is for streaming reads (spark.readStream); a batch read"
                " takes a topic"
            )
    topic_filter = o.get("filter")
    if topic_filter is not None:
        validate_filter(topic_filter)
    since = parse_time(o["starttime"], "startTime") if "starttime" in o else None
    until = parse_time(o["endtime"], "endTime") if "endtime" in o else None
    return ReadOptions(
        db=_db(o),
        topic=_required(o, "topic", "topic"),
        topic_filter=topic_filter,
        key=o.get("key"),
        since_us=since,
        until_us=until,
        starting=parse_offsets(o["startingoffsets"], "startingOffsets")
        if "startingoffsets" in o
        else {},
        ending=parse_offsets(o["endingoffsets"], "endingOffsets") if "endingoffsets" in o else {},
        partition_messages=_positive(o, "maxmessagesperpartition", "maxMessagesPerPartition")
        or DEFAULT_PARTITION_MESSAGES,
    )


def stream_options(options: Mapping[str, str]) -> StreamOptions:
    o = _lower(options)
    for name, spelled in (
        ("topic", "topic"),
        ("filter", "filter"),
        ("key", "key"),
        ("starttime", "startTime"),
        ("endtime", "endTime"),
        ("startingoffsets", "startingOffsets"),
        ("endingoffsets", "endingOffsets"),
    ):
        if name in o:
            raise InvalidConfig(
                f"option {spelled!r} is for batch reads; a streaming read takes its topic,"
                " filter and start from the subscription"
            )
    ordering_text = o.get("ordering", "strict").strip().lower()
    try:
        ordering = Ordering(ordering_text)
    except ValueError:
        raise InvalidConfig(
            f"option ordering={ordering_text!r} must be strict or relaxed"
        ) from None
    return StreamOptions(
        db=_db(o),
        subscription=_required(o, "subscription", "subscription"),
        ordering=ordering,
        max_per_trigger=_positive(o, "maxmessagespertrigger", "maxMessagesPerTrigger"),
        partition_messages=_positive(o, "maxmessagesperpartition", "maxMessagesPerPartition")
        or DEFAULT_PARTITION_MESSAGES,
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    o = _lower(options)
    return WriteOptions(db=_db(o), topic=_required(o, "topic", "topic"))
