"""Seed 003's shard-consistent router and its partition-count rules.

A storage topic with P partitions and scale factor K refines `P / K` base
partitions (its *lineages*). The router

    j = (K * h) % P + (h // P) % K

sends hash h to partition j of lineage `j // K == h % (P / K)`: the lineage of a
key depends only on the base count, which AddStorageTopic keeps constant while K
grows. That is why per-key order survives a scale-up (DESIGN.md, Lineage).
"""

from __future__ import annotations

import zlib

from riverbed.errors import InvalidPartitionCount

MAX_PARTITIONS = 65_536
"""The most partitions a storage topic may have. A topic keeps a stream per
partition and describes them all in memory; without a bound, a mistyped count
(or a request to the HTTP API) could make the process allocate until it is
killed, before anything is written."""


def validate_partitions(partitions: object) -> int:
    """Return the count if seed 003 allows it: 1, 2, 3, or a multiple of 4 or 6,
    at most `MAX_PARTITIONS`."""
    if not isinstance(partitions, int) or isinstance(partitions, bool):
        raise InvalidPartitionCount(f"partition count {partitions!r} is not an integer")
    if partitions < 1:
        raise InvalidPartitionCount(f"partition count {partitions} must be at least 1")
    if partitions > MAX_PARTITIONS:
        raise InvalidPartitionCount(
            f"partition count {partitions} is more than the {MAX_PARTITIONS:,} allowed"
        )
    if partitions in (1, 2, 3) or partitions % 4 == 0 or partitions % 6 == 0:
        return partitions
    raise InvalidPartitionCount(
        f"partition count {partitions} is not allowed: use 1, 2, 3 or a multiple of 4 or 6"
        " (seed 003)"
    )


def scale_factor(previous_partitions: int, previous_k: int, new_partitions: int) -> int:
    """K of a storage topic added after one with `previous_partitions` and `previous_k`.

    seed 003, AddStorageTopic: if the new count is a multiple of the previous base
    count P/K, K = new / base; otherwise K = 1 (a reset: lineages start afresh).
    """
    base = previous_partitions // previous_k
    if new_partitions % base == 0:
        return new_partitions // base
    return 1


def route(h: int, partitions: int, k: int) -> int:
    """seed 003, Produce: the partition for hash `h` in a storage topic (P, K)."""
    return (k * h) % partitions + (h // partitions) % k


def lineage(partition: int, k: int) -> int:
    """The base partition (lineage) that `partition` of a storage topic with K refines."""
    return partition // k


def key_hash(key: str) -> int:
    """A stable 32-bit hash of a key: the same in every process and every run.

    CRC-32 rather than Python's `hash()`, which is salted per process.
    """
    return zlib.crc32(key.encode("utf-8"))
