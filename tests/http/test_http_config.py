"""`[http]` in the configuration file, and HTTPS with its certificate and key."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.net import free_port, wait_listening
from riverbed.errors import InvalidConfig
from riverbed.mqtt.config import Address, HttpConfig, load_config

BASE = "[auth]\nallow_anonymous = true\n[http]\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "riverbed.toml"
    path.write_text(BASE + text)
    return path


def test_off_unless_an_address_is_set(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).http.address is None
    loaded = load_config(write(tmp_path, 'address = "127.0.0.1:8080"\n'))
    assert loaded.http.address == Address("127.0.0.1", 8080)


def test_token_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("")
    loaded = load_config(write(tmp_path, 'address = "0.0.0.0:8080"\ntoken_file = "tokens"\n'))
    assert loaded.http.token_file == tmp_path / "tokens"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('address = "0.0.0.0:8080"\n', "not a loopback address and no http.token_file"),
        ('address = "[::]:8080"\n', "not a loopback address"),
        ('address = "localhost:8080"\ntoken_file = "missing"\n', "no such file"),
        ('address = "127.0.0.1:99999"\n', "0..65535"),
        ('adress = "127.0.0.1:8080"\n', "did you mean http.address"),
    ],
)
def test_bad_http_settings_are_refused(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(InvalidConfig, match=words):
        load_config(write(tmp_path, text))


def test_https_needs_both_files(tmp_path: Path) -> None:
    cert = tmp_path / "server.pem"
    cert.write_text("")
    with pytest.raises(InvalidConfig, match=r"http\.certfile given but http\.keyfile missing"):
        HttpConfig(address=Address("127.0.0.1", 1), certfile=cert)


def test_admin_serves_https_with_a_certificate(sqlite_url: str, tmp_path: Path) -> None:
    key, cert = tmp_path / "server.key", tmp_path / "server.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "riverbed.cli",
            "topic",
            "create",
            "t",
            "--partitions",
            "1",
            "--db",
            sqlite_url,
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    log = tmp_path / "admin.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "riverbed.cli",
                "admin",
                "--http",
                f"127.0.0.1:{port}",
                "--certfile",
                str(cert),
                "--keyfile",
                str(key),
                "--db",
                sqlite_url,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(process, port, 60, "riverbed admin", log.read_text, process.kill)
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trusted) as api:
            assert api.get("/readyz").status_code == 200
            assert [t["name"] for t in api.get("/api/v1/topics").json()] == ["mqtt", "t"]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    finally:
        process.terminate()
        code = process.wait(60)
    assert code == 0, log.read_text()
