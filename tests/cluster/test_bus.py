"""The bus between nodes over PostgreSQL LISTEN/NOTIFY (cluster/bus.py),
with a real server: delivery in order to an announced address on another node,
and losses the protocol tolerates (an unknown address, a payload over
PostgreSQL's limit) counted, never raised."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

import pytest

from harness.waiting import eventually
from riverbed.cluster.bus import MAX_PAYLOAD, NodeBus, PostgresBus, channel
from riverbed.model import StreamId
from riverbed.sharedsub.protocol import Address, Disconnect, GroupId, Message, Ping, decode, encode
from riverbed.storage import Storage, open_storage

GROUP = GroupId("g", "t/#")


Buses = tuple["PostgresBus[Message]", "queue.Queue[tuple[Address, Message]]"]


def shared_bus(
    url: str, storage: Storage, node: str, deliver: Callable[[Address, Message], None]
) -> PostgresBus[Message]:
    """A bus carrying the shared subscriptions' messages, as their runtime makes it."""
    return PostgresBus(url, storage, node, deliver, encode=encode, decode=decode)


@pytest.fixture
def storage(postgres_url: str) -> Iterator[Storage]:
    opened = open_storage(postgres_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def buses(postgres_url: str, storage: Storage) -> Iterator[Buses]:
    got: queue.Queue[tuple[Address, Message]] = queue.Queue()
    sender = shared_bus(postgres_url, storage, "node-a", lambda a, m: None)
    receiver = shared_bus(postgres_url, storage, "node-b", lambda a, m: got.put((a, m)))
    sender.start()
    receiver.start()
    try:
        yield sender, got
        assert receiver.dropped == 0
    finally:
        receiver.close()
        sender.close()


def test_messages_reach_an_address_on_another_node_in_order(buses: Buses, storage: Storage) -> None:
    sender, got = buses
    shared_bus("unused", storage, "node-b", lambda a, m: None).announce("borrower-1")
    pings = [Ping(GROUP, "borrower-1", "node-a/leader/x", seq) for seq in range(20)]
    for ping in pings:
        sender.send("borrower-1", ping)
    received = [got.get(timeout=10) for _ in pings]
    assert received == [("borrower-1", ping) for ping in pings]
    assert sender.dropped == 0


def test_lost_messages_are_counted_not_raised(buses: Buses, storage: Storage) -> None:
    sender, got = buses
    sender.send("nobody", Ping(GROUP, "nobody", "node-a/leader/x", 1))  # never announced
    shared_bus("unused", storage, "node-b", lambda a, m: None).announce("big")
    progress = tuple((StreamId("t" * 40, 0, p), 10**12) for p in range(200))
    huge = Disconnect(GROUP, "big", None, progress)
    sender.send("big", huge)  # above MAX_PAYLOAD
    assert sender.dropped == 2
    with pytest.raises(queue.Empty):
        got.get(timeout=0.5)
    assert MAX_PAYLOAD < 8000
    assert channel("host-1-abc").isidentifier() and len(channel("x" * 500)) < 64


def test_a_node_message_reaches_the_node_by_name(postgres_url: str) -> None:
    got: queue.Queue[dict[str, object]] = queue.Queue()
    downs: list[str] = []
    a = NodeBus(postgres_url, "node-a", lambda m: None)
    b = NodeBus(postgres_url, "node-b", got.put, down=lambda: downs.append("b"))
    a.start()
    b.start()
    try:
        assert a.send("node-b", {"kind": "release", "client_id": "c", "epoch": 3})
        assert got.get(timeout=10) == {"kind": "release", "client_id": "c", "epoch": 3}
        # Presence: a node's listening connection, while it has one.
        assert a.listening("node-b")
        assert not a.listening("node-c")
        # Too large for a NOTIFY: refused before anything is sent.
        with pytest.raises(ValueError, match="node message of"):
            a.send("node-b", {"pad": "x" * MAX_PAYLOAD})
    finally:
        b.close()
    assert downs == []  # a close is no loss
    # Its connection is gone from the server once the server saw it close.
    eventually(lambda: not a.listening("node-b"), 10, "node-b absent")
    a.close()
