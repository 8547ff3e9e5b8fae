"""Who a request is: the bearer token checked against the token file.

    authorized = [Depends(authorizer(context.tokens))]
    api = APIRouter(prefix=API, dependencies=authorized)

No token file: every request is an admin's (the listener then binds to
loopback only). A read token may only GET (and HEAD, OPTIONS).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request

from riverbed.http.auth import Role, TokenFile
from riverbed.http.errors import ApiError

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def authorizer(tokens: TokenFile | None) -> Callable[[Request], Any]:
    """A FastAPI dependency answering 401/403, or the request's `Role`."""

    async def authorize(request: Request) -> Role:
        if tokens is None:
            return Role.ADMIN
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "no bearer token: send Authorization: Bearer TOKEN")
        # scrypt on a worker thread: the loop serves MQTT meanwhile.
        entry = await asyncio.to_thread(tokens.check, token.strip())
        if entry is None:
            raise ApiError(401, "the bearer token is not valid (unknown, revoked or mistyped)")
        if entry.role is Role.READ and request.method not in READ_METHODS:
            raise ApiError(
                403, f"token {entry.name!r} has the read role: {request.method} needs admin"
            )
        return entry.role

    return authorize
