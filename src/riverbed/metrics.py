"""The broker's Prometheus metrics: one registry per broker, rendered as text.

    metrics = Metrics()
    metrics.counts.publish_in[1] += 1      # the hot path: plain ints
    metrics.gauge("riverbed_sessions_online", "...", lambda: len(online))
    body = metrics.render()                # served as CONTENT_TYPE

The hot path pays as little as it can: what happens per message or per read is
counted in plain ints (`Counts`), which a collector reads when Prometheus
scrapes; what happens per commit (a transaction) goes to histogram buckets
kept the same way (`Buckets`: a lock and a bisect, not `Histogram.observe`).
Values a process already keeps (connections, dropped QoS 0 messages) are read
through callables at scrape time (`gauge`, `counter`). Values that cost storage
queries (subscription lag, queue depths, offline sessions, retained messages)
are read on an interval by a background thread (`Refresher`) and a scrape
shows the last reading: a scrape never queries the database.

Each `Metrics` has its own `CollectorRegistry`, not prometheus_client's global
one, so several brokers in one process (tests) keep their numbers apart. The
broker's `Counts` are its own and exist with metrics off too: its `$SYS`
topics read the same ints (one increment per event, not one per reader).

Processes that are not a broker (`riverbed worker`, `riverbed subscription
run`) serve their own `/metrics` when asked to (`Exposition`): what became of
the messages they handled (`outcomes_family`, `OUTCOMES`).

This module sits below every other layer: it imports prometheus_client and the
standard library only, and `mqtt`, `log` and `subscriptions` may import it.
docs/metrics.md lists every metric and what it means.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Content-Type of `render`'s bytes: the Prometheus text format 0.0.4, which
every Prometheus server reads (the names here need nothing newer)."""

COMMIT_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
"""From a fast SQLite commit (~0.5 ms) to a PostgreSQL server in trouble."""
COMMIT_MESSAGES_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
"""Up to the appender's largest transaction (`max_batch` 10,000)."""


class Counts:
    """What the broker's hot path counts, in plain ints: the one set of counters
    that both `$SYS/broker/...` (`mqtt/sys.py`) and the Prometheus exposition
    read, kept whether or not `[metrics]` is enabled.

    Only the event loop thread writes these (connections and their reads),
    so no lock: an `int += 1` costs a few tens of nanoseconds, a prometheus
    `Counter.inc()` a lock and a few hundred. Readers on other threads (a
    scrape, `/api/v1/stats`) see each value as it was at some moment."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "committed",
        "connections",
        "publish_in",
        "publish_out",
        "qos0_dropped",
        "refused",
        "slow_consumers_disconnected",
    )

    def __init__(self) -> None:
        self.connections = 0
        """Connections accepted since the start (TLS: handshake done)."""
        self.refused: dict[str, int] = {}
        """Connections refused (CONNACK with an error, or closed before it), by reason."""
        self.publish_in = [0, 0, 0]
        """PUBLISH packets received from clients, by QoS."""
        self.publish_out = [0, 0, 0]
        """PUBLISH packets sent to clients, by QoS (first sends and resends)."""
        self.committed = 0
        """PUBLISHes from clients committed to the log (counted per commit)."""
        self.bytes_in = 0
        """Bytes read from clients' connections (counted per read)."""
        self.bytes_out = 0
        """Bytes written to clients' connections (counted per write)."""
        self.qos0_dropped = 0
        """QoS 0 messages dropped for clients not reading fast enough."""
        self.slow_consumers_disconnected = 0
        """Connections aborted because their write buffer stayed full."""


@dataclass(frozen=True, slots=True)
class Readings:
    """What the background thread read from storage (`Refresher`)."""

    subscription_lag: Mapping[str, int] = field(default_factory=dict)
    """Named subscription -> messages not yet committed by it."""
    retry_queue: Mapping[str, int] = field(default_factory=dict)
    """Delivered named subscription -> messages waiting in its retry queue."""
    dead_letter_queue: Mapping[str, int] = field(default_factory=dict)
    """Delivered named subscription -> messages parked in its dead-letter queue."""
    sessions_offline: int = 0
    """Sessions kept for clients that are not connected (to any node)."""
    retained: int = 0
    """Topic names with a retained message."""
    at: float = 0.0
    """When this was read (Unix time; 0: never yet)."""


class Buckets:
    """A histogram's counts per bucket, for one observation per commit: a lock
    and a bisect (well under a microsecond), where prometheus_client's
    `Histogram.observe` costs a few (its collector turns these into the
    cumulative `_bucket` series at scrape time)."""

    __slots__ = ("bounds", "counts", "lock", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Observations per bucket: `counts[i]` those in (bounds[i-1], bounds[i]];
        the last one those above every bound."""
        self.sum = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self.lock:
            self.counts[i] += 1
            self.sum += value

    def snapshot(self) -> tuple[list[int], float]:
        """(observations per bucket, their sum), read together."""
        with self.lock:
            return list(self.counts), self.sum

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0..1) estimated as Prometheus's `histogram_quantile`
        does: linearly within the bucket it falls in (from 0 in the first), the
        largest bound if it falls above every bound; None before any observation."""
        counts, _ = self.snapshot()
        total = sum(counts)
        if not total:
            return None
        rank = q * total
        below = 0
        for i, n in enumerate(counts):
            if below + n >= rank and n:
                if i == len(self.bounds):
                    return float(self.bounds[-1])
                low = 0.0 if i == 0 else float(self.bounds[i - 1])
                return low + (float(self.bounds[i]) - low) * (rank - below) / n
            below += n
        return float(self.bounds[-1])

    def family(self, name: str, help: str) -> HistogramMetricFamily:
        counts, total = self.snapshot()
        cumulative = 0
        buckets = []
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        return HistogramMetricFamily(name, help, buckets=buckets, sum_value=total)


class Metrics:
    """One broker's metrics: `counts` for the hot path, histograms for commits,
    whatever is registered with `gauge`/`counter`, and the storage readings."""

    def __init__(self, counts: Counts | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.counts = Counts() if counts is None else counts
        """The hot path's counts (the broker's own, shared with `$SYS`)."""
        self.readings = Readings()
        """The latest storage readings (replaced whole by the `Refresher`)."""
        self._appended: dict[str, int] = {}
        """Log topic -> messages appended by this process."""
        self._appended_lock = threading.Lock()
        self.commit_seconds = Buckets(COMMIT_SECONDS_BUCKETS)
        """How long the log's append transactions took."""
        self.commit_messages = Buckets(COMMIT_MESSAGES_BUCKETS)
        """Messages per append transaction."""
        self._own = _Collected(self)
        self.registry.register(self._own)

    # --- recording ------------------------------------------------------------------
    def committed(self, appended: Mapping[str, int], seconds: float) -> None:
        """An append transaction committed `appended` (log topic -> messages) in
        `seconds`. From the appender's writer thread or the event loop."""
        total = 0
        with self._appended_lock:
            counts = self._appended
            for topic, n in appended.items():
                counts[topic] = counts.get(topic, 0) + n
                total += n
        self.commit_seconds.observe(seconds)
        self.commit_messages.observe(total)

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        """Register a gauge whose value `read()` gives at scrape time."""
        self._own.extra.append(lambda: GaugeMetricFamily(name, help, value=read()))

    def counter(self, name: str, help: str, read: Callable[[], float]) -> None:
        """Register a counter (`name` without `_total`) whose value `read()`
        gives at scrape time."""
        self._own.extra.append(lambda: _counter(name, help, read()))

    def labelled_counter(
        self,
        name: str,
        help: str,
        labels: Sequence[str],
        read: Callable[[], Mapping[tuple[str, ...], float]],
    ) -> None:
        """Register a counter with `labels` (`name` without `_total`): `read()`
        gives label values -> value at scrape time."""
        self._own.extra.append(lambda: _labelled(name, help, labels, read()))

    # --- exposing -------------------------------------------------------------------
    def appended(self) -> dict[str, int]:
        """Log topic -> messages appended by this process (a copy)."""
        with self._appended_lock:
            return dict(self._appended)

    def render(self) -> bytes:
        """Every metric, in the Prometheus text exposition format (`CONTENT_TYPE`)."""
        return render(self.registry)


def render(registry: CollectorRegistry) -> bytes:
    """`registry`'s metrics in the Prometheus text exposition format (`CONTENT_TYPE`)."""
    return generate_latest(registry)


class _Collected(Collector):
    """Reads `Counts`, the appended messages, the readings and the registered
    callables when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.extra: list[Callable[[], Metric]] = []
        """Families read from the process's own state at scrape time."""

    def describe(self) -> Iterable[Metric]:
        return []  # names vary with what is registered: no check at registration

    def collect(self) -> Iterable[Metric]:
        metrics = self.metrics
        counts = metrics.counts
        yield _counter("riverbed_connections", "Client connections accepted.", counts.connections)
        refused = CounterMetricFamily(
            "riverbed_connections_refused",
            "Client connections refused before or by their CONNACK, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(counts.refused.items()):
            refused.add_metric([reason], n)
        yield refused
        yield _by_qos(
            "riverbed_publish_received", "PUBLISH packets received from clients.", counts.publish_in
        )
        yield _by_qos(
            "riverbed_publish_sent", "PUBLISH packets sent to clients.", counts.publish_out
        )
        yield _counter("riverbed_received_bytes", "Bytes read from clients.", counts.bytes_in)
        yield _counter("riverbed_sent_bytes", "Bytes written to clients.", counts.bytes_out)
        appended = CounterMetricFamily(
            "riverbed_messages_appended",
            "Messages this process appended to the log, by log topic.",
            labels=["topic"],
        )
        for topic, n in sorted(metrics.appended().items()):
            appended.add_metric([topic], n)
        yield appended
        yield metrics.commit_seconds.family(
            "riverbed_commit_seconds",
            "Duration of the log's append transactions (group commits), in seconds.",
        )
        yield metrics.commit_messages.family(
            "riverbed_commit_messages",
            "Messages per append transaction of the log (the group commit's batch size).",
        )
        for family in self.extra:
            yield family()
        yield from _readings(metrics.readings)


def _counter(name: str, help: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help, value=value)


def _labelled(
    name: str, help: str, labels: Sequence[str], values: Mapping[tuple[str, ...], float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help, labels=list(labels))
    for key, n in sorted(values.items()):
        family.add_metric(list(key), n)
    return family


def _by_qos(name: str, help: str, values: list[int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help, labels=["qos"])
    for qos, n in enumerate(values):
        family.add_metric([str(qos)], n)
    return family


def _readings(readings: Readings) -> Iterable[Metric]:
    yield _per_subscription(
        "riverbed_subscription_lag",
        "Messages of a named subscription's topic it has not committed yet.",
        readings.subscription_lag,
    )
    yield _per_subscription(
        "riverbed_subscription_retry_queue",
        "Messages waiting in a delivered named subscription's retry queue.",
        readings.retry_queue,
    )
    yield _per_subscription(
        "riverbed_subscription_dead_letter_queue",
        "Messages parked in a delivered named subscription's dead-letter queue.",
        readings.dead_letter_queue,
    )
    yield GaugeMetricFamily(
        "riverbed_sessions_offline",
        "Sessions kept for clients that are not connected to any node.",
        value=readings.sessions_offline,
    )
    yield GaugeMetricFamily(
        "riverbed_retained_messages",
        "Topic names with a retained message.",
        value=readings.retained,
    )
    yield GaugeMetricFamily(
        "riverbed_storage_readings_timestamp_seconds",
        "When the storage-derived gauges were last read (Unix time; 0: not yet).",
        value=readings.at,
    )


def _per_subscription(name: str, help: str, values: Mapping[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help, labels=["subscription"])
    for subscription, n in sorted(values.items()):
        family.add_metric([subscription], n)
    return family


class Refresher:
    """A daemon thread that replaces `metrics.readings` with `read()` every
    `interval` seconds (first at once). A failed reading is logged and the last
    good one stays (its timestamp says how old it is)."""

    def __init__(self, metrics: Metrics, read: Callable[[], Readings], interval: float) -> None:
        self.metrics = metrics
        self.read = read
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="riverbed-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the reading in progress (waits up to `timeout` for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def refresh(self) -> None:
        """Read now (on the calling thread)."""
        started = time.monotonic()
        try:
            readings = self.read()
        except Exception:
            log.exception("reading the storage-derived metrics failed")
            return
        self.metrics.readings = replace(readings, at=time.time())
        took = time.monotonic() - started
        log.debug("read the storage-derived metrics in %.1f ms", took * 1000)
        if took > self.interval / 2:
            log.warning(
                "reading the storage-derived metrics took %.1f s; [metrics] refresh_interval"
                " is %g s",
                took,
                self.interval,
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)


# --- processes that are not a broker: `riverbed worker`, `riverbed subscription run`

OUTCOMES = ("delivered", "retried", "parked")
"""What became of messages a worker or a delivery job handled: the `outcome`
label's values, and the order of the counts `outcomes_family` takes."""


def outcomes_family(
    name: str, help: str, counts: Mapping[str, Sequence[int]]
) -> CounterMetricFamily:
    """The counter `name{subscription, outcome}` (`name` without `_total`) from
    subscription -> its counts in `OUTCOMES` order."""
    family = CounterMetricFamily(name, help, labels=["subscription", "outcome"])
    for subscription, values in sorted(counts.items()):
        for outcome, n in zip(OUTCOMES, values, strict=True):
            family.add_metric([subscription, outcome], n)
    return family


class Exposition:
    """`/metrics` of a process that is not a broker (a worker, a delivery job):
    prometheus_client's HTTP server on a daemon thread of its own, over a
    registry whose one collector calls `collect()` at each scrape.

    Raises `OSError` if it cannot listen on `host:port` (port 0: any free one,
    `port` says which)."""

    def __init__(self, host: str, port: int, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Called(collect))
        self._server, self._thread = start_http_server(port, host, self.registry)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def render(self) -> bytes:
        return render(self.registry)

    def close(self) -> None:
        """Stop serving (a scrape in progress finishes on its own thread)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


class _Called(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect_ = collect

    def collect(self) -> Iterable[Metric]:
        return self.collect_()
