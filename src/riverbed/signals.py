"""Stopping on SIGTERM and SIGINT, with the stop run off the signal handler.

Python runs a signal handler on the main thread between two bytecodes of
whatever that thread was doing. If that code held a lock at the time (a
`threading.Event`'s own, while `Event.wait` returns) and the handler needs the
same lock (`Event.set`), the thread waits for itself: the process hangs and a
second SIGTERM changes nothing. So the handler here does one thing that takes no
Python lock, a put into a `queue.SimpleQueue` (reentrant by design), and a thread
of its own calls `stop` for each signal heard.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(
    stop: Callable[[], None], signals: tuple[signal.Signals, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """While the block runs, each of `signals` calls `stop()` on a thread of its
    own (never inside the handler). Off the main thread, where Python sets no
    signal handlers, the block runs with the signals left as they were. The
    previous handlers are back when the block ends, and every signal heard
    before that has had its `stop()` call."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def call() -> None:
        while heard.get() is not None:
            stop()

    caller = threading.Thread(target=call, name="riverbed-stop-signals", daemon=True)
    caller.start()

    def handle(signum: int, frame: FrameType | None) -> None:
        heard.put(signum)

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        heard.put(None)
        caller.join()
