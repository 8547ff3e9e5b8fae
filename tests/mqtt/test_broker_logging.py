"""The broker's own log (`riverbed serve --log-level`, `[log] level` and
`format`): no line per client at the default info level, one for each client
connecting and leaving at debug, JSON lines on request. A real broker process
and a paho client."""

from __future__ import annotations

import json
from pathlib import Path

from harness.broker import BrokerProcess, Client

START_MARKER = "--- start "
"""The harness's own line in the log file before each start."""


def connect_and_leave(broker: BrokerProcess, client_id: str) -> None:
    client = Client(broker.port, client_id)
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
        connect_and_leave(broker, "quiet-client")
        assert broker.stop() == 0  # after its last line: everything before is in the log
        quiet = broker_lines(broker)
    assert any("listening for MQTT on" in line for line in quiet)
    assert any("stopped; " in line for line in quiet)
    assert not [line for line in quiet if "quiet-client" in line]

    with BrokerProcess(sqlite_url, extra_args=("--log-level", "debug")) as broker:
        connect_and_leave(broker, "loud-client")
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
        connect_and_leave(broker, "json-client")
        assert broker.stop() == 0
        entries = [json.loads(line) for line in broker_lines(broker)]
    assert all(set(entry) == {"time", "level", "logger", "message"} for entry in entries)
    assert {"info", "debug"} <= {entry["level"] for entry in entries}
    assert entries[0]["message"] == f"created a new database at {sqlite_url}"
    mine = [e["message"] for e in entries if e["message"].startswith("client json-client ")]
    assert len(mine) == 2 and mine[1].endswith(") disconnected"), mine
