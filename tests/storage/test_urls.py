"""Passwords in database URLs never show in messages (`riverbed.storage.urls`)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from riverbed.errors import InvalidConfig, StorageUnavailable
from riverbed.storage import StorageUrl, open_storage, redact_url
from riverbed.storage.urls import redact_password

SECRET = "s3cret-91d4"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:s3cret@host/db", "postgresql://user:***@host/db"),
        ("postgresql://user:s3cret@host:5432/db?sslmode=require", None),
        ("postgres://user:p/a@ss:w@rd@host/db", "postgres://user:***@host/db"),
        ("postgresql://user:@host/db", "postgresql://user:***@host/db"),
        ("postgresql://host/db?user=u&password=s3cret&x=1", None),
        ("postgresql://user:s3cret@[bad", "postgresql://user:***@[bad"),
        # Nothing to hide.
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("postgresql://host:5432/db", "postgresql://host:5432/db"),
        ("sqlite:///data/riverbed.db", "sqlite:///data/riverbed.db"),
        ("sqlite:////tmp/a:b@c.db", None),
        ("nonsense", "nonsense"),
    ],
)
def test_redact_url(url: str, shown: str | None) -> None:
    redacted = redact_url(url)

    if shown is not None:
        assert redacted == shown
    assert "s3cret" not in redacted
    assert redact_url(redacted) == redacted


def test_redact_url_keeps_what_identifies_the_database() -> None:
    assert (
        redact_url("postgresql://user:s3cret@host:5432/db?sslmode=require")
        == "postgresql://user:***@host:5432/db?sslmode=require"
    )
    assert (
        redact_url("postgresql://host/db?user=u&password=s3cret&x=1")
        == "postgresql://host/db?user=u&password=***&x=1"
    )


def test_redact_password_hides_it_as_written_and_decoded() -> None:
    url = "postgresql://u:pa%40ss%zz@host/db"
    text = 'invalid percent-encoded token: "pa%40ss%zz" (pa@ss%zz)'

    assert redact_password(text, url) == 'invalid percent-encoded token: "***" (***)'
    assert redact_password("nothing here", "sqlite:///x.db") == "nothing here"


@pytest.mark.parametrize(
    ("url", "error"),
    [
        # Nothing listens there.
        (f"postgresql://postgres:{SECRET}@127.0.0.1:1/nope", StorageUnavailable),
        (f"postgresql://127.0.0.1:1/nope?user=postgres&password={SECRET}", StorageUnavailable),
        # Malformed: refused by us, and by libpq (which quotes the bad token back).
        (f"postgresql://postgres:{SECRET}@127.0.0.1:notaport/db", InvalidConfig),
        (f"postgresql://postgres:{SECRET}%zz@127.0.0.1:1/db", InvalidConfig),
        (f"postgresql://postgres:{SECRET}@127.0.0.1:1/db?bogus=1", InvalidConfig),
    ],
)
def test_the_password_never_shows_when_opening_fails(url: str, error: type[Exception]) -> None:
    with pytest.raises(error) as raised:
        open_storage(url)

    text = "".join(traceback.format_exception(raised.value))  # the chained errors too
    assert SECRET not in text
    assert "127.0.0.1" in str(raised.value)
    assert "***" in str(raised.value)


# --- StorageUrl: a URL parsed once ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "backend", "path", "synchronous", "max_size"),
    [
        ("sqlite:///data/r.db", "sqlite", "data/r.db", "NORMAL", None),
        ("sqlite:////abs/r.db?synchronous=full", "sqlite", "/abs/r.db", "FULL", None),
        ("sqlite:///r.db?max_size=1MiB", "sqlite", "r.db", "NORMAL", 1 << 20),
        ("postgresql://u:pw@127.0.0.1:5432/db", "postgresql", None, "NORMAL", None),
        ("postgres://127.0.0.1/db", "postgresql", None, "NORMAL", None),
    ],
)
def test_a_url_is_parsed_into_its_backend_and_options(
    text: str, backend: str, path: str | None, synchronous: str, max_size: int | None
) -> None:
    url = StorageUrl.parse(text)
    assert url.text == text
    assert url.backend == backend and url.is_sqlite == (backend == "sqlite")
    assert url.path == (None if path is None else Path(path))
    assert (url.synchronous, url.max_size) == (synchronous, max_size)


def test_a_parsed_url_shows_no_password() -> None:
    url = StorageUrl.parse("postgresql://u:s3cret@127.0.0.1/db")
    assert url.shown == "postgresql://u:***@127.0.0.1/db"
    assert str(url) == url.shown and "s3cret" not in repr(url.shown)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("mysql://u:s3cret@h/db", "unsupported scheme 'mysql'"),
        ("relative.db", "unsupported scheme ''"),
        ("sqlite://host/r.db", "a sqlite URL has no host"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///r.db?synchronous=off", "must be normal or full"),
        ("sqlite:///r.db?cache=big", "unknown option(s) ['cache']"),
        ("sqlite:///r.db?max_size=1kB", "below the least size"),
        ("postgresql://h:port/db", "is malformed"),
    ],
)
def test_a_url_riverbed_cannot_use_is_refused_naming_it_and_the_rule(text: str, rule: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        StorageUrl.parse(text)
    assert rule in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_open_storage_takes_a_parsed_url(tmp_path: Path) -> None:
    url = StorageUrl.parse(f"sqlite:///{tmp_path}/r.db")
    storage = open_storage(url)
    try:
        assert storage.url == url.text and (tmp_path / "r.db").exists()
    finally:
        storage.close()
