"""Two broker nodes on one database (issue 3; docs/broker.md "Several nodes").

Each node holds a liveness lease and renews it at its expiry sweep; a session
marked connected on a node whose lease runs is in use there: another node's
sweep never discards it, and a client that connects to another node with clean
start 0 takes it over (Session Present 1) however long ago the first node last
wrote the record; the first node closes its connection (0x8E) before that
(tests/cluster/test_takeover.py).
"""

from __future__ import annotations

import time

from harness.broker import BrokerProcess, Client

SWEEP = 5.0
"""The broker's expiry sweep interval (Broker.expiry_sweep)."""


def test_a_session_in_use_on_one_node_survives_the_others_sweep(storage_url: str) -> None:
    with BrokerProcess(storage_url) as a, BrokerProcess(storage_url) as b:
        on_a = Client(a.port, "roaming")
        assert on_a.connect(clean=True, expiry=1) is False
        on_a.subscribe("n/#", qos=1)
        # Idle on A (its record last written at SUBSCRIBE) for longer than its
        # expiry interval and than B's sweep interval: time passing is the
        # scenario. (A's liveness lease, 30 s, is renewed at A's sweeps.)
        time.sleep(SWEEP + 2)
        on_b = Client(b.port, "roaming")
        assert on_b.connect(clean=False, expiry=1) is True  # taken over, not discarded
        # A closed its connection first (paho would connect again: stop it).
        assert on_a.wait_disconnected(30)
        assert on_a.disconnects == [0x8E]  # Session taken over
        on_a.close()
        # The subscription came along: B delivers to it.
        pub = Client(b.port, "n-pub")
        pub.connect()
        pub.publish("n/1", b"to-b", qos=1).wait_for_publish(30)
        pub.disconnect()
        assert [r.payload for r in on_b.wait_for(1)] == [b"to-b"]
        assert on_a.received == []
        on_b.disconnect()
