"""MQTT over WebSockets: `riverbed serve --ws` with paho-mqtt over WebSockets
and a raw client on wsproto (for framing no library does on purpose), WSS
with throwaway certificates, Origin checks, and every kind of bad input the
listener must close cleanly, one connection at a time, while another client
on the same broker carries on."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from harness.broker import BrokerProcess, Client
from harness.certificates import Certificates, have_openssl, make_certificates
from harness.net import free_port
from riverbed.mqtt.codec import (
    MQTT_3_1_1,
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscribeTopic,
    Will,
    encode,
)

MAXIMUM_PACKET = 1024
"""`limits.maximum_packet_size` of the module's broker: the largest WebSocket message too."""
ALLOWED_ORIGIN = "https://app.example.com"


# --------------------------------------------------------------------- a raw client


class WsClient:
    """A WebSocket client on a socket (over TLS with `context`), on wsproto:
    `handshake()` opens it, `send` writes frames, `packets` decodes the MQTT
    packets of the binary frames received."""

    def __init__(self, port: int, context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if context is not None:
            try:
                sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.decoder = Decoder(MQTT_5)
        self.events: list[Event] = []
        self.closed = False

    def handshake(
        self,
        *,
        path: str = "/mqtt",
        subprotocols: tuple[str, ...] = ("mqtt",),
        origin: str | None = None,
    ) -> AcceptConnection | RejectConnection:
        headers = [] if origin is None else [(b"origin", origin.encode())]
        request = Request(
            host="127.0.0.1", target=path, subprotocols=list(subprotocols), extra_headers=headers
        )
        self.sock.sendall(self.ws.send(request))
        answer = self.next((AcceptConnection, RejectConnection))
        assert isinstance(answer, AcceptConnection | RejectConnection)
        return answer

    def body(self) -> bytes:
        """The body of a refused handshake."""
        data = b""
        while True:
            event = self.next((RejectData,))
            assert isinstance(event, RejectData)
            data += event.data
            if event.body_finished:
                return data

    def send(self, packet: Packet | bytes, *, finished: bool = True, level: int = MQTT_5) -> None:
        data = packet if isinstance(packet, bytes) else encode(packet, level)
        self.sock.sendall(self.ws.send(BytesMessage(data=data, message_finished=finished)))

    def next(self, kinds: tuple[type[Event], ...]) -> Event:
        """The next event of one of `kinds` (others are kept in `events`)."""
        while True:
            for i, event in enumerate(self.events):
                if isinstance(event, kinds):
                    return self.events.pop(i)
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                raise ConnectionError("the broker closed the connection")
            self.ws.receive_data(data)
            self.events.extend(self.ws.events())

    def packets(self, count: int) -> list[Packet]:
        out: list[Packet] = []
        while len(out) < count:
            event = self.next((BytesMessage,))
            assert isinstance(event, BytesMessage)
            out.extend(self.decoder.feed(bytes(event.data)))
        return out

    def close_code(self) -> int:
        """Wait for the broker's Close frame and for it to close the socket;
        return the frame's code."""
        event = self.next((CloseConnection,))
        assert isinstance(event, CloseConnection)
        self.wait_eof()
        return event.code

    def wait_eof(self) -> None:
        """Wait for the broker to close the socket (whatever comes before)."""
        while self.sock.recv(65536):
            pass
        self.closed = True

    def close(self) -> None:
        self.sock.close()


def _raw_eof(port: int, data: bytes) -> bytes:
    """Send `data` on a plain socket; return all the broker answers before it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


# --------------------------------------------------------------------- brokers


def _broker(directory: Path, ws: str = "") -> BrokerProcess:
    """A broker listening for MQTT over WebSockets too, whose largest packet is
    `MAXIMUM_PACKET` and whose allowed origins are `ALLOWED_ORIGIN` and the one
    paho-mqtt sends (`http://HOST:PORT` of the listener; https for WSS).
    `ws`: more lines of `[listeners.ws]`."""
    broker = BrokerProcess(f"sqlite:///{directory}/riverbed.db", ws=True)
    scheme = "https" if "certfile" in ws else "http"
    origins = [ALLOWED_ORIGIN, f"{scheme}://127.0.0.1:{broker.ws_port}"]
    config = directory / "riverbed.toml"
    config.write_text(
        f"[limits]\nmaximum_packet_size = {MAXIMUM_PACKET}\n\n"
        f"[listeners.ws]\nallowed_origins = {json.dumps(origins)}\n{ws}"
    )
    broker.extra_args = ("--config", str(config))
    return broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with _broker(tmp_path_factory.mktemp("ws")) as running:
        yield running


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if not have_openssl():
        pytest.fail("the WSS tests need the openssl command")
    return make_certificates(tmp_path_factory.mktemp("wss-certs"))


def _ws_port(broker: BrokerProcess) -> int:
    assert broker.ws_port is not None
    return broker.ws_port


@pytest.fixture
def bystander(broker: BrokerProcess) -> Iterator[Client]:
    """A paho client over WebSockets that is connected through a test, to show
    that what the test does to another connection leaves it alone."""
    client = Client(_ws_port(broker), "bystander", websocket="/mqtt")
    client.connect()
    assert client.subscribe("bystander/#", qos=1) == [1]
    yield client
    client.publish("bystander/after", b"still here", qos=1).wait_for_publish(10)
    client.wait_payloads(b"still here")
    assert client.disconnects == [], "the bystander was disconnected"
    client.disconnect()


# --------------------------------------------------------------------- paho over WebSockets


@pytest.mark.parametrize("protocol", [paho.MQTTv5, paho.MQTTv311], ids=["mqtt5", "mqtt311"])
def test_paho_over_websockets_qos_0_1_2(broker: BrokerProcess, protocol: int) -> None:
    port = _ws_port(broker)
    sub = Client(port, f"ws-sub-{protocol}", protocol=protocol, websocket="/mqtt")
    sub.connect()
    assert sub.subscribe(f"ws{protocol}/#", qos=2) == [2]
    pub = Client(port, f"ws-pub-{protocol}", protocol=protocol, websocket="/mqtt")
    pub.connect()
    for qos in (0, 1, 2):
        pub.publish(f"ws{protocol}/q{qos}", f"qos {qos}".encode(), qos=qos).wait_for_publish(10)
    tcp = Client(broker.port, f"tcp-pub-{protocol}", protocol=protocol)
    tcp.connect()
    tcp.publish(f"ws{protocol}/tcp", b"from tcp", qos=1).wait_for_publish(10)
    got = sub.wait_payloads(b"qos 0", b"qos 1", b"qos 2", b"from tcp")
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        (f"ws{protocol}/q0", b"qos 0", 0),
        (f"ws{protocol}/q1", b"qos 1", 1),
        (f"ws{protocol}/q2", b"qos 2", 2),
        (f"ws{protocol}/tcp", b"from tcp", 1),
    ]
    assert sub.disconnects == pub.disconnects == []
    for client in (sub, pub, tcp):
        client.disconnect()


def test_a_packet_across_frames_and_packets_in_one_frame(broker: BrokerProcess) -> None:
    client = WsClient(_ws_port(broker))
    try:
        answer = client.handshake()
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "mqtt"  # [MQTT-6.0.0-5]
        connect = encode(Connect("framed", True, 60), MQTT_5)
        # One CONNECT in three messages, the last one fragmented into two frames.
        client.send(connect[:3])
        client.send(connect[3:10])
        client.send(connect[10:15], finished=False)
        client.send(connect[15:])
        (connack,) = client.packets(1)
        assert isinstance(connack, Connack) and connack.reason_code == 0
        # SUBSCRIBE, PUBLISH QoS 1 and PINGREQ in one frame.
        several = b"".join(
            encode(packet, MQTT_5)
            for packet in (
                Subscribe(1, (SubscribeTopic("framed/#", 1),)),
                Publish("framed/a", b"one frame", 1, packet_id=2),
                Pingreq(),
            )
        )
        client.send(several)
        got = client.packets(4)
        kinds = sorted(type(p).__name__ for p in got)
        assert kinds == ["Pingresp", "Puback", "Publish", "Suback"], got
        suback = next(p for p in got if isinstance(p, Suback))
        assert suback.reason_codes == (1,)
        assert next(p for p in got if isinstance(p, Puback)).packet_id == 2
        delivered = next(p for p in got if isinstance(p, Publish))
        assert (delivered.topic, delivered.payload) == ("framed/a", b"one frame")
        assert any(isinstance(p, Pingresp) for p in got)
    finally:
        client.close()


def test_mqtt_311_raw_client(broker: BrokerProcess) -> None:
    client = WsClient(_ws_port(broker))
    try:
        assert isinstance(client.handshake(), AcceptConnection)
        client.decoder = Decoder(MQTT_3_1_1)
        client.send(Connect("raw-311", True, 60), level=MQTT_3_1_1)
        (connack,) = client.packets(1)
        assert isinstance(connack, Connack) and connack.reason_code == 0
        client.send(Pingreq(), level=MQTT_3_1_1)
        assert isinstance(client.packets(1)[0], Pingresp)
    finally:
        client.close()


# --------------------------------------------------------------------- origins


def test_an_allowed_origin_or_none_is_accepted(broker: BrokerProcess) -> None:
    for origin in (ALLOWED_ORIGIN, ALLOWED_ORIGIN.upper(), None):
        client = WsClient(_ws_port(broker))
        try:
            assert isinstance(client.handshake(origin=origin), AcceptConnection), origin
        finally:
            client.close()


def test_another_origin_is_refused(broker: BrokerProcess, bystander: Client) -> None:
    before = broker.logged("origin 'https://evil.example' is not in listeners.ws.allowed_origins")
    client = WsClient(_ws_port(broker))
    try:
        answer = client.handshake(origin="https://evil.example")
        assert isinstance(answer, RejectConnection) and answer.status_code == 403
        assert b"allowed_origins" in client.body()
        client.wait_eof()
    finally:
        client.close()
    broker.wait_logged("origin 'https://evil.example' is not in", before + 1)


# --------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("path", "subprotocols", "status", "logged"),
    [
        ("/mqtt", ("mqttv3.1",), 400, "offered the WebSocket subprotocols mqttv3.1, not 'mqtt'"),
        ("/mqtt", (), 400, "offered the WebSocket subprotocols none, not 'mqtt'"),
        ("/other", ("mqtt",), 404, "asked for '/other'; MQTT over WebSockets is at '/mqtt'"),
    ],
    ids=["wrong subprotocol", "no subprotocol", "wrong path"],
)
def test_a_refused_handshake(
    broker: BrokerProcess,
    bystander: Client,
    path: str,
    subprotocols: tuple[str, ...],
    status: int,
    logged: str,
) -> None:
    pattern = f"WebSocket handshake refused \\({status}\\): {logged}"
    before = broker.logged(pattern)
    client = WsClient(_ws_port(broker))
    try:
        answer = client.handshake(path=path, subprotocols=subprotocols)
        assert isinstance(answer, RejectConnection) and answer.status_code == status
        assert logged.encode() in client.body()
        client.wait_eof()
    finally:
        client.close()
    broker.wait_logged(pattern, before + 1)


@pytest.mark.parametrize(
    "data",
    [
        b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
        encode(Connect("tcp-on-ws", True, 60), MQTT_5),
    ],
    ids=["plain HTTP GET", "HTTP POST", "MQTT without WebSockets"],
)
def test_not_a_websocket_handshake(broker: BrokerProcess, bystander: Client, data: bytes) -> None:
    pattern = r"WebSocket handshake refused \(400\): not a WebSocket handshake"
    before = broker.logged(pattern)
    answer = _raw_eof(_ws_port(broker), data)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    broker.wait_logged(pattern, before + 1)


def _text_frame(client: WsClient) -> None:
    client.sock.sendall(client.ws.send(TextMessage(data="hello")))


def _oversized(client: WsClient) -> None:
    # PINGREQs: each a valid packet, together one message over the limit.
    client.send(encode(Pingreq(), MQTT_5) * (MAXIMUM_PACKET // 2 + 1))


def _oversized_in_fragments(client: WsClient) -> None:
    for _ in range(3):
        client.send(encode(Pingreq(), MQTT_5) * (MAXIMUM_PACKET // 4), finished=False)


def _unmasked(client: WsClient) -> None:
    # A client's frames must be masked (RFC 6455 §5.1): a binary frame without.
    client.sock.sendall(b"\x82\x02" + encode(Pingreq(), MQTT_5))


@pytest.mark.parametrize(
    ("send", "code", "logged"),
    [
        (_text_frame, 1003, r"\(1003\): a text frame"),
        (_oversized, 1009, rf"\(1009\): a WebSocket message of more than {MAXIMUM_PACKET} bytes"),
        (_oversized_in_fragments, 1009, r"\(1009\): a WebSocket message of more than"),
        (_unmasked, 1002, r"\(1002\): a broken WebSocket frame"),
    ],
    ids=["text frame", "oversized message", "oversized in fragments", "unmasked frame"],
)
def test_bad_frames_close_the_connection(
    broker: BrokerProcess, bystander: Client, send: object, code: int, logged: str
) -> None:
    pattern = f"closing its WebSocket {logged}"
    before = broker.logged(pattern)
    client = WsClient(_ws_port(broker))
    try:
        assert isinstance(client.handshake(), AcceptConnection)
        client.send(Connect(f"bad-{code}", True, 60))
        assert isinstance(client.packets(1)[0], Connack)
        send(client)  # type: ignore[operator]
        assert client.close_code() == code
    finally:
        client.close()
    broker.wait_logged(pattern, before + 1)
    # The MQTT connection behind it went too.
    broker.wait_logged(rf"client bad-{code} \(.*\) disconnected")


def test_the_client_closing_its_websocket_fires_its_will(
    broker: BrokerProcess, bystander: Client
) -> None:
    client = WsClient(_ws_port(broker))
    try:
        assert isinstance(client.handshake(), AcceptConnection)
        will = Will("bystander/will", b"gone", 1)
        client.send(Connect("with-will", True, 60, will=will))
        assert isinstance(client.packets(1)[0], Connack)
        client.sock.sendall(client.ws.send(CloseConnection(code=1000)))
        assert client.close_code() == 1000
    finally:
        client.close()
    bystander.wait_payloads(b"gone")


@pytest.mark.slow
def test_a_handshake_that_never_completes_is_closed(
    broker: BrokerProcess, bystander: Client
) -> None:
    pattern = "no WebSocket handshake within 10.0s"
    before = broker.logged(pattern)
    # Half a request, then nothing: the broker closes it after 10 s.
    answer = _raw_eof(_ws_port(broker), b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert answer == b""
    broker.wait_logged(pattern, before + 1)


# --------------------------------------------------------------------- WSS


def _wss_broker(directory: Path, certs: Certificates, cafile: bool) -> BrokerProcess:
    lines = f'certfile = "{certs.server}"\nkeyfile = "{certs.server_key}"\n'
    if cafile:
        lines += f'cafile = "{certs.ca}"\n'
    return _broker(directory, lines)


def test_wss_with_paho(tmp_path: Path, certs: Certificates) -> None:
    with _wss_broker(tmp_path, certs, cafile=False) as broker:
        port = _ws_port(broker)
        sub = Client(port, "wss-sub", tls=certs.client_context(), websocket="/mqtt")
        sub.connect()
        assert sub.subscribe("wss/#", qos=1) == [1]
        pub = Client(
            port, "wss-pub", protocol=paho.MQTTv311, tls=certs.client_context(), websocket="/mqtt"
        )
        pub.connect()
        pub.publish("wss/a", b"over wss", qos=1).wait_for_publish(10)
        assert [m.payload for m in sub.wait_for(1)] == [b"over wss"]
        for client in (sub, pub):
            client.disconnect()
        assert broker.logged(rf"listening for MQTT on .*wss://127\.0\.0\.1:{port}/mqtt") == 1


def test_wss_with_client_certificates(tmp_path: Path, certs: Certificates) -> None:
    with _wss_broker(tmp_path, certs, cafile=True) as broker:
        port = _ws_port(broker)
        client = WsClient(port, certs.client_context(own=True))
        try:
            assert isinstance(client.handshake(), AcceptConnection)
            client.send(Connect("wss-mutual", True, 60))
            assert isinstance(client.packets(1)[0], Connack)
        finally:
            client.close()
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            # No client certificate: the TLS handshake (or the first read) fails.
            refused = WsClient(port, certs.client_context())
            try:
                refused.handshake()
            finally:
                refused.close()


# --------------------------------------------------------------------- refused at start


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "riverbed.cli", "serve", "--db", f"sqlite:///{tmp_path}/x.db"]
    command += ["--allow-anonymous", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--ws", "nowhere"), "listeners.ws.address: address 'nowhere' is not HOST:PORT"),
        (("--ws", "127.0.0.1:99999"), "the port '99999' is not a number 0..65535"),
        (
            ("--mqtt", "127.0.0.1:{port}", "--ws", "127.0.0.1:{port}"),
            "listeners.mqtt and listeners.ws.address are both 127.0.0.1:{port}",
        ),
        (
            (
                "--config",
                '[listeners.ws]\naddress = "127.0.0.1:{port}"\nallowed_origins = ["https://a.example/"]\n',
            ),
            "listeners.ws.allowed_origins: 'https://a.example/' is not an origin",
        ),
        (
            ("--config", '[listeners.ws]\naddress = "127.0.0.1:{port}"\nallowed_origins = ["*"]\n'),
            "listeners.ws.allowed_origins: '*' is not an origin",
        ),
        (
            ("--config", '[listeners.ws]\naddress = "127.0.0.1:{port}"\nallowed_origins = 3\n'),
            "listeners.ws.allowed_origins = 3: must be a list of origins",
        ),
        (
            ("--config", '[listeners.ws]\naddress = "127.0.0.1:{port}"\npath = "mqtt"\n'),
            "listeners.ws.path = 'mqtt': must be an absolute HTTP path",
        ),
        (
            ("--config", '[listeners.ws]\npath = "/ws"\n'),
            "the WebSocket listener needs listeners.ws.address",
        ),
        (
            ("--config", '[listeners.ws]\naddress = "127.0.0.1:{port}"\ncertfile = "{me}"\n'),
            "listeners.ws.certfile is set but listeners.ws.keyfile is not",
        ),
        (
            (
                "--config",
                '[listeners.ws]\naddress = "127.0.0.1:{port}"\n'
                'certfile = "{me}"\nkeyfile = "{me}"\n',
            ),
            "listeners.ws.certfile",
        ),
    ],
    ids=[
        "not HOST:PORT",
        "bad port",
        "same port as mqtt",
        "origin with a path",
        "wildcard origin",
        "origins not a list",
        "relative path",
        "no address",
        "certfile without keyfile",
        "not a certificate",
    ],
)
def test_bad_websocket_config_is_refused(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    port = free_port()
    me = tmp_path / "bad.toml"
    filled = [a.format(port=port, me=me) for a in args]
    if filled[0] == "--config":
        filled[1] = _file(tmp_path, filled[1])
    result = _serve(tmp_path, *filled)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    assert says.format(port=port) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.db").exists()  # refused before the database was opened
