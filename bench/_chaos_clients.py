"""The MQTT clients of bench/chaos.py: paced publishers and persistent
subscribers (paho-mqtt 2.x, MQTT 5), each reconnecting by itself.

Every client keeps a session (clean start 0, session expiry an hour) and lets
paho reconnect after a lost connection (1-2 s apart). A publisher's messages
not yet acknowledged are sent again by paho on the new connection (QoS 1 with
DUP=1; QoS 2 with the same packet id, or its PUBREL: `_Client` mends paho
where it would send the PUBLISH again after its PUBREL): at-least-once publishing,
so a QoS 1 message may be in the log twice (counted apart: a republished
copy). After a lost connection a publisher publishes nothing new until what
paho sends again is acknowledged: paho would let a new PUBLISH overtake them
(it sends one made while it reconnects before those).
A message counts as acknowledged only when paho reports its PUBACK (QoS 1) or
PUBCOMP (QoS 2) with a success reason code; one refused (reason code 0x80 or
above) is published again after REFUSED_BACKOFF. `wire` keeps paho's log of what it sent.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from _chaos_tally import Delivery

SESSION_EXPIRY = 3600
REFUSED_BACKOFF = 0.2
"""Seconds before a refused message is published again."""


class _Client(paho.Client):
    """paho's client, keeping a QoS 2 message's PUBREL owed across a reconnect
    that fails before its CONNACK.

    paho 2.2 resets its outgoing messages on every reconnect: one awaiting
    PUBCOMP becomes "resend PUBREL", but one already in that state (a reconnect
    whose CONNACK never came, e.g. while the broker or the store restarts)
    becomes "publish" again, and the next connection sends the PUBLISH anew.
    MQTT forbids that once the PUBREL is sent (MQTT 5.0 §4.3.3), and the broker,
    which deleted the packet id's marker at the PUBREL, takes it for a new
    message: a copy in the log after later messages of its key.
    """

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            owed = [m for m in self._out_messages.values() if m.state == paho.mqtt_ms_resend_pubrel]
        super()._messages_reconnect_reset_out()
        with self._out_message_mutex:
            for m in owed:
                if m.state == paho.mqtt_ms_publish:
                    m.state = paho.mqtt_ms_resend_pubrel


def _client(client_id: str) -> paho.Client:
    client = _Client(CallbackAPIVersion.VERSION2, client_id, protocol=paho.MQTTv5)
    client.reconnect_delay_set(1, 2)
    client.max_queued_messages_set(0)  # no limit: a publisher's backlog waits in paho
    return client


def _connect(client: paho.Client, port: int) -> None:
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = SESSION_EXPIRY
    # Retried here until the first CONNACK; paho's loop reconnects after that.
    deadline = time.monotonic() + 60
    while True:
        try:
            client.connect("127.0.0.1", port, 30, clean_start=False, properties=properties)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    client.loop_start()


class Publisher:
    """Publishes `pP.kK.S` to `chaos/pP` with the user property `key` = `pPkK`,
    `rate` messages a second over `keys` keys in turn, until `stop()`."""

    def __init__(self, number: int, port: int, qos: int, keys: int, rate: float) -> None:
        self.name = f"p{number}"
        self.qos = qos
        self.keys = keys
        self.rate = rate
        self.lock = threading.Lock()
        self.sent: dict[str, float] = {}
        self.acknowledged: dict[str, float] = {}
        self.refused: list[tuple[str, int]] = []
        self.connects = 0
        self.disconnects = 0
        self._mids: dict[int, str] = {}
        self._refused_queue: list[str] = []
        self._early: dict[int, int] = {}
        self._stop = threading.Event()
        self._resync = threading.Event()
        self._connected = threading.Event()
        self._client = _client(f"chaos-{self.name}")
        self._client.on_publish = self._on_publish
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_log = self._on_log
        self.wire: list[str] = []
        """paho's log of what it sent and got, and which message each mid was:
        evidence for an order violation in the log."""
        self._port = port
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        _connect(self._client, self._port)
        self._thread.start()

    def stop(self) -> None:
        """Stop publishing (what is in flight still gets its acknowledgement)."""
        self._stop.set()
        self._thread.join()

    def outstanding(self) -> int:
        with self.lock:
            return len(self.sent) - len(self.acknowledged)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def _run(self) -> None:
        seq = [0] * self.keys
        n = 0
        start = time.monotonic()
        while not self._stop.is_set():
            if not self._connected.is_set() or (self._resync.is_set() and self.outstanding()):
                # paho sends a PUBLISH made while it reconnects at once, ahead of
                # what it sends again after the CONNACK ([MQTT-4.6.0-1] wants
                # those first, in their order): publish nothing new until the
                # connection is up and what was in flight is acknowledged.
                self._stop.wait(0.02)
                continue
            self._resync.clear()
            k = n % self.keys
            self._publish(f"{self.name}.k{k}.{seq[k]}")
            seq[k] += 1
            n += 1
            pause = start + n / self.rate - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)

    def _publish(self, message: str) -> None:
        properties = Properties(PacketTypes.PUBLISH)
        properties.UserProperty = [("key", message.rsplit(".", 1)[0].replace(".", ""))]
        with self.lock:
            self.sent.setdefault(message, time.monotonic())
        # Not under self.lock: paho holds its own lock while calling on_publish.
        info = self._client.publish(
            f"chaos/{self.name}", message.encode(), self.qos, properties=properties
        )
        with self.lock:
            code = self._early.pop(info.mid, None)
            self.wire.append(f"{time.monotonic():.6f} publish {message} mid {info.mid}")
            if code is None:
                self._mids[info.mid] = message
                return
        self._answered(message, code)  # on_publish came before publish() returned

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        code = int(reason.value) if reason is not None else 0
        with self.lock:
            message = self._mids.pop(mid, None)
            if message is None:
                self._early[mid] = code
                return
        self._answered(message, code)

    def _answered(self, message: str, code: int) -> None:
        with self.lock:
            if code < 0x80:
                self.acknowledged.setdefault(message, time.monotonic())
                return
            self.refused.append((message, code))
        # Refused (e.g. the store is down): not accepted, so publish it again a
        # moment later, off paho's thread, and nothing new until it is accepted.
        # The broker accepts nothing of this connection after a refused one (it
        # refuses the rest and closes it), so republished in order they keep it.
        self._resync.set()
        with self.lock:
            self._refused_queue.append(message)
            if len(self._refused_queue) > 1:
                return  # the timer set for the first takes this one too, in order
        timer = threading.Timer(REFUSED_BACKOFF, self._republish)
        timer.daemon = True
        timer.start()

    def _republish(self) -> None:
        """Publish the refused messages again, in the order they were refused
        (the broker refuses everything after a refusal and closes the
        connection, so that is their order)."""
        with self.lock:
            messages, self._refused_queue = self._refused_queue, []
        for message in messages:
            self._publish(message)
        # What the client had sent after them went unanswered (the broker
        # closed the connection) and paho sends it again on the next one, in
        # its `_out_messages` order: the republished ones go first, being older.
        client = self._client
        with client._out_message_mutex, self.lock:
            republished = [mid for mid, m in self._mids.items() if m in messages]
            for mid in reversed(
                sorted(republished, key=lambda mid: messages.index(self._mids[mid]))
            ):
                if mid in client._out_messages:
                    client._out_messages.move_to_end(mid, last=False)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connects += 1
        self.wire.append(f"{time.monotonic():.6f} on_connect {reason}")
        if int(reason.value) == 0:
            self._connected.set()

    def _on_log(self, client: Any, userdata: Any, level: int, text: str) -> None:
        if not text.startswith("Received PUB"):  # PUBACKs are in `acknowledged`
            self.wire.append(f"{time.monotonic():.6f} {text}")

    def _on_disconnect(self, *args: Any) -> None:
        self.disconnects += 1
        self.wire.append(f"{time.monotonic():.6f} on_disconnect")
        self._connected.clear()
        self._resync.set()


class Subscriber:
    """A persistent session subscribed to `topic_filter`; records every message."""

    def __init__(self, name: str, port: int, topic_filter: str, qos: int) -> None:
        self.name = name
        self.filter = topic_filter
        self.qos = qos
        self.lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.connects = 0
        self.sessions_lost = 0
        """CONNACKs with Session Present 0 after the first: the session was gone."""
        self._subscribed = threading.Event()
        self._client = _client(name)
        self._client.on_message = self._on_message
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._port = port

    def start(self, timeout: float = 60) -> None:
        _connect(self._client, self._port)
        if not self._subscribed.wait(timeout):
            raise RuntimeError(f"{self.name}: no SUBACK within {timeout} s")

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def received(self) -> set[str]:
        with self.lock:
            return {d.message for d in self.deliveries}

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if int(reason.value) != 0:
            return
        self.connects += 1
        if flags.session_present:
            return
        if self.connects > 1:
            self.sessions_lost += 1
        client.subscribe([(self.filter, SubscribeOptions(self.qos))])

    def _on_subscribe(self, *args: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        # paho acknowledges once this returns (QoS 2: it already had the PUBREL).
        delivery = Delivery(
            self.name, message.payload.decode(), time.monotonic(), dup=bool(message.dup)
        )
        with self.lock:
            self.deliveries.append(delivery)
