"""Leases over the key-value namespace: one owner at a time, until it expires.

A lease is a KV record `{owner, expires_us}`. Taking it is a put-if-absent, or a
compare-and-set on the version we read when the record is ours already or has
expired; renewing and releasing are compare-and-sets on the version our last
write left. Each write bumps the version, which doubles as a fencing token: an
owner that lost its lease (it expired and someone else took it) finds its next
renewal refused, whatever its own clock says. Time is passed in (`now_us`), so
callers with a fake clock can test expiry without sleeping.

The shared-subscription leader claim (seed 001) is built on this.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from riverbed.clock import now_us as clock_now_us
from riverbed.errors import InvalidInput, LeaseHeld, PreconditionFailed
from riverbed.storage.base import KVEntry, Storage
from riverbed.storage.transactions import kv_write_in, transaction

NAMESPACE = "leases"


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as its holder last wrote it."""

    name: str
    owner: str
    expires_us: int
    version: int
    """The KV version after our last write: the fencing token."""

    def expired(self, now_us: int) -> bool:
        return now_us >= self.expires_us


class Leases:
    """Acquire, renew, release and inspect named leases in one storage."""

    def __init__(self, storage: Storage, namespace: str = NAMESPACE) -> None:
        self.storage = storage
        self.namespace = namespace

    def get(self, name: str) -> Lease | None:
        """The current record, expired or not (None if nobody ever took it or it
        was released)."""
        entry = self.storage.kv_get(self.namespace, name)
        return None if entry is None else _decode(entry)

    def acquire(self, name: str, owner: str, ttl_us: int, now_us: int | None = None) -> Lease:
        """Take the lease for `ttl_us`, or extend it if `owner` holds it already.

        Raises `LeaseHeld` if another owner holds an unexpired lease (also when
        another owner took it between our read and our write).
        """
        _check(owner, ttl_us)
        now_us = clock_now_us() if now_us is None else now_us
        value = _encode(owner, now_us + ttl_us)
        entry = self.storage.kv_get(self.namespace, name)
        try:
            if entry is None:
                written = self.storage.kv_put_if_absent(self.namespace, name, value)
            else:
                current = _decode(entry)
                if current.owner != owner and not current.expired(now_us):
                    raise _held(current)
                written = self.storage.kv_compare_and_set(
                    self.namespace, name, entry.version, value
                )
        except PreconditionFailed as exc:
            if isinstance(exc, LeaseHeld):
                raise
            raced = self.get(name)
            if raced is not None and raced.owner != owner:
                raise _held(raced) from None
            raise
        return _decode(written)

    def renew(self, lease: Lease, ttl_us: int, now_us: int | None = None) -> Lease:
        """Extend a lease we hold. Raises `PreconditionFailed` if it is no longer
        ours as we last wrote it (it expired and was taken, or was released)."""
        _check(lease.owner, ttl_us)
        now_us = clock_now_us() if now_us is None else now_us
        if lease.expired(now_us):
            # Our own clock says it is gone: someone may hold it by now, so do
            # not resurrect it here; acquire it again instead.
            raise _expired(lease)
        written = self.storage.kv_compare_and_set(
            self.namespace, lease.name, lease.version, _encode(lease.owner, now_us + ttl_us)
        )
        return _decode(written)

    def renew_many(
        self, leases: Sequence[Lease], ttl_us: int, now_us: int | None = None
    ) -> list[Lease | PreconditionFailed]:
        """`renew` for several leases in one transaction (a node's Leaders whose
        claims fall due in the same round: one commit, not one per lease). Each
        renewal succeeds or fails alone: per lease, in order, its new record or
        the `PreconditionFailed` `renew` would have raised (nothing written of it)."""
        for lease in leases:
            _check(lease.owner, ttl_us)
        now_us = clock_now_us() if now_us is None else now_us
        out: list[Lease | PreconditionFailed] = []
        with transaction(self.storage) as tx:
            for lease in leases:
                if lease.expired(now_us):
                    out.append(_expired(lease))
                    continue
                value = _encode(lease.owner, now_us + ttl_us)
                version = kv_write_in(tx, self.namespace, lease.name, value, lease.version)
                if version is None:
                    out.append(_moved(self.namespace, lease))
                else:
                    out.append(Lease(lease.name, lease.owner, now_us + ttl_us, version))
        return out

    def end(self, lease: Lease, at_us: int) -> Lease:
        """Mark another holder's lease lapsed at `at_us`, its holder known to be
        gone (`cluster/presence.py`): who held it stays readable. Raises
        `PreconditionFailed` if it changed since `lease` was read."""
        written = self.storage.kv_compare_and_set(
            self.namespace, lease.name, lease.version, _encode(lease.owner, at_us)
        )
        return _decode(written)

    def release(self, lease: Lease) -> None:
        """Give a lease up. Raises `PreconditionFailed` if it was no longer ours."""
        self.storage.kv_delete_if_version(self.namespace, lease.name, lease.version)


def _check(owner: str, ttl_us: int) -> None:
    if not isinstance(owner, str) or not owner:
        raise InvalidInput(f"lease owner {owner!r} must be a non-empty string")
    if not isinstance(ttl_us, int) or isinstance(ttl_us, bool) or ttl_us <= 0:
        raise InvalidInput(f"lease time-to-live {ttl_us!r}us must be a positive integer")


def _expired(lease: Lease) -> PreconditionFailed:
    return PreconditionFailed(f"lease {lease.name!r} of {lease.owner!r} expired before its renewal")


def _moved(namespace: str, lease: Lease) -> PreconditionFailed:
    """What `kv_compare_and_set` says of a key no longer at our version."""
    return PreconditionFailed(f"key {namespace}/{lease.name} is not at version {lease.version}")


def _encode(owner: str, expires_us: int) -> bytes:
    return json.dumps({"owner": owner, "expires_us": expires_us}).encode()


def _decode(entry: KVEntry) -> Lease:
    record = json.loads(entry.value)
    return Lease(entry.key, str(record["owner"]), int(record["expires_us"]), entry.version)


def _held(current: Lease) -> LeaseHeld:
    return LeaseHeld(
        f"lease {current.name!r} is held by {current.owner!r} until {current.expires_us}us (epoch)"
    )
