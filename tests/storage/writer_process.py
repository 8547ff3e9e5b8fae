"""A writer in a separate process, for the storage contract tests.

Run with `tests/` on PYTHONPATH (for `harness`):

    python writer_process.py URL STREAM_KEYS WRITER BATCHES ROWS_PER_STREAM

Opens the storage, prints `ready`, waits for a line `go` on stdin, then appends
BATCHES batches, each with ROWS_PER_STREAM rows for every stream in STREAM_KEYS
(comma-separated), in one `append` call per batch. Payloads are
`WRITER:SEQUENCE`, with one sequence counting up across all of this writer's
rows, so a reader can check the writer's order in every stream. Prints `done`.
"""

from __future__ import annotations

import sys

from harness.storage import writer_rows
from riverbed.model import MessageIdGenerator
from riverbed.storage import open_storage
from riverbed.storage.base import Row


def main(argv: list[str]) -> int:
    url, keys_text, writer_text, batches_text, rows_text = argv[1:]
    keys = [int(key) for key in keys_text.split(",")]
    writer, batches, rows_per_stream = int(writer_text), int(batches_text), int(rows_text)
    storage = open_storage(url)
    try:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        ids = MessageIdGenerator()
        sequence = 0
        for _ in range(batches):
            batch: dict[int, list[Row]] = {}
            for key in keys:
                batch[key] = writer_rows(ids, writer, sequence, rows_per_stream)
                sequence += rows_per_stream
            storage.append(batch)
        print("done", flush=True)
    finally:
        storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
