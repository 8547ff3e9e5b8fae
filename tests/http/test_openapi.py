"""The admin API against its own OpenAPI document, with schemathesis.

The document at `/api/v1/openapi.json` must load and pass schemathesis's own
validation. Then every operation the app exposes (whatever `make_app` includes:
no list of endpoints here) gets requests generated from what the document
declares, both ones that fit it and ones that deliberately do not, sent to the
app in-process over a temporary SQLite database that holds a topic with a
message and a subscription. No request may be answered with a server error
(an exception escaping a handler counts as one), and an answer with a status
the document declares must fit the schema declared for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from riverbed.http.app import make_app
from riverbed.http.context import HttpContext
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.subscriptions.named import Subscriptions

DOCUMENT = "/api/v1/openapi.json"
EXAMPLES = 25
"""Requests per operation and mode: enough to reach past the first rules of a
body, and the whole module stays within seconds on a busy machine."""


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    directory: Path = tmp_path_factory.mktemp("openapi")
    with Log.open(f"sqlite:///{directory}/riverbed.db") as log:
        # Lists then answer with records, not just [] (their shape is checked too).
        log.topics.create("orders", 4, binding="orders/#")
        log.produce("orders", [Message(payload=b"{}", key="c-1", mqtt_topic="orders/eu")])
        Subscriptions(log.storage).create("billing", "orders")
        yield make_app(HttpContext(log, node="schemathesis", settings={}))


@pytest.fixture(scope="module")
def api_schema(app: FastAPI) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi(DOCUMENT, app)


def test_the_document_is_valid_openapi(api_schema: schemathesis.BaseSchema) -> None:
    api_schema.validate()
    labels = [result.ok().label for result in api_schema.get_all_operations()]
    assert "GET /api/v1/topics" in labels


@pytest.mark.parametrize("mode", list(GenerationMode))
def test_no_generated_request_gets_a_server_error(
    api_schema: schemathesis.BaseSchema, mode: GenerationMode
) -> None:
    failures = []
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @given(operation.as_strategy(mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def requests(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        try:
            requests()
        except Unsatisfiable:
            # Nothing to get wrong: no body or query, and any text is a valid
            # path parameter (GET /healthz, GET /topics/{name}, ...).
            assert mode is GenerationMode.NEGATIVE, operation.label
        except Exception as exc:  # every operation is tried; all failures shown at once
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)


def call(app: FastAPI, method: str, path: str, body: object) -> tuple[httpx.Response, Any]:
    """Send one request to the app in-process; its answer, and `GET /api/v1/topics` after it."""

    async def send() -> tuple[httpx.Response, Any]:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            answer = await client.request(method, path, json=body)
            return answer, (await client.get("/api/v1/topics/orders")).json()

    return asyncio.run(send())


# Found by the test above: each of these escaped as a 500, or made the process
# allocate until the kernel killed it (partitions), before the fix.


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("partitions", 4 * 10**9, "partition count 4000000000 is more than the 65,536 allowed"),
        ("max_messages", 2**63, f"maximum of messages {2**63} is more than the largest"),
        ("max_bytes", "99999999999999999999TB", "maximum of bytes 99999999999999999999000000"),
        ("retention", "99999999999999999d", "retention 8639999999999999913600000000us is more"),
        ("max_age", "99999999999999999d", "maximum age 8639999999999999913600000000us is more"),
    ],
)
def test_a_topic_setting_beyond_what_storage_holds_is_refused(
    app: FastAPI, field: str, value: object, words: str
) -> None:
    body = {"name": "huge", "partitions": 4, field: value}
    answer, _ = call(app, "POST", "/api/v1/topics", body)
    assert answer.status_code == 422, answer.text
    assert words in answer.json()["error"]
    created, _ = call(app, "GET", "/api/v1/topics/huge", None)
    assert created.status_code == 404


def test_a_payload_b64_that_is_not_ascii_is_refused_naming_the_field(app: FastAPI) -> None:
    # base64 refuses non-ASCII text with a plain ValueError (also a traceback
    # from `riverbed produce`).
    path = "/api/v1/topics/orders/messages"
    answer, topic = call(app, "POST", path, {"payload_b64": "é"})
    assert answer.status_code == 422, answer.text
    assert 'payload_b64 "é" is not valid base64' in answer.json()["error"]
    streams = topic["streams"]
    assert sum(s["next_offset"] - s["start_offset"] for s in streams) == 1
