"""A node's shared-subscription runtime on an event loop.

Two sides, each with its own in-process bus:

- the loop side: the sessions' Borrowers (their Shared Subscription Handlers
  run on the event loop, like the sessions);
- the leader side: the node-local `Registry` and the `LeaderHost` with its
  Leaders, in one worker thread, because they call the storage (claims,
  progress) and must not block the loop.

A message goes to the side its address lives on: `REGISTRY` and the Leaders'
ids to the leader thread, everything else (Borrower ids) to the loop. Each side
drains its bus after every hand-over, so a message never waits for a timer.
The leader thread runs `LeaderHost.tick` at the host's `next_deadline()`; the
sessions tick their own Handlers.

    runtime = SharedRuntime(storage, config, node)
    runtime.register(borrower_id, deliver)     # on the loop
    runtime.send(to, message)                  # from the loop
    ...
    await runtime.close()                      # saves and releases the claims
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Generic, TypeVar

from riverbed.errors import RiverbedError, StorageUnavailable
from riverbed.sharedsub.bus import InProcessBus, Registry
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.host import LeaderHost
from riverbed.sharedsub.protocol import REGISTRY, Address, Message, Ping, decode, encode
from riverbed.storage.base import Storage

if TYPE_CHECKING:
    from riverbed.cluster.bus import PostgresBus

log = logging.getLogger(__name__)

Deliver = Callable[[Message], None]
T = TypeVar("T")


URGENT_EVERY = 16
"""The leader thread looks for urgent calls (pings) after this many others."""

SAVE_LOOK = 0.05
"""While the Leaders' saves are made, the leader thread looks for pings this often."""

FLUSH_EVERY = 0.5
"""Seconds the leader thread may go on taking calls before it makes the saves
they asked for (and sends what waits for them); it makes them anyway once no
call waits."""


class _Mailbox(Generic[T]):
    """Items handed from one thread to another in batches: `put` says whether
    the taker must be woken (the first item since its last `take`), so a burst
    costs one wake-up, not one per item. Urgent items are taken first, and
    the taker may take them alone between the others (`take_urgent`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._urgent: list[T] = []
        self._woken = False

    def put(self, item: T, urgent: bool = False) -> bool:
        with self._lock:
            (self._urgent if urgent else self._items).append(item)
            if self._woken:
                return False
            self._woken = True
            return True

    def take(self) -> list[T]:
        """Everything waiting, the urgent items first."""
        with self._lock:
            items = self._urgent + self._items if self._urgent else self._items
            self._items, self._urgent = [], []
            self._woken = False
            return items

    def take_urgent(self) -> list[T]:
        """The urgent items only (for a taker that is at work: no wake-up is owed)."""
        if not self._urgent:  # a peek without the lock: a put is seen at the next look
            return []
        with self._lock:
            items, self._urgent = self._urgent, []
            return items


class _LeaderSide:
    """The leader thread's bus: Leaders and the registry here, the rest to the loop."""

    def __init__(self, runtime: SharedRuntime) -> None:
        self.runtime = runtime
        self.bus = InProcessBus(wire=False)

    def register(self, address: Address, deliver: Deliver) -> None:
        self.bus.register(address, deliver)
        with self.runtime._lock:
            self.runtime._leader_side.add(address)
        if self.runtime.remote is not None:
            self.runtime.remote.announce(address)

    def unregister(self, address: Address) -> None:
        self.bus.unregister(address)
        with self.runtime._lock:
            self.runtime._leader_side.discard(address)
        if self.runtime.remote is not None:
            self.runtime.remote.forget(address)

    def send(self, to: Address, message: Message) -> None:
        runtime = self.runtime
        if runtime._on_leader_side(to):
            self.bus.send(to, message)
        elif runtime.remote is not None and not runtime.bus.has(to):
            # Another node's Borrower (or one gone): a server round trip, made
            # by the sending thread, in order, not by the leader thread.
            runtime.remote.post_send(to, message)
        else:
            runtime._to_loop(to, message)


class SharedRuntime:
    """Runs the shared subscriptions of one broker node."""

    def __init__(
        self,
        storage: Storage,
        config: SharedSubConfig,
        node: str,
        *,
        remote_url: str | None = None,
    ) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._leader_side: set[Address] = {REGISTRY}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="riverbed-shared-leaders")
        self._saver = ThreadPoolExecutor(1, thread_name_prefix="riverbed-shared-saves")
        """Makes the Leaders' saves while the leader thread answers pings (`_flush`)."""
        self._side = _LeaderSide(self)
        self.registry = Registry(self._side, is_local=self._on_leader_side)
        self.host = LeaderHost(storage, self._side, self.registry, config, node)
        self.host.batching = True
        self.registry.find_leader = self.host.find_leader
        self._side.bus.register(REGISTRY, self.registry.deliver)
        self.bus = InProcessBus(wire=False)
        """The loop side: the sessions' Borrowers."""
        self._draining = False
        self._tick: asyncio.TimerHandle | None = None
        self._inbox: _Mailbox[tuple[Callable[..., object], tuple[object, ...]]] = _Mailbox()
        """Calls for the leader thread."""
        self._outbox: _Mailbox[tuple[Address, Message]] = _Mailbox()
        """Messages for the loop's Borrowers."""
        self._planned: float | None = None
        """The leader side's deadline last handed to the loop (leader thread)."""
        self._closed = False
        self.remote: PostgresBus[Message] | None = None
        """The bus to other nodes (`remote_url`: their shared PostgreSQL)."""
        if remote_url is not None:
            from riverbed.cluster.bus import PostgresBus  # psycopg: not for SQLite

            self.remote = PostgresBus(
                remote_url, storage, node, self._from_remote, encode=encode, decode=decode
            )
            self.host.remote_leaders = True

    async def start(self) -> None:
        """Listen for other nodes' messages (with `remote_url`)."""
        if self.remote is not None:
            await asyncio.to_thread(self.remote.start)

    # ----------------------------------------------------------------- the loop side

    def register(self, address: Address, deliver: Deliver) -> None:
        """A Borrower of a session on this node (call on the loop)."""
        self.bus.register(address, deliver)
        if self.remote is not None:
            self.remote.post_announce(address)

    def unregister(self, address: Address) -> None:
        self.bus.unregister(address)
        if self.remote is not None:
            self.remote.post_forget(address)

    def send(self, to: Address, message: Message) -> None:
        """Send from the loop (a Handler's `Send` effect)."""
        if self._on_leader_side(to):
            self._on_leader(self._side.bus.send, to, message, urgent=isinstance(message, Ping))
        elif self.remote is not None and not self.bus.has(to):
            # Another node's Leader: in order, off the loop (one sending thread).
            self.remote.post_send(to, message)
        else:
            self.bus.send(to, message)
            self._drain_soon()

    def _from_remote(self, to: Address, message: Message) -> None:
        """From another node (the listener thread)."""
        if self._on_leader_side(to):
            self._on_leader(self._side.bus.send, to, message, urgent=isinstance(message, Ping))
        else:
            self._to_loop(to, message)

    def _to_loop(self, to: Address, message: Message) -> None:
        """From the leader thread: a message for a Borrower."""
        if not self._closed and self._outbox.put((to, message)):
            self.loop.call_soon_threadsafe(self._arrived)

    def _arrived(self) -> None:
        self.receive_arrived()

    def receive_arrived(self) -> None:
        """On the loop: hand the Borrowers what the leader thread sent them, now.
        Called when the loop is woken for it, and before a session's timers run
        (mqtt/sharing.py): an answer that came while the loop was stuck (a busy
        machine) moves its Borrower's fence before the timers that fell due
        meanwhile look at it. Handed over one loop turn later, it came after
        them, and the Borrower fenced itself off though its Leader had
        answered in time (its in-flight messages went out again)."""
        arrived = self._outbox.take()
        if not arrived:
            return
        for to, message in arrived:
            self.bus.send(to, message)
        self.bus.drain()

    def _drain_soon(self) -> None:
        if not self._draining:
            self._draining = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._draining = False
        self.bus.drain()

    def _on_leader_side(self, address: Address) -> bool:
        with self._lock:
            return address in self._leader_side

    # ----------------------------------------------------------------- the leader thread

    def _on_leader(self, call: Callable[..., object], *args: object, urgent: bool = False) -> None:
        """Run `call(*args)` on the leader thread, then drain its bus and plan
        the next tick. Calls queue up and the thread takes all that wait in one
        go (one hand-over for a burst, not one per message). `urgent` (a
        Borrower's ping) goes before the others waiting, and is taken between
        them too."""
        if not self._closed and self._inbox.put((call, args), urgent):
            self._executor.submit(self._leader_steps)

    def _leader_steps(self) -> None:
        """The leader thread's work: the calls waiting, then the saves they
        asked for (one transaction for all the Leaders). A ping is answered
        within `URGENT_EVERY` other calls of its arrival, and the saves are made
        at least every `FLUSH_EVERY` seconds, so neither waits for the calls
        to stop coming: on a busy machine a Borrower whose ping waited behind
        thousands of other calls let go of its streams (its fence), its
        replacement's requests made more calls, and the leader thread fell
        further behind."""
        flushed = time.monotonic()
        while calls := self._inbox.take():
            for done, (call, args) in enumerate(calls, 1):
                self._leader_call(call, args)
                if done % URGENT_EVERY == 0:
                    for urgent, urgent_args in self._inbox.take_urgent():
                        self._leader_call(urgent, urgent_args)
            if time.monotonic() - flushed >= FLUSH_EVERY:
                self._flush()
                flushed = time.monotonic()
        self._flush()
        deadline = self.host.next_deadline()
        if deadline is not None and deadline != self._planned and not self._closed:
            # Only when it moved: waking the loop costs a write to its self-pipe.
            self._planned = deadline
            self.loop.call_soon_threadsafe(self._plan_tick, deadline)

    def _flush(self) -> None:
        """`LeaderHost.flush` with its saves on the saving thread, the leader
        thread answering pings meanwhile: a Borrower's ping must be answered
        within half its fence's window (2.25 s by default), and the saves of 50
        groups took longer than that on a busy machine."""
        try:
            flush = self.host.take_flush()
        except Exception:
            log.exception("shared subscriptions: the leader side failed")
            return
        if flush is None:
            return
        saving = self._saver.submit(self.host.save_flush, flush)
        while True:
            try:
                results = saving.result(timeout=SAVE_LOOK)
                break
            except TimeoutError:
                for call, args in self._inbox.take_urgent():
                    self._leader_call(call, args)
            except Exception as exc:  # a bug in the save: each Leader stops, said
                log.exception("shared subscriptions: saving the Leaders' progress failed")
                results = [RiverbedError(f"the save failed: {exc!r}")] * len(flush.saves)
                break
        self._leader_call(self.host.end_flush, (flush, results))

    def _leader_call(self, call: Callable[..., object], args: tuple[object, ...]) -> None:
        try:
            call(*args)
            self._side.bus.drain()
        except StorageUnavailable as exc:
            _unreachable(exc)
        except Exception:
            log.exception("shared subscriptions: the leader side failed")

    def _plan_tick(self, deadline: float) -> None:
        """On the loop: tick the leader side at `deadline` (monotonic seconds)."""
        if self._closed:
            return
        if self._tick is not None:
            self._tick.cancel()
        delay = max(0.0, deadline - self.host.clock())
        self._tick = self.loop.call_later(delay, self._on_leader, self._leader_tick)

    def _leader_tick(self) -> None:
        """On the leader thread: the planned tick is used up, plan the next
        whatever it is (`_leader_steps` plans only deadlines that moved)."""
        self._planned = None
        self.host.tick()

    async def close(self, timeout: float = 10.0) -> None:
        """Save and release every claim this node holds; stop the leader thread
        and the bus. Gives up after about `timeout` seconds (a database that does
        not answer): the claims then expire as after a crash, and the next
        Leader resumes from the last progress saved."""
        if self._tick is not None:
            self._tick.cancel()
        done = self.loop.run_in_executor(self._executor, self.host.close)
        self._closed = True
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            log.warning(
                "shared subscriptions: saving the Leaders' progress took over %g s", timeout
            )
        except Exception:
            log.exception("shared subscriptions: saving the Leaders' progress failed")
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._saver.shutdown(wait=False, cancel_futures=True)
        if self.remote is not None:
            await asyncio.to_thread(self.remote.close, timeout / 2)


def _unreachable(exc: StorageUnavailable) -> None:
    """The store cannot be reached (a restart, a failover): one line, no
    traceback; the next tick tries again (what it could not save is saved
    then, or redelivered after a takeover)."""
    log.warning("shared subscriptions: the leader side waits for the store: %s", exc)
