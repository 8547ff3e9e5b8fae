"""Passwords in database URLs never show in messages (`riverbed.storage.urls`)."""

from __future__ import annotations

import traceback

import pytest

from riverbed.errors import InvalidConfig, StorageUnavailable
from riverbed.storage import open_storage, redact_url
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
