"""The admin API's topic storage operations and subscription writes
(`POST /topics/{name}/storage-topics`, `.../switch-produce`, `POST /subscriptions`,
`DELETE /subscriptions/{name}`, reset and reshard as jobs), over real HTTP from a
`riverbed admin` subprocess, on both backends: each does what the command line
does (the same code), bad input is 422 naming the field with nothing changed,
a read token is refused every write."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from harness.admin_api import AdminApi
from harness.cli import rb
from harness.databases import BACKENDS, fresh_database
from harness.waiting import eventually
from riverbed.cli import cli
from riverbed.storage import open_storage
from riverbed.storage.base import StartKind, SubscriptionRecord
from riverbed.subscriptions.definition import Definitions, DeliveryDefinition


@pytest.fixture
def admin(storage_url: str) -> Iterator[AdminApi]:
    with AdminApi(storage_url) as running:
        yield running


@pytest.fixture
def api(admin: AdminApi) -> Iterator[httpx.Client]:
    with admin.client() as client:
        yield client


Shared = Callable[[str, Callable[[httpx.Client], None]], tuple[str, httpx.Client]]


@pytest.fixture(scope="module", params=BACKENDS)
def refusals(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shared]:
    """Bad input changes nothing, so the cases of one refusal test share a
    database and a `riverbed admin` (per backend): `refusals(kind, prepare)`
    makes them at the kind's first case, `prepare` giving the database what
    its cases refuse to change, and returns its URL and a client."""
    made: dict[str, tuple[str, httpx.Client]] = {}
    with contextlib.ExitStack() as stack:

        def shared(kind: str, prepare: Callable[[httpx.Client], None]) -> tuple[str, httpx.Client]:
            if kind not in made:
                url = fresh_database(request, tmp_path_factory, stack, kind)
                admin = stack.enter_context(AdminApi(url))
                client = stack.enter_context(admin.client())
                prepare(client)
                made[kind] = (url, client)
            return made[kind]

        yield shared


def make_topic(api: httpx.Client, partitions: int = 4, name: str = "orders") -> None:
    made = api.post(
        "/api/v1/topics", json={"name": name, "partitions": partitions, "binding": f"{name}/#"}
    )
    assert made.status_code == 201, made.text


def produce(api: httpx.Client, count: int, topic: str = "orders") -> None:
    for n in range(count):
        posted = api.post(
            f"/api/v1/topics/{topic}/messages",
            json={"payload": f"m{n}", "key": f"k{n}", "mqtt_topic": f"{topic}/x"},
        )
        assert posted.status_code == 201, posted.text


def finished(api: httpx.Client, answer: httpx.Response) -> dict[str, Any]:
    """The job a 202 started, once it succeeded (its view)."""
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert answer.headers["location"] == f"/api/v1/jobs/{job['id']}"
    assert job["status"] in ("running", "succeeded")

    def done() -> dict[str, Any] | None:
        view: dict[str, Any] = api.get(answer.headers["location"]).json()
        assert view["status"] != "failed", view
        return view if view["status"] == "succeeded" else None

    return eventually(done, what=f"job {job['id']} ({job['kind']}) to succeed")


def definition(url: str, name: str) -> DeliveryDefinition | None:
    storage = open_storage(url)
    try:
        return Definitions(storage).get(name)
    finally:
        storage.close()


def topic_names(url: str) -> set[str]:
    storage = open_storage(url)
    try:
        return {t.name for t in storage.list_topics()}
    finally:
        storage.close()


# --------------------------------------------------------------------- storage topics


def test_add_a_storage_topic_then_switch_produce_to_it(storage_url: str, api: httpx.Client) -> None:
    make_topic(api, 2)
    added = api.post("/api/v1/topics/orders/storage-topics", json={"partitions": 4})
    assert added.status_code == 201, added.text
    assert [s["partitions"] for s in added.json()["storage_topics"]] == [2, 4]
    assert added.json()["produce_pointer"] == 0
    switched = api.post("/api/v1/topics/orders/switch-produce")
    assert switched.status_code == 200, switched.text
    assert switched.json()["produce_pointer"] == 1
    # The command line sees what the API did.
    described = json.loads(rb(storage_url, "topic", "describe", "orders", "--json").stdout)
    assert described["produce_pointer"] == 1
    assert [s["sealed"] for s in described["streams"]] == [True, True, False, False, False, False]
    # On the newest generation already: nothing to switch to, nothing changes.
    again = api.post("/api/v1/topics/orders/switch-produce")
    assert again.status_code == 200 and again.json()["produce_pointer"] == 1


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"partitions": 5}, "partition count 5"),
        ({"partitions": "many"}, "partitions"),
        ({}, "partitions"),
        ({"partitions": 4, "colour": "blue"}, "colour"),
    ],
)
def test_a_bad_storage_topic_is_422_and_nothing_is_added(
    refusals: Shared, body: dict[str, object], words: str
) -> None:
    _, api = refusals("storage-topic", lambda api: make_topic(api, 2))
    refused = api.post("/api/v1/topics/orders/storage-topics", json=body)
    assert refused.status_code == 422, refused.text
    assert words in refused.json()["error"]
    assert len(api.get("/api/v1/topics/orders").json()["storage_topics"]) == 1


def test_storage_topic_ops_on_a_missing_topic_are_404(api: httpx.Client) -> None:
    for path, body in [("storage-topics", {"partitions": 4}), ("switch-produce", None)]:
        missing = api.post(f"/api/v1/topics/nowhere/{path}", json=body)
        assert missing.status_code == 404, missing.text
        assert "nowhere" in missing.json()["error"]


def test_switch_produce_is_refused_while_a_shard_count_does_not_divide(
    api: httpx.Client,
) -> None:
    make_topic(api, 2)
    made = api.post(
        "/api/v1/subscriptions",
        json={"name": "billing", "topic": "orders", "endpoint": {"url": "m:f", "shards": 2}},
    )
    assert made.status_code == 201, made.text
    assert api.post("/api/v1/topics/orders/storage-topics", json={"partitions": 3}).is_success
    refused = api.post("/api/v1/topics/orders/switch-produce")
    assert refused.status_code == 422, refused.text
    assert "'billing' delivers with 2 shards" in refused.json()["error"]
    assert api.get("/api/v1/topics/orders").json()["produce_pointer"] == 0


# --------------------------------------------------------------------- create, delete


def test_create_a_plain_subscription_reuse_it_and_refuse_a_clash(
    storage_url: str, api: httpx.Client
) -> None:
    make_topic(api)
    produce(api, 2)
    body = {"name": "audit", "topic": "orders", "filter": "orders/x", "start": "latest"}
    made = api.post("/api/v1/subscriptions", json=body)
    assert made.status_code == 201, made.text
    view = made.json()
    assert (view["name"], view["filter"], view["start"], view["lag"]) == (
        "audit",
        "orders/x",
        "latest",
        0,
    )
    assert view["endpoint"] is None
    listed = json.loads(rb(storage_url, "subscription", "list", "--json").stdout)
    assert [s["name"] for s in listed] == ["audit"]
    reused = api.post("/api/v1/subscriptions", json={**body, "if_not_exists": True})
    assert reused.status_code == 200, reused.text
    clash = api.post("/api/v1/subscriptions", json={**body, "start": "earliest"})
    assert clash.status_code == 409
    assert "audit" in clash.json()["error"]


EVERY_OPTION = {
    "shards": 2,
    "grouped": False,
    "method": "put",
    "headers": {"Authorization": "Bearer x", "X-Team": "billing"},
    "connect_timeout": 2.5,
    "request_timeout": 9,
    "retry_on": [503, "429", "TimeoutError"],
    "backoff": "linear",
    "min_delay": 0.5,
    "max_delay": 20,
    "multiplier": 3,
    "max_attempts": 7,
    "inline_retry": 0.25,
    "max_in_flight": 16,
    "max_parallel_groups": 8,
    "error_rate": 0.75,
    "rq_partitions": 4,
    "dlq_partitions": 2,
}
SAME_ON_THE_COMMAND_LINE = [
    *("--shards", "2", "--ungrouped", "--method", "put"),
    *("--header", "Authorization: Bearer x", "--header", "X-Team: billing"),
    *("--connect-timeout", "2.5", "--request-timeout", "9"),
    *("--retry-on", "503,429,TimeoutError", "--backoff", "linear"),
    *("--min-delay", "0.5", "--max-delay", "20", "--multiplier", "3"),
    *("--max-attempts", "7", "--inline-retry", "0.25", "--max-in-flight", "16"),
    *("--max-parallel-groups", "8", "--error-rate", "0.75"),
    *("--rq-partitions", "4", "--dlq-partitions", "2"),
]


def test_a_delivering_subscription_with_every_option_is_the_command_lines(
    storage_url: str, api: httpx.Client
) -> None:
    make_topic(api)
    endpoint = {"url": "http://127.0.0.1:9000/hook", **EVERY_OPTION}
    made = api.post(
        "/api/v1/subscriptions", json={"name": "billing", "topic": "orders", "endpoint": endpoint}
    )
    assert made.status_code == 201, made.text
    view = made.json()
    assert view["endpoint"] == "http://127.0.0.1:9000/hook"
    assert (view["shards"], view["grouped"]) == (2, False)
    assert (view["retry_queue"], view["dead_letter_queue"]) == (0, 0)
    assert {"billing.rq", "billing.dlq"} <= topic_names(storage_url)
    cli = rb(
        storage_url,
        *("subscription", "create", "billing-cli", "--topic", "orders"),
        *("--endpoint", "http://127.0.0.1:9000/hook", *SAME_ON_THE_COMMAND_LINE),
    )
    assert cli.exit_code == 0, cli.output
    by_api, by_cli = definition(storage_url, "billing"), definition(storage_url, "billing-cli")
    assert by_api is not None and by_cli is not None
    assert by_api == replace(by_cli, name="billing")
    assert by_api.retry.retry_on_status == (503, 429)
    assert by_api.retry.retry_on_exceptions == ("TimeoutError",)
    assert by_api.retry.inline_max_delay == 0.25


def test_a_delivering_subscription_keeps_the_command_lines_defaults(
    storage_url: str, api: httpx.Client
) -> None:
    make_topic(api)
    made = api.post(
        "/api/v1/subscriptions",
        json={"name": "billing", "topic": "orders", "endpoint": {"url": "pkg.mod:deliver"}},
    )
    assert made.status_code == 201, made.text
    cli = rb(
        storage_url,
        *("subscription", "create", "other", "--topic", "orders", "--endpoint", "pkg.mod:deliver"),
    )
    assert cli.exit_code == 0, cli.output
    by_api, by_cli = definition(storage_url, "billing"), definition(storage_url, "other")
    assert by_api is not None and by_cli is not None
    assert by_api == replace(by_cli, name="billing")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"start": "yesterday"}, "start: 'yesterday' is not a position"),
        ({"name": "bad name"}, "subscription name 'bad name'"),
        ({"filter": "orders/#/x"}, "orders/#/x"),
        ({"filter": "elsewhere/#"}, "can never match"),
        ({"colour": "blue"}, "colour"),
        ({"endpoint": {"url": "ftp://x/y"}}, "endpoint: endpoint = 'ftp://x/y'"),
        ({"endpoint": {"url": "m:f", "max_attempts": 0}}, "max_attempts = 0"),
        ({"endpoint": {"url": "http://h/x", "method": "DELETE"}}, "method = 'DELETE'"),
        ({"endpoint": {"url": "http://h/x", "retry_on": ["no such"]}}, "retry_on_exceptions"),
        ({"endpoint": {"url": "m:f", "shards": 3}}, "3"),
        ({"endpoint": {"url": "m:f", "method": "PUT"}}, "only apply to an HTTP endpoint"),
        ({"endpoint": {"url": "m:f", "backoff": "cubic"}}, "endpoint.backoff"),
        ({"endpoint": {"url": "m:f", "speed": 9}}, "endpoint.speed"),
    ],
)
def test_a_bad_subscription_is_422_naming_the_field_and_nothing_is_created(
    refusals: Shared, change: dict[str, object], words: str
) -> None:
    storage_url, api = refusals("subscription", make_topic)
    before = topic_names(storage_url)
    refused = api.post(
        "/api/v1/subscriptions", json={"name": "billing", "topic": "orders", **change}
    )
    assert refused.status_code == 422, refused.text
    assert words in refused.json()["error"], refused.json()
    assert api.get("/api/v1/subscriptions").json() == []
    assert topic_names(storage_url) == before
    assert definition(storage_url, "billing") is None


def test_a_subscription_of_a_missing_topic_is_404(api: httpx.Client) -> None:
    missing = api.post("/api/v1/subscriptions", json={"name": "audit", "topic": "nowhere"})
    assert missing.status_code == 404, missing.text
    assert "nowhere" in missing.json()["error"]


def test_delete_a_plain_and_a_delivering_subscription(storage_url: str, api: httpx.Client) -> None:
    make_topic(api)
    for body in (
        {"name": "audit", "topic": "orders"},
        {"name": "billing", "topic": "orders", "endpoint": {"url": "m:f"}},
    ):
        assert api.post("/api/v1/subscriptions", json=body).status_code == 201
    for name in ("audit", "billing"):
        deleted = api.delete(f"/api/v1/subscriptions/{name}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"subscription": name, "deleted": True}
        assert api.get(f"/api/v1/subscriptions/{name}").status_code == 404
    assert not {"billing.rq", "billing.dlq"} & topic_names(storage_url)  # gone with billing
    assert definition(storage_url, "billing") is None
    again = api.delete("/api/v1/subscriptions/billing")
    assert again.status_code == 404
    assert "billing" in again.json()["error"]


# --------------------------------------------------------------------- reset, reshard


def test_reset_runs_as_a_job_and_moves_the_cursors(api: httpx.Client) -> None:
    make_topic(api, 1)
    produce(api, 3)
    assert api.post("/api/v1/subscriptions", json={"name": "audit", "topic": "orders"}).is_success
    assert api.get("/api/v1/subscriptions/audit").json()["lag"] == 3

    job = finished(api, api.post("/api/v1/subscriptions/audit/reset", json={"to": "latest"}))
    assert (job["kind"], job["target"]) == ("reset", "audit")
    assert job["result"] == {"subscription": "audit", "offsets": {"orders/0/0": 3}}
    assert job["progress"]["done"] == job["progress"]["total"]
    assert job["error"] is None and job["finished"] is not None
    assert api.get("/api/v1/subscriptions/audit").json()["lag"] == 0

    to_one = {"to": "offsets", "offsets": {"orders/0/0": 1}}
    finished(api, api.post("/api/v1/subscriptions/audit/reset", json=to_one))
    assert api.get("/api/v1/subscriptions/audit").json()["lag"] == 2

    long_ago = {"to": "time", "time": "2000-01-01T00:00:00Z"}
    finished(api, api.post("/api/v1/subscriptions/audit/reset", json=long_ago))
    assert api.get("/api/v1/subscriptions/audit").json()["lag"] == 3


def _orders_and_audit(api: httpx.Client) -> None:
    """Topic `orders` (1 partition, 3 messages) and subscription `audit` on it."""
    make_topic(api, 1)
    produce(api, 3)
    assert api.post("/api/v1/subscriptions", json={"name": "audit", "topic": "orders"}).is_success


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"to": "time"}, "time: needed"),
        ({"to": "time", "time": "soon"}, "time: time 'soon' is not an ISO 8601 time"),
        ({"to": "latest", "time": "2000-01-01T00:00:00Z"}, "time: only with"),
        ({"to": "offsets", "offsets": {"orders/0/0": 9}}, "outside the retained range"),
        ({"to": "offsets", "offsets": {"nowhere": 1}}, "offsets:"),
        ({"to": "offsets", "offsets": {"orders/0/7": 1}}, "not a stream of topic"),
        ({"to": "latest", "queue": "dlq"}, "for a subscription that delivers"),
        ({"to": "somewhere"}, "to"),
        ({"to": "latest", "colour": "blue"}, "colour"),
    ],
)
def test_a_bad_reset_is_422_and_starts_no_job(
    refusals: Shared, body: dict[str, object], words: str
) -> None:
    _, api = refusals("reset", _orders_and_audit)
    refused = api.post("/api/v1/subscriptions/audit/reset", json=body)
    assert refused.status_code == 422, refused.text
    assert words in refused.json()["error"], refused.json()
    assert api.get("/api/v1/subscriptions/audit").json()["lag"] == 3
    assert api.get("/api/v1/jobs").json() == []


def test_a_cursor_the_broker_owns_is_not_reset_or_deleted_by_name(
    storage_url: str, api: httpx.Client
) -> None:
    """An MQTT session's cursor is listed among the subscriptions; resetting
    or deleting it by name is 422 naming the rule, with no job and nothing
    moved (its session keeps its positions itself)."""
    make_topic(api, 1)
    produce(api, 3)
    name = "$session.s1.orders"
    storage = open_storage(storage_url)
    try:
        storage.create_subscription(
            SubscriptionRecord(name, "orders", None, StartKind.EARLIEST, None, 0), lambda h: {}
        )
    finally:
        storage.close()
    for refused in (
        api.post(f"/api/v1/subscriptions/{name}/reset", json={"to": "latest"}),
        api.delete(f"/api/v1/subscriptions/{name}"),
    ):
        assert refused.status_code == 422, refused.text
        assert "is the broker's own" in refused.json()["error"], refused.json()
    assert api.get(f"/api/v1/subscriptions/{name}").json()["lag"] == 3
    assert api.get("/api/v1/jobs").json() == []


def test_reset_and_reshard_of_a_missing_subscription_are_404(api: httpx.Client) -> None:
    for path, body in [("reset", {"to": "latest"}), ("reshard", {"shards": 2})]:
        missing = api.post(f"/api/v1/subscriptions/nobody/{path}", json=body)
        assert missing.status_code == 404, missing.text
        assert "nobody" in missing.json()["error"]
    assert api.get("/api/v1/jobs").json() == []


def test_reshard_runs_as_a_job_and_changes_the_shards(storage_url: str, api: httpx.Client) -> None:
    make_topic(api, 4)
    body = {"name": "billing", "topic": "orders", "endpoint": {"url": "m:f", "shards": 1}}
    assert api.post("/api/v1/subscriptions", json=body).status_code == 201
    job = finished(api, api.post("/api/v1/subscriptions/billing/reshard", json={"shards": 4}))
    assert job["kind"] == "reshard"
    assert job["result"]["shards_before"] == 1 and job["result"]["shards"] == 4
    assert job["progress"]["done"] == job["progress"]["total"]
    assert api.get("/api/v1/subscriptions/billing").json()["shards"] == 4
    stored = definition(storage_url, "billing")
    assert stored is not None and stored.shard_count == 4


def _orders_billing_and_audit(api: httpx.Client) -> None:
    """Topic `orders` (4 partitions), `billing` delivering in 2 shards, plain `audit`."""
    make_topic(api, 4)
    for made in (
        {"name": "billing", "topic": "orders", "endpoint": {"url": "m:f", "shards": 2}},
        {"name": "audit", "topic": "orders"},
    ):
        assert api.post("/api/v1/subscriptions", json=made).status_code == 201


@pytest.mark.parametrize(
    ("name", "body", "code", "words"),
    [
        ("billing", {"shards": 3}, 422, "3"),
        ("billing", {"shards": "two"}, 422, "shards"),
        ("billing", {}, 422, "shards"),
        ("audit", {"shards": 2}, 404, "does not deliver"),
    ],
)
def test_a_bad_reshard_is_refused_and_starts_no_job(
    refusals: Shared, name: str, body: dict[str, object], code: int, words: str
) -> None:
    storage_url, api = refusals("reshard", _orders_billing_and_audit)
    refused = api.post(f"/api/v1/subscriptions/{name}/reshard", json=body)
    assert refused.status_code == code, refused.text
    assert words in refused.json()["error"]
    stored = definition(storage_url, "billing")
    assert stored is not None and stored.shard_count == 2
    assert api.get("/api/v1/jobs").json() == []


# --------------------------------------------------------------------- read tokens

TOKENS = (("ops", "admin"), ("dash", "read"))


def add_token(file: Path, name: str, role: str) -> str:
    """`riverbed token add FILE NAME --role ROLE`: the token it prints."""
    added = CliRunner().invoke(cli, ["token", "add", str(file), name, "--role", role])
    assert added.exit_code == 0, added.output
    return added.stdout.strip()


def test_a_read_token_may_not_write_and_nothing_changes(storage_url: str, tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    admin_token, read_token = (add_token(file, name, role) for name, role in TOKENS)
    with AdminApi(storage_url, token_file=file) as admin, admin.client(admin_token) as ops:
        make_topic(ops, 4)
        made = {"name": "billing", "topic": "orders", "endpoint": {"url": "m:f"}}
        assert ops.post("/api/v1/subscriptions", json=made).status_code == 201
        with admin.client(read_token) as dash:
            for method, path, body in [
                ("POST", "/api/v1/topics/orders/storage-topics", {"partitions": 8}),
                ("POST", "/api/v1/topics/orders/switch-produce", None),
                ("POST", "/api/v1/subscriptions", {"name": "audit", "topic": "orders"}),
                ("DELETE", "/api/v1/subscriptions/billing", None),
                ("POST", "/api/v1/subscriptions/billing/reset", {"to": "latest"}),
                ("POST", "/api/v1/subscriptions/billing/reshard", {"shards": 2}),
            ]:
                refused = dash.request(method, path, json=body)
                assert refused.status_code == 403, (path, refused.text)
                assert "read role" in refused.json()["error"]
            assert dash.get("/api/v1/subscriptions/billing").json()["shards"] == 1
            assert [s["name"] for s in dash.get("/api/v1/subscriptions").json()] == ["billing"]
            assert len(dash.get("/api/v1/topics/orders").json()["storage_topics"]) == 1
            assert dash.get("/api/v1/jobs").json() == []
