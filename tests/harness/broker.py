"""The broker in a subprocess, for end-to-end tests with real MQTT clients.

    with BrokerProcess(db_url) as broker:
        client.connect("127.0.0.1", broker.port)
        broker.restart()            # SIGTERM, wait, start again on the same port
        broker.kill()               # SIGKILL: a crash
        broker.start()

`start()` runs `python -m riverbed.cli serve --mqtt 127.0.0.1:PORT --db URL
--allow-anonymous --log-level debug` on a free loopback port and waits until the port accepts
connections (with `http=True`, also `--http 127.0.0.1:HTTP_PORT`, and with
`ws=True` `--ws 127.0.0.1:WS_PORT`, waited for too). `stop()` sends SIGTERM and
waits (SIGKILL after `timeout`); `kill()` sends SIGKILL; `rss()` reads its
resident memory. The broker's output goes to a log file whose tail is shown
when the broker fails to start or exits with an error.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from harness.net import free_port, wait_listening
from harness.waiting import DEFAULT_TIMEOUT, SLOW, eventually
from riverbed.sessions.store import SessionRecord, SessionStore
from riverbed.storage import open_storage

START_TIMEOUT = 60.0 * SLOW
"""Seconds a broker may take to listen (imports and storage on a loaded machine)."""
STOP_TIMEOUT = 45.0 * SLOW
"""Seconds `stop` waits after SIGTERM: longer than the broker's own bound
(`limits.stop_grace` 20 s + 5 s), so a slow stop is the broker's to report."""


LIVE: weakref.WeakSet[BrokerProcess] = weakref.WeakSet()
"""Brokers whose log is still on disk: a failing test's report shows their
tails (`harness.logs`)."""


class BrokerProcess:
    """`riverbed serve` in a subprocess, on a free loopback port."""

    def __init__(
        self,
        db_url: str,
        *,
        extra_args: tuple[str, ...] = (),
        port: int = 0,
        http: bool = False,
        ws: bool = False,
        launcher: tuple[str, ...] = ("-m", "riverbed.cli"),
    ) -> None:
        self.db_url = db_url
        self.extra_args = extra_args
        self.launcher = launcher
        """What Python runs: the `riverbed` command, or a script that wraps it."""
        self.port = port or free_port()
        self.http_port = free_port() if http else None
        """With `http`: the admin HTTP API's port (`--http 127.0.0.1:PORT`)."""
        self.ws_port = free_port() if ws else None
        """With `ws`: the MQTT over WebSockets listener's port (`--ws 127.0.0.1:PORT`)."""
        self.process: subprocess.Popen[bytes] | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="riverbed-broker-"))
        self.log_path = self._log_dir / "broker.log"
        self.starts = 0
        LIVE.add(self)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"--- start {self.starts}\n".encode())
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",  # SIGABRT dumps every thread's stack (see `stop`)
                *self.launcher,
                "serve",
                "--mqtt",
                f"127.0.0.1:{self.port}",
                "--db",
                self.db_url,
                "--allow-anonymous",
                "--log-level",  # every client connecting and leaving: tests wait for those
                "debug",
                *(() if self.http_port is None else ("--http", f"127.0.0.1:{self.http_port}")),
                *(() if self.ws_port is None else ("--ws", f"127.0.0.1:{self.ws_port}")),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        wait_listening(self.process, self.port, timeout, "broker", self.tail, self.kill)
        if self.http_port is not None:
            wait_listening(self.process, self.http_port, timeout, "HTTP API", self.tail, self.kill)
        if self.ws_port is not None:
            wait_listening(self.process, self.ws_port, timeout, "WebSockets", self.tail, self.kill)

    @property
    def http_url(self) -> str:
        """The admin HTTP API's base URL (started with `http=True`)."""
        assert self.http_port is not None, "started without http=True"
        return f"http://127.0.0.1:{self.http_port}"

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then wait; SIGKILL if it takes longer than `timeout`."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler: where is it stuck?
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise RuntimeError(f"broker ignored SIGTERM for {timeout}s:\n{self.tail()}") from None

    def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def restart(self) -> None:
        code = self.stop()
        assert code == 0, f"broker exited with {code}:\n{self.tail()}"
        self.start()

    def rss(self) -> int:
        """The broker process's resident memory (VmRSS), in bytes."""
        assert self.process is not None and self.process.poll() is None, "not running"
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for {self.process.pid}")

    def session(self, client_id: str) -> SessionRecord | None:
        """The session record the broker keeps for `client_id` (None: none), read
        from its database: for tests that wait for the broker to have recorded a
        disconnect, or for a session's expiry interval to have passed."""
        storage = open_storage(self.db_url)
        try:
            stored = SessionStore(storage).load(client_id)
        finally:
            storage.close()
        return None if stored is None else stored.record

    def logged(self, pattern: str) -> int:
        """How many lines of the broker's log (every start) match the regular
        expression `pattern`."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return 0
        found = re.compile(pattern)
        return sum(1 for line in text.splitlines() if found.search(line))

    def wait_logged(self, pattern: str, count: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until `count` lines of the broker's log match `pattern`."""
        eventually(
            lambda: self.logged(pattern) >= count,
            timeout,
            f"{count} broker log line(s) matching {pattern!r}",
            interval=0.05,
        )

    def tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> BrokerProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            code = self.stop()
        finally:
            self.kill()
        try:
            if kind is None and code not in (0, -signal.SIGKILL):
                raise AssertionError(f"broker exited with {code}:\n{self.tail()}")
        finally:
            keep = os.environ.get("RIVERBED_TEST_KEEP_LOGS")
            if keep:  # a directory: each broker's log is copied there, by port
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(self.log_path, Path(keep) / f"broker-{self.port}-{os.getpid()}.log")
            LIVE.discard(self)
            shutil.rmtree(self._log_dir, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes
    qos: int
    dup: bool
    retain: bool = False
    expiry: int | None = None
    """The Message Expiry Interval the broker sent (MQTT 5), if any."""
    at: float = 0.0
    """When it arrived (time.monotonic())."""
    identifiers: tuple[int, ...] = ()
    """Its Subscription Identifiers (MQTT 5)."""


class PahoClient(paho.Client):
    """paho-mqtt's client with its QoS 2 resume made right across failed
    reconnect attempts.

    paho-mqtt (2.2.0) resets its outgoing messages at every `reconnect()`, before
    it opens the socket: a QoS 2 message waiting for its PUBCOMP becomes "resend
    the PUBREL". When that attempt fails (the broker is still restarting) the
    next reset finds "resend the PUBREL", which it does not recognise, and turns
    the message back into "send the PUBLISH": paho then publishes again a
    message the broker has already released, under a packet id the broker was
    told it may forget, and the broker stores it a second time, as the MQTT
    specification makes any broker do (§4.3.3: a PUBLISH after the PUBREL is a
    new message). Here a
    message owed a PUBREL stays owed a PUBREL, whatever the number of resets.
    """

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            owed = [
                m
                for m in self._out_messages.values()
                if m.qos == 2 and m.state == paho.mqtt_ms_resend_pubrel
            ]
        super()._messages_reconnect_reset_out()
        with self._out_message_mutex:
            for m in owed:
                m.state = paho.mqtt_ms_resend_pubrel


class Client:
    """A paho-mqtt 2.x client that records what happens to it, for tests.

    `connect()` waits for the CONNACK and returns Session Present; messages
    received are appended to `received` (acknowledged by paho after the
    callback); `disconnects` holds the reason codes of DISCONNECTs and losses.
    With `tls` (a client `SSLContext`) it connects over TLS; with `websocket`
    (a path, e.g. "/mqtt") over WebSockets (WSS with `tls`).
    """

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        protocol: int = paho.MQTTv5,
        tls: ssl.SSLContext | None = None,
        websocket: str | None = None,
    ) -> None:
        self.port = port
        self.tls = tls
        self.websocket = websocket
        self.client_id = client_id
        self.protocol = protocol
        self.received: list[Received] = []
        self.disconnects: list[int] = []
        self.refusals: list[int] = []
        """The reason codes of CONNACKs that refused a CONNECT (0x80 and up)."""
        self.connack: tuple[bool, int] | None = None
        self.connack_properties: Any = None
        self.acked: list[int] = []
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        self._lock = threading.Lock()
        self._subacks: dict[int, list[int]] = {}
        self.paho: paho.Client | None = None

    def connect(
        self,
        *,
        clean: bool = True,
        expiry: int | None = None,
        keepalive: int = 60,
        timeout: float = DEFAULT_TIMEOUT,
        will: tuple[str, bytes, int, bool] | None = None,
        will_delay: int | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> bool:
        """Connect (clean start / clean session `clean`); return Session Present."""
        v5 = self.protocol == paho.MQTTv5
        transport = "tcp" if self.websocket is None else "websockets"
        if v5:
            mqtt = PahoClient(
                CallbackAPIVersion.VERSION2,
                self.client_id,
                protocol=self.protocol,
                transport=transport,
            )
        else:
            mqtt = PahoClient(
                CallbackAPIVersion.VERSION2,
                self.client_id,
                protocol=self.protocol,
                clean_session=clean,
                transport=transport,
            )
        if self.websocket is not None:
            mqtt.ws_set_options(path=self.websocket)
        mqtt.on_connect = self._on_connect
        mqtt.on_message = self._on_message
        mqtt.on_disconnect = self._on_disconnect
        mqtt.on_subscribe = self._on_subscribe
        mqtt.on_unsubscribe = self._on_unsubscribe
        mqtt.on_publish = self._on_publish
        if will is not None:
            will_properties = None
            if v5 and will_delay is not None:
                will_properties = Properties(PacketTypes.WILLMESSAGE)
                will_properties.WillDelayInterval = will_delay
            mqtt.will_set(*will, properties=will_properties)
        if self.tls is not None:
            mqtt.tls_set_context(self.tls)
        if username is not None:
            mqtt.username_pw_set(username, password)
        self.paho = mqtt
        self._connected.clear()
        self._disconnected.clear()
        self.connack = None
        properties = None
        if v5 and expiry is not None:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = expiry
        if v5:
            mqtt.connect(
                "127.0.0.1", self.port, keepalive, clean_start=clean, properties=properties
            )
        else:
            mqtt.connect("127.0.0.1", self.port, keepalive)
        mqtt.loop_start()
        if not self._connected.wait(timeout):
            raise AssertionError(f"no CONNACK for {self.client_id!r} within {timeout}s")
        assert self.connack is not None, (
            f"the connection of {self.client_id!r} ended before its CONNACK"
            f" (paho's reasons: {self.disconnects})"
        )
        present, code = self.connack
        assert code == 0, f"CONNECT of {self.client_id!r} refused: 0x{code:02X}"
        return present

    def subscribe(
        self,
        *filters: str,
        qos: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        retain_handling: int = 0,
        retain_as_published: bool = False,
        no_local: bool = False,
        identifier: int | None = None,
    ) -> list[int]:
        assert self.paho is not None
        if self.protocol == paho.MQTTv5:
            options = SubscribeOptions(
                qos,
                noLocal=no_local,
                retainAsPublished=retain_as_published,
                retainHandling=retain_handling,
            )
            properties = None
            if identifier is not None:
                properties = Properties(PacketTypes.SUBSCRIBE)
                properties.SubscriptionIdentifier = identifier
            result, mid = self.paho.subscribe(
                [(f, options) for f in filters], properties=properties
            )
        else:
            result, mid = self.paho.subscribe([(f, qos) for f in filters])
        assert result == paho.MQTT_ERR_SUCCESS and mid is not None
        return self._ack(mid, timeout, "SUBACK")

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        expiry: int | None = None,
        key: str | None = None,
    ) -> paho.MQTTMessageInfo:
        """PUBLISH; `key` sets the message's ordering key (user property `key`)."""
        assert self.paho is not None
        properties = None
        if expiry is not None or key is not None:
            properties = Properties(PacketTypes.PUBLISH)
            if expiry is not None:
                properties.MessageExpiryInterval = expiry
            if key is not None:
                properties.UserProperty = [("key", key)]
        return self.paho.publish(topic, payload, qos, retain, properties)

    def unsubscribe(self, *filters: str, timeout: float = DEFAULT_TIMEOUT) -> list[int]:
        """UNSUBSCRIBE and wait for the UNSUBACK; its reason codes (MQTT 5)."""
        assert self.paho is not None
        result, mid = self.paho.unsubscribe(list(filters))
        assert result == paho.MQTT_ERR_SUCCESS and mid is not None
        return self._ack(mid, timeout, "UNSUBACK")

    def _ack(self, mid: int, timeout: float, kind: str) -> list[int]:
        """The reason codes of the SUBACK or UNSUBACK for `mid`, once it came."""

        def came() -> tuple[list[int]] | None:
            # In a tuple: an MQTT 3.1.1 UNSUBACK has no reason codes ([] is falsy).
            with self._lock:
                return (self._subacks.pop(mid),) if mid in self._subacks else None

        (codes,) = eventually(came, timeout, f"the {kind} of {self.client_id!r}")
        return codes

    def disconnect(self, expiry: int | None = None) -> None:
        if self.paho is None:
            return
        properties = None
        if expiry is not None:
            properties = Properties(PacketTypes.DISCONNECT)
            properties.SessionExpiryInterval = expiry
        self.paho.disconnect(properties=properties)
        self._disconnected.wait(10)
        self.close()

    def drop(self) -> None:
        """Close the network connection without a DISCONNECT (a lost connection)."""
        if self.paho is not None:
            self.paho.loop_stop()
            sock = self.paho.socket()
            if sock is not None:
                sock.close()
            self.paho = None

    def close(self) -> None:
        """Stop the network loop; a connected client then just goes silent."""
        if self.paho is not None:
            self.paho.loop_stop()
            self.paho = None

    def wait_disconnected(self, timeout: float) -> bool:
        return self._disconnected.wait(timeout)

    def wait_for(self, count: int, timeout: float = DEFAULT_TIMEOUT) -> list[Received]:
        """Wait until at least `count` messages were received; return them all
        (fewer if `timeout` passes first: the caller's assertion says what is
        missing). A count includes duplicates: to know that every message
        arrived, wait for each (`wait_payloads`)."""
        with contextlib.suppress(AssertionError):
            eventually(lambda: len(self.received_now()) >= count, timeout)
        return self.received_now()

    def wait_payloads(self, *payloads: bytes, timeout: float = DEFAULT_TIMEOUT) -> list[Received]:
        """Wait until each of `payloads` has arrived (at least once); return
        everything received so far."""

        def missing() -> list[bytes]:
            have = set(self.payloads())
            return [p for p in payloads if p not in have]

        eventually(
            lambda: not missing(),
            timeout,
            f"{len(payloads)} payloads at {self.client_id!r}",
            explain=lambda: f"missing {missing()[:10]!r}",
        )
        return self.received_now()

    def received_now(self) -> list[Received]:
        """A copy of what arrived so far (paho's thread keeps appending)."""
        with self._lock:
            return list(self.received)

    def payloads(self) -> list[bytes]:
        with self._lock:
            return [m.payload for m in self.received]

    # --- paho callbacks (paho's thread) ---------------------------------------------
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = (bool(flags.session_present), int(reason.value))
        self.connack_properties = props
        if int(reason.value) >= 0x80:
            with self._lock:
                self.refusals.append(int(reason.value))
        self._connected.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            self.received.append(
                Received(
                    message.topic,
                    bytes(message.payload),
                    message.qos,
                    bool(message.dup),
                    bool(message.retain),
                    getattr(message.properties, "MessageExpiryInterval", None),
                    time.monotonic(),
                    tuple(getattr(message.properties, "SubscriptionIdentifier", ()) or ()),
                )
            )

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        with self._lock:
            self.disconnects.append(int(reason.value))
        self._disconnected.set()
        self._connected.set()  # a refused or lost connection ends the wait too

    def _on_unsubscribe(
        self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any
    ) -> None:
        with self._lock:
            self._subacks[mid] = [int(r.value) for r in reasons] if reasons else []

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._lock:
            self._subacks[mid] = [int(r.value) for r in reasons]

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        with self._lock:
            self.acked.append(mid)
