"""The broker's own log (`riverbed serve --log-level`, `[log] level` and
`format`): no line per client at the default info level, one for each client
connecting and leaving at debug, JSON lines on request. A real broker process
and a paho client."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest

from harness.broker import BrokerProcess, Client
from harness.waiting import eventually_async
from riverbed.log.log import Log
from riverbed.mqtt.broker import Broker
from riverbed.mqtt.config import Address, AuthConfig, BrokerConfig, Listeners

START_MARKER = "--- start "
"""The harness's own line in the log file before each start."""


def connect_and_leave(port: int, client_id: str) -> None:
    client = Client(port, client_id)
    client.connect()
    client.disconnect()


def broker_lines(broker: BrokerProcess) -> list[str]:
    """The broker's lines (its log file goes when the `with` block ends)."""
    return [
        line
        for line in broker.log_path.read_text().splitlines()
        if line and not line.startswith(START_MARKER)
    ]


def test_info_has_no_line_per_client_and_debug_has_both(sqlite_url: str) -> None:
    with BrokerProcess(sqlite_url, extra_args=("--log-level", "info")) as broker:
        connect_and_leave(broker.port, "quiet-client")
        assert broker.stop() == 0  # after its last line: everything before is in the log
        quiet = broker_lines(broker)
    assert any("listening for MQTT on" in line for line in quiet)
    assert any("stopped; " in line for line in quiet)
    assert not [line for line in quiet if "quiet-client" in line]

    with BrokerProcess(sqlite_url, extra_args=("--log-level", "debug")) as broker:
        connect_and_leave(broker.port, "loud-client")
        assert broker.stop() == 0
        loud = [line for line in broker_lines(broker) if "loud-client" in line]
    assert len(loud) == 2, loud
    assert " DEBUG riverbed.mqtt.connection: client loud-client (" in loud[0]
    assert ") connected: MQTT 5, session " in loud[0]
    assert loud[1].endswith(") disconnected")


def test_json_format_gives_one_object_per_line(sqlite_url: str, tmp_path: Path) -> None:
    config = tmp_path / "riverbed.toml"
    config.write_text('[log]\nlevel = "debug"\nformat = "json"\n')
    with BrokerProcess(sqlite_url, extra_args=("--config", str(config))) as broker:
        connect_and_leave(broker.port, "json-client")
        assert broker.stop() == 0
        entries = [json.loads(line) for line in broker_lines(broker)]
    assert all(set(entry) == {"time", "level", "logger", "message"} for entry in entries)
    assert {"info", "debug"} <= {entry["level"] for entry in entries}
    assert entries[0]["message"] == f"created a new database at {sqlite_url}"
    mine = [e["message"] for e in entries if e["message"].startswith("client json-client ")]
    assert len(mine) == 2 and mine[1].endswith(") disconnected"), mine


SUMMARY = re.compile(r"(\d+) connected, (\d+) disconnected in the last 0.5 s; (\d+) connected now")


def test_summary_lines_count_the_clients_that_came_and_went(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In process, with a summary every half second instead of every minute."""

    def counted() -> list[tuple[int, ...]]:
        return [tuple(map(int, m.groups())) for m in SUMMARY.finditer(caplog.text)]

    async def scenario() -> None:
        config = BrokerConfig(
            listeners=Listeners(Address("127.0.0.1", 0)), auth=AuthConfig(allow_anonymous=True)
        )
        with Log.open(sqlite_url) as log:
            broker = Broker(config, log, client_summary=0.5)
            await broker.start()
            try:
                for client_id in ("first", "second"):
                    await asyncio.to_thread(connect_and_leave, broker.port, client_id)
                await eventually_async(
                    lambda: sum(c[1] for c in counted()) >= 2,
                    what=f"two disconnects counted in {caplog.text!r}",
                )
            finally:
                await broker.stop()

    with caplog.at_level(logging.INFO, logger="riverbed"):
        asyncio.run(scenario())
    lines = counted()
    assert sum(c[0] for c in lines) == 2 and sum(c[1] for c in lines) == 2
    assert lines[-1][2] == 0
    assert all(c[0] or c[1] for c in lines)  # no line for a spell when nobody came or went
    assert "first" not in caplog.text and "second" not in caplog.text  # no line per client
