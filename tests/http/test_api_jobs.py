"""Jobs of the admin API (`http/jobs.py`): the registry itself, with real
threads (a failing job, one job per target, the finished ones kept), and
`GET /jobs`, `GET /jobs/{id}` over real HTTP from a `riverbed admin`
subprocess on both backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.admin_api import AdminApi
from harness.waiting import eventually
from riverbed.errors import NotFound
from riverbed.http.errors import ApiError
from riverbed.http.jobs import Jobs, Progress
from riverbed.subscriptions.shards import InvalidShardCount


def settled(jobs: Jobs, job_id: str) -> dict[str, Any]:
    return eventually(
        lambda: (view := jobs.get(job_id))["status"] != "running" and view,
        what=f"job {job_id} to end",
    )


def test_a_job_reports_progress_and_its_result() -> None:
    jobs = Jobs()
    step = threading.Event()

    def work(progress: Progress) -> dict[str, Any]:
        progress(1, 3)
        step.wait(30)
        progress(3, 3)
        return {"moved": 3}

    started = jobs.start("reset", "audit", work)
    assert started["status"] == "running" and started["finished"] is None
    eventually(lambda: jobs.get(started["id"])["progress"] == {"done": 1, "total": 3})
    step.set()
    done = settled(jobs, started["id"])
    assert done["status"] == "succeeded" and done["result"] == {"moved": 3}
    assert done["progress"] == {"done": 3, "total": 3} and done["error"] is None
    assert done["finished"] >= done["created"]


def test_a_finished_job_without_a_total_counts_what_it_did() -> None:
    jobs = Jobs()
    started = jobs.start("reset", "audit", lambda progress: {})
    assert settled(jobs, started["id"])["progress"] == {"done": 0, "total": 0}


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (InvalidShardCount("3 shards do not divide 4"), "3 shards do not divide 4"),
        (KeyError("lost"), "KeyError: 'lost'"),
    ],
)
def test_a_failing_job_records_the_message_without_a_traceback(
    error: Exception, message: str
) -> None:
    jobs = Jobs()

    def work(progress: Progress) -> dict[str, Any]:
        raise error

    done = settled(jobs, jobs.start("reshard", "billing", work)["id"])
    assert done["status"] == "failed" and done["result"] is None
    assert done["error"] == message  # no traceback
    assert done["finished"] is not None


def test_one_job_at_a_time_per_target() -> None:
    jobs = Jobs()
    release = threading.Event()
    first = jobs.start("reshard", "billing", lambda progress: {"waited": release.wait(30)})
    with pytest.raises(ApiError) as refused:
        jobs.start("reset", "billing", lambda progress: {})
    assert refused.value.status == 409 and first["id"] in str(refused.value)
    other = jobs.start("reset", "audit", lambda progress: {})  # another target may run
    release.set()
    assert settled(jobs, first["id"])["status"] == "succeeded"
    assert settled(jobs, other["id"])["status"] == "succeeded"
    again = jobs.start("reset", "billing", lambda progress: {})
    assert settled(jobs, again["id"])["status"] == "succeeded"


def test_the_last_finished_jobs_are_kept_newest_first() -> None:
    jobs = Jobs(keep=3)
    ids = []
    for n in range(5):
        ids.append(jobs.start("reset", f"s{n}", lambda progress: {})["id"])
        settled(jobs, ids[-1])
    assert [j["id"] for j in jobs.views()] == ids[:1:-1]
    with pytest.raises(NotFound, match="not known here"):
        jobs.get(ids[0])


# --------------------------------------------------------------------- over HTTP


@pytest.fixture
def api(storage_url: str) -> Iterator[httpx.Client]:
    with AdminApi(storage_url) as admin, admin.client() as client:
        yield client


def test_jobs_are_listed_newest_first_and_read_one_by_one(api: httpx.Client) -> None:
    assert api.get("/api/v1/jobs").json() == []
    topic = {"name": "orders", "partitions": 1}
    assert api.post("/api/v1/topics", json=topic).status_code == 201
    started = []
    for name in ("audit", "report"):
        made = api.post("/api/v1/subscriptions", json={"name": name, "topic": "orders"})
        assert made.status_code == 201, made.text
        answer = api.post(f"/api/v1/subscriptions/{name}/reset", json={"to": "latest"})
        assert answer.status_code == 202, answer.text
        assert answer.headers["location"] == f"/api/v1/jobs/{answer.json()['id']}"
        started.append(answer.json())
    for job in started:
        eventually(
            lambda job=job: api.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "succeeded",
            what=f"job {job['id']} to succeed",
        )
    listed = api.get("/api/v1/jobs").json()
    assert [(j["id"], j["target"]) for j in listed] == [
        (started[1]["id"], "report"),
        (started[0]["id"], "audit"),
    ]
    one = api.get(f"/api/v1/jobs/{started[0]['id']}").json()
    assert set(one) == {
        *("id", "kind", "target", "status", "progress"),
        *("result", "error", "created", "finished"),
    }
    missing = api.get("/api/v1/jobs/nothing-like-it")
    assert missing.status_code == 404
    assert "nothing-like-it" in missing.json()["error"]


def test_openapi_lists_the_new_endpoints(api: httpx.Client) -> None:
    paths = api.get("/api/v1/openapi.json").json()["paths"]
    for path, method in [
        ("/api/v1/topics/{name}/storage-topics", "post"),
        ("/api/v1/topics/{name}/switch-produce", "post"),
        ("/api/v1/subscriptions", "post"),
        ("/api/v1/subscriptions/{name}", "delete"),
        ("/api/v1/subscriptions/{name}/reset", "post"),
        ("/api/v1/subscriptions/{name}/reshard", "post"),
        ("/api/v1/subscriptions/{name}/dlq", "get"),
        ("/api/v1/subscriptions/{name}/dlq/{message_id}", "get"),
        ("/api/v1/subscriptions/{name}/dlq/replay", "post"),
        ("/api/v1/subscriptions/{name}/dlq/purge", "post"),
        ("/api/v1/jobs", "get"),
        ("/api/v1/jobs/{job_id}", "get"),
    ]:
        operation = paths.get(path, {}).get(method)
        assert operation is not None, (path, method)
        assert operation["summary"] and operation["tags"], (path, method)
