"""``/openapi.json`` says what the server does: the error statuses it really answers, each
with OpenAI's error body (never FastAPI's 422), the prompt's four forms, the bounds the
API enforces, SSE as ``text/event-stream`` and ``/metrics`` as text. Each documented
error status of ``/v1/completions`` is also provoked, and its body checked against the
documented schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient

from orchestrator.gateway.lifecycle import GatewayLifecycle
from orchestrator.gateway.protocol.shared import (
    MAX_CHOICES,
    MAX_LOGPROBS,
    MAX_STOP_STRINGS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SEED_MAX,
    SEED_MIN,
)
from tests.gateway.support import client_for, fake_core, wait_until

pytestmark = pytest.mark.timeout(60)

GENERATION = ("/v1/completions", "/v1/chat/completions")
ERROR_STATUSES = ("400", "401", "404", "405", "413", "429", "500", "503")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    core, _ = fake_core(step_time_s=0.02, max_batch_size=1, max_waiting_requests=1)
    with client_for(core, api_keys=["key"], max_body_bytes=4096) as c:
        c.headers["Authorization"] = "Bearer key"
        yield c


@pytest.fixture(scope="module")
def spec(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    schema: dict[str, Any] = r.json()
    return schema


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def props(spec: dict[str, Any], name: str) -> dict[str, Any]:
    properties: dict[str, Any] = spec["components"]["schemas"][name]["properties"]
    return properties


def bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """The constraints of an optional field (the non-null member of its ``anyOf``)."""
    members = [m for m in schema.get("anyOf", [schema]) if m.get("type") != "null"]
    assert len(members) == 1, schema
    return members[0]


def test_no_422_and_no_fastapi_error_schema(spec: dict[str, Any]) -> None:
    text = json.dumps(spec)
    assert '"422"' not in text
    assert "HTTPValidationError" not in text


@pytest.mark.parametrize("path", GENERATION)
def test_generation_routes_document_their_statuses_and_media_types(
    spec: dict[str, Any], path: str
) -> None:
    responses = spec["paths"][path]["post"]["responses"]
    assert set(responses) == {"200", *ERROR_STATUSES}
    for status in ERROR_STATUSES:
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    content = responses["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    event = content["text/event-stream"]["schema"]
    assert event["properties"]["data"]["type"] == "string"
    header = spec["paths"][path]["post"]["parameters"][0]
    assert header["name"] == "X-Priority" and header["in"] == "header"
    assert bounds(header["schema"]) == {
        "type": "integer",
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
    }


def test_error_body_schema_is_openais(spec: dict[str, Any]) -> None:
    detail = resolve(spec, props(spec, "ErrorResponse")["error"])
    assert set(detail["properties"]) == {"message", "type", "param", "code"}


def test_prompt_forms_and_limits(spec: dict[str, Any]) -> None:
    prompt = props(spec, "CompletionRequest")["prompt"]
    forms = {json.dumps(m, sort_keys=True) for m in prompt["anyOf"]}
    kinds = {(m["type"], m.get("items", {}).get("type")) for m in prompt["anyOf"]}
    assert kinds == {
        ("string", None),
        ("array", "string"),
        ("array", "integer"),
        ("array", "array"),
    }
    assert len(forms) == 4
    completion = props(spec, "CompletionRequest")
    chat = props(spec, "ChatCompletionRequest")
    assert bounds(completion["n"])["maximum"] == MAX_CHOICES
    assert bounds(completion["logprobs"])["maximum"] == MAX_LOGPROBS
    assert bounds(chat["top_logprobs"])["maximum"] == MAX_LOGPROBS
    assert bounds(completion["priority"]) == {
        "type": "integer",
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
    }
    seed = bounds(completion["seed"])
    assert (seed["minimum"], seed["maximum"]) == (SEED_MIN, SEED_MAX)
    assert bounds(completion["max_tokens"])["maximum"] == 2**31 - 1
    assert bounds(completion["temperature"])["maximum"] == 2
    stop = next(m for m in completion["stop"]["anyOf"] if m.get("type") == "array")
    assert stop["maxItems"] == MAX_STOP_STRINGS
    assert spec["components"]["schemas"]["CompletionRequest"]["additionalProperties"] is False
    assert "continuous_usage_stats" in props(spec, "StreamOptions")
    usage = props(spec, "Usage")
    assert "prompt_tokens_details" in usage


def test_probes_and_metrics(spec: dict[str, Any]) -> None:
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain"}
    assert set(spec["paths"]["/ready"]["get"]["responses"]) == {"200", "503"}
    assert "401" in spec["paths"]["/v1/models"]["get"]["responses"]


def provoke(client: TestClient, status: int) -> Any:
    """A response of ``/v1/completions`` with that status."""
    ok = {"prompt": "w1 w2", "max_tokens": 2}
    if status == 400:
        return client.post("/v1/completions", json={**ok, "n": "2"})
    if status == 401:
        return client.post("/v1/completions", json=ok, headers={"Authorization": "Bearer no"})
    if status == 404:
        return client.post("/v1/completions", json={**ok, "model": "gpt-9"})
    if status == 405:
        return client.get("/v1/completions")
    if status == 413:
        return client.post("/v1/completions", json={**ok, "prompt": "w1 " * 3000})
    if status == 503:
        lifecycle: GatewayLifecycle = client.app.state.lifecycle  # type: ignore[attr-defined]
        lifecycle.in_flight.closed = True
        try:
            return client.post("/v1/completions", json=ok)
        finally:
            lifecycle.in_flight.closed = False
    assert status == 429
    long = {"prompt": "w1 w2", "max_tokens": 200, "stream": True}
    with client.stream("POST", "/v1/completions", json=long) as running:
        lines = running.iter_lines()  # keep a reference: dropping it closes the stream
        next(lines)
        with client.stream("POST", "/v1/completions", json=long) as waiting:
            assert waiting.status_code == 200
            wait_until(
                lambda: "orchestrator_num_requests_waiting 1.0" in client.get("/metrics").text
            )
            return client.post("/v1/completions", json=ok)


@pytest.mark.parametrize("status", [400, 401, 404, 405, 413, 429, 503])
def test_each_documented_error_is_answered_as_documented(
    client: TestClient, spec: dict[str, Any], status: int
) -> None:
    r = provoke(client, status)
    assert r.status_code == status, r.text
    documented = spec["paths"]["/v1/completions"]["post"]["responses"][str(status)]
    schema = {**documented["content"]["application/json"]["schema"], **spec}
    assert r.headers["content-type"].startswith("application/json")
    jsonschema_rs.validate(schema, r.json())


def test_the_stream_is_served_as_documented(client: TestClient) -> None:
    body = {"prompt": "w1 w2", "max_tokens": 2, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        r.read()
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
