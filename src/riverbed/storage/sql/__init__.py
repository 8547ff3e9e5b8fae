"""What both SQL backends share: every query but the hot append and the wake-ups.

Queries are written once with `?` placeholders; a backend that uses another
paramstyle sets `PARAMSTYLE` and they are rewritten once. Reads go through
`_q`, writes through `with self._write() as cur` (`connections.py`: per-thread
connections, transactions, what happens when a connection breaks). Every public
method is an `operation`: a driver error escaping it becomes a `StorageError`.

`SqlStorage` is made of one part per subject, each a mixin over `SqlCore`
(`core.py`: the connections, the dialect's hooks, the schema): `topics.py`
(topics, generations, heads), `messages.py` (appends, markers, reads,
retention's deletes), `subscriptions.py` (subscriptions and cursors) and
`kv.py` (the key-value store).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from riverbed.storage.connections import operation
from riverbed.storage.sql.core import SqlCore as SqlCore
from riverbed.storage.sql.kv import KVQueries
from riverbed.storage.sql.messages import FIRST_OFFSET_AT as FIRST_OFFSET_AT
from riverbed.storage.sql.messages import RECORD_MARKER as RECORD_MARKER
from riverbed.storage.sql.messages import MessageQueries
from riverbed.storage.sql.subscriptions import SubscriptionQueries
from riverbed.storage.sql.topics import TopicQueries


class SqlStorage(TopicQueries, MessageQueries, SubscriptionQueries, KVQueries):
    """Base of the SQLite and PostgreSQL storages: the queries."""

    networked = False
    """`Storage.networked` (PostgreSQL's says True)."""

    def not_waiting(self) -> AbstractContextManager[None]:
        """Within it, this thread's transactions do not wait for the write lock
        (`transaction_now`); a backend whose commits always wait on a server
        has no such mode (PostgreSQL)."""
        raise NotImplementedError(f"{type(self).__name__} has no transactions that do not wait")

    def busy(self, exc: BaseException | None) -> bool:
        """Whether a driver's error says another connection holds the write lock."""
        return False

    @operation
    def commits_elsewhere(self) -> int | None:
        return None  # a server's other connections: not told here
