"""One JSON log line on ``orchestrator.gateway.requests`` for every API request, however
it ends (generation, each kind of 4xx rejection, an engine failure), never two, none for
probes and scrapes; error details that the response withholds appear only here."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import EngineCore, EngineStep, FinishReason
from tests.gateway.support import MODEL, TimedExecutor, client_for, fake_core

pytestmark = pytest.mark.timeout(60)

LOGGER = "orchestrator.gateway.requests"


@pytest.fixture
def engine() -> tuple[EngineCore, TimedExecutor]:
    return fake_core()


@pytest.fixture
def client(engine: tuple[EngineCore, TimedExecutor]) -> Iterator[TestClient]:
    with client_for(engine[0], api_keys=["key"], max_body_bytes=2048) as c:
        yield c


AUTH = {"Authorization": "Bearer key"}


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_every_api_request_gets_exactly_one_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    ok = client.post("/v1/completions", json={"prompt": "w1", "max_tokens": 2}, headers=AUTH)
    invalid = client.post("/v1/completions", json={"prompt": "w1", "n": "2"}, headers=AUTH)
    no_model = client.post(
        "/v1/chat/completions",
        json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
        headers=AUTH,
    )
    unauthorised = client.post("/v1/completions", json={"prompt": "w1"})
    too_large = client.post("/v1/completions", json={"prompt": "w1 " * 2000}, headers=AUTH)
    wrong_method = client.get("/v1/completions", headers=AUTH)
    no_route = client.get("/v1/nothing", headers=AUTH)
    too_long = client.post(
        "/v1/completions", json={"prompt": "w1", "max_tokens": 256}, headers=AUTH
    )
    for probe in ("/health", "/ready", "/metrics"):
        assert client.get(probe).status_code == 200

    responses = [ok, invalid, no_model, unauthorised, too_large, wrong_method, no_route, too_long]
    assert [r.status_code for r in responses] == [200, 400, 404, 401, 413, 405, 404, 400]
    logged = lines(caplog)
    assert [e["request_id"] for e in logged] == [r.headers["x-request-id"] for r in responses]
    assert [e["status"] for e in logged] == [r.status_code for r in responses]
    assert logged[0]["endpoint"] == "completions" and logged[0]["completion_tokens"] == 2
    assert logged[1]["param"] == "n" and "n: " in logged[1]["error"]
    assert logged[2]["param"] == "model"
    assert "API key" in logged[3]["error"]
    assert logged[4]["path"] == "/v1/completions" and logged[4]["method"] == "POST"
    assert logged[7]["param"] == "max_tokens"
    assert all(e["total_s"] >= 0 for e in logged)


class FailsOneRequest(EngineCore):
    """Ends the first request it runs with an error whose text is internal."""

    def step(self) -> EngineStep:
        step = super().step()
        outputs = [
            msgspec.structs.replace(
                o, finished=True, finish_reason=FinishReason.ERROR, error="CUDA error 700"
            )
            for o in step.outputs
        ]
        for o in outputs:
            self.abort(o.request_id)
        return EngineStep(outputs, step.plan, step.start_time, step.duration_s, step.cost)


def test_an_engine_failure_is_logged_with_its_cause_and_answered_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    core, executor = fake_core()
    failing = FailsOneRequest(core.scheduler, executor, core.clock)
    with client_for(failing) as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "w1"})
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "the engine could not complete this request"
    assert "CUDA" not in r.text
    (entry,) = lines(caplog)
    assert entry["status"] == 500
    assert "CUDA error 700" in entry["error_detail"]
