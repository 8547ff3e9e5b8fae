"""How Borrowers and Leaders reach each other: the `Bus`, and the registry.

A bus delivers a message to an address: a Borrower's id, a Leader's id, or
`REGISTRY`. It promises little, on purpose, so that a bus between broker nodes
fits the same protocol: a message may be lost (a node died, a queue overflowed)
and is then repeated by the protocol's resends and timeouts; messages from one
sender to one address arrive in the order sent. A bus carries the JSON bytes of
`protocol.encode`, so what works in process also crosses processes; a
PostgreSQL implementation can `NOTIFY` a node's channel with the address and
those bytes (8000 bytes is plenty: the largest message, `disconnect`, carries a
progress pair per held stream) and look addresses up in a table of which node
hosts which Borrower or Leader.

`InProcessBus` is that bus inside one process, with no asyncio: `send` queues,
`drain` delivers to the handlers registered for each address (a message to an
address nobody registered is dropped and counted). A runtime drains it from its
loop; tests drain it step by step and may inject loss or duplication. By
default it carries the encoded bytes, so tests prove each message crosses a
wire; a broker's runtime passes `wire=False` and hands the (frozen) message
objects over as they are: 1,000 Borrowers ping a node's Leaders about 450
times a second, and encoding and decoding each was a fifth of the leader
thread's time.

`Registry` is the node-local registry of seed 001 that `leader_wanted` goes to:
it forwards the request (and a `disconnect` from a Borrower that never learned
its Leader) to the group's Leader, asking `find_leader` (the runtime: look up or
take the leader claim, start a Leader) when it knows none. If that finds nobody,
the request is dropped and the Borrower asks again after its retry period.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from riverbed.sharedsub.protocol import (
    REGISTRY,
    Address,
    Disconnect,
    GroupId,
    LeaderId,
    LeaderWanted,
    Message,
    decode,
    encode,
)

Deliver = Callable[[Message], None]


class Bus(Protocol):
    """Delivers messages to addresses, at most once each, in order per sender."""

    def send(self, to: Address, message: Message) -> None:
        """Hand `message` over for `to`; never blocks, never raises for an
        unknown address (the message is lost, as over a network)."""
        ...


Fault = Callable[[Address, Message], int]
"""For tests: how many copies of a message to deliver (0 loses it)."""


class InProcessBus:
    """A bus inside one process: a FIFO queue drained by the owner's loop."""

    def __init__(self, fault: Fault | None = None, *, wire: bool = True) -> None:
        self._handlers: dict[Address, Deliver] = {}
        self._queue: deque[tuple[Address, bytes | Message]] = deque()
        self.fault = fault
        self.wire = wire
        """Carry `protocol.encode`'s bytes (decoded at delivery), not the objects."""
        self.dropped = 0
        """Messages to an address nobody registered (at delivery time)."""
        self.delivered = 0

    def register(self, address: Address, deliver: Deliver) -> None:
        self._handlers[address] = deliver

    def unregister(self, address: Address) -> None:
        self._handlers.pop(address, None)

    def has(self, address: Address) -> bool:
        """Whether `address` is registered here."""
        return address in self._handlers

    def send(self, to: Address, message: Message) -> None:
        copies = 1 if self.fault is None else self.fault(to, message)
        carried = encode(message) if self.wire else message
        for _ in range(copies):
            self._queue.append((to, carried))

    def pending(self) -> int:
        return len(self._queue)

    def deliver_one(self) -> bool:
        """Deliver the oldest queued message; False if there was none."""
        if not self._queue:
            return False
        to, carried = self._queue.popleft()
        handler = self._handlers.get(to)
        if handler is None:
            self.dropped += 1
        else:
            self.delivered += 1
            handler(decode(carried) if isinstance(carried, bytes) else carried)
        return True

    def drain(self, limit: int = 100_000) -> int:
        """Deliver until the queue is empty (including what handlers send); return
        how many were taken. Stops after `limit` to end a ping-pong that never
        settles."""
        count = 0
        while count < limit and self.deliver_one():
            count += 1
        return count


class Registry:
    """The node-local registry: forwards `leader_wanted` to the group's Leader."""

    def __init__(
        self,
        bus: Bus,
        find_leader: Callable[[GroupId], LeaderId | None] | None = None,
        *,
        is_local: Callable[[LeaderId], bool] | None = None,
    ) -> None:
        self.bus = bus
        self.leaders: dict[GroupId, LeaderId] = {}
        self.find_leader = find_leader
        self.is_local = is_local
        """With nodes sharing a bus: only this node's Leaders are remembered (a
        Leader elsewhere may be gone by the next `leader_wanted`: looked up again)."""
        self.unanswered = 0

    address: Address = REGISTRY

    def set_leader(self, group: GroupId, leader: LeaderId | None) -> None:
        if leader is None:
            self.leaders.pop(group, None)
        else:
            self.leaders[group] = leader

    def deliver(self, message: Message) -> None:
        if not isinstance(message, LeaderWanted | Disconnect):
            return  # nothing else is addressed to a registry
        leader = self.leaders.get(message.group)
        if leader is None and self.find_leader is not None:
            leader = self.find_leader(message.group)
            if leader is not None and (self.is_local is None or self.is_local(leader)):
                self.leaders[message.group] = leader
        if leader is None:
            self.unanswered += 1
            return
        self.bus.send(leader, message)
