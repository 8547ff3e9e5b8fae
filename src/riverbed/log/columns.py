"""Produce for rows held as Arrow columns: ids, hashes and routes, vectorised.

What `Appender` does one message at a time (stamp an id, hash the key, seed 003
Produce), done column-wise for a writer that already holds its rows as Arrow
record batches (the Spark sink), so no Python object is made per row. Every
function gives exactly what the per-message path gives for the same rows:
`key_hashes` is `router.key_hash` (CRC-32 of the UTF-8 key; a row without a key
takes the appender's next spread value), `routes` is `router.route`, `stamp`
mints the ids `MessageIdGenerator.reserve` would.

Needs pyarrow (the `riverbed[spark]` extra), imported when first used.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

from riverbed.log.partitioning import key_hash
from riverbed.model import MessageIdGenerator


def key_hashes(keys: Any, spread: Iterator[int]) -> Any:
    """Each row's router hash (int64): `key_hash(key)`, or for a row without a
    key the next value of `spread`, taken in row order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    nulls = keys.null_count
    if nulls == n:
        return pa.array(list(itertools.islice(spread, n)), pa.int64())
    # Hash each distinct key once: most writes repeat a few keys.
    encoded = pc.dictionary_encode(keys)
    distinct = encoded.dictionary.to_pylist()
    hashed = pc.take(pa.array([key_hash(k) for k in distinct], pa.int64()), encoded.indices)
    if nulls == 0:
        return hashed
    # The i-th keyless row takes the i-th spread value.
    spread_values = pa.array(list(itertools.islice(spread, nulls)), pa.int64())
    rank = pc.subtract(pc.cumulative_sum(pc.is_null(keys).cast(pa.int64())), 1)
    return pc.coalesce(hashed, pc.take(spread_values, pc.if_else(pc.is_null(keys), rank, 0)))


def _mod(values: Any, divisor: int) -> Any:
    """`values % divisor` for non-negative int64 values (integer `divide` truncates,
    which for them is floor division)."""
    import pyarrow.compute as pc

    return pc.subtract(values, pc.multiply(pc.divide(values, divisor), divisor))


def routes(hashes: Any, partitions: int, k: int) -> Any:
    """seed 003, Produce, for every hash: `(K * h) % P + (h // P) % K` (int64),
    as `router.route`."""
    import pyarrow.compute as pc

    return pc.add(_mod(pc.multiply(hashes, k), partitions), _mod(pc.divide(hashes, partitions), k))


def group(targets: Any) -> tuple[Any | None, list[tuple[int, int]]]:
    """Rows by partition: the indices that order them by partition, keeping their
    order within one (None when they all go to one partition), and each
    partition's row count, in partition order."""
    import pyarrow.compute as pc

    counts = pc.value_counts(targets)
    found = sorted(
        zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)
    )
    if len(found) <= 1:
        return None, found
    return pc.sort_indices(targets), found  # sort_indices is a stable sort


@functools.cache
def _sequence_bytes() -> tuple[bytes, bytes]:
    """The high and the low byte of every 16-bit sequence number."""
    return bytes(s >> 8 for s in range(1 << 16)), bytes(s & 0xFF for s in range(1 << 16))


def stamp(ids: MessageIdGenerator, count: int) -> tuple[Any, Any]:
    """`count` fresh ids (binary, the 16 bytes of `MessageId`) and their
    timestamps (int64 µs), in increasing order, as `ids.reserve(count)` would
    mint them."""
    import pyarrow as pa

    high, low = _sequence_bytes()
    data = bytearray()
    stamps = []
    for ts, first, n in ids.reserve_spans(count):
        # timestamp : 64 | node : 48 | sequence : 16, big-endian (model.MessageId)
        span = bytearray(((ts << 48) | ids.node).to_bytes(14, "big") + b"\0\0") * n
        span[14::16] = high[first : first + n]
        span[15::16] = low[first : first + n]
        data += span
        stamps.append(pa.repeat(pa.scalar(ts, pa.int64()), n))
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), count, [None, pa.py_buffer(data)])
    timestamps = pa.concat_arrays(stamps) if stamps else pa.array([], pa.int64())
    return fixed.cast(pa.binary()), timestamps
