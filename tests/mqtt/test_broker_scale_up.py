"""Sessions across a scale-up of the topic they read (issue 3; DESIGN.md, Lineage).

AddStorageTopic + SwitchProduce while the broker runs: an online session picks
up the new generation's streams without reconnecting, and every session keeps
per-key order (the key of an MQTT message is its publisher's client id): a
stream of the new generation is read only after the streams of its lineage in
the generation before are fully consumed, also when a session resumes with a
backlog in both generations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.waiting import eventually
from riverbed.log.topics import BUILTIN_TOPIC, Topics
from riverbed.sessions.store import SessionStore, cursor_name
from riverbed.storage import open_storage

PUBLISHERS = 6


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url) as running:
        yield running


def _scale_up(url: str, partitions: int) -> None:
    """What `riverbed topic add-storage-topic` + `switch-produce` do, from
    another process's point of view (its own storage connection)."""
    storage = open_storage(url)
    try:
        topics = Topics(storage)
        topics.add_storage_topic(BUILTIN_TOPIC, partitions)
        topics.switch_produce(BUILTIN_TOPIC)
    finally:
        storage.close()


def _publish(port: int, first: int, count: int) -> None:
    """`count` rounds; in each, every publisher sends its next sequence number."""
    clients = [Client(port, f"pub-{p}") for p in range(PUBLISHERS)]
    for c in clients:
        c.connect()
    for seq in range(first, first + count):
        infos = [c.publish("s/x", f"{p}:{seq}".encode(), qos=1) for p, c in enumerate(clients)]
        for info in infos:
            info.wait_for_publish(30)
    for c in clients:
        c.disconnect()


def _round(first: int, count: int) -> list[bytes]:
    """The payloads of `count` rounds from `first` on."""
    return [f"{p}:{seq}".encode() for seq in range(first, first + count) for p in range(PUBLISHERS)]


def _check_order(payloads: list[bytes], rounds: int) -> None:
    per_key: dict[str, list[int]] = {}
    for payload in payloads:
        key, seq = payload.decode().split(":")
        per_key.setdefault(key, []).append(int(seq))
    assert sorted(per_key) == [str(p) for p in range(PUBLISHERS)]
    for key, seqs in per_key.items():
        assert seqs == list(range(rounds)), f"publisher {key}: {seqs}"


def test_an_online_session_follows_the_new_generation(
    broker: BrokerProcess, storage_url: str
) -> None:
    sub = Client(broker.port, "online")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("s/#", qos=1)
    _publish(broker.port, 0, 20)
    sub.wait_payloads(*_round(0, 20))
    _scale_up(storage_url, 32)
    # Round 40 is the marker: each publisher's last, after all of its others.
    _publish(broker.port, 20, 21)
    sub.wait_payloads(*_round(20, 21), timeout=60)
    _check_order(sub.payloads(), 41)
    assert len(sub.payloads()) == 41 * PUBLISHERS
    sub.disconnect()
    # Gone, it has a stored cursor on every stream, also on the new ones no
    # message reached (at most 6 of 32): retention keeps what comes next there
    # for it. (A checkpoint writes only the cursors that moved, or were never
    # stored.)
    eventually(
        lambda: _session_stream_cursors(storage_url, "online") == _streams(storage_url),
        what="a stored cursor of the session on every stream",
    )


def _streams(url: str) -> set[int]:
    storage = open_storage(url)
    try:
        return {head.key for head in storage.list_streams(BUILTIN_TOPIC)}
    finally:
        storage.close()


def _session_stream_cursors(url: str, client_id: str) -> set[int]:
    """The streams of the built-in topic the session has a stored cursor on,
    once it is saved at disconnect (none before)."""
    storage = open_storage(url)
    try:
        stored = SessionStore(storage).load(client_id)
        assert stored is not None
        if stored.record.connected:
            return set()
        name = cursor_name(stored.record.session_id, BUILTIN_TOPIC)
        return set(storage.get_cursors(name))
    finally:
        storage.close()


def test_a_resumed_session_reads_generations_in_lineage_order(
    broker: BrokerProcess, storage_url: str
) -> None:
    sub = Client(broker.port, "resumer")
    sub.connect(clean=True, expiry=300)
    sub.subscribe("s/#", qos=1)
    sub.disconnect()
    _publish(broker.port, 0, 30)  # generation 0, the session away
    _scale_up(storage_url, 32)
    _publish(broker.port, 30, 30)  # generation 1
    back = Client(broker.port, "resumer")
    assert back.connect(clean=False, expiry=300) is True
    # Round 60 is the marker: each publisher's last, after all of its others.
    _publish(broker.port, 60, 1)
    back.wait_payloads(*_round(0, 61), timeout=60)
    _check_order(back.payloads(), 61)
    back.disconnect()


def test_an_online_session_passed_by_at_the_end_of_a_generation_follows_the_next(
    storage_url: str, tmp_path: Path
) -> None:
    """The last messages of the session's stream in the generation before are
    none of its own: the fan-out does not answer its fetch for them, and no
    hand-out of where it got to comes within the test (`idle_cursor_interval`
    an hour). Its look for the new generation moves its cursors past them
    first (`Fanout.passed`): without that its stream of the generation before
    never looked consumed, and nothing of the new one reached it."""
    config = tmp_path / "riverbed.toml"
    config.write_text("[storage]\nidle_cursor_interval = 3600\n")
    with BrokerProcess(storage_url, extra_args=("--config", str(config))) as broker:
        sub = Client(broker.port, "mine")
        sub.connect(clean=True, expiry=300)
        sub.subscribe("s/mine", qos=1)
        pub = Client(broker.port, "pub")
        pub.connect()
        pub.publish("s/mine", b"before", qos=1).wait_for_publish(30)
        for i in range(5):
            pub.publish("s/other", b"%d" % i, qos=1).wait_for_publish(30)
        sub.wait_payloads(b"before")
        _scale_up(storage_url, 32)
        pub.publish("s/mine", b"after", qos=1).wait_for_publish(30)
        sub.wait_payloads(b"before", b"after", timeout=60)
        pub.disconnect()
        sub.disconnect()
