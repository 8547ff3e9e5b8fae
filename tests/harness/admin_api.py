"""`riverbed admin` in a subprocess: the admin HTTP API alone over a database,
for tests of the API over real HTTP (no MQTT listener to wait for).

    with AdminApi(db_url) as admin, admin.client() as api:
        api.get("/api/v1/topics")
    with AdminApi(db_url, token_file=path) as admin, admin.client(token) as api:
        ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

import httpx

from harness.net import free_port, wait_listening
from harness.waiting import SLOW
from riverbed.storage import open_storage

START_TIMEOUT = 60.0 * SLOW


class AdminApi:
    """`riverbed admin --http 127.0.0.1:PORT --db URL [--token-file FILE]`."""

    def __init__(self, db_url: str, *, token_file: Path | None = None) -> None:
        self.db_url = db_url
        self.token_file = token_file
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="riverbed-admin-"))
        self.log_path = self._dir / "admin.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Create the database if there is none (`riverbed admin` never does), then
        start and wait until it listens."""
        open_storage(self.db_url, create=True).close()
        args = [sys.executable, "-m", "riverbed.cli", "admin"]
        args += ["--http", f"127.0.0.1:{self.port}", "--db", self.db_url]
        if self.token_file is not None:
            args += ["--token-file", str(self.token_file)]
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        wait_listening(
            self.process, self.port, START_TIMEOUT, "riverbed admin", self.tail, self.kill
        )

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self) -> int:
        """SIGTERM, and its exit code (SIGKILL if it does not stop in time)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(45 * SLOW)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def __enter__(self) -> AdminApi:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        code = self.stop()
        if exc_type is None:
            assert code == 0, f"riverbed admin exited with {code}:\n{self.tail()}"
