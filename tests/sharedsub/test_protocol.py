"""Messages, group names, timers and the in-process bus."""

from __future__ import annotations

import json

import pytest

from riverbed.errors import InvalidConfig, InvalidTopicFilter
from riverbed.model import StreamId
from riverbed.sharedsub.bus import InProcessBus, Registry
from riverbed.sharedsub.config import SharedSubConfig
from riverbed.sharedsub.protocol import (
    MESSAGE_TYPES,
    REGISTRY,
    Disconnect,
    Grant,
    GroupId,
    Invalidate,
    InvalidMessage,
    LeaderConnectResponse,
    LeaderWanted,
    Message,
    Ping,
    PingResponse,
    Revoke,
    Revoked,
    RevokeFinished,
    UpdateProgress,
    decode,
    encode,
)

G = GroupId("g", "a/+/#")
S = StreamId("orders/x", 2, 5)

EXAMPLES: list[Message] = [
    LeaderWanted(G, "s/n/1", 1),
    LeaderConnectResponse(G, "s/n/1", "L", 1),
    Ping(G, "s/n/1", "L", 2),
    PingResponse(G, "s/n/1", "L", 2),
    Grant(G, "s/n/1", "L", S, 10),
    Revoke(G, "s/n/1", "L", S),
    Revoked(G, "s/n/1", "L", S),
    UpdateProgress(G, "s/n/1", "L", S, 12, True),
    RevokeFinished(G, "s/n/1", "L", S),
    Disconnect(G, "s/n/1", None, ((S, 3), (StreamId("t", 0, 0), 0))),
    Invalidate(G, "s/n/1", "L"),
]


def test_every_message_type_round_trips_with_the_seed_name() -> None:
    assert {type(m) for m in EXAMPLES} == set(MESSAGE_TYPES.values())
    assert set(MESSAGE_TYPES) == {
        "leader_wanted", "leader_connect_response", "ping", "ping_response", "grant",
        "revoke", "revoked", "update_progress", "revoke_finished", "disconnect", "invalidate",
    }  # fmt: skip
    for message in EXAMPLES:
        raw = encode(message)
        assert json.loads(raw)["type"] == message.type
        assert decode(raw) == message


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"type": "hello"}', "unknown message type"),
        (b'{"type": "ping", "group": "g/t", "borrower": "b", "leader": "L"}', "lacks field 'seq'"),
        (
            b'{"type": "revoke", "group": "g/t", "borrower": "b", "leader": "L", "stream": "x"}',
            "topic/generation/partition",
        ),
        (
            b'{"type": "grant", "group": "g/t", "borrower": "b", "leader": "L", "stream": "t/0/0",'
            b' "offset": -1}',
            "offset -1",
        ),
        (b'{"type": "invalidate", "group": "g/t", "borrower": "", "leader": "L"}', "non-empty"),
        (
            b'{"type": "invalidate", "group": "g/t", "borrower": "b", "leader": "L", "x": 1}',
            "unknown fields",
        ),
        (b'{"type": "invalidate", "group": "g/t/+x", "borrower": "b", "leader": "L"}', "'\\+'"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(raw: bytes, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        decode(raw)


def test_group_ids() -> None:
    assert GroupId.parse("$share/g/a/b") == GroupId("g", "a/b")
    assert GroupId.parse("$queue/a/#") == GroupId("$queue", "a/#")
    assert str(GroupId.parse("$share/g/a/b")) == "$share/g/a/b"
    assert str(GroupId.parse("$queue/a")) == "$queue/a"
    assert GroupId.from_key(GroupId("g", "a/b").key) == GroupId("g", "a/b")
    for bad in ["a/b", "$share/g", "$share//a", "$share/g+/a", "$queue/", "$share/g/a/#/b"]:
        with pytest.raises(InvalidTopicFilter):
            GroupId.parse(bad)


def test_config_defaults_and_rules() -> None:
    c = SharedSubConfig()
    assert (c.find_leader_retry, c.ping_interval, c.ping_timeout, c.unsubscribe_timeout) == (
        1.0, 4.0, 4.0, 1.0,
    )  # fmt: skip
    assert (c.leader_borrower_timeout, c.leader_periodic, c.leader_claim_lease) == (5.0, 1.0, 30.0)
    with pytest.raises(InvalidConfig, match=r"ping_timeout = 0: must be a positive"):
        SharedSubConfig(ping_timeout=0)
    with pytest.raises(InvalidConfig, match=r"find_leader_retry = nan"):
        SharedSubConfig(find_leader_retry=float("nan"))
    with pytest.raises(InvalidConfig, match=r"leader_periodic = True"):
        SharedSubConfig(leader_periodic=True)
    with pytest.raises(InvalidConfig, match=r"ping_interval = 5.*below leader_borrower_timeout"):
        SharedSubConfig(ping_interval=5.0)
    with pytest.raises(InvalidConfig, match=r"leader_claim_lease = 5.*exceed"):
        SharedSubConfig(leader_claim_lease=5.0)


def test_in_process_bus_delivers_in_order_and_drops_unknown_addresses() -> None:
    got: list[Message] = []
    bus = InProcessBus()
    bus.register("b", got.append)
    bus.send("b", EXAMPLES[1])
    bus.send("nobody", EXAMPLES[2])
    bus.send("b", EXAMPLES[3])
    assert bus.pending() == 3
    assert bus.drain() == 3
    assert got == [EXAMPLES[1], EXAMPLES[3]] and bus.dropped == 1
    bus.fault = lambda to, m: 0 if isinstance(m, Ping) else 2
    bus.send("b", EXAMPLES[2])
    bus.send("b", EXAMPLES[4])
    bus.drain()
    assert got[2:] == [EXAMPLES[4], EXAMPLES[4]]


def test_registry_forwards_to_the_leader_it_finds() -> None:
    got: list[Message] = []
    bus = InProcessBus()
    found: list[GroupId] = []

    def find(group: GroupId) -> str | None:
        found.append(group)
        return "L" if len(found) > 1 else None

    registry = Registry(bus, find)
    bus.register(REGISTRY, registry.deliver)
    bus.register("L", got.append)
    bus.send(REGISTRY, EXAMPLES[0])
    bus.drain()
    assert got == [] and registry.unanswered == 1
    bus.send(REGISTRY, EXAMPLES[0])
    bus.send(REGISTRY, EXAMPLES[9])
    bus.drain()
    assert got == [EXAMPLES[0], EXAMPLES[9]] and len(found) == 2  # looked up once more
