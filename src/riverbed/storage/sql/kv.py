"""The key-value store with preconditions."""

from __future__ import annotations

from collections.abc import Sequence

from riverbed.errors import InvalidInput, PreconditionFailed
from riverbed.storage.base import KVEntry
from riverbed.storage.connections import Cursor, operation
from riverbed.storage.sql.core import SqlCore, in_parts


class KVQueries(SqlCore):
    """The key-value queries of `SqlStorage`."""

    # --- key-value ----------------------------------------------------------
    @operation
    def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        row = self._q(
            "SELECT value, version FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
        ).fetchone()
        return None if row is None else KVEntry(namespace, key, bytes(row[0]), int(row[1]))

    @operation
    def kv_get_many(self, namespace: str, keys: Sequence[str]) -> dict[str, KVEntry]:
        out: dict[str, KVEntry] = {}
        for part in in_parts(keys):
            rows = self._q(
                "SELECT key, value, version FROM kv WHERE namespace = ? AND key IN"
                f" ({', '.join('?' * len(part))})",
                (namespace, *part),
            )
            for key, value, version in rows:
                out[key] = KVEntry(namespace, key, bytes(value), int(version))
        return out

    @operation
    def kv_list(self, namespace: str, prefix: str = "") -> list[KVEntry]:
        # A range of the primary key (keys sort by code point on both backends),
        # not `substr(key, 1, n) = prefix`, which read every key of the namespace.
        end = prefix_end(prefix)
        if end is None:
            return self._kv_rows(namespace, "key >= ?", (prefix,))
        return self._kv_rows(namespace, "key >= ? AND key < ?", (prefix, end))

    @operation
    def kv_page(self, namespace: str, after: str | None, limit: int) -> list[KVEntry]:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput(f"page size {limit!r} must be an integer >= 1")
        if after is None:
            return self._kv_rows(namespace, "", (), limit)
        return self._kv_rows(namespace, "key > ?", (after,), limit)

    def _kv_rows(
        self, namespace: str, keys: str, params: tuple[str, ...], limit: int | None = None
    ) -> list[KVEntry]:
        """The entries of `namespace` whose keys satisfy `keys` (an SQL condition
        on `key` with `params`; empty: all), in key order, at most `limit`."""
        sql = "SELECT key, value, version FROM kv WHERE namespace = ?"
        if keys:
            sql += f" AND {keys}"
        sql += " ORDER BY key"
        args: tuple[str | int, ...] = (namespace, *params)
        if limit is not None:
            sql += " LIMIT ?"
            args = (*args, limit)
        rows = self._q(sql, args).fetchall()
        return [KVEntry(namespace, k, bytes(v), int(ver)) for k, v, ver in rows]

    @operation
    def kv_any(self, namespace: str, prefix: str = "") -> bool:
        end = prefix_end(prefix)
        sql = "SELECT 1 FROM kv WHERE namespace = ? AND key >= ?"
        args: tuple[str, ...] = (namespace, prefix)
        if end is not None:
            sql, args = sql + " AND key < ?", (*args, end)
        return self._q(sql + " LIMIT 1", args).fetchone() is not None

    @operation
    def kv_count(self, namespace: str) -> int:
        row = self._q("SELECT count(*) FROM kv WHERE namespace = ?", (namespace,)).fetchone()
        return int(row[0])

    @operation
    def kv_put(self, namespace: str, key: str, value: bytes) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
                " version = kv.version + 1 RETURNING version",
                (namespace, key, value),
            ).fetchone()
            return KVEntry(namespace, key, value, int(row[0]))

    @operation
    def kv_put_if_absent(self, namespace: str, key: str, value: bytes) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "INSERT INTO kv (namespace, key, value, version) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (namespace, key) DO NOTHING RETURNING version",
                (namespace, key, value),
            ).fetchone()
            if row is None:
                raise PreconditionFailed(f"key {namespace}/{key} exists already")
            return KVEntry(namespace, key, value, 1)

    @operation
    def kv_compare_and_set(
        self, namespace: str, key: str, expected_version: int, value: bytes
    ) -> KVEntry:
        with self._write() as cur:
            row = self._x(
                cur,
                "UPDATE kv SET value = ?, version = version + 1"
                " WHERE namespace = ? AND key = ? AND version = ? RETURNING version",
                (value, namespace, key, expected_version),
            ).fetchone()
            if row is None:
                raise PreconditionFailed(
                    f"key {namespace}/{key} is not at version {expected_version}"
                )
            return KVEntry(namespace, key, value, int(row[0]))

    @operation
    def kv_delete_if_version(self, namespace: str, key: str, expected_version: int) -> None:
        with self._write() as cur:
            if not self._kv_delete_if_version_on(cur, namespace, key, expected_version):
                raise PreconditionFailed(
                    f"key {namespace}/{key} is not at version {expected_version}"
                )

    def _kv_delete_if_version_on(
        self, cur: Cursor, namespace: str, key: str, expected_version: int
    ) -> bool:
        """`kv_delete_if_version` inside the transaction of `cur`: whether the
        key was there at that version (and is gone now)."""
        deleted: int = self._x(
            cur,
            "DELETE FROM kv WHERE namespace = ? AND key = ? AND version = ?",
            (namespace, key, expected_version),
        ).rowcount
        return deleted > 0


_MAX_CHAR = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)
"""Code points no stored key holds (text is UTF-8 on both backends)."""


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix`, in code
    point order; None when there is none (an empty prefix, or one of only
    U+10FFFF): `prefix <= key < prefix_end(prefix)` is `key.startswith(prefix)`."""
    stem = prefix.rstrip(chr(_MAX_CHAR))
    if not stem:
        return None
    following = ord(stem[-1]) + 1
    if following in _SURROGATES:
        following = _SURROGATES.stop
    return stem[:-1] + chr(following)
