"""MQTT client routes of the admin API (a broker in this process only).

    GET    /api/v1/clients               the clients connected to this node
    DELETE /api/v1/clients/{client_id}   disconnect one (MQTT 5: 0x98); its session stays

Under `riverbed admin` (no broker) the list is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from riverbed.http.context import HttpContext
from riverbed.http.errors import ApiError

if TYPE_CHECKING:
    from riverbed.mqtt.connection import Connection

MQTT5 = 5


def routes(context: HttpContext) -> APIRouter:
    """The client routes over `context.broker` (the module docstring)."""
    api = APIRouter()

    @api.get("/clients", tags=["clients"])
    async def list_clients() -> list[dict[str, Any]]:
        """The MQTT clients connected to this node (none under `riverbed admin`)."""
        broker = context.broker
        if broker is None:
            return []
        return [_client_view(client_id, conn) for client_id, conn in broker.connections.items()]

    @api.delete("/clients/{client_id}", tags=["clients"])
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


def _client_view(client_id: str, connection: Connection) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "peer": connection.peer,
        "username": connection.username,
        "protocol": "5" if connection.level == MQTT5 else "3.1.1",
        "keep_alive": connection.keep_alive,
        "session_expiry": connection.expiry,
    }
