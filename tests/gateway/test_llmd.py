"""The gateway as an llm-d model server: the SLO, fairness and objective headers llm-d's
endpoint picker passes change admission, ordering and tenancy as configured; a
malformed one is a 400 naming it; refusals carry llm-d's dropped-reason header; and
/metrics has vLLM's cache info gauge."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.core.request import Request
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.errors import DROPPED_REASON_HEADER
from tests.factories import constant_step_time
from tests.gateway.support import MODEL, fake_core, fake_loader, wait_until

CLASSES = {
    "interactive": {"ttft_ms": 100, "tpot_ms": 1000},
    "batch": {"ttft_ms": 60_000, "tpot_ms": 1000},
}
OBJECTIVES = {
    "premium": {"priority": -5, "slo_class": "interactive"},
    "sheddable": {"priority": 5},
}
TTFT, TPOT = "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"
FAIRNESS, OBJECTIVE = "x-llm-d-inference-fairness-id", "x-llm-d-inference-objective"


def prompt_40(first: int) -> str:
    """40 tokens from ``w<first>`` on (distinct prompts: no prefix-cache hits)."""
    return " ".join(f"w{i}" for i in range(first, first + 40))


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "w1 w2 w3", "max_tokens": 3, **extra}


@contextlib.contextmanager
def client_for(core: Any, **server: Any) -> Iterator[TestClient]:
    """The app over ``core`` with the test's SLO classes (default ``batch``) and llm-d
    objectives in its serve config, once ready."""
    config = ServeConfig.model_validate(
        {
            "model": {"name": MODEL, "max_model_len": 256},
            "scheduler": {"slo_classes": CLASSES, "default_slo_class": "batch"},
            "executor": {"type": "sim"},
            "server": {"objectives": OBJECTIVES, **server},
        }
    )
    with TestClient(create_app(config, fake_loader(core), {})) as client:
        wait_until(lambda: client.get("/ready").status_code == 200)
        yield client


def recorded(core: Any) -> list[Request]:
    """Every request the scheduler accepts, as it was queued."""
    seen: list[Request] = []
    add = core.scheduler.add_request

    def record(request: Request, now: float | None = None) -> None:
        add(request, now)
        seen.append(request)

    core.scheduler.add_request = record
    return seen


def first_scheduled(executor: Any) -> list[int]:
    """The first prompt token of each request, in the order the executor first runs it."""
    order: list[int] = []
    seen: set[str] = set()
    execute = executor.execute

    def record(plan: SchedulerOutput) -> StepResult:
        for s in plan.scheduled:
            if s.request_id not in seen:
                seen.add(s.request_id)
                order.append(s.token_ids[0])
        return execute(plan)  # type: ignore[no-any-return]

    executor.execute = record
    return order


def served_behind_a_long_request(
    client: TestClient, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """Queue ``first`` then ``second`` (``(body, headers)`` as keyword arguments of a
    POST) while one long request holds the only batch slot, and wait for all three."""
    engine = client.app.state.lifecycle.engine  # type: ignore[attr-defined]
    with ThreadPoolExecutor(3) as pool:
        # 200 steps of 10 ms: time enough to queue both before it ends.
        long = pool.submit(client.post, "/v1/completions", json=body(prompt="w900", max_tokens=200))
        wait_until(lambda: engine.stats().num_running == 1)
        a = pool.submit(client.post, "/v1/completions", **first)
        wait_until(lambda: engine.stats().num_waiting == 1)
        b = pool.submit(client.post, "/v1/completions", **second)
        wait_until(lambda: engine.stats().num_waiting == 2)
        for future in (long, a, b):
            assert future.result(timeout=60).status_code == 200


# ---------------------------------------------------------------- SLO targets


def slo_admission_core(**admission: Any) -> Any:
    # Every step is predicted at 5 s and runs 16 tokens: a 40-token prompt's first token
    # is predicted 15 s out, which the default class (60 s) admits.
    core, _ = fake_core(
        predictor=constant_step_time(5.0),
        slo_classes=CLASSES,
        default_slo_class="batch",
        admission={"type": "slo", **admission},
        max_num_tokens=16,
        chunk_size=16,
        max_batch_size=4,
    )
    return core


@pytest.mark.parametrize("header", [TTFT, "x-slo-ttft-ms"])
def test_a_tight_ttft_header_sheds_a_request_its_class_admits(header: str) -> None:
    with client_for(slo_admission_core()) as client:
        assert client.post("/v1/completions", json=body(prompt=prompt_40(0))).status_code == 200
        r = client.post(
            "/v1/completions", json=body(prompt=prompt_40(100)), headers={header: "500"}
        )
        assert r.status_code == 429
        error = r.json()["error"]
        assert error["code"] == "ttft_unattainable"
        assert "500 ms target set by the request" in error["message"]
        # predicted 15 s (three steps) - the request's own 0.5 s = 14.5 s, in whole seconds.
        assert r.headers["retry-after"] == "15"
        assert r.headers[DROPPED_REASON_HEADER] == "rejected-saturated"


def test_a_request_with_its_own_target_is_refused_rather_than_downgraded() -> None:
    with client_for(slo_admission_core(downgrade_to="batch")) as client:
        # Its class's 100 ms cannot be met; the batch class's 60 s can: downgraded.
        plain = body(prompt=prompt_40(0), slo_class="interactive")
        assert client.post("/v1/completions", json=plain).status_code == 200
        # Its own 500 ms would be its target in any class: moving it cannot help.
        own = body(prompt=prompt_40(100), slo_class="interactive")
        r = client.post("/v1/completions", json=own, headers={TTFT: "500"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "ttft_unattainable"


def test_a_queue_full_refusal_carries_the_dropped_reason_too() -> None:
    core, _ = fake_core(step_time_s=0.01, max_batch_size=1, max_waiting_requests=1)
    with client_for(core) as client, ThreadPoolExecutor(2) as pool:
        engine = client.app.state.lifecycle.engine  # type: ignore[attr-defined]
        long = pool.submit(client.post, "/v1/completions", json=body(max_tokens=200))
        wait_until(lambda: engine.stats().num_running == 1)
        queued = pool.submit(client.post, "/v1/completions", json=body())
        wait_until(lambda: engine.stats().num_waiting == 1)
        r = client.post("/v1/completions", json=body())
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert r.headers[DROPPED_REASON_HEADER] == "rejected-saturated"
        assert "retry-after" in r.headers
        assert long.result(timeout=60).status_code == queued.result(timeout=60).status_code == 200


def test_the_targets_reach_the_engine_and_override_the_class_per_request() -> None:
    core, _ = fake_core(slo_classes=CLASSES, default_slo_class="batch")
    queued = recorded(core)
    with client_for(core) as client:
        headers = {TTFT: "250", TPOT: "40.5"}
        assert client.post("/v1/completions", json=body(), headers=headers).status_code == 200
        assert client.post("/v1/completions", json=body()).status_code == 200
        assert client.post("/v1/completions", json=body(), headers={TPOT: "20"}).status_code == 200
    own, default, tpot_only = queued
    assert own.slo_class == "batch"
    assert own.ttft_target_s == pytest.approx(0.25) and own.tpot_target_s == pytest.approx(0.0405)
    assert own.ttft_deadline == pytest.approx(own.arrival_time + 0.25)
    assert default.ttft_target_s == pytest.approx(60.0) and default.tpot_target_s == 1.0
    # One header replaces one target; the other stays the class's.
    assert tpot_only.ttft_target_s == pytest.approx(60.0)
    assert tpot_only.tpot_target_s == pytest.approx(0.02)


def test_a_ttft_header_moves_a_later_request_ahead_in_deadline_order() -> None:
    core, executor = fake_core(
        step_time_s=0.01,
        max_batch_size=1,
        policy="slo",
        preempt_for_priority=False,
        slo_classes=CLASSES,
        default_slo_class="batch",
    )
    order = first_scheduled(executor)
    with client_for(core) as client:
        served_behind_a_long_request(
            client,
            {"json": body(prompt="w11 w12")},
            {"json": body(prompt="w21 w22"), "headers": {TTFT: "100"}},
        )
    # The later request's own 100 ms deadline is earlier than the first one's 60 s.
    assert order == [900, 21, 11]


def test_a_ttft_target_without_any_class_makes_the_request_sheddable() -> None:
    # One sequence at a time: a request with its own 100 ms target (no class configured
    # at all) waits past its deadline behind a long one and is ended with a 503.
    core, _ = fake_core(
        step_time_s=0.01,
        max_batch_size=1,
        admission={"type": "queue_limits", "shed_after_deadline_s": 0.0},
    )
    config = ServeConfig.model_validate(
        {"model": {"name": MODEL, "max_model_len": 256}, "executor": {"type": "sim"}}
    )
    with TestClient(create_app(config, fake_loader(core), {})) as client:
        wait_until(lambda: client.get("/ready").status_code == 200)
        engine = client.app.state.lifecycle.engine  # type: ignore[attr-defined]
        with ThreadPoolExecutor(1) as pool:
            long = pool.submit(client.post, "/v1/completions", json=body(max_tokens=200))
            wait_until(lambda: engine.stats().num_running == 1)
            r = client.post("/v1/completions", json=body(), headers={TTFT: "100"})
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "ttft_deadline_passed" and "its own target" in error["message"]
            assert r.headers[DROPPED_REASON_HEADER] == "evicted"
            assert long.result(timeout=60).status_code == 200


# ---------------------------------------------------------------- objectives and fairness


def test_the_objective_sets_priority_and_class_below_the_requests_own_fields() -> None:
    core, _ = fake_core(slo_classes=CLASSES, default_slo_class="batch")
    queued = recorded(core)
    with client_for(core) as client:
        cases: list[tuple[dict[str, Any], dict[str, str]]] = [
            ({}, {OBJECTIVE: "premium"}),
            ({}, {"x-gateway-inference-objective": "sheddable"}),  # the deprecated name
            ({"priority": 2, "slo_class": "batch"}, {OBJECTIVE: "premium"}),
            ({}, {OBJECTIVE: "premium", "X-Priority": "1", "X-SLO-Class": "batch"}),
            # A name llm-d's picker routed but this server does not map: the defaults.
            ({}, {OBJECTIVE: "no-such-objective"}),
        ]
        for extra, headers in cases:
            r = client.post("/v1/completions", json=body(**extra), headers=headers)
            assert r.status_code == 200, r.text
    assert [(r.priority, r.slo_class) for r in queued] == [
        (-5, "interactive"),
        (5, "batch"),
        (2, "batch"),
        (1, "batch"),
        (0, "batch"),
    ]


def test_the_objective_changes_the_order_two_queued_requests_are_served() -> None:
    core, executor = fake_core(
        step_time_s=0.01,
        max_batch_size=1,
        policy="priority",
        preempt_for_priority=False,
        slo_classes=CLASSES,
        default_slo_class="batch",
    )
    order = first_scheduled(executor)
    with client_for(core) as client:
        served_behind_a_long_request(
            client,
            {"json": body(prompt="w11 w12"), "headers": {OBJECTIVE: "sheddable"}},
            {"json": body(prompt="w21 w22"), "headers": {OBJECTIVE: "premium"}},
        )
    assert order == [900, 21, 11]


def test_an_objective_naming_an_unknown_class_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"server\.objectives\.gold\.slo_class: 'gold'"):
        ServeConfig.model_validate(
            {
                "executor": {"type": "sim"},
                "server": {"objectives": {"gold": {"slo_class": "gold"}}},
            }
        )


def test_the_fairness_id_is_the_tenant_below_the_api_key_and_above_user() -> None:
    core, _ = fake_core()
    queued = recorded(core)
    with client_for(core) as client:
        cases: list[tuple[dict[str, Any], dict[str, str]]] = [
            ({}, {FAIRNESS: "team-a"}),
            ({"user": "alice"}, {FAIRNESS: "team-a"}),
            ({}, {FAIRNESS: "team-a", "Authorization": "Bearer key-1"}),
            ({}, {"x-gateway-inference-fairness-id": "team-b"}),  # the deprecated name
            ({"user": "alice"}, {}),
        ]
        for extra, headers in cases:
            assert client.post("/v1/completions", json=body(**extra), headers=headers).is_success
    assert [r.tenant for r in queued] == ["team-a", "team-a", "key-1", "team-b", "alice"]


def test_the_current_header_name_wins_over_its_deprecated_alias() -> None:
    core, _ = fake_core()
    queued = recorded(core)
    with client_for(core) as client:
        headers = {
            FAIRNESS: "new",
            "x-gateway-inference-fairness-id": "old",
            TTFT: "500",
            "x-slo-ttft-ms": "not even a number",
        }
        assert client.post("/v1/completions", json=body(), headers=headers).status_code == 200
    (request,) = queued
    assert request.tenant == "new" and request.ttft_target_s == pytest.approx(0.5)


# ---------------------------------------------------------------- invalid values


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TTFT, "soon"),
        (TTFT, "-5"),
        (TTFT, "0"),
        (TTFT, "nan"),
        (TTFT, "inf"),
        (TTFT, "3600001"),  # over an hour: a typo, as the config's classes rule it
        ("x-slo-ttft-ms", "fast"),
        (TPOT, "1e9"),
        (TPOT, ""),
        (FAIRNESS, ""),
        (FAIRNESS, "x" * 254),
        (OBJECTIVE, "tab\there"),
    ],
)
def test_a_malformed_header_is_a_400_naming_it(header: str, value: str) -> None:
    core, _ = fake_core()
    queued = recorded(core)
    with client_for(core) as client:
        for path, payload in (
            ("/v1/completions", body()),
            (
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            ),
        ):
            r = client.post(path, json=payload, headers={header: value})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == header and error["code"] == "invalid_value"
            assert error["message"].startswith(f"{header}: ")
        # Nothing was queued, and the next request is served as usual.
        assert queued == []
        assert client.post("/v1/completions", json=body()).status_code == 200


# ---------------------------------------------------------------- metrics


def test_metrics_export_vllms_cache_config_info() -> None:
    core, _ = fake_core(num_blocks=48)
    with client_for(core) as client:
        text = client.get("/metrics").text
    (line,) = [x for x in text.splitlines() if x.startswith("vllm:cache_config_info{")]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels == {
        "block_size": "16",
        "num_gpu_blocks": "48",
        "enable_prefix_caching": "True",
        "engine": "0",
    }
    assert float(line.rsplit(" ", 1)[1]) == 1.0
    assert "# TYPE vllm:cache_config_info gauge" in text
    for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
        assert f'vllm:{gauge}{{model_name="{MODEL}"}}' in text
