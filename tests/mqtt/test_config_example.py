"""riverbed.example.toml: rendered from the key table and the dataclasses'
defaults (`riverbed.mqtt.config_example`), checked in, and loadable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from riverbed.cli import cli
from riverbed.errors import InvalidConfig
from riverbed.mqtt import config_example
from riverbed.mqtt.config import KEYS, AuthConfig, BrokerConfig, Key, load_config
from riverbed.mqtt.config_example import EXAMPLE_FILE_NAME, EXAMPLES, defaults, render_example

CHECKED_IN = Path(__file__).resolve().parents[2] / EXAMPLE_FILE_NAME


def test_the_checked_in_example_is_the_rendered_one() -> None:
    assert CHECKED_IN.read_text() == render_example(), (
        f"{EXAMPLE_FILE_NAME} is out of date: run `riverbed config example > {EXAMPLE_FILE_NAME}`"
    )


def test_riverbed_config_example_prints_it() -> None:
    result = CliRunner().invoke(cli, ["config", "example"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.output == render_example()


def test_every_key_is_in_the_example_with_its_help() -> None:
    text = render_example()
    for key in KEYS:
        section, _, name = key.rpartition(".")
        assert re.search(rf"^(# )?\[{re.escape(section)}\]$", text, re.M), section
        assert len(re.findall(rf"^(# )?{name} = ", text, re.M)) >= 1, key
        assert f"# {KEYS[key].help}\n" in text, key


def test_as_it_is_the_example_is_refused_for_letting_nobody_in() -> None:
    with pytest.raises(InvalidConfig, match=r"auth\.allow_anonymous is false and no"):
        load_config(CHECKED_IN)


def test_loading_the_example_gives_the_defaults() -> None:
    loaded = load_config(CHECKED_IN, {"auth.allow_anonymous": True})
    assert loaded == BrokerConfig(auth=AuthConfig(allow_anonymous=True))


def test_uncommented_the_example_values_load(tmp_path: Path) -> None:
    """Every commented-out line (the TLS section, the keys unset by default)
    taken in, beside the files it names: it loads, with the example values."""
    for name in ("server.pem", "server.key", "clients-ca.pem", "passwd", "acl", "tokens"):
        (tmp_path / name).write_text("")
    uncommented = re.sub(
        r"^# ((\[[a-z_.]+\])|([a-z_]+ = .*))$", r"\1", CHECKED_IN.read_text(), flags=re.M
    )
    path = tmp_path / "riverbed.toml"
    path.write_text(uncommented)
    loaded = load_config(path)
    assert loaded.listeners.tls is not None
    assert str(loaded.listeners.tls.address) == EXAMPLES["listeners.tls.address"]
    assert loaded.listeners.tls.cafile == tmp_path / "clients-ca.pem"
    assert loaded.auth.password_file == tmp_path / "passwd"
    assert loaded.auth.acl_file == tmp_path / "acl"
    assert loaded.limits.server_keep_alive == EXAMPLES["limits.server_keep_alive"]
    assert loaded.limits.default_session_expiry == 7 * 24 * 3600
    assert loaded.storage.url == EXAMPLES["storage.url"]
    assert loaded.http.token_file == tmp_path / "tokens"


def test_a_key_no_dataclass_holds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KEYS, "limits.max_wishes", Key(lambda key, value: value, "wishes"))
    with pytest.raises(LookupError, match=r"no default found for limits\.max_wishes"):
        defaults()


def test_a_key_unset_by_default_without_an_example_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(config_example.EXAMPLES, "auth.acl_file")
    assert "\n# acl_file: unset by default\n" in render_example()
