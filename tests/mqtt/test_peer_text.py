"""A connection's peer as people write it (logs, `GET /api/v1/clients`)."""

from __future__ import annotations

import pytest

from riverbed.mqtt.connection import peer_text


@pytest.mark.parametrize(
    ("peername", "text"),
    [
        (("127.0.0.1", 52853), "127.0.0.1:52853"),
        (("::1", 52853, 0, 0), "[::1]:52853"),
        ("/run/riverbed.sock", "/run/riverbed.sock"),
        (None, "-"),
    ],
)
def test_peer_text(peername: object, text: str) -> None:
    assert peer_text(peername) == text
