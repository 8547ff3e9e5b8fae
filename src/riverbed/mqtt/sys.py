"""`$SYS/broker/...`: the broker's status as MQTT topics, like mosquitto's.

Every `[sys] interval` seconds (10; 0: never) the broker publishes its
counters under `$SYS/broker/` (the list is `SysState.update`; docs/broker.md
has it with what each value means). Each is a retained QoS 0 message, so
a client that subscribes `$SYS/#` gets the current values at once, and
then each new value as it is published. Only values that changed since the
last update are published (all of them at the start): an idle broker
publishes little more than its uptime.

Where the messages go: through the log, like any PUBLISH, into the built-in
topic `sys` (one partition, binding `$SYS/#`), which keeps at most
`SYS_MAX_MESSAGES` messages for at most `SYS_RETENTION_US`, read or not
(retention policy `expired`, a `max_messages` limit): the fan-out
delivers them to online sessions, and an offline session is never owed more
than that. The broker's retention thread applies that limit; with
retention off (`[retention] interval = 0`) this task applies it to `sys`
after each update, so `$SYS` never grows the log without bound. The retained
copies (`mqtt/retained.py`) are one per topic name, written over.

A client may not publish to `$SYS` (`is_sys_topic`; MQTT 5.0 §4.7.2: topic
names starting with `$` are the server's): `mqtt/inbound.py` refuses it as
not authorized. Reading is under the ACL like any topic: a client needs to
be allowed to subscribe `$SYS/#`. Filters starting with a wildcard (`#`,
`+/...`) do not match `$SYS` names [MQTT-4.7.2-1] (`topics/filters.py`).

The counters are per broker process (node), the very ints its Prometheus
metrics read (`Broker.counts`, `riverbed.metrics.Counts`): `messages/sent` is
`riverbed_publish_sent_total` summed over QoS, `bytes/...` are
`riverbed_received_bytes_total` and `riverbed_sent_bytes_total`. The session,
subscription and retained counts are read from the database, so with several
nodes on one PostgreSQL they count every node's, and each node publishes its
own values under the same names (the last one written is what a new
subscriber gets).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from riverbed.clock import now_us
from riverbed.errors import AlreadyExists, BindingOverlap, RiverbedError, TopicNotFound
from riverbed.log.retention import apply_retention
from riverbed.log.topics import KeyKind, KeyMode
from riverbed.model import Message, StreamId
from riverbed.mqtt.messages import committed_runs
from riverbed.mqtt.ports import Services
from riverbed.mqtt.retained import NAMESPACE as RETAINED_NAMESPACE
from riverbed.storage.base import RetentionPolicy

log = logging.getLogger(__name__)

SYS_PREFIX = "$SYS"
SYS_TOPIC = "sys"
"""The built-in log topic that stores `$SYS/...` messages."""
SYS_BINDING = "$SYS/#"
SYS_MAX_MESSAGES = 1000
"""Messages the `sys` topic keeps at most: a few minutes of updates at the
default interval, enough for a session that was away a moment to catch up."""
SYS_RETENTION_US = 3600 * 1_000_000
"""An hour: what is older goes, read or not."""
LOAD_WINDOWS = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))
"""The load averages' names and time constants (seconds), mosquitto's."""


def is_sys_topic(topic: str) -> bool:
    """A topic name in the broker's `$SYS` tree, where clients may not publish."""
    return topic == SYS_PREFIX or topic.startswith(SYS_PREFIX + "/")


def broker_version() -> str:
    try:
        return f"riverbed {importlib.metadata.version('riverbed')}"
    except importlib.metadata.PackageNotFoundError:
        return "riverbed"


@dataclass(frozen=True, slots=True)
class Counters:
    """What the broker counted, read at one moment (`now`, monotonic seconds)."""

    now: float
    connected: int
    sessions: int
    """Session records, online and offline (every node's)."""
    disconnected: int
    """Session records whose client is not connected (every node's)."""
    subscriptions: int
    retained: int
    messages_received: int
    messages_sent: int
    bytes_received: int
    bytes_sent: int
    connections: int
    """Connections accepted since the start."""
    dropped: int
    """QoS 0 messages dropped for slow clients (`Counts.qos0_dropped`)."""


@dataclass(slots=True)
class Load:
    """A rate per minute, damped exponentially over a time constant, as
    mosquitto's (and a Unix load average): each update moves it towards the
    rate of the last interval by `1 - exp(-elapsed / window)`."""

    window: float
    value: float = 0.0

    def update(self, count: int, elapsed: float) -> float:
        if elapsed > 0:
            rate = count * 60.0 / elapsed
            self.value = rate + math.exp(-elapsed / self.window) * (self.value - rate)
        return self.value


_LOADED = ("messages/received", "messages/sent", "bytes/received", "bytes/sent", "connections")


@dataclass(slots=True)
class SysState:
    """Turns successive `Counters` into the `$SYS` values to publish (sans-I/O)."""

    started: float
    version: str
    published: dict[str, str] = field(default_factory=dict)
    """Topic name -> the value last published."""
    loads: dict[str, list[Load]] = field(
        default_factory=lambda: {name: [Load(w) for _, w in LOAD_WINDOWS] for name in _LOADED}
    )
    last: Counters | None = None
    maximum: int = 0

    def update(self, counters: Counters) -> dict[str, str]:
        """The `$SYS` topic names whose value changed since the last update, with
        their new values (every one at the first update)."""
        last = self.last
        elapsed = 0.0 if last is None else counters.now - last.now
        self.maximum = max(self.maximum, counters.connected)
        values = {
            "version": self.version,
            "uptime": f"{int(counters.now - self.started)} seconds",
            "clients/connected": str(counters.connected),
            "clients/disconnected": str(counters.disconnected),
            "clients/total": str(counters.sessions),
            "clients/maximum": str(self.maximum),
            "messages/received": str(counters.messages_received),
            "messages/sent": str(counters.messages_sent),
            "publish/messages/dropped": str(counters.dropped),
            "bytes/received": str(counters.bytes_received),
            "bytes/sent": str(counters.bytes_sent),
            "subscriptions/count": str(counters.subscriptions),
            "retained messages/count": str(counters.retained),
        }
        totals = {
            "messages/received": counters.messages_received,
            "messages/sent": counters.messages_sent,
            "bytes/received": counters.bytes_received,
            "bytes/sent": counters.bytes_sent,
            "connections": counters.connections,
        }
        before = (
            dict.fromkeys(totals, 0)
            if last is None
            else {
                "messages/received": last.messages_received,
                "messages/sent": last.messages_sent,
                "bytes/received": last.bytes_received,
                "bytes/sent": last.bytes_sent,
                "connections": last.connections,
            }
        )
        for name, total in totals.items():
            for (suffix, _), load in zip(LOAD_WINDOWS, self.loads[name], strict=True):
                value = load.update(total - before[name], elapsed)
                values[f"load/{name}/{suffix}"] = f"{value:.2f}"
        self.last = counters
        changed = {
            f"{SYS_PREFIX}/broker/{name}": value
            for name, value in values.items()
            if self.published.get(f"{SYS_PREFIX}/broker/{name}") != value
        }
        self.published.update(changed)
        return changed


class SysPublisher:
    """Publishes the broker's `$SYS` topics every `interval` seconds (a task on
    the broker's event loop; the database work in threads)."""

    def __init__(self, broker: Services, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self.state = SysState(time.monotonic(), broker_version())
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.updates = 0
        """Updates published (for tests and operators)."""

    async def start(self) -> None:
        """Make the `sys` topic if needed and publish the first values (before the
        broker takes clients: the first subscriber finds them retained), then
        every `interval` seconds."""
        await asyncio.to_thread(ensure_sys_topic, self.broker)
        await self._update()
        self._task = asyncio.create_task(self._run(), name="riverbed-sys")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._update()

    async def _update(self) -> None:
        try:
            await self.publish_once()
        except RiverbedError as exc:
            if not self._failing:  # once per episode, not every interval
                log.warning("publishing the $SYS topics failed: %s", exc)
            self._failing = True
            self.state.published.clear()  # all of them again next time
        else:
            if self._failing:
                log.info("publishing the $SYS topics works again")
            self._failing = False

    async def publish_once(self) -> None:
        """Publish the values that changed; trim the `sys` topic if the
        broker's retention is off."""
        broker = self.broker
        unwritten = broker.unwritten_sessions()  # on the loop, beside the connections
        sessions, disconnected, subscriptions, retained = await asyncio.to_thread(
            _stored_counts, broker, self.interval
        )
        counts = broker.counts  # the ones the Prometheus metrics read too
        counters = Counters(
            time.monotonic(),
            len(broker.connections),
            sessions + unwritten,
            disconnected,
            subscriptions,
            retained,
            counts.committed,
            sum(counts.publish_out),
            counts.bytes_in,
            counts.bytes_out,
            counts.connections,
            counts.qos0_dropped,
        )
        changed = self.state.update(counters)
        if changed:
            await self._publish(changed)
        if broker.retainer is None:
            await asyncio.to_thread(_trim, broker)
        self.updates += 1

    async def _publish(self, values: dict[str, str]) -> None:
        broker = self.broker
        by_topic: dict[str, list[Message]] = {}
        for name, value in values.items():
            route = broker.log.route(name)
            message = Message(value.encode(), key=name, mqtt_topic=name, qos=0, retain=True)
            by_topic.setdefault(route.topic, []).append(message)
        messages = [m for batch in by_topic.values() for m in batch]
        if broker.config.limits.retain_available:
            await asyncio.to_thread(_retain, broker, messages)
        for log_topic, batch in by_topic.items():
            # Shielded: a stop cancelling this task must not cancel the
            # appender's future under it.
            committing = asyncio.wrap_future(broker.log.produce_async(log_topic, batch))
            positions = await asyncio.shield(committing)
            _route(broker, positions, batch)


def _stored_counts(broker: Services, max_age: float) -> tuple[int, int, int, int]:
    """(sessions, disconnected, subscriptions, retained messages) from the
    database: the session records as the expiry sweep read them every few
    seconds (read now if that was over `max_age` seconds ago), and a count
    of the retained ones."""
    census = broker.store.census(max_age)
    retained = broker.log.storage.kv_count(RETAINED_NAMESPACE)
    return census.sessions, census.disconnected, census.subscriptions, retained


def _retain(broker: Services, messages: Iterable[Message]) -> None:
    at = now_us()
    for message in messages:
        broker.retained.put(message, at)


def _route(
    broker: Services, positions: Sequence[tuple[StreamId, int]], messages: Sequence[Message]
) -> None:
    """Hand the committed messages to the fan-out, one run per stream."""
    for stream, first, rows in committed_runs(messages, positions):
        broker.fanout.committed(stream, first, rows)


def ensure_sys_topic(broker: Services) -> None:
    """Create the built-in topic `sys` for `$SYS/#` if it does not exist.

    An existing one is left as it is (an operator may have changed its
    limits). A binding of another topic that overlaps `$SYS/#` keeps those
    names: logged, and `$SYS` messages go where `Log.route` says."""
    topics = broker.log.topics
    try:
        topics.get(SYS_TOPIC)
        return
    except TopicNotFound:
        pass
    try:
        topics.create(
            SYS_TOPIC,
            1,
            binding=SYS_BINDING,
            retention_us=SYS_RETENTION_US,
            retention_policy=RetentionPolicy.EXPIRED,
            max_messages=SYS_MAX_MESSAGES,
            key_mode=KeyMode(KeyKind.TOPIC),
        )
    except AlreadyExists:
        pass  # another node made it meanwhile
    except BindingOverlap as exc:
        log.warning("no built-in topic %r for $SYS messages: %s", SYS_TOPIC, exc)


def _trim(broker: Services) -> None:
    """Apply the `sys` topic's retention (its message limit), when nothing else does."""
    with contextlib.suppress(TopicNotFound):
        apply_retention(broker.log.storage, SYS_TOPIC)
