"""Key modes of topic bindings: parsing, storing, routing, upgrading (both backends)."""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.storage.sql.core
from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.log.topics import (
    BUILTIN_TOPIC,
    CLIENT_ID_KEY,
    DEFAULT_KEY_MODE,
    KEY_FORMS,
    KeyKind,
    KeyMode,
    Topics,
)
from riverbed.storage import Storage, open_storage
from riverbed.storage.schema import MIGRATIONS

FORMS = ["client-id", "topic", "client-topic", "none", "property:device", "property:a:b"]


@pytest.mark.parametrize("text", FORMS)
def test_parse_round_trips_every_form(text: str) -> None:
    assert str(KeyMode.parse(text)) == text


def test_parse_property_keeps_the_name_after_the_first_colon() -> None:
    assert KeyMode.parse("property:a:b") == KeyMode(KeyKind.PROPERTY, "a:b")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("banana", "is not one of"),
        ("", "is not one of"),
        ("property", "is not one of"),
        ("property:", "names no user property"),
        ("property:a\x00b", "names no user property"),
        ("Client-Id", "is not one of"),
        ("topic:x", "is not one of"),
        (" none", "is not one of"),
    ],
)
def test_parse_refuses_naming_the_value_and_the_forms(text: str, says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        KeyMode.parse(text)
    message = str(refused.value)
    assert repr(text) in message and says in message
    assert "client-id" in message and "property:NAME" in message


@given(st.text(max_size=20))
def test_parse_takes_exactly_the_documented_forms(text: str) -> None:
    try:
        mode = KeyMode.parse(text)
    except InvalidInput as refused:
        assert repr(text) in str(refused)
        assert text not in {"client-id", "topic", "client-topic", "none"}
        assert not (text.startswith("property:") and len(text) > 9 and "\x00" not in text)
    else:
        assert str(mode) == text


def test_a_property_name_goes_with_property_only() -> None:
    with pytest.raises(InvalidInput):
        KeyMode(KeyKind.TOPIC, "device")
    with pytest.raises(InvalidInput):
        KeyMode(KeyKind.PROPERTY)
    with pytest.raises(InvalidInput):
        KeyMode(KeyKind.PROPERTY, "a\x00b")


# --------------------------------------------------------------------- topics


def snapshot(storage: Storage) -> tuple[object, ...]:
    topics = storage.list_topics()
    return (storage.meta_version(), topics, storage.list_streams())


def test_new_topics_get_client_topic_and_keep_what_they_are_given(storage: Storage) -> None:
    topics = Topics(storage)
    topics.ensure_builtin()
    # The catch-all of a new database is keyed as in an upgraded one.
    assert storage.get_topic(BUILTIN_TOPIC).key_mode == "client-id"
    assert str(DEFAULT_KEY_MODE) == "client-topic"
    assert topics.create("plain", 2, binding="plain/#").key_mode == "client-topic"
    made = topics.create("spread", 2, binding="s/#", key_mode=KeyMode.parse("none"))
    assert made.key_mode == "none"
    assert topics.get("spread").key_mode == "none"
    assert topics.describe("spread").as_dict()["key"] == "none"
    topics.create("dev", 2, binding="d/#", key_mode=KeyMode.parse("property:device"))
    assert topics.get("dev").key_mode == "property:device"


def test_a_key_mode_without_a_binding_is_refused_and_changes_nothing(storage: Storage) -> None:
    topics = Topics(storage)
    topics.ensure_builtin()
    before = snapshot(storage)
    with pytest.raises(InvalidInput, match=r"'none' for topic 'loose'.*has no binding"):
        topics.create("loose", 2, key_mode=KeyMode.parse("none"))
    assert snapshot(storage) == before


def test_set_key_mode(storage: Storage) -> None:
    topics = Topics(storage)
    topics.ensure_builtin()
    topics.create("orders", 2, binding="orders/#")
    topics.create("loose", 2)
    assert topics.set_key_mode("orders", KeyMode.parse("topic")).key_mode == "topic"
    assert topics.set_key_mode(BUILTIN_TOPIC, CLIENT_ID_KEY).key_mode == "client-id"
    before = snapshot(storage)
    with pytest.raises(InvalidInput, match="has no binding"):
        topics.set_key_mode("loose", KeyMode.parse("none"))
    assert snapshot(storage) == before


def test_route_gives_the_binding_key_mode_and_sees_changes_at_once(log: Log) -> None:
    log.topics.create("orders", 4, binding="orders/#", key_mode=KeyMode.parse("none"))
    assert log.route("orders/eu") == ("orders", KeyMode.parse("none"))
    assert log.route("other") == (BUILTIN_TOPIC, CLIENT_ID_KEY)
    assert log.route("orders/eu") is log.route("orders/eu")  # remembered, not resolved again
    log.topics.set_key_mode("orders", KeyMode.parse("property:device"))
    assert log.route("orders/eu") == ("orders", KeyMode.parse("property:device"))


def test_route_sees_another_process_change_within_the_ttl(log: Log, storage_url: str) -> None:
    log.topics.create("orders", 4, binding="orders/#", key_mode=KeyMode.parse("none"))
    assert log.route("orders/1").key_mode == KeyMode.parse("none")
    other = open_storage(storage_url)
    try:
        Topics(other).set_key_mode("orders", KeyMode.parse("topic"))
    finally:
        other.close()
    from harness.waiting import eventually

    eventually(lambda: log.route("orders/1").key_mode == KeyMode.parse("topic"), 10, "new mode")


# --------------------------------------------------------------------- upgrade


def _execute(url: str, statements: list[str]) -> None:
    """Run SQL behind the storage's back (to build a database as an older
    Riverbed left it)."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())


def test_an_existing_database_keeps_client_id_and_new_topics_get_the_default(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = next(i for i, m in enumerate(MIGRATIONS) if any("key_mode" in s for s in m))
    with monkeypatch.context() as patch:
        patch.setattr(riverbed.storage.sql.core, "MIGRATIONS", MIGRATIONS[:mine])
        open_storage(storage_url).close()  # the schema before key modes
    _execute(
        storage_url,
        [
            "INSERT INTO topics (name, binding, retention_us, retention_policy, produce_pointer,"
            f" created_us) VALUES ('{name}', {binding}, NULL, 'consumed-and-expired', 0, 1)"
            for name, binding in [(BUILTIN_TOPIC, "NULL"), ("orders", "'orders/#'")]
        ],
    )
    with Log.open(storage_url) as log:  # upgrades
        assert log.topics.get(BUILTIN_TOPIC).key_mode == "client-id"
        assert log.topics.get("orders").key_mode == "client-id"
        assert log.route("orders/1") == ("orders", CLIENT_ID_KEY)
        assert log.route("anything") == (BUILTIN_TOPIC, CLIENT_ID_KEY)
        assert log.topics.create("fresh", 2, binding="fresh/#").key_mode == "client-topic"
        assert log.route("fresh/1").key_mode == DEFAULT_KEY_MODE


def test_the_error_lists_every_form() -> None:
    for form in ["client-id", "topic", "client-topic", "property:NAME", "none"]:
        assert form in KEY_FORMS
