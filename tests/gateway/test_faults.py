"""Faults injected under the HTTP API (``tests/gateway/faults.py``): which requests end
with an error, that the others finish, that no KV block stays held, and what the server
does when the executor itself breaks. The policy these tests pin down is written in
docs/gateway.md ("Failures")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import EngineCore, Submission, WallClock
from orchestrator.gateway.lifecycle import GatewayLifecycle
from tests.factories import make_scheduler
from tests.gateway.faults import FAIL_MARKER, Faults, FaultyExecutor
from tests.gateway.support import (
    TimedExecutor,
    client_for,
    fake_config,
    fake_loader,
    metric,
    running_server,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

MARKED = f"w{FAIL_MARKER} w1 w2 w3"  # its first token is the marker
PLAIN = "w5 w1 w2 w3"


def faulty_core(faults: Faults, step_time_s: float = 0.005) -> tuple[EngineCore, FaultyExecutor]:
    executor = FaultyExecutor(TimedExecutor(64, 16, step_time_s), faults)
    scheduler = make_scheduler(num_blocks=64, block_size=16, max_model_len=256)
    return EngineCore(scheduler, executor, WallClock()), executor


def stream(client: TestClient | httpx.Client, prompt: str, max_tokens: int = 20) -> list[Any]:
    """A streamed completion's events: parsed chunks, then the literal ``[DONE]``."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]] + ["[DONE]"]


def all_blocks_free(core: EngineCore) -> None:
    wait_until(lambda: core.stats().kv_blocks_used == 0 and core.stats().num_running == 0)
    stats = core.stats()
    assert (stats.kv_blocks_used, stats.num_running, stats.num_waiting) == (0, 0, 0)


@pytest.fixture
def failing() -> Iterator[tuple[TestClient, EngineCore, FaultyExecutor]]:
    core, executor = faulty_core(Faults(fail_marker=FAIL_MARKER, fail_after_steps=3))
    with client_for(core) as client:
        yield client, core, executor


def test_failed_requests_end_with_an_error_event_and_the_rest_finish(
    failing: tuple[TestClient, EngineCore, FaultyExecutor],
) -> None:
    client, core, executor = failing
    prompts = [MARKED, PLAIN, MARKED, PLAIN]
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: stream(client, p), prompts))
    assert len(executor.log.failed) == 2
    for prompt, events in zip(prompts, results, strict=True):
        if prompt == MARKED:
            # Two tokens (prefill, one decode), then the step that fails it.
            assert len([e for e in events[:-2] if "choices" in e]) == 2
            error = events[-2]["error"]
            assert error["code"] == "generation_failed"
            assert "injected" not in error["message"]  # the executor's text stays internal
        else:
            assert "error" not in events[-2]
            assert events[-2]["choices"][0]["finish_reason"] == "length"
            assert len(events) == 20 + 1
    all_blocks_free(core)
    text = client.get("/metrics").text
    assert metric(text, "orchestrator_requests_total", 'finish_reason="error"') == 2
    assert metric(text, "orchestrator_requests_total", 'finish_reason="length"') == 2


def test_a_failed_whole_response_is_a_500_and_the_server_serves_on(
    failing: tuple[TestClient, EngineCore, FaultyExecutor],
) -> None:
    client, core, _ = failing
    r = client.post("/v1/completions", json={"prompt": MARKED, "max_tokens": 20})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "generation_failed"
    ok = client.post("/v1/completions", json={"prompt": PLAIN, "max_tokens": 5})
    assert ok.status_code == 200
    assert client.get("/ready").status_code == 200
    all_blocks_free(core)


def test_a_submission_that_raises_rejects_only_that_request() -> None:
    """``add_request`` raising a non-engine error (after touching the scheduler, as a
    half-applied submission would) must reject that request alone."""
    core, _ = faulty_core(Faults(), step_time_s=0.01)
    add = core.add_request

    def add_or_break(submission: Submission) -> None:
        add(submission)
        if submission.prompt_token_ids[0] == FAIL_MARKER:
            raise OverflowError("int too large to convert to float")

    core.add_request = add_or_break  # type: ignore[method-assign]
    with client_for(core) as client, ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream, client, PLAIN, 40)
        wait_until(lambda: core.stats().num_running == 1)
        bad = client.post("/v1/completions", json={"prompt": MARKED, "max_tokens": 5})
        assert bad.status_code == 500
        assert bad.json()["error"] == {
            "message": "the engine could not accept this request",
            "type": "internal_error",
            "param": None,
            "code": "submission_failed",
        }
        events = running.result(timeout=30)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert client.get("/ready").status_code == 200
        assert client.post("/v1/completions", json={"prompt": PLAIN}).status_code == 200
        all_blocks_free(core)  # the half-applied submission was dropped from the core


def test_a_broken_executor_stops_the_engine_and_every_request_hears_of_it() -> None:
    core, executor = faulty_core(Faults(raise_on_step=6), step_time_s=0.01)
    with client_for(core) as client:
        lifecycle: GatewayLifecycle = client.app.state.lifecycle  # type: ignore[attr-defined]
        with ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(stream, client, PLAIN, 100) for _ in range(2)]
            whole = pool.submit(
                client.post, "/v1/completions", json={"prompt": PLAIN, "max_tokens": 100}
            )
            results = [s.result(timeout=30) for s in streams]
            answer = whole.result(timeout=30)
        for events in results:
            assert events[-2]["error"]["type"] == "service_unavailable"
            assert events[-2]["error"]["message"] == "the engine stopped after an internal error"
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "engine_unavailable"
        wait_until(lifecycle.fatal.is_set)
        assert client.get("/ready").json() == {"status": "engine stopped"}
        later = client.post("/v1/completions", json={"prompt": PLAIN})
        assert later.status_code == 503
        assert later.json()["error"]["code"] == "engine_unavailable"
        assert client.get("/health").status_code == 200  # the process answers until it exits
    assert executor.log.steps >= 6


@pytest.mark.slow
def test_a_stalled_step_delays_everyone_and_loses_nothing() -> None:
    """A step that hangs for a second: the event loop keeps answering, a client that
    leaves during the stall is aborted once the step returns, and everything else
    finishes. (There is no watchdog: a stall is waited out.)"""
    stall_s = 1.0
    core, executor = faulty_core(Faults(stall_on_step=4, stall_s=stall_s), step_time_s=0.01)
    with (
        running_server(fake_config(), fake_loader(core)) as (base, _),
        httpx.Client(base_url=base, timeout=30) as client,
        ThreadPoolExecutor(2) as pool,
    ):
        patient = pool.submit(stream, client, PLAIN, 30)
        leaving_started = threading.Event()

        def leave_during_stall() -> int:
            body = {"prompt": PLAIN, "max_tokens": 200, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)
                leaving_started.set()
                wait_until(lambda: executor.log.stalled_steps, timeout_s=10)
            return r.status_code  # leaving the block closed the connection mid-stall

        leaving = pool.submit(leave_during_stall)
        assert leaving_started.wait(10)
        wait_until(lambda: executor.log.stalled_steps, timeout_s=10)
        started = time.monotonic()
        assert client.get("/health").status_code == 200  # the loop is not blocked
        assert client.get("/ready").status_code == 200
        assert time.monotonic() - started < stall_s / 2
        assert leaving.result(timeout=30) == 200
        events = patient.result(timeout=30)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        all_blocks_free(core)
        text = client.get("/metrics").text
        assert metric(text, "orchestrator_requests_total", 'finish_reason="abort"') == 1
