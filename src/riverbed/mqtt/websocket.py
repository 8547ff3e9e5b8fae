"""MQTT over WebSockets: the `[listeners.ws]` listener's side of a connection.

    accept = lambda: WebSocket(listener, limits.maximum_packet_size, lambda: Connection(broker))
    server = await loop.create_server(accept, host, port)

A `WebSocket` is the asyncio protocol on the socket. It speaks the WebSocket
protocol through wsproto (h11's sibling: bytes in, events out, no I/O of its
own) and, once the opening handshake is accepted, drives an ordinary MQTT
`Connection` through `_Frames`, a transport that carries what the connection
writes in binary frames and hands it the payloads of the frames received. The
MQTT side is the one TCP clients have: nothing of it is copied here.

What MQTT 5.0 §6 (and 3.1.1 §6) ask of the server, and what it does:

- The handshake is an HTTP/1.1 GET for `listeners.ws.path` whose
  Sec-WebSocket-Protocol offers `mqtt`; the server selects `mqtt`
  [MQTT-6.0.0-4, MQTT-6.0.0-5]. A request for another path gets 404, one that
  does not offer `mqtt` 400, a browser whose Origin is not in
  `listeners.ws.allowed_origins` (when it is not empty) 403, and a request that
  is no WebSocket handshake at all (or no HTTP) 400: each with a line of text
  saying why, then the socket is closed and an info line logged. A request
  without an Origin header comes from no browser and is not checked: the
  header protects browsers' users from other sites' pages, and any other
  client can send whatever Origin it likes.
- A handshake not complete within `HANDSHAKE_TIMEOUT` seconds of the
  connection (after the TLS handshake, for WSS) closes the socket.
- MQTT packets travel in binary frames; a text frame closes the connection
  (1003) [MQTT-6.0.0-1]. A packet may span frames and a frame may hold several
  packets [MQTT-6.0.0-2]: payloads go to the MQTT decoder as they come, which
  reassembles packets whatever the framing. A WebSocket message longer than
  `limits.maximum_packet_size` closes the connection (1009), so a peer cannot
  make the server read an endless message.
- Ping frames are answered; a Close frame is answered and the socket closed,
  which the MQTT connection sees as the network connection's loss (its Will
  goes out unless it sent DISCONNECT). When the MQTT connection closes, a
  Close frame (1000) goes out after its last packet, then (over plain TCP) the
  FIN, and the socket stays open until the client answers with its Close or
  closes its end (or the connection's `CLOSE_LINGER` passes): closed with
  bytes unread, the socket would send a RST that can make the client lose the
  DISCONNECT before it.

The per-message path stays off wsproto's event objects: a complete, masked,
unfragmented binary frame of at most 65,535 bytes (every frame MQTT clients
send, one packet each) is unmasked here (`_read_frames`), and each write of
the MQTT connection is framed here (`frame()`: server frames are unmasked, so a
header is all it takes). Every other frame (control frames, text, fragments,
anything malformed) goes to wsproto, from that frame on until wsproto has no
frame half read, so what the listener accepts, answers and refuses is
wsproto's.

Flow control passes straight through: the MQTT connection pausing its reads
pauses the socket's, and the socket's write buffer (its limits, its size, its
pause and resume) is the connection's (`limits.write_buffer_limit`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from riverbed.mqtt.connection import peer_text

if TYPE_CHECKING:
    from riverbed.mqtt.config import WebSocketListener

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a new connection has to complete its WebSocket handshake (as
`[limits] connect_timeout` for its CONNECT, which comes after)."""
SUBPROTOCOL = "mqtt"
"""The WebSocket subprotocol of MQTT 3.1.1 and 5 [MQTT-6.0.0-4]."""
BINARY_FIN = 0x82
"""The first byte of an unfragmented binary frame (FIN, no RSV bits, opcode 2)."""
MASKED = 0x80
"""The mask bit of a frame's second byte: set on every client frame."""


def frame(data: bytes | bytearray | memoryview) -> bytes:
    """`data` as one unmasked binary frame, as a server sends it."""
    n = len(data)
    if n < 126:
        head = bytes((BINARY_FIN, n))
    elif n < 0x10000:
        head = bytes((BINARY_FIN, 126, n >> 8, n & 0xFF))
    else:
        head = bytes((BINARY_FIN, 127)) + n.to_bytes(8, "big")
    return head + data


def unmask(data: bytes, start: int, end: int, key: bytes) -> bytes:
    """`data[start:end]` XORed with the 4-byte masking `key`, repeated."""
    n = end - start
    keys = key * ((n >> 2) + 1)
    value = int.from_bytes(data[start:end], "little") ^ int.from_bytes(keys[:n], "little")
    return value.to_bytes(n, "little")


class WebSocket(asyncio.Protocol):
    """One MQTT over WebSockets client: the handshake, then its frames.

    `make()` makes the MQTT connection (an `asyncio.Protocol`) that the frames'
    payloads go to once the handshake is accepted."""

    __slots__ = (
        "_closing",
        "_deadline",
        "_frames",
        "_inner",
        "_limit",
        "_listener",
        "_loop",
        "_make",
        "_message",
        "_partial",
        "_transport",
        "_ws",
        "_wsproto",
        "peer",
    )

    def __init__(
        self,
        listener: WebSocketListener,
        maximum_message: int,
        make: Callable[[], asyncio.Protocol],
    ) -> None:
        self._listener = listener
        self._limit = maximum_message
        self._make = make
        self._ws = WSConnection(ConnectionType.SERVER)
        self._transport: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._frames: _Frames | None = None
        self._message = 0
        """Bytes of the WebSocket message being received, so far."""
        self._wsproto = True
        """wsproto reads the frames (it may hold part of one); else `_read_frames`."""
        self._partial = b""
        """The start of a frame `_read_frames` has not all of yet."""
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._deadline: asyncio.TimerHandle | None = None
        self.peer = "-"

    # --- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self.peer = peer_text(transport.get_extra_info("peername"))
        self._deadline = self._loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        payload: list[bytes] = []
        if self._wsproto and self._frames is not None and _wsproto_idle(self._ws):
            self._wsproto = False
        if not self._wsproto:
            data = self._read_frames(data, payload)
            if not data:
                self._feed(payload)
                return
            self._wsproto = True  # a frame for wsproto: it takes over from there
        try:
            self._ws.receive_data(data)
        except RemoteProtocolError as exc:
            # Not a WebSocket handshake, or no HTTP at all.
            hint = exc.event_hint
            status = hint.status_code if isinstance(hint, RejectConnection) else 400
            self._refuse(status, f"not a WebSocket handshake ({exc})")
            return
        for event in self._ws.events():
            if not self._event(event, payload):
                break
        self._feed(payload)

    def eof_received(self) -> bool | None:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._frames is not None:
            self._frames.closing = True
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # --- events ------------------------------------------------------------------------
    def _event(self, event: Event, payload: list[bytes]) -> bool:
        """Handle one WebSocket event; False once the connection is closing.
        Binary payloads are collected in `payload`, to be fed to the MQTT
        connection together (so that a read's PUBLISHes are committed together)."""
        match event:
            case BytesMessage(data=data, message_finished=finished):
                self._message += len(data)
                if self._message > self._limit:
                    self._feed(payload)
                    self._fail(
                        CloseReason.MESSAGE_TOO_BIG,
                        f"a WebSocket message of more than {self._limit} bytes"
                        " (limits.maximum_packet_size)",
                    )
                    return False
                if finished:
                    self._message = 0
                payload.append(bytes(data))
                return True
            case Ping():
                self._send(event.response())
                return True
            case Request():
                self._request(event)
                return not self._closing
            case TextMessage():
                self._feed(payload)
                self._fail(
                    CloseReason.UNSUPPORTED_DATA,
                    "a text frame (MQTT travels in binary frames [MQTT-6.0.0-1])",
                )
                return False
            case CloseConnection(code=code, reason=reason):
                self._feed(payload)
                state = self._ws.state
                if state is ConnectionState.REMOTE_CLOSING:
                    log.debug("client %s: closed its WebSocket (%d %s)", self.peer, code, reason)
                    self._send(event.response())
                    self._close()
                elif state is ConnectionState.CLOSED:
                    self._close()  # its answer to our Close (`_Frames.write_eof`)
                else:  # a frame wsproto could not parse: it says why
                    self._fail(code, f"a broken WebSocket frame ({reason})")
                return False
            case _:  # Pong, and nothing else comes to a server after its handshake
                return True

    def _read_frames(self, data: bytes, payload: list[bytes]) -> bytes:
        """Unmask the complete binary frames at the start of `data` into
        `payload` and keep a last one begun; return the rest from the first
        frame that wsproto must read (b"" when there is none)."""
        if self._partial:
            data = self._partial + data
            self._partial = b""
        limit = self._limit
        end = len(data)
        i = 0
        while i < end:
            if data[i] != BINARY_FIN:
                return data[i:]
            if end - i < 2:
                break
            second = data[i + 1]
            n = second & 0x7F
            if not second & MASKED or n == 127:
                return data[i:]
            if n == 126:
                if end - i < 4:
                    break
                n = data[i + 2] << 8 | data[i + 3]
                if n < 126:  # wsproto refuses a length longer than it need be
                    return data[i:]
                start = i + 8
            else:
                start = i + 6
            if n > limit:  # wsproto counts it and closes (1009)
                return data[i:]
            stop = start + n
            if stop > end:
                break
            if n:
                payload.append(unmask(data, start, stop, data[start - 4 : start]))
            i = stop
        if i < end:
            self._partial = data[i:]
        return b""

    def _feed(self, payload: list[bytes]) -> None:
        """Hand the MQTT connection the payloads collected (all a read's, or
        those that came before an event that closes)."""
        if payload and self._inner is not None:
            self._inner.data_received(b"".join(payload))
        payload.clear()

    def _request(self, request: Request) -> None:
        """The opening handshake: accept it, or refuse it saying why."""
        listener = self._listener
        path = request.target.partition("?")[0]
        if path != listener.path:
            self._refuse(404, f"asked for {path!r}; MQTT over WebSockets is at {listener.path!r}")
            return
        origin = _header(request, b"origin")
        if (
            listener.allowed_origins
            and origin is not None
            and origin.lower() not in listener.allowed_origins
        ):
            self._refuse(403, f"origin {origin!r} is not in listeners.ws.allowed_origins")
            return
        if SUBPROTOCOL not in request.subprotocols:
            offered = ", ".join(request.subprotocols) or "none"
            self._refuse(
                400,
                f"offered the WebSocket subprotocols {offered}, not {SUBPROTOCOL!r} [MQTT-6.0.0-4]",
            )
            return
        self._send(AcceptConnection(subprotocol=SUBPROTOCOL))
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        transport = self._transport
        assert transport is not None
        self._frames = _Frames(self._ws, transport)
        self._inner = self._make()
        self._inner.connection_made(self._frames)

    # --- closing -------------------------------------------------------------------------
    def _refuse(self, status: int, why: str) -> None:
        """Answer the handshake with HTTP `status` and `why`, then close."""
        log.info("client %s: WebSocket handshake refused (%d): %s", self.peer, status, why)
        body = f"{why}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        try:
            self._send(RejectConnection(status_code=status, headers=headers, has_body=True))
            self._send(RejectData(data=body))
        except LocalProtocolError:
            pass  # the HTTP exchange is beyond answering: just close
        self._close()

    def _fail(self, code: int, why: str) -> None:
        """Close the WebSocket with `code` for what the client sent."""
        log.info("client %s: closing its WebSocket (%d): %s", self.peer, code, why)
        self._send(CloseConnection(code=code, reason=why[:100]))
        self._close()

    def _handshake_timeout(self) -> None:
        self._deadline = None
        if not self._closing:
            log.info("client %s: no WebSocket handshake within %ss", self.peer, HANDSHAKE_TIMEOUT)
            self._close()

    def _send(self, event: Event) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            data = self._ws.send(event)
        except LocalProtocolError:
            return  # e.g. a Close frame when one has been sent already
        transport.write(data)

    def _close(self) -> None:
        """Close the socket after what is written; the MQTT connection, if
        any, learns it from `connection_lost`."""
        self._closing = True
        if self._frames is not None:
            self._frames.closing = True
        if self._transport is not None:
            self._transport.close()


def _wsproto_idle(ws: WSConnection) -> bool:
    """Whether wsproto is between frames and messages, holding no bytes: the
    next frame may be read without it. False if its internals are not the
    ones known (tests/mqtt/test_websocket.py checks that they are)."""
    try:
        proto: Any = getattr(ws.connection, "_proto")  # noqa: B009 - not typed: private
        frames = proto._frame_decoder
        return bool(
            frames.header is None
            and not len(frames.buffer)
            and proto._message_decoder.opcode is None
        )
    except AttributeError:
        return False


def _header(request: Request, name: bytes) -> str | None:
    for key, value in request.extra_headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class _Frames(asyncio.Transport):
    """The transport the MQTT connection of a WebSocket client writes to: each
    write goes out as one binary frame [MQTT-6.0.0-1]; closing sends a Close
    frame first. The rest is the socket's own: reading paused and resumed,
    write buffer limits and size, and the extra info. The socket itself
    (`get_extra_info("socket")`) is the TCP connection the frames travel on,
    so the connection's TCP_QUICKACK works on it as it does for any client."""

    __slots__ = ("_transport", "_ws", "closing")

    def __init__(self, ws: WSConnection, transport: asyncio.Transport) -> None:
        super().__init__()
        self._ws = ws
        self._transport = transport
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or self._transport.is_closing():
            return
        if self._ws.state is not ConnectionState.OPEN:
            return  # the WebSocket is closing (a Close frame went one way or the other)
        self._transport.write(frame(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        transport = self._transport
        if not transport.is_closing() and self._ws.state is ConnectionState.OPEN:
            transport.write(self._ws.send(CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
        transport.close()

    def abort(self) -> None:
        self.closing = True
        self._transport.abort()

    def is_closing(self) -> bool:
        return self.closing or self._transport.is_closing()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()  # over plain TCP (TLS closes its own way)

    def write_eof(self) -> None:
        """The end of what the MQTT connection writes: a Close frame (1000),
        then the socket's FIN. The socket stays open until the client answers
        with its Close (`WebSocket._event`) or closes its end, or the
        connection closes it (`close`)."""
        transport = self._transport
        if self.closing or transport.is_closing():
            return
        # Past the Close frame, `write` writes nothing (the state is no longer OPEN).
        if self._ws.state is ConnectionState.OPEN:
            transport.write(self._ws.send(CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
        transport.write_eof()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)
