"""Will Messages end to end: sent when the connection is lost or DISCONNECT 0x04
asks for it, not after DISCONNECT 0x00; delayed by the Will Delay Interval and
cancelled by a reconnect within it; QoS and retain honoured."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from harness.broker import BrokerProcess, Client
from harness.inprocess import running_broker
from harness.nodes import NODE
from harness.raw_mqtt import AsyncRawClient
from harness.waiting import DEFAULT_TIMEOUT, eventually, eventually_async
from riverbed.log.appender import Positions
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.codec import Connack, Connect, ConnectProperties, Disconnect, Will
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners
from riverbed.sessions.store import SessionRecord, Stored

PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url) as running:
        yield running


def _watcher(port: int) -> Client:
    watcher = Client(port, "watcher")
    watcher.connect()
    watcher.subscribe("will/#", qos=2)
    return watcher


def _marker(port: int, client_id: str, watcher: Client) -> bytes:
    """Publish a marker as `client_id` and wait for `watcher` to get it.

    A Will goes out like a PUBLISH from its client: its key is the client id,
    so it is in the same stream as this marker, before it if it was published
    before, and the watcher gets it first. Connecting with clean start would
    also publish a Will still pending [MQTT-3.1.3-9]."""
    marker = f"marker of {client_id}".encode()
    client = Client(port, client_id)
    client.connect(clean=True, expiry=0)
    client.publish(f"will/marker/{client_id}", marker, qos=1).wait_for_publish(30)
    client.disconnect()
    watcher.wait_payloads(marker)
    return marker


def _disconnect_seen(broker: BrokerProcess, client_id: str) -> None:
    """Wait until the broker has recorded that `client_id`'s connection closed."""
    eventually(
        lambda: (r := broker.session(client_id)) is not None and not r.connected,
        what=f"the broker to see {client_id!r} go",
        interval=0.05,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_lost_connection_sends_the_will(broker: BrokerProcess, protocol: int) -> None:
    watcher = _watcher(broker.port)
    client = Client(broker.port, "dies", protocol=protocol)
    client.connect(will=("will/dies", b"gone", 2, False))
    client.drop()
    got = watcher.wait_payloads(b"gone")
    assert [(m.topic, m.payload, m.qos) for m in got] == [("will/dies", b"gone", 2)]
    watcher.disconnect()


def test_normal_disconnect_sends_no_will_and_0x04_does(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    polite = Client(broker.port, "polite")
    polite.connect(will=("will/polite", b"no", 1, False))
    polite.disconnect()
    asks = Client(broker.port, "asks")
    asks.connect(will=("will/asks", b"yes", 1, False))
    assert asks.paho is not None
    asks.paho.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    asks.wait_disconnected(30)
    asks.close()
    watcher.wait_payloads(b"yes")
    marker = _marker(broker.port, "polite", watcher)
    assert sorted(watcher.payloads()) == sorted([b"yes", marker])  # never b"no"
    watcher.disconnect()


def test_will_delay_and_a_reconnect_within_it(broker: BrokerProcess) -> None:
    # Both wills are delayed DELAY seconds: "back" reconnects well within it (a
    # CONNECT takes far less on a loaded machine), and "late", dropped after
    # "back", is due after "back" would have been.
    delay = 4
    watcher = _watcher(broker.port)
    back = Client(broker.port, "back")
    back.connect(clean=True, expiry=60, will=("will/back", b"back", 1, False), will_delay=delay)
    back.drop()
    _disconnect_seen(broker, "back")  # a resume, not a takeover of a live connection
    again = Client(broker.port, "back")
    assert again.connect(clean=False, expiry=60) is True  # within the delay: no will
    late = Client(broker.port, "late")
    late.connect(clean=True, expiry=60, will=("will/late", b"late", 1, False), will_delay=delay)
    started = time.monotonic()
    late.drop()
    watcher.wait_payloads(b"late")
    elapsed = time.monotonic() - started
    assert elapsed > delay - 0.5  # not before its delay
    # A marker from "back"'s connection (its key): "back"'s will, had it been
    # published, was due before "late"'s and would be in that stream before it.
    again.publish("will/marker", b"marker", qos=1).wait_for_publish(30)
    watcher.wait_payloads(b"marker")
    assert sorted(watcher.payloads()) == [b"late", b"marker"]
    again.disconnect()
    watcher.disconnect()


def test_delay_is_cut_short_by_the_session_ending(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    short = Client(broker.port, "short")
    # Session expiry 0: the session ends with the connection, so the will goes now.
    short.connect(clean=True, expiry=0, will=("will/short", b"now", 1, False), will_delay=30)
    started = time.monotonic()
    short.drop()
    assert [m.payload for m in watcher.wait_payloads(b"now", timeout=25)] == [b"now"]
    assert time.monotonic() - started < 25  # well before the 30 s delay
    watcher.disconnect()


def test_a_retained_will(broker: BrokerProcess) -> None:
    watcher = _watcher(broker.port)
    client = Client(broker.port, "kept")
    client.connect(will=("will/kept", b"kept", 1, True))
    client.drop()
    # Published: then it is retained too (stored before it is committed).
    watcher.wait_payloads(b"kept")
    watcher.disconnect()
    late = Client(broker.port, "late-sub")
    late.connect()
    late.subscribe("will/#")
    got = late.wait_for(1)
    assert [(m.payload, m.retain) for m in got] == [(b"kept", True)]
    late.disconnect()


def _persistent_watcher(port: int, clean: bool) -> Client:
    watcher = Client(port, "p-watcher")
    watcher.connect(clean=clean, expiry=300)
    if clean:
        watcher.subscribe("will/#", qos=1)
    return watcher


def test_a_pending_will_survives_a_broker_restart(broker: BrokerProcess) -> None:
    _persistent_watcher(broker.port, clean=True).disconnect()
    client = Client(broker.port, "pending")
    client.connect(clean=True, expiry=60, will=("will/pending", b"late", 1, False), will_delay=5)
    client.drop()
    _disconnect_seen(broker, "pending")
    record = broker.session("pending")
    assert record is not None and record.will is not None  # still pending
    broker.kill()  # before the delay is over
    broker.start()
    watcher = _persistent_watcher(broker.port, clean=False)
    assert [m.payload for m in watcher.wait_payloads(b"late")] == [b"late"]
    watcher.disconnect()
    broker.stop()
    broker.start()  # published and cleared: not again
    watcher = _persistent_watcher(broker.port, clean=False)
    marker = _marker(broker.port, "pending", watcher)
    assert watcher.payloads() == [marker]
    watcher.disconnect()


def test_a_crash_publishes_the_wills_of_connected_clients(sqlite_url: str) -> None:
    """The restarted broker is another node (a new name at every start), and
    the killed node's liveness lease still runs (an hour here): the new one
    finds that its process ended (riverbed/cluster/presence.py) and publishes
    the Will at its start, without waiting for the lease to lapse."""
    launcher = (str(NODE), "--node-lease-ttl", "3600")
    with BrokerProcess(sqlite_url, launcher=launcher) as broker:
        _persistent_watcher(broker.port, clean=True).disconnect()
        polite = Client(broker.port, "polite2")
        polite.connect(clean=True, expiry=60, will=("will/polite2", b"no", 1, False))
        polite.disconnect()  # DISCONNECT 0x00: its will is gone for good
        connected = Client(broker.port, "connected")
        connected.connect(clean=True, expiry=60, will=("will/connected", b"crash", 1, False))
        broker.kill()
        connected.close()
        broker.start()
        watcher = _persistent_watcher(broker.port, clean=False)
        watcher.wait_payloads(b"crash")
        marker = _marker(broker.port, "polite2", watcher)
        assert sorted(watcher.payloads()) == sorted([b"crash", marker])  # never b"no"
        watcher.disconnect()


@pytest.mark.parametrize("expiry", [0, 60], ids=["ends-with-connection", "persistent"])
def test_a_broker_stopping_publishes_the_wills_of_its_clients(
    broker: BrokerProcess, expiry: int
) -> None:
    """A broker that stops closes its clients' connections (0x8B, not a
    DISCONNECT from them): their Wills go out, once, by the time it is up again."""
    _persistent_watcher(broker.port, clean=True).disconnect()
    clients = []
    for i in range(20):
        client = Client(broker.port, f"leaving-{i}")
        client.connect(clean=True, expiry=expiry, will=(f"will/leaving-{i}", b"bye", 1, False))
        clients.append(client)
    broker.stop()
    for client in clients:
        client.close()
    broker.start()
    watcher = _persistent_watcher(broker.port, clean=False)
    eventually(
        lambda: watcher.payloads().count(b"bye") >= 20,
        what="the 20 Wills",
        explain=lambda: f"{watcher.payloads().count(b'bye')} so far",
    )
    _marker(broker.port, "leaving-0", watcher)  # a second Will of it would be before it
    topics = sorted(m.topic for m in watcher.received_now() if m.payload == b"bye")
    assert topics == sorted(f"will/leaving-{i}" for i in range(20))  # each once
    watcher.disconnect()


def test_a_stopping_broker_waits_for_the_wills_it_is_publishing(sqlite_url: str) -> None:
    """In process: the Will of a session that ends with its connection exists
    nowhere but in the task publishing it. A broker that stops while that
    Will's append has not begun (held here until the stop has started) waits
    for it: the Will is in the log when the stop returns, before the log
    could close."""
    held = threading.Event()
    asked = threading.Event()

    async def scenario() -> None:
        config = BrokerConfig(
            listeners=Listeners(Address("127.0.0.1", 0)),
            auth=AuthConfig(allow_anonymous=True),
        )
        with Log.open(sqlite_url) as log:
            broker = Broker(config, log)
            await broker.start()
            produce = log.produce_async

            def slow_produce(topic: str, messages: list[Message]) -> Future[Positions]:
                if not any(m.mqtt_topic == "will/held" for m in messages):
                    return produce(topic, messages)
                answer: Future[Positions] = Future()

                def later() -> None:
                    asked.set()
                    held.wait(DEFAULT_TIMEOUT)
                    inner = produce(topic, messages)
                    error = inner.exception()
                    if error is None:
                        answer.set_result(inner.result())
                    else:
                        answer.set_exception(error)

                threading.Thread(target=later, daemon=True).start()
                return answer

            log.produce_async = slow_produce  # type: ignore[method-assign]
            client = Client(broker.port, "held")
            await asyncio.to_thread(
                client.connect, clean=True, expiry=0, will=("will/held", b"bye", 1, False)
            )
            stopping = asyncio.ensure_future(broker.stop())
            await eventually_async(asked.is_set, what="the Will's append asked for")
            held.set()
            await stopping
            # Not once the log has it later: by the time the stop returns.
            found = [
                m.payload
                for head in log.storage.list_streams("mqtt")
                for m in log.storage.read(head.key, 0, 1000)
                if m.mqtt_topic == "will/held"
            ]
            assert found == [b"bye"]
            await asyncio.to_thread(client.close)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("expiry", "save"), [(60, "commit"), (0, "discard")], ids=["persistent", "ends-with-it"]
)
def test_a_disconnect_is_saved_ahead_of_what_is_read_after_it(
    storage_url: str, expiry: int, save: str
) -> None:
    """In process, on both backends: a client's DISCONNECT 0x00 and another
    client's CONNECT come in together (one turn of the loop reads both). The
    first's save, its Will gone, goes to the session writer (which commits in
    the order it is given writes) ahead of the CONNECT's: once that CONNECT
    is answered, a crash cannot leave the discarded Will stored for the next
    start to publish. (It was submitted once its transport had closed, two
    turns later: the CONNECT's write went first, and a broker killed right
    after its CONNACK published a Will its client had discarded.)"""

    async def scenario() -> None:
        async with running_broker(storage_url) as broker:
            polite = await AsyncRawClient.open(broker.port)
            polite.send(
                Connect(
                    "polite",
                    keep_alive=600,
                    will=Will("will/polite", b"no", 1),
                    properties=ConnectProperties(session_expiry_interval=expiry),
                )
            )
            await polite.expect(Connack)
            later = await AsyncRawClient.open(broker.port)
            await eventually_async(
                lambda: len(broker.every_connection()) == 2, what="the second connection made"
            )
            order: list[tuple[str, str]] = []
            writer = broker.writer
            write, commit, discard = writer.write, writer.commit, writer.discard

            def noted_write(record: SessionRecord, *args: Any, **kwargs: Any) -> Any:
                order.append(("write", record.client_id))
                return write(record, *args, **kwargs)

            def noted_commit(stored: Stored, *args: Any, **kwargs: Any) -> Any:
                order.append(("commit", stored.record.client_id))
                return commit(stored, *args, **kwargs)

            def noted_discard(stored: Stored) -> Any:
                order.append(("discard", stored.record.client_id))
                return discard(stored)

            writer.write = noted_write  # type: ignore[method-assign]
            writer.commit = noted_commit  # type: ignore[method-assign]
            writer.discard = noted_discard  # type: ignore[method-assign]
            polite.send(Disconnect())  # both sent before the loop reads either
            later.send(
                Connect(
                    "later",
                    keep_alive=600,
                    properties=ConnectProperties(session_expiry_interval=60),
                )
            )
            assert (await later.expect(Connack)).reason_code == 0
            await eventually_async(lambda: len(order) >= 2, what="both writes submitted")
            assert order[:2] == [(save, "polite"), ("write", "later")]
            stored = broker.store.load("polite")
            if expiry:
                assert stored is not None
                assert stored.record.will is None and not stored.record.connected
            else:
                assert stored is None
            later.close()
            polite.close()

    asyncio.run(scenario())
