"""Delivery definitions of named subscriptions (issue 7): rules, round trip, store."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import AlreadyExists, NotFound
from riverbed.storage.base import Storage
from riverbed.subscriptions.definition import (
    CallableEndpoint,
    ConsumptionPolicy,
    Definitions,
    DeliveryDefinition,
    HttpEndpoint,
    InvalidDefinition,
    RetryPolicy,
    parse_endpoint,
)

headers = st.dictionaries(
    st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,10}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n\0"), max_size=20),
    max_size=3,
)
endpoints = st.one_of(
    st.builds(
        HttpEndpoint,
        url=st.sampled_from(["http://127.0.0.1:8080/hook", "https://example.test/a?b=1"]),
        method=st.sampled_from(["POST", "PUT", "PATCH"]),
        headers=headers,
        connect_timeout=st.floats(0.1, 60),
        request_timeout=st.floats(0.1, 600),
    ),
    st.builds(CallableEndpoint, target=st.sampled_from(["pkg.mod:fn", "handlers:deliver"])),
)
retries = st.builds(
    lambda statuses, backoff, low, spread, mult, attempts: RetryPolicy(
        tuple(statuses), ("TimeoutError",), backoff, low, low + spread, mult, attempts
    ),
    st.lists(st.integers(100, 599), max_size=4),
    st.sampled_from(["linear", "exponential"]),
    st.floats(0, 100),
    st.floats(0, 1000),
    st.floats(1, 10),
    st.integers(1, 50),
)
definitions = st.builds(
    DeliveryDefinition,
    name=st.sampled_from(["orders", "audit.log"]),
    topic=st.sampled_from(["mqtt", "orders"]),
    endpoint=endpoints,
    shard_count=st.integers(1, 16),
    grouped=st.booleans(),
    retry=retries,
    consumption=st.builds(
        ConsumptionPolicy,
        max_in_flight=st.integers(1, 1000),
        max_parallel_groups=st.integers(1, 1000),
        error_rate_threshold=st.floats(0.01, 1),
        error_window=st.integers(1, 1000),
        throttled_rate=st.floats(0.1, 1000),
    ),
    rq_partitions=st.none() | st.integers(1, 64),
    dlq_partitions=st.none() | st.integers(1, 64),
)


@given(definitions)
def test_a_definition_round_trips_through_json(definition: DeliveryDefinition) -> None:
    assert DeliveryDefinition.from_json(definition.to_json()) == definition


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: HttpEndpoint("ftp://x/y"), "endpoint = 'ftp://x/y': must be an http"),
        (lambda: HttpEndpoint("http:///nohost"), "with a host"),
        (lambda: HttpEndpoint("http://h/", method="GET"), "method = 'GET': must be one of"),
        (lambda: HttpEndpoint("http://h/", headers={"Bad Name": "x"}), "header name"),
        (lambda: HttpEndpoint("http://h/", headers={"X": "a\r\nb"}), "without line breaks"),
        (lambda: HttpEndpoint("http://h/", request_timeout=0), "request_timeout = 0"),
        (lambda: CallableEndpoint("not a target"), "package.module:function"),
        (lambda: RetryPolicy(retry_on_status=(42,)), "retry_on_status = 42"),
        (lambda: RetryPolicy(retry_on_exceptions=("no such!",)), "exception type names"),
        (lambda: RetryPolicy(backoff="random"), "linear or exponential"),  # type: ignore[arg-type]
        (lambda: RetryPolicy(min_delay=5, max_delay=1), "max_delay = 1: must be at least"),
        (lambda: RetryPolicy(multiplier=0.5), "multiplier = 0.5"),
        (lambda: RetryPolicy(max_attempts=0), "max_attempts = 0"),
        (lambda: ConsumptionPolicy(max_in_flight=0), "max_in_flight = 0"),
        (lambda: ConsumptionPolicy(error_rate_threshold=1.5), "error_rate_threshold = 1.5"),
        (
            lambda: DeliveryDefinition("s", "t", CallableEndpoint("m:f"), shard_count=0),
            "shard_count",
        ),
        (lambda: DeliveryDefinition("s", "t", "http://h/"), "endpoint = 'http://h/'"),  # type: ignore[arg-type]
        (lambda: parse_endpoint("m:f", method="PUT"), "only apply to an HTTP endpoint"),
    ],
)
def test_bad_values_name_the_field_and_the_rule(build: object, message: str) -> None:
    with pytest.raises(InvalidDefinition, match=message.replace("?", r"\?")):
        build()  # type: ignore[operator]


def test_backoff_delays() -> None:
    linear = RetryPolicy(backoff="linear", min_delay=1, max_delay=5, multiplier=2)
    assert [linear.delay(a) for a in range(1, 6)] == [1, 3, 5, 5, 5]
    exponential = RetryPolicy(min_delay=0.5, max_delay=10, multiplier=3)
    assert [exponential.delay(a) for a in range(1, 6)] == [0.5, 1.5, 4.5, 10, 10]
    assert exponential.delay(10_000) == 10  # no overflow


def test_which_failures_are_retried() -> None:
    policy = RetryPolicy(retry_on_status=(503,), retry_on_exceptions=("TimeoutError",))
    assert policy.retries(status=503) and not policy.retries(status=400)
    assert policy.retries(exception="TimeoutError") and not policy.retries(exception="KeyError")


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://h/x", method="PUT") == HttpEndpoint("http://h/x", "PUT")
    assert parse_endpoint("pkg.handlers:deliver") == CallableEndpoint("pkg.handlers:deliver")


def test_unreadable_stored_definitions_are_refused() -> None:
    for data in (b"{", b"{}", b'{"endpoint": {"kind": "smtp"}}'):
        with pytest.raises(InvalidDefinition, match=r"unreadable|neither http"):
            DeliveryDefinition.from_json(data)


def test_definitions_are_stored_once_per_subscription(storage: Storage) -> None:
    store = Definitions(storage)
    first = DeliveryDefinition("orders", "mqtt", HttpEndpoint("http://127.0.0.1:9/x"))
    store.create(first)
    with pytest.raises(AlreadyExists, match="'orders'"):
        store.create(DeliveryDefinition("orders", "mqtt", CallableEndpoint("m:f")))
    assert store.get("orders") == first
    assert store.get("nope") is None
    assert store.list() == [first]
    store.delete("orders")
    assert store.list() == []
    with pytest.raises(NotFound, match="'orders'"):
        store.delete("orders")


@given(retries, st.integers(1, 200))
def test_backoff_grows_and_stays_within_its_bounds(policy: RetryPolicy, attempt: int) -> None:
    delay = policy.delay(attempt)
    assert policy.min_delay <= delay <= policy.max_delay
    assert policy.delay(attempt + 1) >= delay
