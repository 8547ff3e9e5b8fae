"""The admin HTTP API as a FastAPI app: `make_app(context)`.

    app = make_app(HttpContext(log, node="n1", settings=config_view(config)))

Routes (docs/http.md):

- `GET /healthz`: 200 while the process answers; `GET /readyz`: 200 once the
  listeners are bound and the store answers within `READY_DEADLINE`, else 503
  with the reason. Neither needs a token.
- `GET /metrics`: the broker's Prometheus text (`riverbed.metrics`), for a read token.
- `/api/v1/...`: the node here; topics (`topics`), named subscriptions
  (`subscriptions`), their dead-letter queues (`dlq`), the jobs long
  operations run as (`jobs`), connected MQTT clients (`clients`), stored
  sessions (`sessions`), retained messages (`retained`), shared subscription
  groups (`groups`), broker nodes (`nodes`) and the dashboard's numbers
  (`stats`) in their modules.
  The OpenAPI document is `/api/v1/openapi.json`.
- `GET /` and `/static/...`: the web dashboard (`dashboard`), which calls the
  API from the browser; loading the page needs no token.

Handlers call what the command line calls, never their own copy. Handlers that
touch the store are plain functions, which FastAPI runs on its worker threads:
the event loop they share with the MQTT broker never waits for the database.
Errors are JSON (`errors`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from riverbed.errors import RiverbedError
from riverbed.http import (
    clients,
    dashboard,
    dlq,
    groups,
    jobs,
    nodes,
    retained,
    sessions,
    stats,
    subscriptions,
    topics,
)
from riverbed.http.bearer import authorizer
from riverbed.http.context import HttpContext, version
from riverbed.http.errors import error_response, install_error_handlers
from riverbed.log.jsonlines import format_time
from riverbed.metrics import CONTENT_TYPE

API = "/api/v1"
READY_DEADLINE = 2.0
"""Seconds the store has to answer for `/readyz` to say ready."""


def make_app(context: HttpContext) -> FastAPI:
    """The admin API over `context` (routes: the module docstring)."""
    app = FastAPI(
        title="Riverbed admin API",
        version=version(),
        openapi_url=f"{API}/openapi.json",
        docs_url=f"{API}/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    log = context.log
    authorized = [Depends(authorizer(context.tokens))]

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """200 while the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """200 once the listeners are bound and the store answers in time."""
        if not context.listening():
            return error_response(
                503, "not ready: the listeners are not bound yet", status="starting"
            )
        try:
            await asyncio.wait_for(asyncio.to_thread(log.storage.list_topics), READY_DEADLINE)
        except TimeoutError:
            return error_response(
                503,
                f"not ready: the store did not answer within {READY_DEADLINE:g} s",
                status="storage",
            )
        except RiverbedError as exc:
            return error_response(503, f"not ready: the store fails: {exc}", status="storage")
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"], dependencies=authorized)
    def metrics() -> Response:
        """Prometheus text exposition of the node's metrics (`riverbed.metrics`)."""
        broker = context.broker
        counted = None if broker is None else broker.metrics
        if counted is None:
            return PlainTextResponse(
                "no metrics here: no broker in this process, or [metrics] enabled = false\n",
                status_code=404,
            )
        return Response(counted.render(), media_type=CONTENT_TYPE)

    api = APIRouter(prefix=API, dependencies=authorized)

    @api.get("/node", tags=["node"])
    def node() -> dict[str, Any]:
        """Version, node id, uptime and the configuration in force (no secrets)."""
        return {
            "version": version(),
            "node": context.node,
            "started": format_time(int(context.started * 1_000_000)),
            "uptime_seconds": round(time.time() - context.started, 3),
            "config": context.settings,
        }

    modules = (topics, subscriptions, dlq, jobs, clients, sessions, retained, groups, nodes, stats)
    for module in modules:
        api.include_router(module.routes(context))
    app.include_router(api)
    dashboard.install(app)
    return app
