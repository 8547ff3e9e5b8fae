"""The connection core: one client connection's MQTT rules, sans-I/O.

`ConnectionCore` is a plain object per connection, in the manner of h11: the
runtime hands it the socket's bytes with the time (`receive(data, now)`) and
gets back effects (`mqtt/protocol_effects.py`: send these bytes, authenticate,
open the session, append this PUBLISH, close with this reason...), which it
carries out and answers with events (`handle(event, now)`) or, on the hot
path, with a plain method call (`committed(count)`, `refused(reason, ...)`).
Deliveries to the client are encoded here (`publish`, `pubrel`) so that the
rules about what a client may be sent live in the same place as the rules
about what it may send. It owns no socket, clock, thread or database: `now`
is whatever clock the runtime keeps (the event loop's, or a fake one in tests),
and `next_deadline()` says when the runtime must call `timer(now)`.

The machine, as data in `_TRANSITIONS`::

    AWAITING_CONNECT --CONNECT--> AUTHENTICATING --SessionOpened--> CONNECTED
          |                             |                               |
          | protocol error,             | refused: CONNACK >= 0x80,     | DISCONNECT, keep alive,
          | no CONNECT in time          | protocol error                | protocol error, taken
          v                             v                               v over, the server's reason
          +-----------------------> CLOSING <---------------------------+

- AWAITING_CONNECT: the decoder refuses anything but a CONNECT first
  [MQTT-3.1.0-1]; no CONNECT within `connect_timeout` closes without a word.
- AUTHENTICATING: the CONNECT was read; the credentials are being checked and
  then the session opened (`Authenticate`, then `OpenSession`). Packets that
  arrive meanwhile are held and handled, in order, once CONNECTED. No keep
  alive runs (the runtime is working for the client).
- CONNECTED: the CONNACK went out. Every packet is checked here. A packet
  whose effect must finish before the next is handled (a QoS 2 or retained
  PUBLISH, PUBREL, SUBSCRIBE, UNSUBSCRIBE) makes the core `waiting`: it holds
  what it reads until the runtime calls `resume`, so every check of a later
  packet (Receive Maximum, a resent QoS 2...) sees the earlier one done.
- CLOSING: a `Close` effect was returned; nothing more is read or answered.
  `connection_lost` then says whether a Will must be scheduled.

Who is at fault is told by the exception: a `ProtocolError` from the client's
bytes closes the connection with its reason code (CONNACK before the CONNACK was
sent, DISCONNECT after at MQTT 5; MQTT 3.1.1 gets the CONNACK return code when
there is one, else is just closed); a `LocalProtocolError` means the runtime
misused the core (a bug here, never the client's).

The rules, each in one place, with its statement id: CONNECT (assigned client
id [MQTT-3.1.3-6], 3.1.1 empty id [MQTT-3.1.3-8], enhanced authentication,
session expiry, server keep alive [MQTT-3.2.2-21]), keep alive [MQTT-3.1.2-22],
topic aliases both ways [MQTT-3.3.2-9] / §3.3.2.3.4, Receive Maximum both ways
[MQTT-3.3.4-7] / [MQTT-3.3.4-9], message expiry [MQTT-3.3.2-5], Maximum Packet
Size both ways [MQTT-3.1.2-25] (inbound: the decoder's limit), retained
PUBLISH when retain is unavailable [MQTT-3.3.1-12 / 3.2.2-14], `$SYS`
(§4.7.2), acknowledgement order [MQTT-4.6.0-2], inbound QoS 2 (PUBREC, PUBREL,
PUBCOMP §4.3.3) and DISCONNECT's session expiry [MQTT-3.14.2-2].
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache
from typing import assert_never, cast

from riverbed.errors import LocalProtocolError, ProtocolError
from riverbed.mqtt.codec import (
    MQTT_5,
    NO_PUBLISH_PROPERTIES,
    Auth,
    Connack,
    ConnackProperties,
    Connect,
    ConnectReason,
    Decoder,
    Disconnect,
    DisconnectProperties,
    DisconnectReason,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    PubackReason,
    Pubcomp,
    PubcompReason,
    Publish,
    PublishProperties,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
    encode,
    encode_puback,
    encode_pubacks,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from riverbed.mqtt.codec.reasons import CONNACK_REASONS_V311
from riverbed.mqtt.protocol_effects import (
    Append,
    Authenticate,
    Authenticated,
    Close,
    Effect,
    Event,
    ForgetPacketId,
    OpenSession,
    Released,
    ScheduleWill,
    Send,
    ServerClose,
    SessionOpened,
    SessionRefused,
    TakenOver,
    ToSession,
)

_MOVE_REASONS = frozenset({DisconnectReason.USE_ANOTHER_SERVER, DisconnectReason.SERVER_MOVED})
"""A server's reasons to close that a CONNACK can give as well: the client is
to connect elsewhere."""
CONNECT_TIMEOUT = 10.0
"""Seconds a new connection has to send its CONNECT."""
CLIENT_RECEIVE_MAXIMUM = 0xFFFF
"""A client's Receive Maximum when its CONNECT names none (MQTT 5.0 §3.1.2.11.3)."""
SYS_PREFIX = "$SYS"


class State(Enum):
    """Where a connection is in its life (the module docstring draws the machine)."""

    AWAITING_CONNECT = "awaiting CONNECT"
    AUTHENTICATING = "authenticating"
    CONNECTED = "connected"
    CLOSING = "closing"


_TRANSITIONS: dict[tuple[State, str], State] = {
    (State.AWAITING_CONNECT, "connect"): State.AUTHENTICATING,
    (State.AWAITING_CONNECT, "close"): State.CLOSING,
    (State.AUTHENTICATING, "session opened"): State.CONNECTED,
    (State.AUTHENTICATING, "close"): State.CLOSING,
    (State.CONNECTED, "close"): State.CLOSING,
    # The transport is gone, whatever the state.
    (State.AWAITING_CONNECT, "lost"): State.CLOSING,
    (State.AUTHENTICATING, "lost"): State.CLOSING,
    (State.CONNECTED, "lost"): State.CLOSING,
    (State.CLOSING, "lost"): State.CLOSING,
}
"""(state, what happened) -> the next state; anything else is a `LocalProtocolError`."""


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """What the broker grants each client (from `mqtt.config.Limits`, plus what
    the broker offers: shared subscriptions)."""

    receive_maximum: int = 100
    topic_alias_maximum: int = 16
    maximum_packet_size: int = 1 << 20
    server_keep_alive: int | None = None
    max_session_expiry: int = 7 * 86400
    v311_session_expiry: int = 7 * 86400
    max_inflight: int = 100
    retain_available: bool = True
    shared_subscription_available: bool = True
    connect_timeout: float = CONNECT_TIMEOUT


_NO_IDS: set[int] = set()
"""The packet ids of a connection with none: its `outbound` and `qos2` until
the first one (never added to; the first id makes the connection a set of its
own). An idle connection holds no containers of its own."""


def _anyone_may_publish(username: str | None, client_id: str, topic: str) -> bool:
    return True


def _connack_properties(
    expiry: int | None, assigned: str | None, limits: ProtocolLimits
) -> ConnackProperties:
    """What an MQTT 5 CONNACK accepting a connection says: the Session Expiry
    Interval if the broker changed the client's, the client id it assigned,
    and what the broker grants."""
    return ConnackProperties(
        session_expiry_interval=expiry,
        receive_maximum=limits.receive_maximum,
        retain_available=limits.retain_available,
        maximum_packet_size=limits.maximum_packet_size,
        assigned_client_identifier=assigned,
        topic_alias_maximum=limits.topic_alias_maximum,
        shared_subscription_available=limits.shared_subscription_available,
        server_keep_alive=limits.server_keep_alive,
    )


@lru_cache(maxsize=64)
def _accepted(present: bool, expiry: int | None, limits: ProtocolLimits) -> bytes:
    """The encoded MQTT 5 CONNACK accepting a client that brought its own client
    id: the same bytes for every such client under these limits, so a fleet
    reconnecting at once has it built, checked and encoded once."""
    return encode(Connack(present, properties=_connack_properties(expiry, None, limits)), MQTT_5)


class ConnectionCore:
    """One client connection's MQTT rules (the module docstring tells the story).

    `may_publish(username, client_id, topic)` is the authorization policy
    (`mqtt/acl.py`, itself sans-I/O); `new_client_id()` makes an Assigned
    Client Identifier; `publish_in`, if given, counts the PUBLISHes read per
    QoS (the broker's metrics: plain ints).
    """

    __slots__ = (
        "_alias_maximum",
        "_aliases_in",
        "_aliases_out",
        "_client_max_packet",
        "_deadline",
        "_decoder",
        "_effects",
        "_held",
        "_last_read",
        "_limits",
        "_may_publish",
        "_new_client_id",
        "_out",
        "_pending",
        "_publish_in",
        "_queue",
        "_refused",
        "_requested_expiry",
        "_unacked",
        "_waiting",
        "_will_scheduled",
        "assigned",
        "clean_start",
        "client_id",
        "connack_sent",
        "expiry",
        "keep_alive",
        "level",
        "normal",
        "outbound",
        "qos2",
        "state",
        "username",
        "will",
        "window",
    )

    def __init__(
        self,
        limits: ProtocolLimits,
        now: float,
        *,
        new_client_id: Callable[[], str],
        may_publish: Callable[[str | None, str, str], bool] = _anyone_may_publish,
        publish_in: list[int] | None = None,
    ) -> None:
        self._limits = limits
        self._decoder = Decoder(max_packet_size=limits.maximum_packet_size)
        self._may_publish = may_publish
        self._publish_in = [0, 0, 0] if publish_in is None else publish_in
        self._new_client_id = new_client_id
        self.state = State.AWAITING_CONNECT
        self.level = 4
        self.client_id = ""
        self.assigned: str | None = None
        """The Assigned Client Identifier, if the client sent none."""
        self.username: str | None = None
        self.clean_start = True
        self.will: Will | None = None
        self.keep_alive = 0
        self.expiry = 0
        """Session Expiry Interval in force (seconds; DISCONNECT may change it)."""
        self.window = limits.max_inflight
        """Outbound in-flight window: the client's Receive Maximum, capped by ours."""
        self.connack_sent = False
        self.normal = False
        """The client sent DISCONNECT 0x00 (its Will is discarded [MQTT-3.1.2-10])."""
        self.outbound: set[int] = _NO_IDS
        """Packet ids of QoS 1/2 deliveries not yet acknowledged (PUBACK, PUBCOMP)."""
        self.qos2: set[int] = _NO_IDS
        """Inbound QoS 2 packet ids committed, PUBREC sent, PUBREL not yet read."""
        self._deadline: float | None = now + limits.connect_timeout
        self._last_read = now
        self._client_max_packet: int | None = None
        self._alias_maximum = 0
        self._aliases_in: dict[int, str] | None = None
        self._aliases_out: dict[str, int] | None = None
        """Topic aliases each way (made on the first: most clients use none)."""
        self._held: deque[Packet] | None = None
        """Packets read while authenticating or `waiting`, handled in order later
        (a deque only while there are)."""
        self._waiting = False
        """An effect that must finish before the next packet is handled is being
        carried out (`resume` ends it)."""
        self._queue: deque[Publish | tuple[int, int, int]] | None = None
        """Inbound PUBLISHes in arrival order, not yet acknowledged: a `Publish`
        appended and not yet reported committed, or (qos, packet id, reason) for
        one answered on arrival that waits behind those [MQTT-4.6.0-2]. Made on
        the first PUBLISH (a client that only subscribes never needs one)."""
        self._pending = 0
        """How many of `_queue` are appends whose commit is not reported yet."""
        self._unacked = 0
        """How many of `_queue` are QoS 1/2 (Receive Maximum counts those)."""
        self._refused: int | None = None
        """The reason the store refused a commit: what is read after is refused too."""
        self._will_scheduled = False
        self._requested_expiry = 0
        self._effects: list[Effect] | None = None
        """What the current call returns so far (a list only while it has some)."""
        self._out: list[bytes] | None = None
        """Bytes for the client, sent with the next effect or at the end of the
        call (a list only while there are)."""

    # ----------------------------------------------------------------- the runtime's calls

    def receive(self, data: bytes, now: float) -> list[Effect]:
        """The client's next bytes, in any cut: handle the packets they complete
        (or hold them, while authenticating or `waiting`)."""
        self._last_read = now
        if self.state is State.CLOSING:
            return []
        try:
            for packet in self._decoder.feed(data):
                state = self.state
                if state is State.CONNECTED and not self._waiting:
                    self._packet(packet)
                elif state is State.CONNECTED or state is State.AUTHENTICATING:
                    held = self._held
                    if held is None:
                        held = self._held = deque()
                    held.append(packet)
                elif state is State.AWAITING_CONNECT:
                    # The decoder lets nothing but a CONNECT come first [MQTT-3.1.0-1].
                    assert type(packet) is Connect
                    self._connect(packet)
        except ProtocolError as exc:
            self._protocol_error(exc)
        return self._done()

    @property
    def waiting(self) -> bool:
        """The last effect must finish before the next packet is handled: a QoS 2
        or retained `Append`, `ForgetPacketId` (PUBREL), SUBSCRIBE or
        UNSUBSCRIBE. The runtime calls `resume` once it has."""
        return self._waiting

    @property
    def held(self) -> int:
        """How many packets wait to be handled (the runtime stops reading when
        there are many)."""
        return 0 if self._held is None else len(self._held)

    def resume(self, now: float) -> list[Effect]:
        """The effect the core waited for is done: handle the packets held
        meanwhile, up to the next one that waits."""
        self._waiting = False
        if self.state is State.CONNECTED:
            self._handle_held()
        return self._done()

    def _handle_held(self) -> None:
        held = self._held
        if held is None:
            return
        try:
            while held and not self._waiting and self.state is State.CONNECTED:
                self._packet(held.popleft())
        except ProtocolError as exc:
            self._protocol_error(exc)
        if not held:
            self._held = None  # none held most of the time: no deque kept for it

    def handle(self, event: Event, now: float) -> list[Effect]:
        """An answer to an effect, or news only the runtime has."""
        match event:
            case Authenticated(reason, username):
                if not self._expect(State.AUTHENTICATING, event):
                    pass
                elif reason is ConnectReason.SUCCESS:
                    self.username = username
                    self._emit(
                        OpenSession(
                            self.client_id, self.clean_start, self.level, self.expiry, self.will
                        )
                    )
                else:
                    self._refuse_connect(reason)
            case SessionOpened(present):
                if self._expect(State.AUTHENTICATING, event):
                    self._accept_connect(present, now)
            case SessionRefused(reason):
                if self._expect(State.AUTHENTICATING, event):
                    self._refuse_connect(reason)
            case Released(packet_id, known):
                self._released(packet_id, known)
            case TakenOver():
                self._close(DisconnectReason.SESSION_TAKEN_OVER)
            case ServerClose(reason, server_reference):
                self._close(reason, server_reference=server_reference)
            case _:
                assert_never(event)
        return self._done()

    def committed(self, count: int = 1) -> list[Effect]:
        """The next `count` appends (`Publish` and `Append` effects, reported in
        the order the core returned them) are committed: acknowledge them, and
        the refusals waiting behind them, in arrival order [MQTT-4.6.0-2]. The
        hot path: one call per commit of many, the successful PUBACKs of a run
        written as one bytes object (`encode_pubacks`)."""
        if count > self._pending:
            raise LocalProtocolError(f"{count} commits reported, {self._pending} pending")
        self._pending -= count
        self._send_acks(count)
        return self._done()

    def _send_acks(self, count: int) -> None:
        """Acknowledge the next `count` appends and the refusals around them,
        in arrival order, up to the next append still pending."""
        queue = self._queue
        closing = self.state is State.CLOSING
        ids: list[int] = []  # successful QoS 1 packet ids in a row: one bytes object
        while queue:
            entry = queue[0]
            if type(entry) is Publish:
                if not count:
                    break
                count -= 1
                queue.popleft()
                qos = entry.qos
                if not qos:
                    continue
                self._unacked -= 1
                if closing:
                    continue
                packet_id: int = entry.packet_id  # type: ignore[assignment]
                if qos == 1:
                    ids.append(packet_id)
                    continue
                if ids:
                    self._write(encode_pubacks(ids))
                    ids = []
                if self.qos2 is _NO_IDS:
                    self.qos2 = set()
                self.qos2.add(packet_id)
                self._ack(2, packet_id, 0)
            else:
                queue.popleft()
                self._unacked -= 1
                if closing:
                    continue
                if ids:
                    self._write(encode_pubacks(ids))
                    ids = []
                qos, packet_id, reason = entry  # type: ignore[misc]
                self._ack(qos, packet_id, reason)
        if ids:
            self._write(encode_pubacks(ids) if len(ids) > 1 else encode_puback(ids[0]))
        if self._refused is not None and not queue and not closing:
            self._close(DisconnectReason.QUOTA_EXCEEDED)

    def refused(self, reason: int, store_refused: bool = False) -> list[Effect]:
        """The next append (in the order the core returned them) failed to
        commit, with `reason` (a PUBACK reason code); `store_refused` if the
        store refuses writes (full, read-only, unreachable), so what is read
        after is refused too. MQTT 3.1.1, which cannot refuse, is closed
        without the acknowledgement: the client sends it again, and all after."""
        if not self._pending:
            raise LocalProtocolError("a refused commit reported, none pending")
        self._send_acks(0)  # the refusals decided on arrival before it
        self._pending -= 1
        assert self._queue is not None  # made by the append now refused
        entry = self._queue.popleft()
        assert type(entry) is Publish
        qos = entry.qos
        if qos:
            self._unacked -= 1
        if self.state is State.CLOSING:
            return self._done()
        if self.level != MQTT_5:
            self._refused = reason
            self._close(DisconnectReason.UNSPECIFIED_ERROR)
            return self._done()
        if store_refused and self._refused is None:
            self._refused = reason
        if qos:
            self._ack(qos, entry.packet_id or 0, reason)
        self._send_acks(0)  # and the refusals behind it
        return self._done()

    def timer(self, now: float) -> list[Effect]:
        """The deadline `next_deadline()` named has come (or not yet: nothing)."""
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            if self.state is State.AWAITING_CONNECT:
                self._close(None)  # no CONNECT in time: nobody to tell
            else:
                # [MQTT-3.1.2-22]: nothing read for 1.5 times the keep alive.
                self._close(DisconnectReason.KEEP_ALIVE_TIMEOUT)
        return self._done()

    def next_deadline(self) -> float | None:
        """When `timer` must be called next (the CONNECT timeout, then keep
        alive), or None."""
        state = self.state
        if state is State.CONNECTED:
            if not self.keep_alive:
                return None
            return self._last_read + self.keep_alive * 1.5
        if state is State.AWAITING_CONNECT:
            return self._deadline
        return None

    def connection_lost(self) -> list[Effect]:
        """The transport is gone (whoever closed it)."""
        self._goto("lost")
        self._out = None
        will = self.will
        if will is not None and not self.normal and self.connack_sent and not self._will_scheduled:
            # Not DISCONNECT 0x00 (0x04 asks for the Will): after its delay, or
            # when the session ends if that is sooner [MQTT-3.1.3-9].
            self._will_scheduled = True
            delay = (will.properties.will_delay_interval or 0) if self.level == MQTT_5 else 0
            self._emit(ScheduleWill(self.client_id, self.username, will, min(delay, self.expiry)))
        return self._done()

    # ----------------------------------------------------------------- deliveries

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        properties: PublishProperties,
        expiry: int | None,
    ) -> bytes | None:
        """A delivery's bytes, or None if it must be dropped as if acknowledged.

        `expiry` is what is left of its Message Expiry Interval (None: it has
        none); `properties` already carry it (MQTT 5)."""
        if expiry is not None and expiry <= 0:
            # [MQTT-3.3.2-5]: expired while it waited: not delivered.
            return None
        v5 = self.level == MQTT_5
        new_alias = 0
        wire_topic = topic
        aliases = self._aliases_out
        if v5 and self._alias_maximum:
            # §3.3.2.3.4, up to the client's Topic Alias Maximum [MQTT-3.3.2-10]:
            # a topic's first PUBLISH names it and sets an alias, later ones
            # send only the alias.
            if aliases is None:
                aliases = self._aliases_out = {}
            alias = aliases.get(topic)
            if alias is not None:
                properties = replace(properties, topic_alias=alias)
                wire_topic = ""
            elif len(aliases) < self._alias_maximum:
                new_alias = len(aliases) + 1
                properties = replace(properties, topic_alias=new_alias)
        if not v5:
            properties = NO_PUBLISH_PROPERTIES
        data = encode_publish(wire_topic, payload, qos, retain, dup, packet_id, properties, v5)
        if self._client_max_packet is not None and len(data) > self._client_max_packet:
            # [MQTT-3.1.2-25]: larger than the client accepts: dropped.
            return None
        if qos:
            outbound = self.outbound
            if packet_id is None:
                raise LocalProtocolError(f"a QoS {qos} delivery without a packet id")
            if packet_id not in outbound:
                # A DUP resend of what a previous connection left in flight goes
                # out whatever this client's window [MQTT-4.4.0-1]: a session
                # resumed with a smaller Receive Maximum still owes it.
                if len(outbound) >= self.window and not dup:
                    # [MQTT-3.3.4-9]: never more unacknowledged than the client's
                    # Receive Maximum; the session's window keeps to it.
                    raise LocalProtocolError(
                        f"delivery {packet_id} beyond the in-flight window of {self.window}"
                    )
                if outbound is _NO_IDS:
                    outbound = self.outbound = set()
                outbound.add(packet_id)
        if new_alias and aliases is not None:
            aliases[topic] = new_alias
        return data

    def pubrel(self, packet_id: int) -> bytes:
        """A PUBREL for an outbound QoS 2 delivery (in flight until its PUBCOMP)."""
        if self.outbound is _NO_IDS:
            self.outbound = set()
        self.outbound.add(packet_id)
        return encode_pubrel(packet_id, 0, self.level == MQTT_5)

    # ----------------------------------------------------------------- packets

    def _packet(self, packet: Packet) -> None:
        """A packet of a CONNECTED client."""
        # `type(...) is`, not `match`: this runs for every packet.
        kind = type(packet)
        if kind is Publish:
            self._publish(cast(Publish, packet))
        elif kind is Puback or kind is Pubcomp:
            done = cast(Puback | Pubcomp, packet)
            self.outbound.discard(done.packet_id)
            effects = self._effects
            if self._out:
                self._emit(done)
            elif effects is None:
                self._effects = [done]  # the session's, as it is
            else:
                effects.append(done)
        elif kind is Pubrec:
            received = cast(Pubrec, packet)
            if received.reason_code >= 0x80:
                # A refused QoS 2 delivery ends there (§4.3.3): no PUBREL follows.
                self.outbound.discard(received.packet_id)
            self._emit(received)
        elif kind is Pubrel:
            # The PUBCOMP waits for the marker to go; what follows waits for it.
            self._waiting = True
            self._emit(ForgetPacketId(cast(Pubrel, packet).packet_id))
        elif kind is Pingreq:
            self._send(Pingresp())
        elif kind is Subscribe or kind is Unsubscribe:
            # In effect when handled; what follows waits for the SUBACK/UNSUBACK.
            self._waiting = True
            self._emit(ToSession(cast(Subscribe | Unsubscribe, packet)))
        elif kind is Disconnect:
            self._disconnect(cast(Disconnect, packet))
        elif kind is Auth:
            raise ProtocolError(
                DisconnectReason.PROTOCOL_ERROR, "AUTH without enhanced authentication [4.12]"
            )
        else:
            raise ProtocolError(
                DisconnectReason.PROTOCOL_ERROR, f"a client must not send {kind.__name__}"
            )

    def _connect(self, packet: Connect) -> None:
        self._goto("connect")
        self._deadline = None  # the CONNECT came in time
        limits = self._limits
        self.level = level = self._decoder.protocol_level or 4
        v5 = level == MQTT_5
        props = packet.properties
        self.clean_start = packet.clean_start
        self.will = packet.will
        if v5 and props.authentication_method is not None:
            # Enhanced authentication (§4.12) is not offered.
            self._refuse_connect(ConnectReason.BAD_AUTHENTICATION_METHOD)
            return
        client_id = packet.client_id
        if not client_id:
            # [MQTT-3.1.3-6]: the server assigns one (MQTT 5 tells it in CONNACK).
            # 3.1.1 allows that only with CleanSession=1 [MQTT-3.1.3-8]: the
            # decoder's rule.
            client_id = self.assigned = self._new_client_id()
        self.client_id = client_id
        if v5:
            self.expiry = min(props.session_expiry_interval or 0, limits.max_session_expiry)
        else:
            self.expiry = 0 if packet.clean_start else limits.v311_session_expiry
        # Server Keep Alive is MQTT 5's [MQTT-3.2.2-21]; a 3.1.1 client cannot be
        # told otherwise, so it is held to its own.
        server_keep_alive = limits.server_keep_alive if v5 else None
        self.keep_alive = packet.keep_alive if server_keep_alive is None else server_keep_alive
        self.window = min(props.receive_maximum or CLIENT_RECEIVE_MAXIMUM, limits.max_inflight)
        self._client_max_packet = props.maximum_packet_size
        self._alias_maximum = (props.topic_alias_maximum or 0) if v5 else 0
        self._requested_expiry = (props.session_expiry_interval or 0) if v5 else self.expiry
        self._emit(Authenticate(client_id, packet.username, packet.password))

    def _accept_connect(self, present: bool, now: float) -> None:
        self._goto("session opened")
        if self.level == MQTT_5:
            expiry = self.expiry if self.expiry != self._requested_expiry else None
            if self.assigned is None:
                self._write(_accepted(present, expiry, self._limits))
            else:
                properties = _connack_properties(expiry, self.assigned, self._limits)
                self._send(Connack(present, properties=properties))
        else:
            self._send(Connack(present))
        self.connack_sent = True
        self._last_read = max(self._last_read, now)
        self._handle_held()

    def _refuse_connect(self, reason: ConnectReason, error: str = "") -> None:
        """A CONNACK refusal, then close [MQTT-3.2.2-6]; 3.1.1 only gets the
        return codes it has (else it is just closed)."""
        if self.level == MQTT_5 or reason in CONNACK_REASONS_V311:
            self._send(Connack(reason_code=reason))
        self._close(reason, error)

    def _disconnect(self, packet: Disconnect) -> None:
        interval = packet.properties.session_expiry_interval
        if interval is not None:
            if self.expiry == 0 and interval != 0:
                raise ProtocolError(
                    DisconnectReason.PROTOCOL_ERROR,
                    "Session Expiry Interval was 0 at CONNECT; DISCONNECT cannot set it"
                    " [MQTT-3.14.2-2]",
                )
            self.expiry = min(interval, self._limits.max_session_expiry)
        # DISCONNECT 0x00 discards the Will [MQTT-3.1.2-10]; 0x04 keeps it.
        self.normal = packet.reason_code == DisconnectReason.NORMAL_DISCONNECTION
        self._goto("close")
        self._emit(Close(packet.reason_code, by_client=True))

    # ----------------------------------------------------------------- inbound PUBLISH

    def _publish(self, packet: Publish) -> None:
        """Checks every PUBLISH passes, in this order: after a store refusal,
        Subscription Identifier, topic alias, a resent QoS 2, Receive Maximum,
        retain, `$SYS` and authorization. Accepted: `Append`."""
        qos = packet.qos
        self._publish_in[qos] += 1
        packet_id = packet.packet_id
        if self._refused is not None:
            # Read after a PUBLISH the store refused: refused as well, never
            # committed ahead of it; the connection closes once answered.
            if qos:
                self._answer(qos, packet_id, self._refused)
            return
        topic = packet.topic
        properties = packet.properties
        if properties is not NO_PUBLISH_PROPERTIES:
            if properties.subscription_identifiers:
                raise ProtocolError(
                    DisconnectReason.PROTOCOL_ERROR,
                    "a PUBLISH from a client must not carry a Subscription Identifier"
                    " [MQTT-3.3.4-6]",
                )
            alias = properties.topic_alias
            if alias is not None:
                topic = self._resolve_alias(alias, topic)
        if qos == 2 and packet_id in self.qos2:
            # A resent QoS 2 PUBLISH whose PUBREC was lost: committed already and
            # counted already (§4.3.3): answered again, in order.
            self._answer(qos, packet_id, 0)
            return
        limits = self._limits
        # [MQTT-3.3.4-7]: QoS 1/2 PUBLISHes not yet acknowledged, and QoS 2 ones
        # whose PUBCOMP is not sent; QoS 0 not at all. MQTT 3.1.1, which has no
        # Receive Maximum to announce, is closed at the same limit.
        if qos and self._unacked + len(self.qos2) >= limits.receive_maximum:
            raise ProtocolError(
                DisconnectReason.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than Receive Maximum {limits.receive_maximum} QoS 1/2"
                " PUBLISHes unacknowledged [MQTT-3.3.4-7]",
            )
        v5 = self.level == MQTT_5
        if packet.retain and not limits.retain_available and v5:
            raise ProtocolError(
                DisconnectReason.RETAIN_NOT_SUPPORTED,
                "retained messages are not available (CONNACK Retain Available 0) [MQTT-3.2.2-14]",
            )
        # Topic names starting with `$` are the server's (§4.7.2): the broker's
        # own `$SYS` tree is refused to every client.
        if (topic == SYS_PREFIX or topic.startswith("$SYS/")) or not self._may_publish(
            self.username, self.client_id, topic
        ):
            if qos:
                # 3.1.1 has no refusal to send: the PUBACK/PUBREC says success.
                self._answer(qos, packet_id, PubackReason.NOT_AUTHORIZED if v5 else 0)
            return
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        queue.append(packet)
        self._pending += 1
        if qos:
            self._unacked += 1
        # QoS 2 commits alone, after those before it and before the next is
        # handled (per-publisher order); a retained PUBLISH is stored first.
        if qos == 2 or packet.retain:
            self._waiting = True
            self._emit(Append(packet, topic, True))
        elif topic is packet.topic and not self._out:
            # The hot path: the PUBLISH itself is the effect (no object per message).
            effects = self._effects
            if effects is None:
                self._effects = [packet]
            else:
                effects.append(packet)
        elif topic is packet.topic:
            self._emit(packet)
        else:
            self._emit(Append(packet, topic))

    def _resolve_alias(self, alias: int, topic: str) -> str:
        maximum = self._limits.topic_alias_maximum
        if alias > maximum:
            raise ProtocolError(
                DisconnectReason.TOPIC_ALIAS_INVALID,
                f"Topic Alias {alias} above the maximum {maximum} [MQTT-3.3.2-9]",
            )
        aliases = self._aliases_in
        if topic:
            if aliases is None:
                aliases = self._aliases_in = {}
            aliases[alias] = topic
            return topic
        found = None if aliases is None else aliases.get(alias)
        if found is None:
            raise ProtocolError(
                DisconnectReason.PROTOCOL_ERROR,
                f"Topic Alias {alias} was never set on this connection [3.3.2.3.4]",
            )
        return found

    def _answer(self, qos: int, packet_id: int | None, reason: int) -> None:
        """Acknowledge with `reason`, decided on arrival, in arrival order: at
        once if nothing before it waits for a commit, else behind that
        [MQTT-4.6.0-2]."""
        queue = self._queue
        if queue:
            queue.append((qos, packet_id or 0, reason))
            self._unacked += 1
        else:
            self._ack(qos, packet_id or 0, reason)

    def _ack(self, qos: int, packet_id: int, reason: int) -> None:
        # The codec writes them from their fields: no packet object per message.
        v5 = self.level == MQTT_5
        if qos == 1:
            self._write(encode_puback(packet_id, reason, v5))
        else:
            self._write(encode_pubrec(packet_id, reason, v5))

    def _released(self, packet_id: int, known: bool) -> None:
        """PUBREL's marker is gone: PUBCOMP (§4.3.3). It counted toward Receive
        Maximum until now [MQTT-3.3.4-7]."""
        if self.state is State.CLOSING:
            return
        known = packet_id in self.qos2 or known
        self.qos2.discard(packet_id)
        if known or self.level != MQTT_5:
            self._write(encode_pubcomp(packet_id, 0, self.level == MQTT_5))
        else:
            # Nothing awaits release under that id (a PUBREL resent after our
            # PUBCOMP was lost, or a stray one): MQTT 5 says so, 3.1.1 cannot.
            not_found = PubcompReason.PACKET_IDENTIFIER_NOT_FOUND
            self._write(encode_pubcomp(packet_id, not_found))

    # ----------------------------------------------------------------- closing

    def _protocol_error(self, exc: ProtocolError) -> None:
        """The client broke a rule: say why and close [MQTT-4.13.1-1]."""
        if self.state is State.CLOSING:
            return
        error = f"{exc} (0x{exc.reason_code:02X})"
        if not self.connack_sent:
            self.level = self._decoder.protocol_level or 4
            try:
                reason = ConnectReason(exc.reason_code)
            except ValueError:
                reason = ConnectReason.UNSPECIFIED_ERROR
            self._refuse_connect(reason, error)
            return
        try:
            disconnect = DisconnectReason(exc.reason_code)
        except ValueError:
            disconnect = DisconnectReason.PROTOCOL_ERROR
        self._close(disconnect, error)

    def _close(
        self,
        reason: ConnectReason | DisconnectReason | None,
        error: str = "",
        server_reference: str | None = None,
    ) -> None:
        if self.state is State.CLOSING:
            return
        answering = self.state is State.AUTHENTICATING
        self._goto("close")
        if self.connack_sent and self.level == MQTT_5 and isinstance(reason, DisconnectReason):
            if server_reference is None:
                self._send(Disconnect(reason))
            else:
                self._send(
                    Disconnect(reason, DisconnectProperties(server_reference=server_reference))
                )
        elif answering and self.level == MQTT_5 and reason in _MOVE_REASONS:
            # A node draining while a CONNECT is in hand: no DISCONNECT before
            # a CONNACK under 0x80 [MQTT-3.14.0-1], so the CONNACK says where to go
            # (MQTT 5.0 §4.11: Use another server, Server moved).
            assert isinstance(reason, DisconnectReason)
            self._send(
                Connack(
                    reason_code=ConnectReason(reason.value),
                    properties=ConnackProperties(server_reference=server_reference),
                )
            )
        self._emit(Close(reason, error=error))

    # ----------------------------------------------------------------- plumbing

    def _goto(self, what: str) -> None:
        new = _TRANSITIONS.get((self.state, what))
        if new is None:
            raise LocalProtocolError(f"{what!r} in state {self.state.value}")
        self.state = new

    def _expect(self, state: State, event: Event) -> bool:
        """True in `state`; False once closing (an answer that came too late)."""
        if self.state is state:
            return True
        if self.state is State.CLOSING:
            return False
        raise LocalProtocolError(f"{type(event).__name__} in state {self.state.value}")

    def _send(self, packet: Packet) -> None:
        self._write(encode(packet, self.level))

    def _write(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)

    def _emit(self, effect: Effect) -> None:
        effects = self._effects
        if effects is None:
            effects = self._effects = []
        out = self._out
        if out is not None:
            self._out = None
            effects.append(Send(out[0] if len(out) == 1 else b"".join(out)))
        effects.append(effect)

    def _done(self) -> list[Effect]:
        out = self._out
        effects = self._effects
        if out is not None:
            self._out = None
            if effects is None:
                effects = []
            effects.append(Send(out[0] if len(out) == 1 else b"".join(out)))
        if not effects:
            return []
        self._effects = None
        return effects
