"""Small builders for tests that talk to a `Storage` directly."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from riverbed.model import MessageIdGenerator, encode_properties
from riverbed.storage import Storage
from riverbed.storage.base import RetentionPolicy, Row, StreamHead, TopicRecord

_ids = MessageIdGenerator(node=1)


def topic_record(
    name: str,
    *,
    binding: str | None = None,
    retention_us: int | None = None,
    retention_policy: RetentionPolicy = RetentionPolicy.CONSUMED_AND_EXPIRED,
    created_us: int = 1_700_000_000_000_000,
) -> TopicRecord:
    return TopicRecord(name, binding, retention_us, retention_policy, 0, created_us)


def accept_any(existing: list[TopicRecord]) -> None:
    """A `create_topic` validator that refuses nothing."""


def create_topic(storage: Storage, name: str, partitions: int = 1) -> list[StreamHead]:
    """Create a topic (generation 0) and return its streams' heads."""
    storage.create_topic(topic_record(name), partitions, accept_any)
    return storage.list_streams(name)


def head(storage: Storage, stream_key: int) -> StreamHead:
    """The head of one stream (fails the test if the stream is gone)."""
    found = [h for h in storage.list_streams() if h.key == stream_key]
    assert found, f"stream {stream_key} does not exist"
    return found[0]


def make_rows(
    payloads: Iterable[bytes], *, key: str | None = "k", timestamps: Iterable[int] | None = None
) -> list[Row]:
    """One row per payload, with fresh ids, on MQTT topic `t`."""
    rows: list[Row] = []
    stamps = iter(timestamps) if timestamps is not None else None
    for payload in payloads:
        raw, now_us = _ids.next_raw()
        timestamp_us = next(stamps) if stamps is not None else now_us
        rows.append((raw.to_bytes(16, "big"), timestamp_us, "t", key, payload, None, 1, 0))
    return rows


def mixed_rows() -> list[Row]:
    """Four rows of every shape a reader must carry: keys null and not (null
    first: SQLite's ADBC driver infers types from the first rows), properties
    none and some, empty and binary payloads, timestamps 10, 20, 30, 40."""
    rows = make_rows([b"", b"\x00\xff", b"c", b"d"], key=None, timestamps=[10, 20, 30, 40])
    props = encode_properties((("a", "1"), ("b", b"\x01")))
    out: list[Row] = []
    for i, row in enumerate(rows):
        r = list(row)
        r[3] = None if i < 2 else f"k{i}"
        r[5] = props if i == 3 else None
        r[6] = i % 3
        r[7] = i % 2
        out.append(tuple(r))  # type: ignore[arg-type]
    return out


def numbered_rows(count: int, first: int = 0, key: str | None = "k") -> list[Row]:
    """Rows whose payloads are `b"0"`, `b"1"`, ... from `first` on."""
    return make_rows((str(n).encode() for n in range(first, first + count)), key=key)


def writer_rows(ids: MessageIdGenerator, writer: int, first_sequence: int, count: int) -> list[Row]:
    """Rows of one concurrent writer: key `w<writer>`, payload `<writer>:<sequence>`."""
    rows: list[Row] = []
    for sequence in range(first_sequence, first_sequence + count):
        raw, timestamp_us = ids.next_raw()
        payload = f"{writer}:{sequence}".encode()
        rows.append((raw.to_bytes(16, "big"), timestamp_us, "t", f"w{writer}", payload, None, 1, 0))
    return rows


def check_writers(payloads: list[bytes]) -> dict[int, list[int]]:
    """Check one stream's `writer:sequence` payloads: no duplicates and each
    writer's sequences increasing. Return the sequences by writer."""
    assert len(set(payloads)) == len(payloads), "a message was written twice"
    by_writer: dict[int, list[int]] = {}
    for payload in payloads:
        writer_text, sequence_text = payload.decode().split(":")
        by_writer.setdefault(int(writer_text), []).append(int(sequence_text))
    for writer, sequences in by_writer.items():
        assert sequences == sorted(sequences), f"writer {writer}'s messages are out of order"
    return by_writer


@contextlib.contextmanager
def raw_connection(url: str) -> Iterator[Any]:
    """A plain driver connection to the database at `url` in autocommit mode,
    for SQL behind the storage's back (a schema as an older version left it)."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            yield pg


# --------------------------------------------------------------- a writer in another process

WRITER_SCRIPT = Path(__file__).parents[1] / "storage" / "writer_process.py"
TESTS_DIR = Path(__file__).parents[1]


@contextmanager
def writer_process(
    url: str, stream_keys: list[int], writer: int, batches: int, rows_per_stream: int
) -> Iterator[subprocess.Popen[str]]:
    """A `writer_process.py` child that has opened the storage and waits for `go`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR)]))}
    command = [
        sys.executable,
        str(WRITER_SCRIPT),
        url,
        ",".join(map(str, stream_keys)),
        str(writer),
        str(batches),
        str(rows_per_stream),
    ]
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if line != "ready\n":
                process.kill()
                _, errors = process.communicate(timeout=30)
                raise AssertionError(f"writer {writer} did not start: {line!r} {errors}")
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)


def go(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()


def finish(process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait for a writer to say `done` and exit 0."""
    output, errors = process.communicate(timeout=timeout)
    assert process.returncode == 0 and output == "done\n", errors
