"""Back-pressure, client disconnects and fatal errors through a real uvicorn on
127.0.0.1, over the fake engine (steps of real time, so requests stay in flight)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator.core.engine import EngineCore
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.gateway.lifecycle import LoadedModel
from orchestrator.gateway.server import GatewayServer, build_server
from tests.gateway.support import (
    MODEL,
    TimedExecutor,
    fake_config,
    fake_core,
    fake_loader,
    free_port,
    metric,
    running_server,
    wait_ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEP_S = 0.05


@pytest.fixture
def server() -> Iterator[tuple[str, EngineCore, TimedExecutor]]:
    core, executor = fake_core(step_time_s=STEP_S, max_batch_size=1, max_waiting_requests=1)
    with running_server(fake_config(), fake_loader(core)) as (base, _):
        yield base, core, executor


def metrics(base: str) -> str:
    return httpx.get(f"{base}/metrics").text


def wait_for(condition: Any, timeout_s: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)
    return time.monotonic() - start


def long_request(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "w1 w2 w3 w4", "max_tokens": 200, "stream": stream}


def plans_with(executor: TimedExecutor, request_id: str) -> int:
    return sum(any(s.request_id == request_id for s in p.scheduled) for p in executor.plans)


def test_full_queue_answers_429_with_retry_after(
    server: tuple[str, EngineCore, TimedExecutor],
) -> None:
    base, core, _ = server
    with httpx.Client(base_url=base, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=long_request(True)) as running:
            lines = running.iter_lines()  # keep a reference: dropping it closes the stream
            next(lines)
            with client.stream("POST", "/v1/completions", json=long_request(True)) as waiting:
                assert waiting.status_code == 200
                wait_for(lambda: core.stats().num_waiting == 1, 5)
                refused = client.post("/v1/completions", json=long_request(False))
                assert refused.status_code == 429
                assert int(refused.headers["retry-after"]) >= 1
                assert refused.json()["error"]["type"] == "rate_limit_error"
                assert "max_waiting_requests" in refused.json()["error"]["message"]
        assert metric(metrics(base), "orchestrator_requests_rejected_total") == 1
        wait_for(lambda: metric(metrics(base), "orchestrator_kv_blocks_used") == 0, 5)


def test_disconnect_mid_stream_aborts_and_frees_blocks(
    server: tuple[str, EngineCore, TimedExecutor],
) -> None:
    base, _, executor = server
    with (
        httpx.Client(base_url=base, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=long_request(True)) as r,
    ):
        request_id = r.headers["x-request-id"]
        lines = r.iter_lines()
        chunks = 0
        while chunks < 3:
            chunks += next(lines).startswith("data: ")
        assert metric(metrics(base), "orchestrator_kv_blocks_used") > 0
        steps_before = plans_with(executor, request_id)
    # Leaving the block closed the connection mid-stream.
    wait_for(lambda: metric(metrics(base), "orchestrator_kv_blocks_used") == 0, 5)
    text = metrics(base)
    assert metric(text, "orchestrator_num_requests_running") == 0
    assert metric(text, "orchestrator_requests_total", 'finish_reason="abort"') == 1
    # At most the step already running (and one more while the disconnect travels).
    assert plans_with(executor, request_id) - steps_before <= 2
    assert plans_with(executor, request_id) < 200


def test_disconnect_while_waiting_for_a_whole_response_aborts(
    server: tuple[str, EngineCore, TimedExecutor],
) -> None:
    base, _, executor = server
    port = int(base.rsplit(":", 1)[1])
    body = httpx.Request("POST", f"{base}/v1/completions", json=long_request(False))
    raw = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body.content)}\r\n\r\n".encode()
        + body.content
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(raw)
        wait_for(lambda: metric(metrics(base), "orchestrator_kv_blocks_used") > 0, 5)
    # 200 tokens at 50 ms a step would take 10 s; the abort frees the blocks at once.
    wait_for(lambda: metric(metrics(base), "orchestrator_kv_blocks_used") == 0, 3)
    assert metric(metrics(base), "orchestrator_requests_total", 'finish_reason="abort"') == 1
    assert len([p for p in executor.plans if p.scheduled]) < 100  # it did not run to the end


def serve_in_thread(loader: Any) -> tuple[str, GatewayServer, threading.Thread]:
    port = free_port()
    server = build_server(fake_config(), "127.0.0.1", port, loader)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{port}", server, thread


def test_failed_model_load_stops_the_server_with_exit_code_1() -> None:
    def broken() -> LoadedModel:
        raise FileNotFoundError("no weights")

    _, server, thread = serve_in_thread(broken)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert server.exit_code == 1


def test_engine_crash_stops_the_server_with_exit_code_1() -> None:
    core, executor = fake_core(step_time_s=0.01)
    execute = executor.execute

    def crash(plan: SchedulerOutput) -> StepResult:
        if len(executor.plans) >= 3:
            raise RuntimeError("device lost")
        return execute(plan)

    executor.execute = crash  # type: ignore[method-assign]
    base, server, thread = serve_in_thread(fake_loader(core))
    wait_ready(base, 30, alive=thread.is_alive)
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "w1", "max_tokens": 20}, timeout=30)
    assert r.status_code == 503
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert server.exit_code == 1
    assert executor.shut_down
