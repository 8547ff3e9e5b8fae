"""`riverbed worker --metrics`: a real worker process (and its children) serving
`riverbed_worker_messages_total{subscription,outcome}` over HTTP, scraped and
parsed as Prometheus would, after a handler that fails some messages; a bad
`--metrics` value or an address in use is refused before anything is consumed."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.cli import rb
from harness.waiting import eventually
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage
from riverbed.subscriptions import Subscriptions

HANDLERS = """
def judge(batch):
    for m in batch.messages:
        text = m.payload.decode()
        if text.startswith("bad") or (text.startswith("flaky") and batch.attempt == 1):
            raise RuntimeError("refusing " + text)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "rb_metrics_handlers.py").write_text(HANDLERS)
    return tmp_path


def _fill(url: str, payloads: list[str]) -> None:
    with Log.open(url) as log:
        log.topics.create("t", 2)
        Subscriptions(log.storage).create("s", "t")
        log.produce("t", [Message(p.encode(), key=p) for p in payloads])


def _lag(url: str) -> int:
    storage = open_storage(url)
    try:
        return sum(s.lag for s in Subscriptions(storage).lag("s"))
    finally:
        storage.close()


def _outcomes(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "riverbed_worker_messages"
        for s in family.samples
        if s.labels.get("subscription") == "s"
    }


@pytest.fixture
def worker(project: Path, sqlite_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize(
    ("payloads", "args", "expected"),
    [
        pytest.param(
            [*(f"good-{i}" for i in range(10)), *(f"bad-{i}" for i in range(3))],
            ("--on-error", "skip", "--processes", "2"),
            {"delivered": 10, "retried": 0, "parked": 3},
            id="skip-in-two-processes",
        ),
        pytest.param(
            [*(f"good-{i}" for i in range(5)), *(f"flaky-{i}" for i in range(2))],
            ("--on-error", "retry"),
            {"delivered": 7, "retried": 2, "parked": 0},
            id="retry",
        ),
    ],
)
def test_worker_metrics_count_delivered_retried_parked(
    project: Path,
    sqlite_url: str,
    worker: list[subprocess.Popen[bytes]],
    payloads: list[str],
    args: tuple[str, ...],
    expected: dict[str, int],
) -> None:
    _fill(sqlite_url, payloads)
    err = project / "worker.err"
    with err.open("wb") as out:
        worker.append(
            subprocess.Popen(
                [sys.executable, "-m", "riverbed.cli", "worker", "s",
                 "--handler", "rb_metrics_handlers:judge", "--db", sqlite_url,
                 "--batch-size", "1", "--poll-interval", "0.1", "--metrics", "127.0.0.1:0",
                 *args],
                cwd=project,
                env=dict(os.environ),
                stderr=out,
            )
        )  # fmt: skip
    found = eventually(
        lambda: re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", err.read_text()),
        what="the worker to say where its metrics are",
        explain=err.read_text,
    )
    base = found.group(1)
    eventually(
        lambda: _lag(sqlite_url) == 0 and _outcomes(base) == expected,
        60,
        what=f"the counts {expected}",
        explain=lambda: (_outcomes(base), _lag(sqlite_url), err.read_text()),
    )
    worker[0].send_signal(signal.SIGTERM)
    assert worker[0].wait(30) == 0, err.read_text()


def test_a_bad_metrics_address_is_refused_naming_the_rule(project: Path, sqlite_url: str) -> None:
    _fill(sqlite_url, ["good-0"])
    done = rb(
        sqlite_url, "worker", "s", "--handler", "rb_metrics_handlers:judge",
        "--metrics", "localhost:http",
    )  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "'--metrics'" in done.output
    assert "the port 'http' is not a number 0..65535" in done.output
    assert _lag(sqlite_url) == 1  # nothing consumed


def test_a_metrics_address_in_use_is_refused_before_consuming(
    project: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(sqlite_url, ["good-0"])
    monkeypatch.chdir(project)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = rb(
            sqlite_url, "worker", "s", "--handler", "rb_metrics_handlers:judge",
            "--metrics", str(port),
        )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert f"cannot serve metrics on 127.0.0.1:{port}: address already in use" in done.output
    assert "Traceback" not in done.output
    assert _lag(sqlite_url) == 1
