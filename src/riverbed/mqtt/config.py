"""The broker's configuration: a TOML file plus command-line overrides, validated once.

    config = load_config("riverbed.toml", {"listeners.mqtt": "0.0.0.0:1883"})

`load_config` reads the file (every key optional), lays the overrides over it
(dotted keys; a `None` value means "flag not given"), and returns a frozen
`BrokerConfig`. Every bad value is refused with `InvalidConfig` naming where it
came from, the key, the value and the rule; an unknown key is refused with the
keys its section knows. The dataclasses check themselves too, so a config built
in code obeys the same rules.

A complete file, with the defaults:

    [listeners]
    mqtt = "127.0.0.1:1883"          # HOST:PORT; [::1]:1883 for IPv6; port 0 = any free

    [listeners.tls]                  # optional: the TLS listener (address, certfile, keyfile)
    address = "0.0.0.0:8883"
    certfile = "server.pem"          # PEM certificate chain
    keyfile = "server.key"           # PEM private key
    cafile = "clients-ca.pem"        # optional: require client certificates signed by it

    [listeners.ws]                   # optional: MQTT over WebSockets (mqtt/websocket.py)
    address = "0.0.0.0:8080"         # HOST:PORT
    path = "/mqtt"                   # the HTTP path clients ask for
    allowed_origins = []             # browsers' Origin accepted, e.g. ["https://app.example.com"];
                                     # empty: any (requests without an Origin are always taken)
    # certfile = "server.pem"        # WSS: serve over TLS (with keyfile; cafile as above)
    # keyfile = "server.key"

    [storage]
    url = "sqlite:///./riverbed-data/riverbed.db"   # default: --db, $RIVERBED_DB, else this
    commit_interval_ms = 3           # the least time between two commits of PUBLISHes
    poll_interval_ms = 20            # the least time between two looks for others' messages
    idle_cursor_interval = 1         # seconds: online sessions' cursors pass what matched none

    [limits]
    receive_maximum = 100            # QoS 1/2 PUBLISHes a client may have unacknowledged
    topic_alias_maximum = 16         # topic aliases a client may set (0: none)
    maximum_packet_size = 1048576    # bytes, the largest packet accepted
    # server_keep_alive = 60         # seconds, MQTT 5 clients; unset: the client's own
    max_session_expiry = "7d"        # the longest session expiry granted ("never" allowed)
    # default_session_expiry = "7d"  # MQTT 3.1.1 clean session 0; unset: max_session_expiry
    session_queue_limit = 1000       # messages queued in memory for one online session
    max_inflight = 100               # QoS 1/2 messages sent to a client and unacknowledged
    retain_available = true          # keep retained messages
    stop_grace = 20                  # seconds: SIGTERM to exit at most (then exits anyway)
    write_buffer_limit = 1048576     # bytes waiting to go to one client before QoS 0 is dropped
    slow_consumer_timeout = 60       # seconds a client's write buffer may stay full
    connect_timeout = 10             # seconds a new connection may take to send its CONNECT

    [shared_subscriptions]           # $share/GROUP/FILTER and $queue/FILTER (sharedsub/)
    enabled = true
    find_leader_retry = 1.0          # seconds: a member asks again for its group's Leader
    ping_interval = 4.0              # a member pings its Leader this often
    ping_timeout = 4.0               # ... and gives up on it after this long
    unsubscribe_timeout = 1.0        # a revoked stream waits this long for its acknowledgements
    leader_borrower_timeout = 5.0    # a silent member's streams move on after this long
    fence_margin = 0.5               # a member lets go this long before the Leader may drop it
    leader_periodic = 1.0            # the Leader renews, rebalances and saves this often
    leader_resend = 1.0              # an unanswered grant/revoke/revoked goes again
    leader_claim_lease = 30.0        # the Leader's claim on its group lasts this long unrenewed
    leader_idle_stop = 30.0          # a Leader with no member stops after this long

    [retention]                      # the broker applies topics' retention itself
    interval = 60                    # seconds between passes (0: never; `riverbed retention run`)
    pin_warning_hours = 24           # warn when a subscription holds messages this old
    batch = 10000                    # messages deleted per transaction

    [sys]                            # $SYS/broker/... status topics (mqtt/sys.py)
    interval = 10                    # seconds between updates (0: none published)
    [metrics]                        # Prometheus metrics (riverbed.metrics; docs/metrics.md)
    enabled = true                   # count (false: nothing is counted or exposed)
    refresh_interval = 15            # seconds between readings of lag, queue depths, sessions

    [auth]
    allow_anonymous = false          # clients without a user name
    # password_file = "passwd"       # `riverbed passwd FILE USER` manages it
    # acl_file = "acl"               # rules: riverbed.mqtt.acl
    acl_wildcard = "filter"          # or "strict": refuse a filter that reaches a denied topic

    [http]                           # the admin HTTP API (riverbed.http); off unless set
    # address = "127.0.0.1:8080"     # HOST:PORT; without token_file only a loopback address
    # token_file = "tokens"          # bearer tokens: `riverbed token add FILE NAME --role ROLE`
    # certfile = "server.pem"        # serve HTTPS (with keyfile)
    # keyfile = "server.key"

    [cluster]                        # several nodes on one PostgreSQL (docs/cluster.md)
    # node_name = "node-1"           # unset: host-pid-random, new at every start
    # server_reference = "lb:1883"   # a drained node's MQTT 5 clients are sent there

    [log]                            # the broker's log, on stderr
    level = "info"                   # debug, info, warning or error (debug: every connection)
    format = "text"                  # text, or json: one JSON object per line

Relative file names in the file are relative to the file's directory; in
overrides, to the working directory (as is a relative `sqlite:///` path in
`storage.url`, wherever it is given, like `--db`). Durations are whole seconds, as an integer
or with a unit (`90`, `"15m"`, `"12h"`, `"7d"`).

Why the defaults are what they are:

- `receive_maximum` 100 and `max_inflight` 100. Riverbed answers PUBACK only
  once the message is committed, so a publisher's throughput is at most its
  window over the commit latency: 100 in flight at ~5 ms per group commit
  allows 20k msg/s per connection, above what one client sends (DESIGN.md:
  ~11k/s for paho), while one connection can tie up at most 100 unacknowledged
  packets of memory. MQTT's own default, 65535, would let one client hold 64 GiB
  at the default packet size. The outgoing window is the smaller of
  `max_inflight` and the client's Receive Maximum; it also bounds what a crash
  redelivers (the unacknowledged window, DESIGN.md guarantee 3).
- `maximum_packet_size` 1 MiB: one packet is read whole into memory before it
  is committed; large blobs belong in object storage, with a reference on the
  bus. At least 128 bytes: below that a CONNECT with a 23-byte client id
  [MQTT-3.1.3-5], a user name, a password and properties does not fit. At most
  268,435,460, the largest packet MQTT can express.
- `topic_alias_maximum` 16: enough for a device publishing to a handful of
  topics to send each name once, while a connection's alias table stays small.
- `max_session_expiry` 7 days, the default topic retention: a session keeps
  its cursors, and so pins the log's retention, for at most that long after its
  client left. MQTT 5 clients asking for more are granted this (the CONNACK says
  so); MQTT 3.1.1 clients with clean session 0 have no expiry of their own and
  get `default_session_expiry`, which defaults to the same.
- `session_queue_limit` 1000: messages routed to an online session wait in
  memory until its in-flight window has room; a session that falls this far
  behind reads on from the log instead, so nothing is dropped for being slow.
- `write_buffer_limit` 1 MiB and `slow_consumer_timeout` 60 s: a client that
  stops reading fills the kernel's socket buffers, then the broker's own
  buffer for its connection. Past this many bytes there, QoS 0 messages for it
  are dropped (and counted) until it drains to a quarter of it, as mosquitto
  drops past `max_queued_messages` (1,000); QoS 1/2 messages wait in the
  in-flight window and the log. So one stuck client costs at most about this
  much memory, not a copy of everything published since it stopped. If the
  buffer stays full this long the connection is closed (its session stays):
  a client paused for a minute is gone, and should reconnect. At least 4 KiB
  (a few messages), at most 1 GiB; the timeout from 1 s to a day.
- `connect_timeout` 10 s: a connection that has not sent its whole CONNECT by
  then is closed without a word (MQTT 5.0 §4.8: a server closes a connection
  that sends nothing it can act on). A fleet reconnecting after an outage gets
  its CONNACKs within a second or so (docs/benchmarks.md), so 10 s is room for
  a slow TLS handshake on a loaded link; what it bounds is how long a socket
  that never speaks holds a file descriptor and memory. From 1 s to an hour.
- `commit_interval_ms` 3: every commit of PUBLISHes costs a transaction, a
  PUBACK write, a delivery write and their wake-ups, whatever it holds. The
  commit pacer (`mqtt/pacer.py`) commits at once after a quiet spell, and under
  a steady stream at most every 3 ms, all connections' messages together: at
  2,000 msg/s six messages share each commit, and the broker's CPU per message
  is less than half what it is unpaced (0 ms), for at most 3 ms more latency
  (p50 0.3 -> 2.0 ms). 2 ms cost 20% more CPU for 0.6 ms less latency; 4 ms
  saved nothing more (docs/benchmarks.md). 0 commits every loop turn.
- `poll_interval_ms` 20: while sessions wait for messages, the broker looks at
  the log's stream heads for messages it did not commit itself. On PostgreSQL
  another node's commit wakes it at once (LISTEN/NOTIFY); its own commits are
  routed directly, and the looks they prompt (for messages that came another
  way) are at most this often. While the LISTEN connection is down, and on
  SQLite (which cannot tell its own commits from other processes'), it looks
  this often whatever wakes it: other nodes' messages are then up to this
  late. Each look is one small query; 20 ms keeps them cheap under load.
  From 1 ms to 60 s.
- `idle_cursor_interval` 1 s: a message that matches none of an online
  session's subscriptions costs that session nothing when it is routed; where
  its cursors have got to past such messages is handed to all the sessions
  this often, and to each at its disconnect. Until then an idle subscription's
  stored cursor stays behind, which holds those messages back from retention
  (a pass a minute: `[retention] interval`) and is what a crash of the broker
  makes the session read again, matching none of it: after a crash (a clean
  stop saves every session where it got to) each idle session of a fleet
  reads up to this long's messages of its streams back. 2,000 idle sessions
  after a SIGKILL, 12,000 messages past them in the 12 s before: back in 3.3 s
  at 1 s, in 50 s at 10 s (docs/benchmarks.md). Each hand-out costs a cursor
  write per session whose streams moved, as every second while traffic flows
  before the fan-out let messages pass sessions by. From 1 s to 1 h.
- `[retention] interval` 60 s: retention deletes what every subscription has
  consumed and is past its topic's retention time, so a pass a minute keeps a
  busy topic within a minute's messages of that, at the cost of a few cheap
  queries per stream when there is nothing to delete. `batch` 10,000: each
  transaction of a deletion holds the write lock for some milliseconds, so a
  concurrent commit waits at most that (docs/benchmarks.md: retention).
  `pin_warning_hours` 24: a subscription nobody reads keeps its topic's log,
  however old; a day past retention is long enough not to warn about a reader
  that is down for the night (docs/storage.md).
- `[metrics] refresh_interval` 15 s: subscription lag, retry and dead-letter
  queue depths, offline sessions and retained messages cost storage queries,
  so a background thread reads them this often and a scrape shows the last
  reading (Prometheus scrapes every 15 to 60 s). From 1 s to an hour.
  `enabled` true: counting costs the broker no CPU per message that a busy
  2-core machine can measure (docs/benchmarks.md, Metrics on and off).
- `[log] level` info: what an operator acts on (listening, stopping, sessions
  expired, refusals, warnings), not one line per client connecting or leaving:
  a broker with thousands of clients reconnecting would log little else. Those
  lines are at debug.
- `allow_anonymous` false: anonymous access only where configured.
  A configuration with neither anonymous access nor a password file is refused,
  since no client could connect.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from riverbed.errors import InvalidConfig
from riverbed.model import parse_duration
from riverbed.mqtt.codec.wire import MAX_PACKET_SIZE
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.storage import DEFAULT_URL
from riverbed.storage.urls import StorageUrl, redact_url

MAX_UINT16 = 0xFFFF
SESSION_NEVER_EXPIRES = 0xFFFF_FFFF
"""Session Expiry Interval meaning "never" (MQTT 5.0 §3.1.2.11.2)."""
MIN_PACKET_SIZE = 128
"""The smallest `maximum_packet_size` accepted (why: the module docstring)."""
DAY = 24 * 3600
MIN_WRITE_BUFFER = 4096
MAX_WRITE_BUFFER = 1 << 30
"""The bounds of `limits.write_buffer_limit` (why: the module docstring)."""


# --------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Address:
    """A listener's HOST:PORT. Port 0 asks the system for any free port."""

    host: str
    port: int

    def __post_init__(self) -> None:
        _check_host(self.host, "address", str(self))
        if type(self.port) is not int or not 0 <= self.port <= MAX_UINT16:
            raise InvalidConfig(f"address {str(self)!r}: the port must be 0..65535")

    @classmethod
    def parse(cls, text: str) -> Address:
        """`HOST:PORT`, `[IPV6]:PORT`; HOST an IPv4 address or a DNS name."""
        if text.startswith("["):
            host, bracket, rest = text[1:].partition("]")
            if not bracket or not rest.startswith(":"):
                raise InvalidConfig(f"address {text!r} is not [IPV6]:PORT, e.g. [::1]:1883")
            port = rest[1:]
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise InvalidConfig(
                    f"address {text!r}: {host!r} in brackets is not an IPv6 address"
                ) from None
        else:
            host, colon, port = text.rpartition(":")
            if not colon:
                raise InvalidConfig(f"address {text!r} is not HOST:PORT, e.g. 127.0.0.1:1883")
            if ":" in host:
                raise InvalidConfig(
                    f"address {text!r}: an IPv6 address goes in brackets, e.g. [::1]:1883"
                )
        if not (port.isascii() and port.isdigit()) or int(port) > MAX_UINT16:
            raise InvalidConfig(f"address {text!r}: the port {port!r} is not a number 0..65535")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_DOTTED_DIGITS = re.compile(r"[0-9.]+")
"""All digits and dots: meant as an IPv4 address (300.1.1.1 is a typo, not a name)."""


def _check_host(host: str, what: str, shown: str) -> None:
    if not isinstance(host, str) or not host:
        raise InvalidConfig(
            f"{what} {shown!r} has no host: use 127.0.0.1 (this machine only), 0.0.0.0"
            " (every IPv4 interface) or [::] (every IPv6 interface)"
        )
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if _DOTTED_DIGITS.fullmatch(host):
        raise InvalidConfig(f"{what} {shown!r}: the host {host!r} is not an IPv4 address")
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise InvalidConfig(
            f"{what} {shown!r}: the host {host!r} is neither an IP address nor a DNS name"
        )


# --------------------------------------------------------------------- the tree


def _check_fields(section: str, config: Any) -> None:
    """Check each field of a config dataclass with its key's converter: a config
    built in code obeys the rules a loaded one does, and holds typed values."""
    for f in fields(config):
        name = f"{section}.{f.name}"
        key = KEYS.get(name)
        if key is None:
            continue
        value = getattr(config, f.name)
        typed = key.convert(name, value)
        if typed != value or type(typed) is not type(value):
            raise InvalidConfig(
                f"{name} = {value!r}: must be {type(typed).__name__}, not"
                f" {type(value).__name__} (load_config converts text)"
            )


@dataclass(frozen=True, slots=True)
class TlsListener:
    """The TLS listener. With `cafile`, clients must present a certificate it signed."""

    address: Address
    certfile: Path
    keyfile: Path
    cafile: Path | None = None

    def __post_init__(self) -> None:
        _check_fields("listeners.tls", self)


@dataclass(frozen=True, slots=True)
class WebSocketListener:
    """The MQTT over WebSockets listener: HTTP upgrade requests for `path`, from
    a browser whose Origin is in `allowed_origins` (empty: any). With `certfile`
    and `keyfile` it serves WSS (and with `cafile`, asks for client certificates)."""

    address: Address
    path: str = "/mqtt"
    allowed_origins: tuple[str, ...] = ()
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None

    def __post_init__(self) -> None:
        _check_fields("listeners.ws", self)
        if (self.certfile is None) != (self.keyfile is None):
            given, missing = ("certfile", "keyfile")[:: 1 if self.keyfile is None else -1]
            raise InvalidConfig(
                f"listeners.ws.{given} is set but listeners.ws.{missing} is not: WSS needs both"
            )
        if self.cafile is not None and self.certfile is None:
            raise InvalidConfig(
                "listeners.ws.cafile is set without listeners.ws.certfile and keyfile:"
                " client certificates are asked for only over WSS"
            )

    @property
    def secure(self) -> bool:
        """Whether it serves WSS (WebSockets over TLS)."""
        return self.certfile is not None


@dataclass(frozen=True, slots=True)
class Listeners:
    """Where the broker listens: plain MQTT always, TLS and WebSockets when configured."""

    mqtt: Address = Address("127.0.0.1", 1883)
    tls: TlsListener | None = None
    ws: WebSocketListener | None = None

    def __post_init__(self) -> None:
        _check_fields("listeners", self)
        named = [("listeners.mqtt", self.mqtt)]
        if self.tls is not None:
            named.append(("listeners.tls.address", self.tls.address))
        if self.ws is not None:
            named.append(("listeners.ws.address", self.ws.address))
        for i, (key, address) in enumerate(named):
            for other, taken in named[:i]:
                if address == taken and address.port != 0:
                    raise InvalidConfig(
                        f"{other} and {key} are both {address}: the two listeners need"
                        " different ports"
                    )


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """The database; `url=None` means `--db`, else `$RIVERBED_DB`, else the default."""

    url: str | None = None
    commit_interval_ms: int = 3
    poll_interval_ms: int = 20
    idle_cursor_interval: int = 1

    def __post_init__(self) -> None:
        _check_fields("storage", self)


@dataclass(frozen=True, slots=True)
class Limits:
    """What the broker grants each client. Times are seconds (see the module
    docstring for why each default is what it is)."""

    receive_maximum: int = 100
    topic_alias_maximum: int = 16
    maximum_packet_size: int = 1 << 20
    server_keep_alive: int | None = None
    max_session_expiry: int = 7 * DAY
    default_session_expiry: int | None = None
    session_queue_limit: int = 1000
    max_inflight: int = 100
    retain_available: bool = True
    stop_grace: int = 20
    write_buffer_limit: int = 1 << 20
    slow_consumer_timeout: int = 60
    connect_timeout: int = 10

    def __post_init__(self) -> None:
        _check_fields("limits", self)
        if (
            self.default_session_expiry is not None
            and self.default_session_expiry > self.max_session_expiry
        ):
            raise InvalidConfig(
                f"limits.default_session_expiry = {self.default_session_expiry} is more than"
                f" limits.max_session_expiry = {self.max_session_expiry}: the default cannot"
                " exceed the maximum"
            )

    @property
    def v311_session_expiry(self) -> int:
        """The session expiry of an MQTT 3.1.1 client connecting with clean session 0."""
        if self.default_session_expiry is None:
            return self.max_session_expiry
        return self.default_session_expiry


ACL_WILDCARD_STRICT = "strict"
ACL_WILDCARD_MODES = ("filter", ACL_WILDCARD_STRICT)
"""`auth.acl_wildcard` (riverbed.mqtt.acl: how a SUBSCRIBE is checked)."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Who may connect (`riverbed.mqtt.passwords.Authenticator`) and what they may do
    (`riverbed.mqtt.acl.Authorizer`; without an ACL file, anything)."""

    allow_anonymous: bool = False
    password_file: Path | None = None
    acl_file: Path | None = None
    acl_wildcard: str = "filter"
    """How a wildcard SUBSCRIBE is checked: `filter` grants it when the filter
    itself is allowed and withholds each message the client may not read;
    `strict` refuses it if it can reach any topic the client may not read."""

    def __post_init__(self) -> None:
        _check_fields("auth", self)


@dataclass(frozen=True, slots=True)
class SharedSubscriptions:
    """Durable shared subscriptions (`sharedsub/`): on or off, and the timers
    of the protocol between a group's members and its Leader (which check the
    rules between themselves: `SharedSubConfig`)."""

    enabled: bool = True
    timers: SharedSubConfig = field(default_factory=SharedSubConfig)

    def __post_init__(self) -> None:
        _check_fields("shared_subscriptions", self)


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention applied by the broker (`log/retention.py: Retainer`): every
    `interval` seconds (0: never), at most `batch` messages per transaction,
    warning about subscriptions that hold messages more than
    `pin_warning_hours` past retention."""

    interval: int = 60
    pin_warning_hours: int = 24
    batch: int = 10_000

    def __post_init__(self) -> None:
        _check_fields("retention", self)


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The admin HTTP API (`riverbed.http`): off without an `address`. Without a
    `token_file` every request is an admin's, so only a loopback address is
    allowed; `certfile` and `keyfile` together serve HTTPS."""

    address: Address | None = None
    token_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None

    def __post_init__(self) -> None:
        _check_fields("http", self)
        if (self.certfile is None) != (self.keyfile is None):
            given, missing = (
                ("http.certfile", "http.keyfile")
                if self.keyfile is None
                else ("http.keyfile", "http.certfile")
            )
            raise InvalidConfig(
                f"HTTPS needs http.certfile and http.keyfile: {given} given but {missing} missing"
            )
        if (
            self.address is not None
            and self.token_file is None
            and not is_loopback(self.address.host)
        ):
            raise InvalidConfig(
                f"http.address {self.address} is not a loopback address and no http.token_file"
                " is set: without tokens anyone who reaches it would be an admin; set"
                " http.token_file (`riverbed token add FILE NAME --role admin`) or listen on"
                " 127.0.0.1"
            )


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class SysConfig:
    """The `$SYS/broker/...` status topics (`mqtt/sys.py`): updated every
    `interval` seconds (0: never published)."""

    interval: int = 10

    def __post_init__(self) -> None:
        _check_fields("sys", self)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus metrics (`riverbed.metrics`): counted if `enabled`; the
    storage-derived gauges read every `refresh_interval` seconds."""

    enabled: bool = True
    refresh_interval: int = 15

    def __post_init__(self) -> None:
        _check_fields("metrics", self)


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The broker's own log: how much (`level`) and how (`format`)."""

    level: str = "info"
    format: str = "text"

    def __post_init__(self) -> None:
        _check_fields("log", self)


NODE_NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Several nodes on one PostgreSQL (docs/cluster.md): this node's name
    (`node_name`; unset: host name, process id and a random part, new at each
    start) and where a drained node sends its MQTT 5 clients
    (`server_reference`, the Server Reference of DISCONNECT 0x9C)."""

    node_name: str | None = None
    server_reference: str | None = None

    def __post_init__(self) -> None:
        _check_fields("cluster", self)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The whole broker configuration."""

    listeners: Listeners = field(default_factory=Listeners)
    storage: StorageConfig = field(default_factory=StorageConfig)
    limits: Limits = field(default_factory=Limits)
    auth: AuthConfig = field(default_factory=AuthConfig)
    shared_subscriptions: SharedSubscriptions = field(default_factory=SharedSubscriptions)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    sys: SysConfig = field(default_factory=SysConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        if not self.auth.allow_anonymous and self.auth.password_file is None:
            raise InvalidConfig(
                "auth.allow_anonymous is false and no auth.password_file is set, so no client"
                " could connect: set auth.password_file (`riverbed passwd FILE USER` creates"
                " one) or auth.allow_anonymous = true"
            )


# --------------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: how to read its value, and what it means."""

    convert: Callable[[str, object], Any]
    """`convert(key, value)`: the typed value, or `InvalidConfig` naming the rule."""
    help: str
    is_path: bool = False


def _fail(key: str, value: object, rule: str) -> InvalidConfig:
    return InvalidConfig(f"{key} = {value!r}: {rule}")


def _integer(low: int, high: int | None, why: str = "") -> Callable[[str, object], int]:
    bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
    rule = f"must be an integer {bounds}{why}"

    def convert(key: str, value: object) -> int:
        number = _as_int(value)
        if number is None or number < low or (high is not None and number > high):
            raise _fail(key, value, rule)
        return number

    return convert


def _as_int(value: object) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _seconds(high: int, never: bool = False, low: int = 0) -> Callable[[str, object], int]:
    rule = (
        f"must be whole seconds from {low} to {high}, as an integer or with a unit"
        ' (90, "15m", "12h", "7d")' + (' or "never"' if never else "")
    )

    def convert(key: str, value: object) -> int:
        if never and isinstance(value, str) and value.strip().lower() == "never":
            return SESSION_NEVER_EXPIRES
        number = _as_int(value)
        if number is None and isinstance(value, str):
            try:
                micros = parse_duration(value)
            except ValueError:
                raise _fail(key, value, rule) from None
            if micros % 1_000_000:
                raise _fail(key, value, rule)
            number = micros // 1_000_000
        if number is None or not low <= number <= high:
            raise _fail(key, value, rule)
        return number

    return convert


def _retention_interval(key: str, value: object) -> int:
    # `_seconds` takes the integer -1 as is: refused here.
    seconds: int = _seconds(7 * DAY)(key, value)
    if seconds < 0:
        raise _fail(key, value, f"must be whole seconds from 0 to {7 * DAY} (0: no retention)")
    return seconds


def _sys_interval(key: str, value: object) -> int:
    seconds: int = _seconds(DAY)(key, value)
    if seconds < 0:
        raise _fail(key, value, f"must be whole seconds from 0 to {DAY} (0: no $SYS topics)")
    return seconds


def _positive_seconds(key: str, value: object) -> float:
    rule = "must be a positive number of seconds (e.g. 0.5 or 4)"
    number: object = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _fail(key, value, rule) from None
    if (
        not isinstance(number, int | float)
        or isinstance(number, bool)
        or not math.isfinite(number)
        or number <= 0
    ):
        raise _fail(key, value, rule)
    return float(number)


def _optional(convert: Callable[[str, object], Any]) -> Callable[[str, object], Any]:
    def optional(key: str, value: object) -> Any:
        return None if value is None else convert(key, value)

    return optional


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _boolean(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _fail(key, value, "must be true or false")


def _choice(choices: tuple[str, ...]) -> Callable[[str, object], str]:
    def choice(key: str, value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise _fail(key, value, f"must be one of {', '.join(choices)}")

    return choice


def _node_name(key: str, value: object) -> str:
    if isinstance(value, str) and NODE_NAME_RULE.fullmatch(value):
        return value
    raise _fail(
        key,
        value,
        "must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit",
    )


def _server_reference(key: str, value: object) -> str:
    # MQTT 5.0 §4.11: a UTF-8 string, space-separated references; kept short
    # and printable here (it goes into every DISCONNECT of a drain).
    if isinstance(value, str) and value.strip() and value.isprintable() and len(value) <= 1024:
        return value.strip()
    raise _fail(key, value, 'must be a non-empty string of up to 1024 characters, e.g. "lb:1883"')


def _address(key: str, value: object) -> Address:
    if isinstance(value, Address):
        return value
    if not isinstance(value, str):
        raise _fail(key, value, 'must be HOST:PORT as a string, e.g. "127.0.0.1:1883"')
    try:
        return Address.parse(value)
    except InvalidConfig as exc:
        raise InvalidConfig(f"{key}: {exc}") from None


def _readable_file(key: str, value: object) -> Path:
    if not isinstance(value, str | Path) or not str(value):
        raise _fail(key, value, "must be the name of a file")
    path = Path(value)
    if not path.exists():
        raise InvalidConfig(f"{key} = {str(path)!r}: no such file")
    if not path.is_file():
        raise InvalidConfig(f"{key} = {str(path)!r}: not a regular file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InvalidConfig(f"{key} = {str(path)!r}: cannot be read ({exc.strerror})") from None
    return path


def _ws_path(key: str, value: object) -> str:
    rule = 'must be an absolute HTTP path such as "/mqtt" (no query, fragment or spaces)'
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or not value.isascii()
        or any(c in value for c in "?# ")
        or not value.isprintable()
    ):
        raise _fail(key, value, rule)
    return value


def _origins(key: str, value: object) -> tuple[str, ...]:
    """A list of web origins (`https://app.example.com`, `http://localhost:3000`),
    lowercased as browsers send them; a comma-separated string on the command line."""
    items: object = value
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(items, list | tuple):
        raise _fail(key, value, 'must be a list of origins, e.g. ["https://app.example.com"]')
    origins: list[str] = []
    for item in items:
        if not _is_origin(item):
            raise InvalidConfig(
                f"{key}: {item!r} is not an origin: SCHEME://HOST[:PORT] with http or https"
                ' and no path, not even "/", e.g. "https://app.example.com" or'
                ' "http://localhost:3000"'
            )
        origins.append(cast(str, item).lower())
    return tuple(origins)


def _is_origin(item: object) -> bool:
    """Whether `item` is an origin as a browser sends it in its Origin header (RFC 6454)."""
    if not isinstance(item, str) or not item.isascii() or any(c.isspace() for c in item):
        return False
    try:
        parts = urlsplit(item)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number 0..65535
    except ValueError:
        return False
    return (
        parts.scheme.lower() in ("http", "https")
        and bool(parts.hostname)
        and not (parts.path or parts.query or parts.fragment or "@" in parts.netloc)
    )


def _storage_url(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _fail(key, value, "must be a database URL string")
    try:
        StorageUrl.parse(value)
    except InvalidConfig as exc:
        # The URL may hold a password: show it redacted, never with !r of the raw value.
        shown = redact_url(value)
        rule = str(exc).removeprefix(f"database URL {shown!r}").removeprefix(":").strip()
        raise InvalidConfig(f"{key} = {shown!r}: {rule}") from None
    return value


_SHARED_TIMER_HELP = {
    "find_leader_retry": "seconds: a member asks again for its group's Leader this often",
    "ping_interval": "seconds: a member pings its group's Leader this often",
    "ping_timeout": "seconds: a member gives up on a Leader silent this long after a ping",
    "unsubscribe_timeout": "seconds a revoked stream waits for its messages' acknowledgements",
    "leader_borrower_timeout": "seconds: a member silent this long loses its streams to others",
    "fence_margin": "seconds: a member lets go this long before the Leader may drop it",
    "leader_periodic": "seconds: the Leader renews, rebalances and saves this often",
    "leader_resend": "seconds: the Leader resends an unanswered grant/revoke/revoked after this",
    "leader_claim_lease": "seconds the Leader's claim on its group lasts unrenewed",
    "leader_idle_stop": "seconds: a Leader with no member stops after this long",
}
"""The help of each `SharedSubConfig` field."""

KEYS: dict[str, Key] = {
    "listeners.mqtt": Key(_address, "HOST:PORT of the MQTT listener"),
    "listeners.tls.address": Key(_address, "HOST:PORT of the TLS listener"),
    "listeners.tls.certfile": Key(_readable_file, "PEM certificate chain", is_path=True),
    "listeners.tls.keyfile": Key(_readable_file, "PEM private key", is_path=True),
    "listeners.tls.cafile": Key(
        _optional(_readable_file),
        "PEM CA bundle; clients must present a certificate",
        is_path=True,
    ),
    "listeners.ws.address": Key(_address, "HOST:PORT of the MQTT over WebSockets listener"),
    "listeners.ws.path": Key(_ws_path, "the HTTP path of MQTT over WebSockets"),
    "listeners.ws.allowed_origins": Key(
        _origins, "origins browsers may connect from (empty: any), e.g. https://app.example.com"
    ),
    "listeners.ws.certfile": Key(
        _optional(_readable_file), "PEM certificate chain: serve WSS (with keyfile)", is_path=True
    ),
    "listeners.ws.keyfile": Key(_optional(_readable_file), "PEM private key of WSS", is_path=True),
    "listeners.ws.cafile": Key(
        _optional(_readable_file),
        "PEM CA bundle; WSS clients must present a certificate",
        is_path=True,
    ),
    "storage.url": Key(
        _optional(_storage_url),
        f"database URL; unset: --db, else $RIVERBED_DB, else {DEFAULT_URL}",
    ),
    "storage.commit_interval_ms": Key(
        _integer(0, 1000, " ms"), "the least time between two commits of PUBLISHes"
    ),
    "storage.poll_interval_ms": Key(
        _integer(1, 60_000, " ms"),
        "the least time between two looks for messages others committed"
        " (another node's commit wakes the broker at once on PostgreSQL)",
    ),
    "storage.idle_cursor_interval": Key(
        _seconds(3600, low=1),
        "seconds between two moves of online sessions' cursors past messages"
        " that matched none of their subscriptions",
    ),
    "limits.receive_maximum": Key(
        _integer(
            1, MAX_UINT16, " (MQTT 5.0 §3.2.2.3.3: a Receive Maximum of 0 is a Protocol Error)"
        ),
        "QoS 1/2 PUBLISHes a client may have unacknowledged",
    ),
    "limits.topic_alias_maximum": Key(
        _integer(0, MAX_UINT16), "topic aliases a client may set (0: none)"
    ),
    "limits.maximum_packet_size": Key(
        _integer(MIN_PACKET_SIZE, MAX_PACKET_SIZE, " bytes"), "the largest packet accepted"
    ),
    "limits.server_keep_alive": Key(
        _optional(_seconds(MAX_UINT16)), "keep alive imposed on MQTT 5 clients; unset: theirs"
    ),
    "limits.max_session_expiry": Key(
        _seconds(SESSION_NEVER_EXPIRES, never=True), "the longest session expiry granted"
    ),
    "limits.default_session_expiry": Key(
        _optional(_seconds(SESSION_NEVER_EXPIRES, never=True)),
        "session expiry of MQTT 3.1.1 clients with clean session 0",
    ),
    "limits.session_queue_limit": Key(
        _integer(1, None), "messages queued in memory for one online session"
    ),
    "limits.max_inflight": Key(
        _integer(1, MAX_UINT16), "QoS 1/2 messages sent to a client and unacknowledged"
    ),
    "limits.retain_available": Key(_boolean, "keep retained messages"),
    "limits.stop_grace": Key(
        _seconds(3600, low=1), "seconds a stopping broker may take before it exits anyway"
    ),
    "limits.write_buffer_limit": Key(
        _integer(MIN_WRITE_BUFFER, MAX_WRITE_BUFFER, " bytes"),
        "bytes waiting to go to one client before its QoS 0 messages are dropped",
    ),
    "limits.slow_consumer_timeout": Key(
        _seconds(DAY, low=1), "seconds a client's write buffer may stay full"
    ),
    "limits.connect_timeout": Key(
        _seconds(3600, low=1), "seconds a new connection may take to send its CONNECT"
    ),
    "shared_subscriptions.enabled": Key(_boolean, "accept $share/ and $queue/ subscriptions"),
    **{
        f"shared_subscriptions.{f.name}": Key(_positive_seconds, _SHARED_TIMER_HELP[f.name])
        for f in fields(SharedSubConfig)
    },
    "retention.interval": Key(
        _retention_interval, "seconds between the broker's retention passes (0: none)"
    ),
    "retention.pin_warning_hours": Key(
        _integer(1, None, " hours"), "warn when a subscription holds messages this long"
    ),
    "retention.batch": Key(
        _integer(100, 1_000_000, " messages"), "messages retention deletes per transaction"
    ),
    "sys.interval": Key(_sys_interval, "seconds between $SYS/broker/... updates (0: none)"),
    "metrics.enabled": Key(_boolean, "count and expose Prometheus metrics"),
    "metrics.refresh_interval": Key(
        _seconds(3600, low=1), "seconds between readings of lag, queue depths and sessions"
    ),
    "auth.allow_anonymous": Key(_boolean, "let clients without a user name connect"),
    "auth.password_file": Key(
        _optional(_readable_file), "user names and scrypt hashes", is_path=True
    ),
    "auth.acl_file": Key(_optional(_readable_file), "publish/subscribe rules", is_path=True),
    "auth.acl_wildcard": Key(
        _choice(ACL_WILDCARD_MODES),
        "filter: grant an allowed filter, withhold unreadable messages; strict: refuse it",
    ),
    # --- [http]: the admin HTTP API
    "http.address": Key(_optional(_address), "HOST:PORT of the admin HTTP API; unset: off"),
    "http.token_file": Key(
        _optional(_readable_file), "names, roles and hashes of bearer tokens", is_path=True
    ),
    "http.certfile": Key(
        _optional(_readable_file), "PEM certificate chain: serve HTTPS", is_path=True
    ),
    "http.keyfile": Key(_optional(_readable_file), "PEM private key of HTTPS", is_path=True),
    # --- [cluster]: several nodes on one PostgreSQL
    "cluster.node_name": Key(
        _optional(_node_name), "this node's name among the nodes; unset: host-pid-random"
    ),
    "cluster.server_reference": Key(
        _optional(_server_reference),
        "where a drained node sends MQTT 5 clients (Server Reference), e.g. lb:1883",
    ),
    # ---
    "log.level": Key(_choice(LOG_LEVELS), "how much the broker logs: debug, info, warning, error"),
    "log.format": Key(_choice(LOG_FORMATS), "log lines as text, or as one JSON object each"),
}
"""Every configuration key, dotted (`limits.receive_maximum`), in file order."""

_SECTIONS = {key.rpartition(".")[0] for key in KEYS}
_TLS_REQUIRED = ("listeners.tls.address", "listeners.tls.certfile", "listeners.tls.keyfile")


# --------------------------------------------------------------------- loading


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, object] | None = None
) -> BrokerConfig:
    """The configuration from the TOML file at `path` (if any) with `overrides`.

    `overrides` maps dotted keys to values, as command-line flags give them
    (strings, or already typed); `None` values are skipped.
    """
    typed: dict[str, object] = {}
    if path is not None:
        source = Path(path)
        for key, value in _flatten(_read_toml(source), "", str(source)).items():
            if KEYS[key].is_path and isinstance(value, str) and value:
                value = source.parent / value  # relative to the file; absolute stays absolute
            # A bad value in the file is refused even where a flag overrides it.
            typed[key] = _convert(key, value, str(source))
    for key, value in (overrides or {}).items():
        if key not in KEYS:
            raise _unknown(key, "command line")
        if value is not None:
            typed[key] = _convert(key, value, "command line")
    return _build(typed)


def _convert(key: str, value: object, origin: str) -> object:
    try:
        return KEYS[key].convert(key, value)
    except InvalidConfig as exc:
        raise InvalidConfig(f"{origin}: {exc}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise InvalidConfig(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise InvalidConfig(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidConfig(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _flatten(table: Mapping[str, Any], prefix: str, source: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise InvalidConfig(f"{source}: {key} must be a table ([{key}]), not {value!r}")
            out.update(_flatten(value, f"{key}.", source))
        elif key in KEYS:
            if isinstance(value, dict):
                raise InvalidConfig(f"{source}: {key} must be a value, not a table")
            out[key] = value
        elif isinstance(value, dict):
            sections = sorted(_SECTIONS)
            guess = difflib.get_close_matches(key, sections, n=1)
            hint = f" (did you mean [{guess[0]}]?)" if guess else ""
            raise InvalidConfig(
                f"{source}: unknown section [{key}]{hint}; known sections:"
                f" {', '.join(f'[{s}]' for s in sections)}"
            )
        else:
            raise _unknown(key, source)
    return out


def _unknown(key: str, source: str) -> InvalidConfig:
    section = key.rpartition(".")[0]
    known = [k for k in KEYS if k.rpartition(".")[0] == section] or list(KEYS)
    guess = difflib.get_close_matches(key, KEYS, n=1)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return InvalidConfig(f"{source}: unknown key {key!r}{hint}; known keys: {', '.join(known)}")


def _build(values: Mapping[str, object]) -> BrokerConfig:
    def section(name: str) -> dict[str, Any]:
        return {
            key.rpartition(".")[2]: value
            for key, value in values.items()
            if key.rpartition(".")[0] == name
        }

    tls_given = [key for key in KEYS if key.startswith("listeners.tls.") and key in values]
    tls: TlsListener | None = None
    if tls_given:
        missing = [key for key in _TLS_REQUIRED if key not in values]
        if missing:
            raise InvalidConfig(
                f"the TLS listener needs {', '.join(_TLS_REQUIRED)}; {', '.join(tls_given)}"
                f" given but {', '.join(missing)} missing"
            )
        tls = TlsListener(**section("listeners.tls"))
    ws_given = [key for key in KEYS if key.startswith("listeners.ws.") and key in values]
    ws: WebSocketListener | None = None
    if ws_given:
        if "listeners.ws.address" not in values:
            raise InvalidConfig(
                f"the WebSocket listener needs listeners.ws.address; {', '.join(ws_given)}"
                " given without it"
            )
        ws = WebSocketListener(**section("listeners.ws"))
    return BrokerConfig(
        listeners=Listeners(**section("listeners"), tls=tls, ws=ws),
        storage=StorageConfig(**section("storage")),
        limits=Limits(**section("limits")),
        auth=AuthConfig(**section("auth")),
        shared_subscriptions=_shared(section("shared_subscriptions")),
        retention=RetentionConfig(**section("retention")),
        sys=SysConfig(**section("sys")),
        metrics=MetricsConfig(**section("metrics")),
        log=LogConfig(**section("log")),
        http=HttpConfig(**section("http")),
        cluster=ClusterConfig(**section("cluster")),
    )


def _shared(values: dict[str, Any]) -> SharedSubscriptions:
    enabled = values.pop("enabled", True)
    try:
        return SharedSubscriptions(enabled, SharedSubConfig(**values))
    except InvalidConfig as exc:
        raise InvalidConfig(f"[shared_subscriptions]: {exc}") from None
