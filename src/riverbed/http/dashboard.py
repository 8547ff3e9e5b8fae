"""The web dashboard: one page at `/` and its files under `/static` (docs/dashboard.md).

    GET /                  the page (no token needed to load it)
    GET /static/{path}     its script and styles, and the vendored uPlot

The page is plain files (`static/index.html`, `dashboard.js`, `dashboard.css`)
that call the API under `/api/v1` from the browser with the token it asks for,
so nothing here reads the store or needs a token: loading the page tells no
one anything. Third-party files live in `static/vendor/NAME-VERSION/`, copied
from npm by `make dashboard-assets` with their licence; a new version is a new
path, so they may be cached for a year. Our own files are revalidated on every
load (ETag / Last-Modified) so an upgrade shows at once.

Every answer here forbids scripts and styles from anywhere but this server,
inline ones included (`Content-Security-Policy: default-src 'self'`): the page
shows names that MQTT clients chose (client ids, topics), and a name that
smuggled markup in could run nothing even if it slipped past the page's
escaping.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"
"""The page's files, shipped in the package (the wheel includes them)."""

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
VENDOR_CACHE = "public, max-age=31536000, immutable"
"""Vendor files: their path names their version, so a year is safe."""
OWN_CACHE = "no-cache"
"""Our own files: kept, but checked with the server on each load."""


class _DashboardFiles(StaticFiles):
    """Static files with the security headers and the cache rule of their path."""

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(SECURITY_HEADERS)
        vendored = Path(full_path).parent.parent.name == "vendor"
        response.headers["Cache-Control"] = VENDOR_CACHE if vendored else OWN_CACHE
        return response


def install(app: FastAPI) -> None:
    """Serve the dashboard on `app`: `/` and `/static` (beside `/api/v1`, not in it)."""

    @app.get("/", tags=["dashboard"], include_in_schema=False)
    async def page() -> FileResponse:
        """The dashboard page."""
        return FileResponse(
            STATIC / "index.html",
            media_type="text/html; charset=utf-8",
            headers=SECURITY_HEADERS | {"Cache-Control": OWN_CACHE},
        )

    app.mount("/static", _DashboardFiles(directory=STATIC), name="static")
