"""Opening a storage: URLs, bad input, reopening."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.storage import create_topic, numbered_rows
from riverbed.errors import InvalidConfig, StorageUnavailable
from riverbed.storage import DEFAULT_URL, ENV_VAR, default_url, open_storage


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/x.db",
        "mysql://x",
        "sqlite:///",
        "sqlite://",
        "sqlite:///dir/",
        "sqlite:///x.db?synchronous=bogus",
        "sqlite:///x.db?foo=1",
        "sqlite://[bad/x.db",
        "postgresql://postgres@127.0.0.1:notaport/db",
        "postgresql://[bad",
        "nonsense",
    ],
)
def test_malformed_urls_raise_invalid_config_naming_the_url(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths would land here

    with pytest.raises(InvalidConfig) as raised:
        open_storage(url)

    assert isinstance(raised.value, ValueError)
    assert repr(url) in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_unreachable_postgres_raises_storage_unavailable_promptly() -> None:
    url = "postgresql://postgres@127.0.0.1:1/nope"
    started = time.monotonic()

    with pytest.raises(StorageUnavailable) as raised:
        open_storage(url)

    assert time.monotonic() - started < 5
    assert url in str(raised.value)


def test_sqlite_in_a_directory_that_cannot_exist(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    url = f"sqlite:///{tmp_path}/file/riverbed.db"

    with pytest.raises(StorageUnavailable, match="file"):
        open_storage(url)


def test_sqlite_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///rel/a.db", "sqlite:///rel/b.db?synchronous=full"):
        open_storage(url).close()
    open_storage(f"sqlite:///{tmp_path}/abs.db?synchronous=NORMAL").close()

    assert (tmp_path / "rel" / "a.db").exists()
    assert (tmp_path / "rel" / "b.db").exists()
    assert (tmp_path / "abs.db").exists()


def test_default_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert default_url() == DEFAULT_URL
    monkeypatch.setenv(ENV_VAR, "sqlite:///elsewhere.db")
    assert default_url() == "sqlite:///elsewhere.db"


def test_reopening_keeps_everything(storage_url: str) -> None:
    first = open_storage(storage_url)
    try:
        (stream,) = create_topic(first, "orders", 1)
        first.append({stream.key: numbered_rows(3)})
        first.kv_put("ns", "k", b"v")
        version = first.meta_version()
    finally:
        first.close()

    second = open_storage(storage_url)
    try:
        assert [t.name for t in second.list_topics()] == ["orders"]
        assert [m.payload for m in second.read(stream.key, 0, 10)] == [b"0", b"1", b"2"]
        assert second.append({stream.key: numbered_rows(1, first=3)}) == {stream.key: 3}
        entry = second.kv_get("ns", "k")
        assert entry is not None and entry.value == b"v"
        assert second.meta_version() == version
    finally:
        second.close()
