"""Running competing-consumer workers until a signal: in this process, or in N
child processes (what `riverbed worker` does).

SIGTERM or SIGINT asks every worker to stop: each finishes the batch in hand
and records its position (or abandons it unrecorded during a retry backoff), so
nothing is lost, then exits. A parent forwards the signal to its children and
waits for them. A child that fails (its handler failed with on-error stop, or
it was killed) makes the parent stop the others and exit 1.

Children are spawned, not forked: each opens its own storage and lock service
and imports the handler by its `module:function` name.

Counting (`riverbed worker --metrics`): each worker copies its delivered,
retried and parked counts into a tally of its own (`tallies`: shared memory
for a child, a list in this process), which the parent's metrics add up.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass

from riverbed.errors import HandlerFailed, InvalidInput, SubscriptionNotFound
from riverbed.signals import stop_on_signals
from riverbed.storage import open_storage
from riverbed.subscriptions.handling import ErrorPolicy, Guarantee, OnError, load_handler
from riverbed.subscriptions.workers import Worker, WorkerStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What a worker process is told (picklable: no callables)."""

    batch_size: int = 100
    guarantee: Guarantee = Guarantee.AT_LEAST_ONCE
    on_error: OnError = OnError.STOP
    max_attempts: int | None = None
    backoff: float = 0.5
    poll_interval: float = 1.0

    def policy(self) -> ErrorPolicy:
        return ErrorPolicy(
            self.on_error,
            max_attempts=self.max_attempts,
            backoff=self.backoff,
            give_up=OnError.SKIP if self.on_error is OnError.SKIP else OnError.STOP,
        )


Tally = MutableSequence[int]
"""A worker's delivered, retried and parked message counts, in that order."""


def tallies(processes: int) -> list[Tally]:
    """One tally per worker of `run_processes`: shared memory its child writes
    and this process reads (a plain list for one worker, which runs here)."""
    if processes == 1:
        return [[0, 0, 0]]
    context = multiprocessing.get_context("spawn")
    return [context.RawArray("q", 3) for _ in range(processes)]


def _keep(tally: Tally) -> Callable[[WorkerStats], None]:
    def copy(stats: WorkerStats) -> None:
        tally[0], tally[1], tally[2] = stats.delivered, stats.retried, stats.parked

    return copy


def run_worker(
    url: str,
    subscription: str,
    handler_spec: str,
    options: WorkerOptions,
    tally: Tally | None = None,
) -> int:
    """Run one worker in this process until SIGTERM/SIGINT. Returns the exit code:
    0 when stopped by a signal, 1 when the handler failed and the policy said stop.

    Raises `InvalidInput` (bad handler or option) and `SubscriptionNotFound`
    before it starts. With `tally`, the worker's counts are copied there.
    """
    handler = load_handler(handler_spec)
    storage = open_storage(url)
    try:
        worker = Worker(
            storage,
            subscription,
            handler,
            batch_size=options.batch_size,
            guarantee=options.guarantee,
            on_error=options.policy(),
            poll_interval=options.poll_interval,
            on_counted=None if tally is None else _keep(tally),
        )
        try:
            with stop_on_signals(worker.stop):
                worker.run()
        except (HandlerFailed, SubscriptionNotFound) as exc:  # the latter: deleted meanwhile
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        storage.close()


def _child(
    url: str,
    subscription: str,
    handler_spec: str,
    options: WorkerOptions,
    tally: Tally | None,
) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(message)s")
    sys.exit(run_worker(url, subscription, handler_spec, options, tally))


def run_processes(
    url: str,
    subscription: str,
    handler_spec: str,
    processes: int,
    options: WorkerOptions,
    counted: Sequence[Tally] | None = None,
) -> int:
    """Run `processes` workers, each in a child process, until SIGTERM/SIGINT (or
    until one fails). Returns the exit code: 0 when all stopped on a signal, 1 if
    one failed. With `counted` (`tallies(processes)`), worker i counts into
    `counted[i]`."""
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise InvalidInput(f"process count {processes!r} must be an integer >= 1")
    load_handler(handler_spec)  # refuse a bad name here, not N times in the children
    storage = open_storage(url)
    try:
        storage.get_subscription(subscription)
    finally:
        storage.close()
    if counted is not None and len(counted) != processes:
        raise InvalidInput(f"{len(counted)} tallies for {processes} worker processes")
    if processes == 1:
        return run_worker(
            url, subscription, handler_spec, options, None if counted is None else counted[0]
        )
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(
            target=_child,
            args=(
                url,
                subscription,
                handler_spec,
                options,
                None if counted is None else counted[i],
            ),
            name=f"riverbed-worker-{i}",
        )
        for i in range(processes)
    ]
    stopping = threading.Event()
    handles: dict[int, int] = {}
    """Each started child's pidfd (Linux): it names that process for good, so a
    SIGTERM sent after the child was reaped cannot reach another process that
    was given its pid since (`exitcode` reaps; a signal handler may run
    between that and the kill)."""

    def stop_all() -> None:
        stopping.set()
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    handle = handles.get(child.pid)
                    if handle is None:
                        os.kill(child.pid, signal.SIGTERM)
                    else:
                        signal.pidfd_send_signal(handle, signal.SIGTERM)

    code = 0
    with stop_on_signals(stop_all):
        try:
            for child in children:
                child.start()
                if child.pid is not None and hasattr(os, "pidfd_open"):
                    with contextlib.suppress(OSError):  # a kernel without pidfds
                        handles[child.pid] = os.pidfd_open(child.pid)
            running = list(children)
            while running:
                multiprocessing.connection.wait([c.sentinel for c in running], timeout=1.0)
                for child in [c for c in running if c.exitcode is not None]:
                    running.remove(child)
                    if child.exitcode != 0 and not stopping.is_set():
                        print(
                            f"error: worker process {child.pid} exited with {child.exitcode};"
                            " stopping the others",
                            file=sys.stderr,
                            flush=True,
                        )
                        code = 1
                        stop_all()
                    elif child.exitcode not in (0, None, -signal.SIGTERM):
                        # Ended by our SIGTERM: before its handler was set (it was
                        # still starting), so with nothing in hand; a clean stop.
                        code = 1
        finally:
            stop_all()
            for child in children:
                if child.pid is not None:
                    child.join()
            for handle in handles.values():
                os.close(handle)
    return code
