"""SIGTERM and SIGINT call a stop off the signal handler (`riverbed.signals`).

The defect these guard against: a worker process hung on SIGTERM because its
handler called `Worker.stop` (an `Event.set`) on the main thread at a moment the
main thread held that event's lock (returning from `Event.wait`). Here the
interrupted code holds a lock the stop needs, every time: a stop run inside the
handler cannot take it, one run on a thread of its own takes it as soon as the
interrupted code lets go.
"""

from __future__ import annotations

import signal
import threading

from tests.harness.waiting import DEFAULT_TIMEOUT, eventually

from riverbed.signals import stop_on_signals


def test_a_stop_needing_a_lock_the_interrupted_code_holds_runs_once_it_is_let_go() -> None:
    lock = threading.Lock()
    took: list[bool] = []

    def stop() -> None:
        taken = lock.acquire(timeout=DEFAULT_TIMEOUT / 6)
        took.append(taken)
        if taken:
            lock.release()

    with stop_on_signals(stop):
        with lock:
            signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
            held_by_main = lock.locked()
        eventually(lambda: took, what="the stop after SIGTERM")
    assert held_by_main
    assert took == [True], "the stop could not take the lock the interrupted code held"


def test_each_signal_heard_has_its_stop_and_the_previous_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    calls: list[str] = []
    with stop_on_signals(lambda: calls.append(threading.current_thread().name)):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    # The block's end waits for the stops of the signals heard in it.
    assert len(calls) == 2
    assert threading.main_thread().name not in calls
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_off_the_main_thread_the_block_runs_with_the_handlers_untouched() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def body() -> None:
        with stop_on_signals(lambda: seen.append("stop")):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]
