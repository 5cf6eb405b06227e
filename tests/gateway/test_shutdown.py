"""How the server ends requests when it stops before they finish: a second SIGTERM
(skip the rest of the drain) and a drain that times out. Every open stream must end
with an error event and ``data: [DONE]``, a whole response with a 503, each logged as the
server's end (503, not a client's 499), and nothing may be logged at ERROR (no
``CancelledError`` tracebacks from tasks cancelled under uvicorn).

uvicorn runs in a thread of this process over the fake engine; ``handle_exit`` is what
its signal handler calls, so the tests call it as a SIGTERM would."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from orchestrator.gateway.server import GatewayServer, build_server
from tests.gateway.support import fake_config, fake_core, fake_loader, free_port, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEP_S = 0.05  # 200 tokens would take 10 s: every request below outlives the shutdown
LONG = {"prompt": "w1 w2 w3", "max_tokens": 200}


def start(drain_timeout_s: float) -> tuple[str, GatewayServer, threading.Thread]:
    core, _ = fake_core(step_time_s=STEP_S)
    port = free_port()
    config = fake_config(drain_timeout_s=drain_timeout_s)
    server = build_server(config, "127.0.0.1", port, fake_loader(core))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, 30, alive=thread.is_alive)
    return base, server, thread


def read_stream(base: str, started: threading.Event) -> list[str]:
    events = []
    with httpx.stream(
        "POST", f"{base}/v1/completions", json={**LONG, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                started.set()
    return events


def in_flight(base: str, pool: ThreadPoolExecutor) -> tuple[list[Future[list[str]]], Future[Any]]:
    """Two streams (each past its first chunk) and a whole response, all running."""
    flags = [threading.Event(), threading.Event()]
    streams = [pool.submit(read_stream, base, flag) for flag in flags]
    whole = pool.submit(httpx.post, f"{base}/v1/completions", json=LONG, timeout=60)
    assert all(flag.wait(30) for flag in flags)
    return streams, whole


def assert_ended_by_the_server(
    streams: list[Future[list[str]]], whole: Future[Any], reason: str
) -> None:
    for future in streams:
        events = future.result(timeout=30)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "service_unavailable"
        assert reason in error["message"]
        assert "choices" in json.loads(events[0])  # it had streamed a token before
    response = whole.result(timeout=30)
    assert response.status_code == 503
    assert reason in response.json()["error"]["message"]


def assert_logged_as_server_ends(caplog: pytest.LogCaptureFixture) -> None:
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "orchestrator.gateway.requests"
    ]
    generation = [e for e in lines if e["path"] == "/v1/completions"]
    assert [e["status"] for e in generation] == [503, 503, 503]
    assert all(e["finish_reason"] == "error" for e in generation)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert "CancelledError" not in caplog.text


def test_a_second_sigterm_ends_every_request_with_an_error_and_exits_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    base, server, thread = start(drain_timeout_s=60)
    with ThreadPoolExecutor(3) as pool:
        streams, whole = in_flight(base, pool)
        server.handle_exit(signal.SIGTERM, None)  # drain: in-flight requests keep running
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/ready").status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not any(s.done() for s in streams)
        stopped_at = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)  # no more waiting
        assert_ended_by_the_server(streams, whole, "shutting down")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert time.monotonic() - stopped_at < 8  # far sooner than the 10 s the requests need
    assert server.exit_code == 0
    assert_logged_as_server_ends(caplog)


def test_a_drain_timeout_ends_every_request_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    base, server, thread = start(drain_timeout_s=0.5)
    with ThreadPoolExecutor(3) as pool:
        streams, whole = in_flight(base, pool)
        server.handle_exit(signal.SIGTERM, None)
        assert_ended_by_the_server(streams, whole, "drain timeout of 0.5 s")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert server.exit_code == 0
    assert_logged_as_server_ends(caplog)
