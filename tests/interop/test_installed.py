"""A client that is not installed: its tests skip locally and fail in CI."""

from __future__ import annotations

import pytest

from interop.installed import missing, require_command

ABSENT = "riverbed-no-such-mqtt-client"


def test_outside_ci_a_missing_client_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"the command '{ABSENT}' is not installed"):
        require_command(ABSENT, "apt-get install it")


def test_in_ci_a_missing_client_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="in CI every interop client must run"):
        require_command(ABSENT, "apt-get install it")
    with pytest.raises(pytest.fail.Exception, match=r"MQTT\.js is not installed \(make it\)"):
        missing("MQTT.js", "make it")


def test_an_installed_command_is_found() -> None:
    assert require_command("sh", "POSIX").endswith("/sh")
