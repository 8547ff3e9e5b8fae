"""MQTT client routes of the admin API (a broker in this process only).

    GET    /api/v1/clients[?q=TEXT]      the clients connected to this node
    DELETE /api/v1/clients/{client_id}   disconnect one (MQTT 5: 0x98); its session stays

`q` keeps the clients whose id, username or peer address contains it (case
ignored). Under `riverbed admin` (no broker) the list is empty. Read from the
broker's memory (no storage query), on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from riverbed.http.context import HttpContext
from riverbed.http.errors import ApiError
from riverbed.log.jsonlines import format_time

if TYPE_CHECKING:
    from riverbed.mqtt.connection import Connection

MQTT5 = 5


def routes(context: HttpContext) -> APIRouter:
    """The client routes over `context.broker` (the module docstring)."""
    api = APIRouter()

    @api.get("/clients", tags=["clients"])
    async def list_clients(q: str | None = None) -> list[dict[str, Any]]:
        """The MQTT clients connected to this node (none under `riverbed admin`);
        `q`: only those whose client id, username or peer contains it."""
        broker = context.broker
        if broker is None:
            return []
        views = [
            _client_view(client_id, conn, context.node)
            for client_id, conn in broker.connections.items()
        ]
        if q:
            wanted = q.casefold()
            views = [
                v
                for v in views
                if any(wanted in (v[k] or "").casefold() for k in ("client_id", "username", "peer"))
            ]
        return views

    @api.delete(
        "/clients/{client_id}",
        tags=["clients"],
        responses={404: {"description": "not connected here"}},
    )
    async def disconnect_client(client_id: str) -> dict[str, Any]:
        """Disconnect one client (MQTT 5: DISCONNECT 0x98 Administrative action);
        its session stays."""
        from riverbed.mqtt.codec import DisconnectReason

        broker = context.broker
        connection = None if broker is None else broker.connections.get(client_id)
        if connection is None:
            raise ApiError(404, f"client {client_id!r} is not connected to this node")
        connection.close(DisconnectReason.ADMINISTRATIVE_ACTION)
        return {"client_id": client_id, "disconnected": True}

    return api


def _client_view(client_id: str, connection: Connection, node: str) -> dict[str, Any]:
    session = connection.session
    connected = connection.connected_us
    return {
        "client_id": client_id,
        "peer": connection.peer,
        "username": connection.username,
        "protocol": "5" if connection.level == MQTT5 else "3.1.1",
        "keep_alive": connection.keep_alive,
        "session_expiry": connection.expiry,
        # QoS 1 and 2 messages sent and not yet acknowledged (completed, for QoS 2).
        "in_flight": 0 if session is None else session.inflight,
        "connected_since": None if connected is None else format_time(connected),
        "node": node,
    }
