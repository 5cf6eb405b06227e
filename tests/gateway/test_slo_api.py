"""SLO classes at the API: the ``slo_class`` field and ``X-SLO-Class`` header, 400s that
name the field, SLO admission's 429 with its reason code and computed Retry-After, and
the prediction-error and regretted-refusal metrics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi.testclient import TestClient

from orchestrator.core.request import Request
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from tests.factories import constant_step_time
from tests.gateway.support import MODEL, client_for, fake_core, fake_loader, wait_until

CLASSES = {
    "interactive": {"ttft_ms": 100, "tpot_ms": 1000},
    "batch": {"ttft_ms": 60_000, "tpot_ms": 1000},
}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "w1 w2 w3", "max_tokens": 3, **extra}


def slo_core(step_s: float, **scheduler: Any):  # type: ignore[no-untyped-def]
    core, _ = fake_core(
        predictor=constant_step_time(step_s),
        slo_classes=CLASSES,
        default_slo_class="batch",
        admission={"type": "slo"},
        **scheduler,
    )
    return core


def test_an_unknown_class_is_a_400_naming_the_field() -> None:
    with client_for(slo_core(0.001)) as client:
        r = client.post("/v1/completions", json=body(slo_class="gold"))
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "slo_class" and "unknown SLO class 'gold'" in error["message"]
        r = client.post("/v1/completions", json=body(), headers={"X-SLO-Class": "gold"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "slo_class"
        r = client.post("/v1/completions", json=body(), headers={"X-SLO-Class": "x" * 65})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-SLO-Class"


def test_slo_admission_refuses_with_code_and_computed_retry_after() -> None:
    # Every step is predicted at 5 s and runs 16 tokens: an interactive request (100 ms)
    # with a 40-token prompt cannot make it. (A prompt that fits one step is admitted
    # at an idle server whatever the prediction: nothing could serve it sooner.)
    prompt = " ".join(f"w{i}" for i in range(40))
    with client_for(slo_core(5.0, max_num_tokens=16, chunk_size=16, max_batch_size=4)) as client:
        r = client.post("/v1/completions", json=body(slo_class="interactive", prompt=prompt))
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "ttft_unattainable"
        # predicted 15 s (three steps) - 0.1 s target = 14.9 s, in whole seconds.
        assert r.headers["retry-after"] == "15"
        # The header picks the class too; batch's 60 s target admits it.
        headers = {"X-SLO-Class": "batch"}
        ok = client.post("/v1/completions", json=body(prompt=prompt), headers=headers)
        assert ok.status_code == 200
        text = client.get("/metrics").text
        refused = (
            'orchestrator_slo_rejections_total{code="ttft_unattainable",slo_class="interactive"}'
        )
        assert f"{refused} 1.0" in text


def test_prediction_errors_are_exported() -> None:
    with client_for(slo_core(0.001)) as client:
        assert client.post("/v1/completions", json=body()).status_code == 200
        text = client.get("/metrics").text
        assert "orchestrator_step_time_prediction_error " in text
        assert "orchestrator_ttft_prediction_error " in text
        assert "orchestrator_ttft_prediction_error_by_class{slo_class=" in text
        assert "orchestrator_requests_shed_total 0.0" in text


def test_regretted_refusals_are_exported_per_class() -> None:
    # One waiting prompt token allowed: every prompt is refused (queue_tokens_full) at an
    # idle server, where its first token would have come within the batch class's 60 s.
    with client_for(slo_core(0.001, max_waiting_tokens=1)) as client:
        r = client.post("/v1/completions", json=body())
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_tokens_full"
        line = 'orchestrator_admission_regretted_refusals_total{slo_class="batch"} 1.0'
        wait_until(lambda: line in client.get("/metrics").text)


def test_a_request_shed_past_its_deadline_is_a_503_with_the_reason_code() -> None:
    # One sequence at a time, 50 ms steps: a 40-token request holds the batch for about
    # 2 s while a second, interactive one (100 ms target) waits past its deadline.
    core, _ = fake_core(
        step_time_s=0.05,
        max_batch_size=1,
        slo_classes=CLASSES,
        default_slo_class="batch",
        admission={"type": "queue_limits", "shed_after_deadline_s": 0.0},
    )
    with client_for(core) as client, ThreadPoolExecutor(1) as pool:
        long = pool.submit(client.post, "/v1/completions", json=body(max_tokens=40))
        time.sleep(0.3)  # the long request is running
        r = client.post("/v1/completions", json=body(slo_class="interactive"))
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "ttft_deadline_passed" and "TTFT deadline" in error["message"]
        assert long.result(timeout=30).status_code == 200
        assert "orchestrator_requests_shed_total 1.0" in client.get("/metrics").text


def test_a_tenant_default_class_comes_between_the_request_and_the_default() -> None:
    core = slo_core(0.001)
    config = ServeConfig.model_validate(
        {
            "model": {"name": MODEL, "max_model_len": 256},
            "scheduler": {"slo_classes": CLASSES, "default_slo_class": "batch"},
            "executor": {"type": "sim"},
            "server": {"tenant_slo_classes": {"nightly": "interactive"}},
        }
    )
    classes: list[str | None] = []
    add = core.scheduler.add_request

    def record(request: Request, now: float | None = None) -> None:
        add(request, now)
        classes.append(request.slo_class)

    core.scheduler.add_request = record  # type: ignore[method-assign]
    with TestClient(create_app(config, fake_loader(core), {})) as client:
        wait_until(lambda: client.get("/ready").status_code == 200)
        for extra in ({"user": "nightly", "slo_class": "batch"}, {"user": "nightly"}, {}):
            assert client.post("/v1/completions", json=body(**extra)).status_code == 200
    # The request's own class, then its tenant's (the gateway), then the default (the core).
    assert classes == ["batch", "interactive", "batch"]
