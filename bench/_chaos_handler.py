"""The competing-consumer handler of bench/chaos.py (`riverbed worker ...
--handler _chaos_handler:record`, run with bench/ as the current directory).

Each call appends one line to `$CHAOS_WORKER_OUT` with a single O_APPEND write
once the batch is handled: `exit-time pid stream offsets payloads` (monotonic
seconds, one clock for every process on the machine). A worker killed inside
the call writes nothing: that batch was never acknowledged.
"""

from __future__ import annotations

import os
import time
from typing import Any

OUT = os.environ.get("CHAOS_WORKER_OUT", "worker-calls.txt")


def record(batch: Any) -> None:
    offsets = ",".join(str(m.offset) for m in batch.messages)
    payloads = ",".join(m.payload.decode() for m in batch.messages)
    line = f"{time.monotonic():.6f} {os.getpid()} {batch.stream} {offsets} {payloads}\n"
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
