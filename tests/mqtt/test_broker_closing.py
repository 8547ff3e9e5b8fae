"""How the broker closes a connection from its side (a stop, a drain, a
takeover, a protocol error): the DISCONNECT with its reason, then the FIN, and
it goes on reading (dropping what comes) until the client closes its end, for
`CLOSE_LINGER` seconds at most (`Connection._close_transport`).

A socket closed with bytes unread sends a RST instead of a FIN: a client that
was writing (acknowledgements of the messages it was receiving) got the RST as
it wrote and reported a broken connection, its DISCONNECT unread. Seen as 11 of
the ~65 clients of a drained node not told to move (paho's 128 instead of 0x9C,
tests/cluster/test_load_balancer.py), and 48 of 60 QoS 2 subscribers of a
stopping broker without its 0x8B.
"""

from __future__ import annotations

import select
import socket
import threading
from collections import Counter

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request

from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed.mqtt.codec import MQTT_5, Connect, Decoder, Disconnect, Pingreq, encode
from riverbed.mqtt.codec.reasons import DisconnectReason

SUBSCRIBERS = 40
SHUTTING_DOWN = int(DisconnectReason.SERVER_SHUTTING_DOWN)


@pytest.mark.parametrize("websocket", [False, True], ids=["tcp", "websocket"])
def test_subscribers_acknowledging_a_stream_as_the_broker_stops_each_read_its_disconnect(
    sqlite_url: str, websocket: bool
) -> None:
    """QoS 2 subscribers of a stream write PUBRECs and PUBCOMPs all the time:
    when the broker stops, each reads its DISCONNECT 0x8B rather than losing
    the connection (before: most of them lost it, paho's 128). Over
    WebSockets the Close frame follows the DISCONNECT."""
    with BrokerProcess(sqlite_url, ws=websocket) as broker:
        port = broker.ws_port if broker.ws_port is not None else broker.port
        path = "/mqtt" if websocket else None
        subscribers = [Client(port, f"closing-sub-{i}", websocket=path) for i in range(SUBSCRIBERS)]
        for subscriber in subscribers:
            subscriber.connect(clean=False, expiry=3600)
            assert subscriber.subscribe("closing/#", qos=2) == [2]
        publisher = Client(broker.port, "closing-pub")
        publisher.connect()
        stop = threading.Event()

        def publish() -> None:
            mqtt = publisher.paho
            assert mqtt is not None
            while not stop.is_set() and mqtt.is_connected():
                for _ in range(20):
                    mqtt.publish("closing/stream", b"x" * 100, qos=2)
                stop.wait(0.01)  # pacing: a steady stream, not a wait for anything

        thread = threading.Thread(target=publish, name="closing-publisher", daemon=True)
        thread.start()
        try:
            eventually(
                lambda: all(len(s.received) >= 20 for s in subscribers),
                what="every subscriber receiving the stream",
                explain=lambda: sorted(len(s.received) for s in subscribers)[:5],
            )
            assert broker.stop() == 0, broker.tail()
        finally:
            stop.set()
            thread.join(30)
        eventually(
            lambda: all(s.disconnects for s in subscribers),
            what="every subscriber disconnected",
        )
        first = Counter(s.disconnects[0] for s in subscribers)
        clients = [*subscribers, publisher]
        for client in clients:
            if client.paho is not None:
                client.paho.disconnect()  # no reconnecting to a broker that is gone
        for client in clients:
            client.close()
    assert first == {SHUTTING_DOWN: SUBSCRIBERS}, f"first reasons seen: {dict(first)}"


def _peeked(sock: socket.socket) -> list[object]:
    """The packets the broker sent so far, read without taking them."""
    if not select.select([sock], [], [], 0)[0]:
        return []
    data = sock.recv(65536, socket.MSG_PEEK)
    return list(Decoder(MQTT_5).feed(data)) if data else []


def test_a_client_that_goes_on_writing_after_the_disconnect_came_still_reads_it(
    sqlite_url: str,
) -> None:
    """A client writes as the broker stops, and for a while after its
    DISCONNECT came (it has not read it yet): nothing it writes is refused
    (no RST), and it then reads the DISCONNECT 0x8B and the end of the stream."""
    broker = BrokerProcess(sqlite_url)
    with broker, RawClient(broker.port) as raw:
        raw.connect("closing-raw", clean=True)
        assert broker.process is not None
        broker.process.terminate()
        pingreq = encode(Pingreq(), MQTT_5)

        def disconnect_came() -> bool:
            raw.sock.sendall(pingreq)  # an acknowledgement on its way, say
            return any(isinstance(p, Disconnect) for p in _peeked(raw.sock))

        eventually(disconnect_came, what="the broker's DISCONNECT")
        for _ in range(50):
            raw.sock.sendall(pingreq)  # a client that has not read it yet
        packets, data = [], b""
        decoder = Decoder(MQTT_5)
        while chunk := raw.sock.recv(65536):
            data += chunk
        packets = list(decoder.feed(data))
        disconnects = [p for p in packets if isinstance(p, Disconnect)]
        assert [d.reason_code for d in disconnects] == [SHUTTING_DOWN], packets
        raw.close()
        assert broker.process.wait(60) == 0, broker.tail()


def test_a_client_that_never_closes_its_end_does_not_hold_the_broker_up(
    sqlite_url: str,
) -> None:
    """The broker waits `CLOSE_LINGER` at most for a client to close its end:
    one that reads its DISCONNECT and the FIN and keeps the socket open does
    not keep the broker from stopping."""
    broker = BrokerProcess(sqlite_url)
    with broker, RawClient(broker.port) as raw:
        raw.connect("closing-idle", clean=True)
        assert broker.process is not None
        broker.process.terminate()
        assert raw.expect(Disconnect).reason_code == SHUTTING_DOWN
        assert raw.sock.recv(65536) == b""  # the FIN; the socket stays open
        assert broker.process.wait(60) == 0, broker.tail()


def test_a_websocket_client_that_goes_on_writing_after_the_close_frame_came_still_reads_it(
    sqlite_url: str,
) -> None:
    """The same over WebSockets: the DISCONNECT, then the Close frame (1000)
    and the FIN; what the client writes meanwhile is read and dropped, and
    its Close answers the broker's."""
    broker = BrokerProcess(sqlite_url, ws=True)
    with broker, socket.create_connection(("127.0.0.1", broker.ws_port or 0), timeout=10) as sock:
        ws = WSConnection(ConnectionType.CLIENT)
        sock.sendall(ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
        events: list[object] = []
        while not any(isinstance(e, AcceptConnection) for e in events):
            ws.receive_data(sock.recv(65536))
            events += ws.events()
        sock.sendall(ws.send(BytesMessage(data=encode(Connect("closing-ws", True, 60), MQTT_5))))
        while not any(isinstance(e, BytesMessage) for e in events):  # the CONNACK
            ws.receive_data(sock.recv(65536))
            events += ws.events()
        assert broker.process is not None
        broker.process.terminate()
        pingreq = ws.send(BytesMessage(data=encode(Pingreq(), MQTT_5)))
        close_frame = b"\x88\x02\x03\xe8"  # Close 1000, from the server: unmasked

        def close_came() -> bool:
            sock.sendall(pingreq)  # an acknowledgement on its way, say
            ready = select.select([sock], [], [], 0)[0]
            return bool(ready) and close_frame in sock.recv(65536, socket.MSG_PEEK)

        eventually(close_came, what="the broker's Close frame")
        for _ in range(50):
            sock.sendall(pingreq)  # a client that has not read it yet
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        ws.receive_data(data)
        received = list(ws.events())
        closes = [e.code for e in received if isinstance(e, CloseConnection)]
        payload = b"".join(e.data for e in received if isinstance(e, BytesMessage))
        packets = list(Decoder(MQTT_5).feed(payload))
        disconnects = [p.reason_code for p in packets if isinstance(p, Disconnect)]
        assert (disconnects, closes) == ([SHUTTING_DOWN], [1000]), received
        sock.sendall(ws.send(CloseConnection(code=1000)))  # the answer
        assert broker.process.wait(60) == 0, broker.tail()
