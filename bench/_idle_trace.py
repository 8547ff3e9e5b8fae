"""`riverbed` under tracemalloc, for `bench/idle_connections.py --sites`.

    python bench/_idle_trace.py serve ...     # the arguments of `riverbed`

A file `snap-NAME` appearing in the folder $RIVERBED_TRACE_DIR makes it dump
a snapshot of the Python heap (after a garbage collection) to `NAME.snap`
there, then create `NAME.done`. A thread watches the folder, so the broker
needs no hook of its own.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 12
"""Frames kept per allocation: enough to reach the broker's code from the loop's."""


def _watch(folder: Path) -> None:
    while True:
        for request in sorted(folder.glob("snap-*")):
            name = request.name.removeprefix("snap-")
            request.unlink()
            gc.collect()
            tracemalloc.take_snapshot().dump(str(folder / f"{name}.snap"))
            (folder / f"{name}.done").touch()
        time.sleep(0.1)


def main() -> None:
    tracemalloc.start(FRAMES)
    folder = Path(os.environ["RIVERBED_TRACE_DIR"])
    threading.Thread(target=_watch, args=(folder,), daemon=True).start()
    from riverbed.cli._app import main as riverbed

    sys.argv[0] = "riverbed"
    riverbed()


if __name__ == "__main__":
    main()
