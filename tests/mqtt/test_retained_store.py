"""The retained store's quick look (`RetainedStore.any_under`): never says
"none" where `matching` finds some; its pages (`page`) put together are what
`matching` finds; on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.model import Message
from riverbed.mqtt import retained as retained_module
from riverbed.mqtt.retained import RetainedStore
from riverbed.storage import Storage, open_storage

LEVELS = st.sampled_from(["a", "b", "ab", "$s", ""])
TOPICS = st.lists(LEVELS, min_size=1, max_size=3).map("/".join)
FILTERS = st.lists(st.sampled_from(["a", "b", "ab", "$s", "", "+"]), min_size=1, max_size=3).map(
    "/".join
) | st.lists(LEVELS, max_size=2).map(lambda levels: "/".join([*levels, "#"]))


@pytest.fixture
def storage(storage_url: str) -> Iterator[Storage]:
    opened = open_storage(storage_url)
    yield opened
    opened.close()


def _retain(store: RetainedStore, topics: list[str]) -> None:
    for topic in topics:
        store.put(Message(b"r", mqtt_topic=topic), 1)


def test_an_empty_store_has_nothing_under_any_filter(storage: Storage) -> None:
    store = RetainedStore(storage)
    assert not store.any_under("#")
    assert not store.any_under("a/+")
    _retain(store, ["a/b"])
    assert store.any_under("#") and store.any_under("a/+") and store.any_under("a/b")
    assert not store.any_under("b/#") and not store.any_under("a/bc")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(retained=st.lists(TOPICS, max_size=6, unique=True), topic_filter=FILTERS)
def test_any_under_is_true_whenever_matching_finds_some(
    storage_url: str, retained: list[str], topic_filter: str
) -> None:
    storage = open_storage(storage_url)
    try:
        store = RetainedStore(storage)
        for entry in storage.kv_list("retained"):
            store.delete(entry.key)
        _retain(store, retained)
        if store.matching(topic_filter):
            assert store.any_under(topic_filter)
        if not any(
            t.startswith(topic_filter.split("+")[0].split("#")[0].rstrip("/")) for t in retained
        ):
            assert not store.any_under(topic_filter)
    finally:
        storage.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    retained=st.lists(TOPICS, max_size=10, unique=True),
    topic_filter=FILTERS,
    limit=st.integers(1, 4),
    read=st.sampled_from([1, 2, 256]),
)
def test_pages_put_together_are_what_matching_finds(
    storage_url: str, retained: list[str], topic_filter: str, limit: int, read: int
) -> None:
    """`page` hands out what `matching` finds, in the same order, at most
    `limit` at a time, and says when there is no more; whatever the size of
    its reads (`read`: entries per storage read, those the filter does not
    match among them)."""
    storage = open_storage(storage_url)
    try:
        with patch.object(retained_module, "_READ", read):
            _check_pages(RetainedStore(storage), storage, retained, topic_filter, limit)
    finally:
        storage.close()


def _check_pages(
    store: RetainedStore, storage: Storage, retained: list[str], topic_filter: str, limit: int
) -> None:
    for entry in storage.kv_list("retained"):
        store.delete(entry.key)
    _retain(store, retained)
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        found, after = store.page(topic_filter, after, limit)
        assert len(found) <= limit
        pages.append([m.mqtt_topic for m in found])
        if after is None:
            break
        assert len(pages) <= len(retained) + 1, "pages that never end"
    assert [t for page in pages for t in page] == [
        m.mqtt_topic for m in store.matching(topic_filter)
    ]


def test_a_page_of_no_size_is_refused(storage: Storage) -> None:
    with pytest.raises(ValueError, match="page size 0 must be at least 1"):
        RetainedStore(storage).page("#", None, 0)


def test_a_filter_without_wildcards_is_one_look_up(storage: Storage) -> None:
    """A SUBSCRIBE naming a topic has its retained message read by key: the
    names under it (`a/b/c` under `a/b`) are not read."""
    store = RetainedStore(storage)
    _retain(store, ["a/b", "a/b/c", "a/bc"])
    with (
        patch.object(storage, "kv_page", wraps=storage.kv_page) as paged,
        patch.object(storage, "kv_get", wraps=storage.kv_get) as got,
    ):
        found, after = store.page("a/b", None, 10)
        assert ([m.mqtt_topic for m in found], after) == (["a/b"], None)
        assert store.page("a/x", None, 10) == ([], None)
    assert paged.call_count == 0 and got.call_count == 2
