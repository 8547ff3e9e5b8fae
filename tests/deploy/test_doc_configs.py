"""The configuration files README.md and docs/deploy.md show are ones the broker
accepts: every TOML block there loads, beside the files it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from riverbed.mqtt.config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/deploy.md")
NAMED_FILES = ("passwd", "acl", "server.pem", "server.key")


def toml_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for number, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S), 1):
            blocks.append((f"{page} #{number}", block))
    return blocks


def test_the_pages_show_configuration_files() -> None:
    assert {name.partition(" ")[0] for name, _ in toml_blocks()} == set(PAGES)


@pytest.mark.parametrize(("where", "block"), toml_blocks(), ids=[n for n, _ in toml_blocks()])
def test_a_configuration_block_loads(where: str, block: str, tmp_path: Path) -> None:
    for name in NAMED_FILES:
        (tmp_path / name).write_text("")
    path = tmp_path / "riverbed.toml"
    path.write_text(block)
    # A block may show one section only: anonymous access stands in for the rest.
    config = load_config(path, {"auth.allow_anonymous": "true"})
    if "password_file" in block:
        assert config.auth.password_file == tmp_path / "passwd", where
    if "[listeners.tls]" in block:
        assert config.listeners.tls is not None, where
