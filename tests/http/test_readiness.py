"""`/readyz` says why it is not ready: the app in-process over a real database."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from riverbed.http.app import make_app
from riverbed.http.context import HttpContext
from riverbed.log.log import Log


def get(context: HttpContext, path: str) -> httpx.Response:
    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=make_app(context))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.get(path)

    return asyncio.run(request())


def test_not_ready_until_the_listeners_are_bound(sqlite_url: str) -> None:
    bound = False
    with Log.open(sqlite_url) as log:
        context = HttpContext(log, "n1", {}, listening=lambda: bound)
        waiting = get(context, "/readyz")
        assert waiting.status_code == 503
        assert waiting.json()["status"] == "starting"
        assert get(context, "/healthz").status_code == 200
        bound = True
        assert get(context, "/readyz").status_code == 200


def test_not_ready_when_the_store_fails(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gone.db"
    with Log.open(url) as log:
        context = HttpContext(log, "n1", {})
        assert get(context, "/readyz").status_code == 200
        log.storage.close()
        for name in ("gone.db", "gone.db-wal", "gone.db-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        (tmp_path / "gone.db").mkdir()  # where the database was, something no store opens
        failing = get(context, "/readyz")
        assert failing.status_code == 503, failing.text
        assert failing.json()["status"] == "storage"
        assert "store" in failing.json()["error"]
