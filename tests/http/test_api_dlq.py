"""The admin API's dead-letter queue routes (`/subscriptions/{name}/dlq...`), over
real HTTP from a `riverbed admin` subprocess, on both backends. Messages are
parked the real way: subscription `billing` delivers to a local HTTP endpoint
that answers 400 to groups g1 and g2 (not retried), driven batch by batch
(`harness/delivery.py`); a replay is delivered again once the endpoint heals."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from harness.admin_api import AdminApi
from harness.databases import BACKENDS, fresh_database
from harness.delivery import Driver, by_group, produce_groups, subscribe
from harness.endpoint import Endpoint
from harness.waiting import eventually
from riverbed.cli import cli
from riverbed.storage import open_storage
from riverbed.storage.base import Storage


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    with Endpoint() as running:
        yield running


def park(storage: Storage, endpoint: Endpoint) -> Driver:
    """`billing` (2 shards, grouped) with g1's and g2's messages 0 and 1
    parked: its driver, run until idle (the caller closes it)."""
    subscribe(storage, endpoint.url)
    produce_groups(storage, 3, 0, 2)
    endpoint.fail(b"g1:", 400)
    endpoint.fail(b"g2:", 400)
    running = Driver(storage, "billing")
    running.until_idle()
    return running


@pytest.fixture
def delivery(storage: Storage, endpoint: Endpoint) -> Iterator[Driver]:
    running = park(storage, endpoint)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def api(storage_url: str, delivery: Driver) -> Iterator[httpx.Client]:
    with AdminApi(storage_url) as admin, admin.client() as client:
        yield client


@pytest.fixture(scope="module", params=BACKENDS)
def unchanged(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A refusal changes nothing, so the refusal tests' cases share one parked
    `billing` (as `delivery` makes it), a subscription `audit` that delivers
    nothing, and one `riverbed admin` (per backend); each case checks that
    nothing changed."""
    with contextlib.ExitStack() as stack:
        url = fresh_database(request, tmp_path_factory, stack, "dlq")
        storage = open_storage(url)
        try:
            with Endpoint() as endpoint:
                park(storage, endpoint).close()
        finally:
            storage.close()
        admin = stack.enter_context(AdminApi(url))
        client = stack.enter_context(admin.client())
        made = client.post("/api/v1/subscriptions", json={"name": "audit", "topic": "orders"})
        assert made.status_code == 201, made.text
        yield client


def nothing_changed(api: httpx.Client) -> None:
    assert listed(api)["total"] == 4
    assert api.get("/api/v1/jobs").json() == []


DLQ = "/api/v1/subscriptions/billing/dlq"


def listed(api: httpx.Client, **params: Any) -> dict[str, Any]:
    answer = api.get(DLQ, params=params)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def finished(api: httpx.Client, answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 202, answer.text

    def done() -> dict[str, Any] | None:
        view: dict[str, Any] = api.get(answer.headers["location"]).json()
        assert view["status"] != "failed", view
        return view if view["status"] == "succeeded" else None

    return eventually(done, what="the job to succeed")


def test_list_by_group_id_time_and_page(api: httpx.Client) -> None:
    everything = listed(api)
    assert everything["subscription"] == "billing" and everything["total"] == 4
    messages = everything["messages"]
    assert sorted(m["key"] for m in messages) == ["g1", "g1", "g2", "g2"]
    first = messages[0]
    assert first["error"] == "HTTP 400" and first["attempts"] == 1
    assert first["size"] == len(f"{first['key']}:0:") and first["mqtt_topic"] == "orders/new"
    assert first["stream"].startswith("billing.dlq/") and first["failed_at"].endswith("Z")
    assert [m["key"] for m in listed(api, group="g1")["messages"]] == ["g1", "g1"]
    both = listed(api, group=["g1", "g2"])
    assert both["total"] == 4
    one = messages[2]["id"]
    assert [m["id"] for m in listed(api, message_id=one)["messages"]] == [one]
    page = listed(api, limit=3, page=2)
    assert page["total"] == 4 and [m["id"] for m in page["messages"]] == [messages[3]["id"]]
    assert listed(api, since="2999-01-01T00:00:00Z") == {
        "subscription": "billing",
        "messages": [],
        "total": 0,
    }
    assert listed(api, until="2999-01-01T00:00:00Z")["total"] == 4


def test_show_one_with_its_payload(api: httpx.Client) -> None:
    one = next(m for m in listed(api)["messages"] if m["key"] == "g2")
    shown = api.get(f"{DLQ}/{one['id']}")
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["id"] == one["id"] and body["key"] == "g2"
    assert body["payload"] in ("g2:0:", "g2:1:")
    assert isinstance(body["properties"], list)


@pytest.mark.parametrize(
    ("path", "params", "code", "words"),
    [
        (DLQ, {"since": "yesterday"}, 422, "since: time 'yesterday' is not an ISO 8601 time"),
        (DLQ, {"until": "soon"}, 422, "until:"),
        (DLQ, {"message_id": "xyz"}, 422, "message_id: message id 'xyz'"),
        (DLQ, {"limit": 0}, 422, "limit"),
        (DLQ, {"page": "two"}, 422, "page"),
        ("/api/v1/subscriptions/nobody/dlq", {}, 404, "nobody"),
        ("/api/v1/subscriptions/audit/dlq", {}, 404, "'audit' does not deliver"),
        (f"{DLQ}/{'0' * 32}", {}, 404, "is not parked"),
        (f"{DLQ}/xyz", {}, 422, "message id 'xyz'"),
    ],
)
def test_bad_reads_are_refused_naming_the_field(
    unchanged: httpx.Client, path: str, params: dict[str, Any], code: int, words: str
) -> None:
    refused = unchanged.get(path, params=params)
    assert refused.status_code == code, refused.text
    assert words in refused.json()["error"], refused.json()
    nothing_changed(unchanged)


def test_replay_is_a_job_and_the_replayed_are_delivered_again(
    api: httpx.Client, delivery: Driver, endpoint: Endpoint
) -> None:
    endpoint.heal()
    job = finished(api, api.post(f"{DLQ}/replay", json={"groups": ["g1"]}))
    assert (job["kind"], job["target"]) == ("dlq-replay", "billing")
    assert job["result"]["replayed"] == 2 and job["result"]["selected"] == 2
    assert job["progress"] == {"done": 2, "total": 2}  # one step per shard
    left = listed(api)
    assert left["total"] == 2 and {m["key"] for m in left["messages"]} == {"g2"}
    delivery.until_idle()
    delivered = by_group(endpoint.delivered())
    assert delivered["g1"] == [0, 1]
    assert "g2" not in delivered
    assert api.get("/api/v1/subscriptions/billing").json()["dead_letter_queue"] == 2


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({}, 422, "not both and not neither"),
        ({"all": True, "groups": ["g1"]}, 422, "not both and not neither"),
        ({"since": "yesterday"}, 422, "since: time 'yesterday'"),
        ({"message_ids": ["xyz"]}, 422, "message_ids: message id 'xyz'"),
        ({"message_ids": ["0" * 32]}, 404, "are not parked"),
        ({"all": True, "colour": "blue"}, 422, "colour"),
    ],
)
@pytest.mark.parametrize("verb", ["replay", "purge"])
def test_bad_replay_or_purge_is_refused_and_nothing_changes(
    unchanged: httpx.Client, verb: str, body: dict[str, Any], code: int, words: str
) -> None:
    refused = unchanged.post(f"{DLQ}/{verb}", json=body)
    assert refused.status_code == code, refused.text
    assert words in refused.json()["error"], refused.json()
    nothing_changed(unchanged)


def test_purge_drops_the_selected_with_the_earlier_of_their_groups(api: httpx.Client) -> None:
    g2 = [m for m in listed(api, group="g2")["messages"]]
    later = next(m for m in g2 if api.get(f"{DLQ}/{m['id']}").json()["payload"] == "g2:1:")
    purged = api.post(f"{DLQ}/purge", json={"message_ids": [later["id"]]})
    assert purged.status_code == 200, purged.text
    body = purged.json()
    # Grouped: g2's earlier parked message leaves with it, in order.
    assert (body["purged"], body["selected"], body["earlier_of_their_groups"]) == (2, 1, 1)
    assert {m["key"] for m in listed(api)["messages"]} == {"g1"}
    everything = api.post(f"{DLQ}/purge", json={"all": True})
    assert everything.status_code == 200 and everything.json()["purged"] == 2
    assert listed(api)["total"] == 0


def test_a_read_token_may_not_replay_or_purge(
    storage_url: str, delivery: Driver, tmp_path: Path
) -> None:
    file = tmp_path / "tokens"
    added = CliRunner().invoke(cli, ["token", "add", str(file), "dash", "--role", "read"])
    assert added.exit_code == 0, added.output
    with (
        AdminApi(storage_url, token_file=file) as admin,
        admin.client(added.stdout.strip()) as dash,
    ):
        for verb in ("replay", "purge"):
            refused = dash.post(f"{DLQ}/{verb}", json={"all": True})
            assert refused.status_code == 403, refused.text
        assert dash.get(DLQ).json()["total"] == 4
        assert dash.get("/api/v1/jobs").json() == []
