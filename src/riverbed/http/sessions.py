"""MQTT session routes of the admin API: the stored sessions, offline ones too.

    GET    /api/v1/sessions[?online=BOOL][&q=TEXT]  every session record
    GET    /api/v1/sessions/{client_id}             one, with its subscriptions and backlog
    DELETE /api/v1/sessions/{client_id}             forget it (a client connected here is
                                                    disconnected first, 0x98)

Read through the sessions layer (`SessionStore`): a session is online while a
connection holds it, i.e. its record is marked connected on a broker node
whose liveness lease runs; `node` names that node. A session that ends with
its connection, which the broker beside the API keeps in memory until it has
something to store (`Broker.defers_ephemeral`), is shown from there, online.
The backlog is what its cursors have not passed (`SessionStore.backlog`): a
few queries per topic, so only for one session (null in the list).

Deleting: a client connected to this node is disconnected first (MQTT 5:
DISCONNECT 0x98 Administrative action), under the client id's lock so that
it cannot connect again in between, and its session is deleted once its
connection has saved it; a pending Will then goes at once, as when a session
ends [MQTT-3.1.3-9]. One connected to another running node is refused (409):
this node cannot close that connection, and deleting the record under it
would have the two disagree.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from riverbed.clock import now_us
from riverbed.errors import NotFound, PreconditionFailed
from riverbed.http.context import HttpContext
from riverbed.http.errors import ApiError
from riverbed.log.jsonlines import format_time
from riverbed.sessions.store import NEVER_EXPIRES, SessionRecord, SessionStore

MQTT5 = 5
DELETE_ATTEMPTS = 5
"""Times a delete reads the record again when it changed under it."""


def _view(store: SessionStore, record: SessionRecord, live: set[str]) -> dict[str, Any]:
    online = store.online(record, live)
    expires = None if online else record.expires_us()
    expiry = record.expiry_interval
    return {
        "client_id": record.client_id,
        "online": online,
        "node": record.node if online else None,
        "protocol": "5" if record.protocol_level == MQTT5 else "3.1.1",
        "expiry_seconds": None if expiry == NEVER_EXPIRES else expiry,
        "expires_at": None if expires is None else format_time(expires),
        "disconnected_at": None
        if online or record.disconnected_us is None
        else format_time(record.disconnected_us),
        "subscriptions": len(record.subscriptions),
        "backlog": None,
    }


def _unwritten(context: HttpContext) -> dict[str, SessionRecord]:
    """Sessions the broker beside the API holds in memory, not stored yet (they
    end with their connection: `Broker.defers_ephemeral`), by client id."""
    broker = context.broker
    return {} if broker is None else broker.unwritten_records()


def _live_nodes(store: SessionStore, at_us: int) -> set[str]:
    return {node for node, lease in store.node_leases().items() if not lease.expired(at_us)}


def routes(context: HttpContext) -> APIRouter:
    """The session routes over `context.log` and `context.broker` (the module docstring)."""
    store = SessionStore(context.log.storage)
    api = APIRouter()

    @api.get("/sessions", tags=["sessions"])
    def list_sessions(online: bool | None = None, q: str | None = None) -> list[dict[str, Any]]:
        """Every stored session, online or not (`online`: only those; `q`: only
        client ids containing it, case ignored), without backlogs."""
        live = _live_nodes(store, now_us())
        wanted = None if not q else q.casefold()
        records = [stored.record for stored in store.all()]
        unwritten = _unwritten(context)
        if unwritten:
            stored_ids = {r.client_id for r in records}
            records += [r for c, r in unwritten.items() if c not in stored_ids]
        views = [
            _view(store, record, live)
            for record in records
            if wanted is None or wanted in record.client_id.casefold()
        ]
        if online is not None:
            views = [v for v in views if v["online"] is online]
        return sorted(views, key=lambda v: str(v["client_id"]))

    @api.get("/sessions/{client_id}", tags=["sessions"], responses={404: {"description": "none"}})
    def get_session(client_id: str) -> dict[str, Any]:
        """One session with its subscriptions and its backlog (the messages its
        cursors have not passed; `backlog_exact` false: an upper bound)."""
        stored = store.load(client_id)
        record = stored.record if stored is not None else _unwritten(context).get(client_id)
        if record is None:
            raise NotFound(f"client {client_id!r} has no session")
        backlog = store.backlog(record)
        return _view(store, record, _live_nodes(store, now_us())) | {
            "session_id": record.session_id,
            "subscriptions": [
                {
                    "filter": s.topic_filter,
                    "qos": s.qos,
                    "no_local": s.no_local,
                    "retain_as_published": s.retain_as_published,
                    "retain_handling": s.retain_handling,
                    "identifier": s.identifier,
                }
                for s in record.subscriptions
            ],
            "topics": list(record.topics),
            "backlog": backlog.messages,
            "backlog_exact": backlog.exact,
        }

    def delete_stored(client_id: str, was_connected: bool) -> None:
        for _attempt in range(DELETE_ATTEMPTS):
            stored = store.load(client_id)
            if stored is None:
                if was_connected:
                    return  # it ended with its connection (expiry 0) or expired
                raise NotFound(f"client {client_id!r} has no session")
            record = stored.record
            if store.held_elsewhere(record, context.node, now_us()):
                raise ApiError(
                    409,
                    f"client {client_id!r} is connected to node {record.node}: disconnect it"
                    " there first (DELETE /api/v1/clients/CLIENT_ID on that node's API)",
                )
            try:
                store.discard(stored)
            except PreconditionFailed:
                continue  # written meanwhile (a checkpoint, an expiry): read again
            return
        raise ApiError(409, f"the session of {client_id!r} kept changing; try again")

    @api.delete(
        "/sessions/{client_id}",
        tags=["sessions"],
        responses={404: {"description": "none"}, 409: {"description": "connected elsewhere"}},
    )
    async def delete_session(client_id: str) -> dict[str, Any]:
        """Delete a session with its cursors; a client connected here is
        disconnected first (MQTT 5: 0x98), one connected to another node is 409."""
        from riverbed.mqtt.codec import DisconnectReason

        broker = context.broker
        if broker is None:
            await asyncio.to_thread(delete_stored, client_id, False)
        else:
            async with broker.client_lock(client_id):
                connection = broker.connections.get(client_id)
                if connection is not None:
                    connection.close(DisconnectReason.ADMINISTRATIVE_ACTION)
                    await connection.done.wait()  # its session saved
                await asyncio.to_thread(delete_stored, client_id, connection is not None)
            broker.wills.fire_now(client_id)
        return {"client_id": client_id, "deleted": True}

    return api
