"""Bearer tokens: `riverbed token ...`, and what a served API lets each token do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from harness.admin_api import AdminApi
from harness.broker import BrokerProcess
from harness.net import free_port
from harness.waiting import eventually
from riverbed.cli import cli
from riverbed.http.auth import load_token_file


def token(*args: str) -> Result:
    return CliRunner().invoke(cli, ["token", *args], catch_exceptions=False)


def add(file: Path, name: str, role: str) -> str:
    added = token("add", str(file), name, "--role", role)
    assert added.exit_code == 0, added.output
    return added.stdout.strip()


def test_add_prints_the_token_once_and_keeps_only_a_hash(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    secret = add(file, "ci", "admin")
    assert secret.startswith("ci.")
    stored = file.read_text()
    assert secret not in stored and secret.partition(".")[2] not in stored
    assert stored.startswith("ci:admin:$scrypt$")
    assert oct(file.stat().st_mode & 0o777) == "0o600"
    assert load_token_file(file)["ci"].hashed.verify(secret.encode())


def test_list_and_revoke(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    add(file, "ci", "admin")
    add(file, "grafana", "read")
    listed = token("list", str(file), "--json")
    assert '"name": "grafana"' in listed.output and '"role": "read"' in listed.output
    assert token("revoke", str(file), "ci").exit_code == 0
    assert list(load_token_file(file)) == ["grafana"]
    missing = token("revoke", str(file), "ci")
    assert missing.exit_code == 1
    assert "'ci' is not in token file" in missing.output


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("bad name", "--role", "read"), 2, "letters, digits"),
        (("ok", "--role", "root"), 2, "'root' is not one of"),
    ],
)
def test_bad_token_input_changes_nothing(
    tmp_path: Path, args: tuple[str, ...], code: int, words: str
) -> None:
    file = tmp_path / "tokens"
    add(file, "ci", "admin")
    before = file.read_bytes()
    refused = token("add", str(file), *args)
    assert refused.exit_code == code
    assert words in refused.output
    assert file.read_bytes() == before


def test_a_name_already_there_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    add(file, "ci", "admin")
    before = file.read_bytes()
    again = token("add", str(file), "ci", "--role", "read")
    assert again.exit_code == 1
    assert "already" in again.output
    assert file.read_bytes() == before


# --------------------------------------------------------------------- served


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[Path, str, str]:
    file = tmp_path / "tokens"
    return file, add(file, "ops", "admin"), add(file, "dash", "read")


@pytest.fixture
def guarded(sqlite_url: str, tokens: tuple[Path, str, str]) -> Iterator[httpx.Client]:
    file = tokens[0]
    with (
        BrokerProcess(sqlite_url, http=True, extra_args=("--token-file", str(file))) as broker,
        httpx.Client(base_url=broker.http_url, timeout=30) as client,
    ):
        yield client


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


TOPIC = {"name": "orders", "partitions": 1}


def test_requests_without_or_with_a_wrong_token_are_401(
    guarded: httpx.Client, tokens: tuple[Path, str, str]
) -> None:
    _, admin, _ = tokens
    for headers in ({}, bearer("ops.wrong"), bearer("nobody.x"), {"Authorization": admin}):
        refused = guarded.get("/api/v1/topics", headers=headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert "token" in refused.json()["error"]
        assert refused.headers["www-authenticate"] == "Bearer"
    assert guarded.post("/api/v1/topics", json=TOPIC).status_code == 401
    assert guarded.get("/metrics").status_code == 401
    # Health needs no token.
    assert guarded.get("/healthz").status_code == 200
    assert guarded.get("/readyz").status_code == 200


def test_a_read_token_reads_but_may_not_write(
    guarded: httpx.Client, tokens: tuple[Path, str, str]
) -> None:
    _, admin, read = tokens
    assert guarded.get("/api/v1/topics", headers=bearer(read)).status_code == 200
    refused = guarded.post("/api/v1/topics", json=TOPIC, headers=bearer(read))
    assert refused.status_code == 403
    assert "read role" in refused.json()["error"]
    assert guarded.get("/api/v1/topics/orders", headers=bearer(read)).status_code == 404
    created = guarded.post("/api/v1/topics", json=TOPIC, headers=bearer(admin))
    assert created.status_code == 201, created.text
    assert guarded.get("/api/v1/topics/orders", headers=bearer(read)).status_code == 200


def test_a_revoked_token_is_refused_from_its_next_request(
    guarded: httpx.Client, tokens: tuple[Path, str, str]
) -> None:
    file, _, read = tokens
    assert guarded.get("/api/v1/node", headers=bearer(read)).status_code == 200
    assert token("revoke", str(file), "dash").exit_code == 0
    eventually(
        lambda: guarded.get("/api/v1/node", headers=bearer(read)).status_code == 401,
        what="the revoked token refused",
    )


# --------------------------------------------------------------------- binding


def run_riverbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("command", ["serve", "admin"])
def test_a_non_loopback_address_without_tokens_is_refused(sqlite_url: str, command: str) -> None:
    extra = ("--allow-anonymous",) if command == "serve" else ()
    port = free_port()
    done = run_riverbed(command, "--http", f"0.0.0.0:{port}", "--db", sqlite_url, *extra)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "is not a loopback address" in lines[0] and "http.token_file" in lines[0]
    assert "Traceback" not in done.stderr


def test_an_http_address_in_use_is_refused_and_nothing_runs(sqlite_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_riverbed(
            "serve", "--allow-anonymous", "--mqtt", f"127.0.0.1:{free_port()}",
            "--http", f"127.0.0.1:{port}", "--db", sqlite_url,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"error: cannot listen for HTTP on 127.0.0.1:{port}: address already in use" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_admin_serves_the_api_without_mqtt(sqlite_url: str, tmp_path: Path) -> None:
    made = CliRunner().invoke(
        cli, ["topic", "create", "orders", "--partitions", "2", "--db", sqlite_url]
    )
    assert made.exit_code == 0, made.output
    with AdminApi(sqlite_url) as admin, admin.client() as api:
        assert api.get("/readyz").status_code == 200
        assert "orders" in [t["name"] for t in api.get("/api/v1/topics").json()]
        posted = api.post("/api/v1/topics/orders/messages", json={"payload": "x", "key": "a"})
        assert posted.status_code == 201, posted.text
        assert api.get("/api/v1/clients").json() == []
