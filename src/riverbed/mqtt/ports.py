"""What the broker's parts below it use of the broker, named as a `typing.Protocol`.

The package is layered top-down (docs/architecture.md, "The mqtt package"):
`broker` (listeners, the registry of connections) over `websocket` over
`connection` (the asyncio adapter of one client) over the helpers of one
connection or of the broker (`following`, `inbound`, `wills` over `sharing`,
`sys`) over this module over the sans-I/O core, the fan-out, the pacer and the
stores, over the codec. A module never imports one above it, not even for a
type annotation: what it needs of the `Broker` is `Services` (what it needs of
its `Connection`, the module says itself: `following.FollowingOwner`,
`sharing.SharingOwner`). The `Broker` fits it as it is, attribute for
read-only property, so nothing costs a call more at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Protocol, TypeVar

from riverbed.log.log import Log
from riverbed.log.retention import Holds, Retainer
from riverbed.metrics import Counts
from riverbed.mqtt.acl import Authorizer
from riverbed.mqtt.config import BrokerConfig
from riverbed.mqtt.deadlines import Deadlines
from riverbed.mqtt.fanout import Fanout
from riverbed.mqtt.pacer import CommitPacer
from riverbed.mqtt.retained import RetainedStore
from riverbed.mqtt.shapes import TopicShapes
from riverbed.mqtt.turns import EndOfTurn
from riverbed.sessions.reader import ResumeReader
from riverbed.sessions.store import SessionStore
from riverbed.sessions.writer import SessionWriter
from riverbed.sharedsub.runtime import SharedRuntime
from riverbed.topics.trie import TopicTrie

T = TypeVar("T")


class Services(Protocol):
    """The broker's shared parts, as a connection, its helpers, the Wills and
    the `$SYS` publisher use them (`mqtt/broker.py`'s `Broker` is the one)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def log(self) -> Log: ...

    @property
    def store(self) -> SessionStore: ...

    @property
    def writer(self) -> SessionWriter:
        """Session writes of all connections, group-committed."""
        ...

    @property
    def resumes(self) -> ResumeReader:
        """Resuming sessions' records and cursors, many per read."""
        ...

    @property
    def retained(self) -> RetainedStore: ...

    @property
    def trie(self) -> TopicTrie[Hashable]:
        """Topic filter -> the subscribers (connections) matching it."""
        ...

    @property
    def fanout(self) -> Fanout: ...

    @property
    def pacer(self) -> CommitPacer: ...

    @property
    def deadlines(self) -> Deadlines:
        """Every connection's CONNECT timeout and keep alive, on one timer."""
        ...

    @property
    def turns(self) -> EndOfTurn:
        """The sessions' offers and the connections' writes, at the end of a turn."""
        ...

    @property
    def shapes(self) -> TopicShapes:
        """Topics' shapes and bindings, read once for all sessions."""
        ...

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def may_publish(self) -> Callable[[str | None, str, str], bool]:
        """`authorizer.allows_publish`, one bound method for every connection."""
        ...

    @property
    def shared(self) -> SharedRuntime | None:
        """Durable shared subscriptions, unless disabled."""
        ...

    @property
    def holds(self) -> Holds:
        """Where SUBSCRIBEs taken here start until their cursors are committed."""
        ...

    @property
    def retainer(self) -> Retainer | None:
        """Retention on a schedule, unless its interval is 0."""
        ...

    @property
    def counts(self) -> Counts:
        """What the broker counted (read by `$SYS` and the metrics)."""
        ...

    @property
    def connections(self) -> Mapping[str, object]:
        """Client id -> the connection holding its session on this node."""
        ...

    def unwritten_sessions(self) -> int:
        """Sessions of connections here that are not stored yet (they end with
        their connection: `Broker.defers_ephemeral`), for counts of all sessions."""
        ...

    async def read(self, read: Callable[..., T], *args: object) -> T:
        """A storage read for a connection (never a write)."""
        ...

    async def read_shared(self, key: Hashable, read: Callable[..., T], *args: object) -> T:
        """`read`, joined by every connection asking with the same `key` while
        it runs (the answer is as of some moment after the call)."""
        ...
