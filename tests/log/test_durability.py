"""Acknowledged means committed: kill -9 a producer, and nothing it was told is lost.

DESIGN.md guarantee 1. A child process produces through `Log.produce` and prints
each acknowledged position with its payload; we SIGKILL it at a random moment,
reopen the database and look for every one of them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness.waiting import eventually
from riverbed.log.log import Log
from riverbed.model import StreamId
from riverbed.storage import open_storage

pytestmark = pytest.mark.slow

PRODUCER = """
import random, sys
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage

log = Log(open_storage(sys.argv[1]))
rng = random.Random(int(sys.argv[2]))
print("ready", flush=True)
sequence = 0
while True:
    size = rng.choice([1, 1, 2, 5])
    batch = [
        Message(b"payload-%d" % (sequence + i), key="k%d" % ((sequence + i) % 7))
        for i in range(size)
    ]
    positions = log.produce("t", batch)
    lines = [
        "%s %d %s" % (stream, offset, m.payload.decode())
        for (stream, offset), m in zip(positions, batch)
    ]
    sys.stdout.write("\\n".join(lines) + "\\n")
    sys.stdout.flush()
    sequence += size
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_loses_no_acknowledged_message(storage_url: str, seed: int) -> None:
    setup = Log(open_storage(storage_url))
    setup.topics.create("t", 4)
    setup.close()

    kill_after = random.Random(seed).uniform(0, 0.8)
    with subprocess.Popen(
        [sys.executable, "-c", PRODUCER, storage_url, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline() == b"ready\n"
            stdout = proc.stdout
            chunks: list[bytes] = []
            # Keep the pipe drained so that the child never blocks writing to it.
            reader = threading.Thread(target=lambda: chunks.extend(stdout))
            reader.start()
            # Enough acknowledged to test something, then a random moment more.
            eventually(lambda: len(chunks) > 20, what="20 acknowledged messages")
            time.sleep(kill_after)  # the scenario: a random point to kill at
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            reader.join(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGKILL

    text = b"".join(chunks).decode()
    complete = text[: text.rfind("\n") + 1]  # the last line may be cut by the kill
    acknowledged = [line.split(" ") for line in complete.splitlines()]
    assert len(acknowledged) > 10, "the producer acknowledged too little to test anything"

    storage = open_storage(storage_url)
    try:
        stored: dict[tuple[StreamId, int], bytes] = {}
        for head in storage.list_streams("t"):
            messages = storage.read(head.key, 0, head.next_offset + 1)
            assert [m.offset for m in messages] == list(range(head.next_offset)), head.stream
            stored.update({(head.stream, m.offset): m.payload for m in messages})
    finally:
        storage.close()

    for stream, offset, payload in acknowledged:
        key = (StreamId.parse(stream), int(offset))
        assert stored.get(key) == payload.encode(), f"acknowledged {payload} lost at {key}"
    # At most the batch in flight at the kill is committed without an acknowledgement,
    # and nothing is stored twice.
    assert len(set(stored.values())) == len(stored)
    assert 0 <= len(stored) - len(acknowledged) <= 5
