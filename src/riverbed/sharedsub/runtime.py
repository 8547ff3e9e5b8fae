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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from riverbed.cluster.bus import PostgresBus
from riverbed.errors import StorageUnavailable
from riverbed.sharedsub.bus import InProcessBus, Registry
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.host import LeaderHost
from riverbed.sharedsub.protocol import REGISTRY, Address, Message, decode, encode
from riverbed.storage.base import Storage

log = logging.getLogger(__name__)

Deliver = Callable[[Message], None]
T = TypeVar("T")


class _Mailbox(Generic[T]):
    """Items handed from one thread to another in batches: `put` says whether
    the taker must be woken (the first item since its last `take`), so a burst
    costs one wake-up, not one per item."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._woken = False

    def put(self, item: T) -> bool:
        with self._lock:
            self._items.append(item)
            if self._woken:
                return False
            self._woken = True
            return True

    def take(self) -> list[T]:
        with self._lock:
            items, self._items = self._items, []
            self._woken = False
            return items


class _LeaderSide:
    """The leader thread's bus: Leaders and the registry here, the rest to the loop."""

    def __init__(self, runtime: SharedRuntime) -> None:
        self.runtime = runtime
        self.bus = InProcessBus()

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
        self._side = _LeaderSide(self)
        self.registry = Registry(self._side, is_local=self._on_leader_side)
        self.host = LeaderHost(storage, self._side, self.registry, config, node)
        self.host.batching = True
        self.registry.find_leader = self.host.find_leader
        self._side.bus.register(REGISTRY, self.registry.deliver)
        self.bus = InProcessBus()
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
            self._on_leader(self._side.bus.send, to, message)
        elif self.remote is not None and not self.bus.has(to):
            # Another node's Leader: in order, off the loop (one sending thread).
            self.remote.post_send(to, message)
        else:
            self.bus.send(to, message)
            self._drain_soon()

    def _from_remote(self, to: Address, message: Message) -> None:
        """From another node (the listener thread)."""
        if self._on_leader_side(to):
            self._on_leader(self._side.bus.send, to, message)
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

    def _on_leader(self, call: Callable[..., object], *args: object) -> None:
        """Run `call(*args)` on the leader thread, then drain its bus and plan
        the next tick. Calls queue up and the thread takes all that wait in one
        go (one hand-over for a burst, not one per message)."""
        if not self._closed and self._inbox.put((call, args)):
            self._executor.submit(self._leader_steps)

    def _leader_steps(self) -> None:
        while calls := self._inbox.take():
            for call, args in calls:
                try:
                    call(*args)
                    self._side.bus.drain()
                except StorageUnavailable as exc:
                    _unreachable(exc)
                except Exception:
                    log.exception("shared subscriptions: the leader side failed")
        try:
            self.host.flush()
            self._side.bus.drain()
        except StorageUnavailable as exc:
            _unreachable(exc)
        except Exception:
            log.exception("shared subscriptions: the leader side failed")
        deadline = self.host.next_deadline()
        if deadline is not None and deadline != self._planned and not self._closed:
            # Only when it moved: waking the loop costs a write to its self-pipe.
            self._planned = deadline
            self.loop.call_soon_threadsafe(self._plan_tick, deadline)

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
        if self.remote is not None:
            await asyncio.to_thread(self.remote.close, timeout / 2)


def _unreachable(exc: StorageUnavailable) -> None:
    """The store cannot be reached (a restart, a failover): one line, no
    traceback; the next tick tries again (what it could not save is saved
    then, or redelivered after a takeover)."""
    log.warning("shared subscriptions: the leader side waits for the store: %s", exc)
