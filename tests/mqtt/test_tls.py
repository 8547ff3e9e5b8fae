"""The TLS listener: paho-mqtt 2.x clients over TLS against `riverbed serve`.

Certificates are made for each test module (`harness/certificates.py`): a CA,
a server certificate for 127.0.0.1 and a client certificate it signed, and a
second CA that signed nothing the broker knows.
"""

from __future__ import annotations

import gc
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from harness.broker import BrokerProcess, Client
from harness.certificates import Certificates, encrypt_key, have_openssl, make_certificates
from harness.net import free_port, wait_listening
from riverbed.mqtt.config import Address, TlsListener
from riverbed.mqtt.tls import server_context

pytestmark = pytest.mark.skipif(not have_openssl(), reason="needs openssl")


# --------------------------------------------------------------------- certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@dataclass
class TlsBroker:
    process: BrokerProcess
    tls_port: int


def _broker(sqlite_url: str, certs: Certificates, cafile: bool) -> Iterator[TlsBroker]:
    tls_port = free_port()
    with BrokerProcess(
        sqlite_url, extra_args=certs.listener_args(tls_port, cafile=cafile)
    ) as running:
        assert running.process is not None
        # The plain listener is up; the TLS one starts right after it.
        wait_listening(running.process, tls_port, 10, "broker", running.tail, running.kill)
        yield TlsBroker(running, tls_port)


@pytest.fixture
def broker(sqlite_url: str, certs: Certificates) -> Iterator[TlsBroker]:
    yield from _broker(sqlite_url, certs, cafile=False)


@pytest.fixture
def mtls_broker(sqlite_url: str, certs: Certificates) -> Iterator[TlsBroker]:
    yield from _broker(sqlite_url, certs, cafile=True)


def _refused(port: int, context: ssl.SSLContext) -> str:
    """Connect over TLS; return how the connection failed (fail the test if it did not)."""
    done = threading.Event()
    outcome: list[str] = []

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        outcome.append(f"CONNACK {reason}")
        done.set()

    def on_disconnect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        outcome.append(f"lost: {reason}")
        done.set()

    mqtt = paho.Client(CallbackAPIVersion.VERSION2, "refused", protocol=paho.MQTTv5)
    mqtt.tls_set_context(context)
    mqtt.on_connect = on_connect
    mqtt.on_disconnect = on_disconnect
    failed = _handshake_failure(mqtt, port)
    if failed:
        return failed
    mqtt.loop_start()
    try:
        assert done.wait(10), "neither CONNACK nor disconnect within 10 s"
    finally:
        mqtt.loop_stop()
        mqtt.disconnect()
    assert not outcome[0].startswith("CONNACK Success"), outcome
    return outcome[0]


def _handshake_failure(mqtt: paho.Client, port: int) -> str:
    """Connect; what went wrong if the TLS handshake failed, else ""."""
    # paho leaves the socket of a failed handshake to the garbage collector,
    # whose ResourceWarning `-W error` would turn into a failure of a later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            mqtt.connect("127.0.0.1", port, 60)
        except (ssl.SSLError, OSError) as exc:  # the client refusing the server
            failed = f"handshake: {exc}"
        else:
            failed = ""
        gc.collect()
    return failed


# --------------------------------------------------------------------- tests


def test_publish_and_receive_over_tls_beside_plain(broker: TlsBroker, certs: Certificates) -> None:
    sub = Client(broker.tls_port, "tls-sub", tls=certs.client_context())
    assert sub.connect() is False
    assert sub.subscribe("secure/#", qos=1) == [1]
    pub = Client(broker.tls_port, "tls-pub", tls=certs.client_context())
    pub.connect()
    pub.publish("secure/a", b"over tls", qos=1).wait_for_publish(5)
    plain = Client(broker.process.port, "plain-pub")
    plain.connect()
    plain.publish("secure/b", b"over tcp", qos=1).wait_for_publish(5)
    got = sub.wait_for(2)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("secure/a", b"over tls", 1),
        ("secure/b", b"over tcp", 1),
    ]
    assert pub.acked  # the QoS 1 PUBACK came back over TLS
    for client in (pub, plain, sub):
        client.disconnect()


def test_a_client_that_does_not_trust_the_ca_fails(broker: TlsBroker, certs: Certificates) -> None:
    how = _refused(broker.tls_port, certs.client_context(trust=certs.other_ca))
    assert "CERTIFICATE_VERIFY_FAILED" in how


def test_client_certificates_when_cafile_is_set(
    mtls_broker: TlsBroker, certs: Certificates
) -> None:
    client = Client(mtls_broker.tls_port, "with-cert", tls=certs.client_context(own=True))
    client.connect()
    assert client.subscribe("m/#", qos=1) == [1]
    client.publish("m/1", b"mutual", qos=1).wait_for_publish(5)
    assert [m.payload for m in client.wait_for(1)] == [b"mutual"]
    client.disconnect()
    _refused(mtls_broker.tls_port, certs.client_context())  # no client certificate
    plain = Client(mtls_broker.process.port, "plain")
    plain.connect()  # the plain listener asks for no certificate
    plain.disconnect()


# --------------------------------------------------------------------- refused at start


def _serve(sqlite_url: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "riverbed.cli", "serve", "--mqtt", f"127.0.0.1:{free_port()}"]
    command += ["--db", sqlite_url, "--allow-anonymous", "--tls", f"127.0.0.1:{free_port()}"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=60)


def _bad_files(certs: Certificates) -> dict[str, tuple[Path, Path, str, str]]:
    """name -> (certfile, keyfile, the file the message names, what it says)."""
    d = certs.directory
    garbage = d / "garbage.pem"
    garbage.write_text("not a PEM file\n")
    encrypted = d / "encrypted.key"
    encrypt_key(certs.server_key, encrypted, "x")
    return {
        "missing certfile": (d / "nope.pem", certs.server_key, "nope.pem", "no such file"),
        "missing keyfile": (certs.server, d / "nope.key", "nope.key", "no such file"),
        "garbage certfile": (garbage, certs.server_key, "garbage.pem", "no PEM certificate"),
        "key as certfile": (certs.server_key, certs.server_key, "server.key", "certificate"),
        "garbage keyfile": (certs.server, garbage, "garbage.pem", "no PEM private key"),
        "key not the certificate's": (
            certs.server, certs.client_key, "client.key", "not the private key"
        ),
        "encrypted key": (certs.server, encrypted, "encrypted.key", "encrypted"),
    }  # fmt: skip


BAD = [
    "missing certfile",
    "missing keyfile",
    "garbage certfile",
    "key as certfile",
    "garbage keyfile",
    "key not the certificate's",
    "encrypted key",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_certificate_or_key_refused_at_start(
    sqlite_url: str, certs: Certificates, case: str
) -> None:
    certfile, keyfile, named, says = _bad_files(certs)[case]
    result = _serve(sqlite_url, "--certfile", certfile, "--keyfile", keyfile)
    assert result.returncode == 2, result.stderr  # InvalidInput: the CLI's usage-error code
    assert result.stderr.startswith("error: "), result.stderr
    assert named in result.stderr and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_bad_cafile_refused_at_start(sqlite_url: str, certs: Certificates) -> None:
    args = ("--certfile", certs.server, "--keyfile", certs.server_key, "--cafile", certs.server_key)
    result = _serve(sqlite_url, *args)
    assert result.returncode == 2, result.stderr
    assert "listeners.tls.cafile" in result.stderr and "server.key" in result.stderr


def test_server_context(certs: Certificates) -> None:
    address = Address("127.0.0.1", 0)
    plain = server_context(TlsListener(address, certs.server, certs.server_key))
    assert plain.minimum_version == ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode == ssl.CERT_NONE
    mutual = server_context(TlsListener(address, certs.server, certs.server_key, certs.ca))
    assert mutual.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in mutual.get_ca_certs()] == [((("commonName", "ca"),),)]
