"""The HTTP API over a fake engine, in process (Starlette's TestClient runs the app and
its lifespan without a socket). Token ids are a pure function of the engine request id
and position (``tests.fakes.fake_token``), and the request id comes back in
``X-Request-Id``, so every expected text is computed, not recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.core.engine import EngineCore
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.gateway.app import create_app
from orchestrator.gateway.lifecycle import GatewayLifecycle, LoadedModel
from orchestrator.gateway.tokenizer import ChatTemplateError
from tests.fakes import fake_token
from tests.gateway.support import (
    MODEL,
    TimedExecutor,
    WordTokenizer,
    client_for,
    fake_config,
    fake_core,
    metric,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def engine() -> tuple[EngineCore, TimedExecutor]:
    return fake_core()


@pytest.fixture
def client(engine: tuple[EngineCore, TimedExecutor]) -> Iterator[TestClient]:
    with client_for(engine[0]) as c:
        yield c


def expected_text(request_id: str, prompt_len: int, n_tokens: int) -> str:
    """The fake engine's text: the first output token sits at position ``prompt_len``,
    sampled from the token at ``prompt_len - 1``."""
    return "".join(f" w{fake_token(request_id, prompt_len - 1 + k)}" for k in range(n_tokens))


PROMPT = "w1 w2 w3 w4"  # four tokens of WordTokenizer


def complete(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body})


def stream_chunks(response: httpx.Response) -> list[Any]:
    events = list(sse_events(response.iter_lines()))
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ---------------------------------------------------------------------- probes


def test_health_ready_models_and_request_ids(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    ids = {client.get(path).headers["x-request-id"] for path in ("/health", "/ready", "/nope")}
    assert len(ids) == 3


def test_unknown_route_uses_the_openai_error_body(client: TestClient) -> None:
    r = client.get("/v1/nope")
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


# ---------------------------------------------------------------------- completions


def test_completion_text_usage_and_finish_reason(client: TestClient) -> None:
    r = complete(client, max_tokens=5)
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    body = r.json()
    assert body["id"] == f"cmpl-{rid}"
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == expected_text(rid, 4, 5)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_default_max_tokens_is_sixteen(client: TestClient) -> None:
    assert complete(client).json()["usage"]["completion_tokens"] == 16


def test_token_id_prompt(client: TestClient) -> None:
    r = complete(client, prompt=[5, 6, 7], max_tokens=3)
    assert r.json()["choices"][0]["text"] == expected_text(r.headers["x-request-id"], 3, 3)


def test_streamed_completion_matches_and_reports_usage(client: TestClient) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        rid = r.headers["x-request-id"]
        chunks = stream_chunks(r)
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == expected_text(rid, 4, 6)
    assert len(text_chunks) == 6  # one per token: nothing held back for word tokens
    assert [c["choices"][0].get("finish_reason") for c in text_chunks][-1] == "length"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


def test_n_choices_and_prompt_batches(client: TestClient) -> None:
    r = complete(client, prompt=[PROMPT, "w9 w8"], n=2, max_tokens=3, seed=5)
    rid = r.headers["x-request-id"]
    body = r.json()
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    # Choice i of prompt p is engine request "<id>-<p * n + i>".
    assert texts == [
        expected_text(f"{rid}-0", 4, 3),
        expected_text(f"{rid}-1", 4, 3),
        expected_text(f"{rid}-2", 2, 3),
        expected_text(f"{rid}-3", 2, 3),
    ]
    assert body["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 12,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_stop_string_cuts_the_text_and_ends_the_request(
    client: TestClient, engine: tuple[EngineCore, TimedExecutor]
) -> None:
    r = complete(client, max_tokens=60, stop=["7"])
    rid = r.headers["x-request-id"]
    choice = r.json()["choices"][0]
    full = expected_text(rid, 4, 60)
    assert "7" in full  # 60 random three-digit words: all but certain
    assert choice["text"] == full[: full.index("7")]
    assert choice["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] < 60
    wait_until(lambda: engine[0].stats().num_running == 0)


def test_stop_string_in_a_stream_is_never_sent(client: TestClient) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 60, "stream": True, "stop": ["7"]}
    with client.stream("POST", "/v1/completions", json=body) as r:
        rid = r.headers["x-request-id"]
        chunks = stream_chunks(r)
    full = expected_text(rid, 4, 60)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[: full.index("7")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_logprobs(client: TestClient) -> None:
    choice = complete(client, max_tokens=3, logprobs=2).json()["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["token_logprobs"] == [-0.25] * 3
    assert all(len(top) == 2 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])


# ---------------------------------------------------------------------- chat


def chat(client: TestClient, **body: Any) -> httpx.Response:
    messages = [{"role": "user", "content": "w1 w2"}]
    return client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, **body})


CHAT_PROMPT_LEN = len(WordTokenizer().encode_chat([{"role": "user", "content": "w1 w2"}]))


def test_chat_completion(client: TestClient) -> None:
    r = chat(client, max_tokens=4)
    rid = r.headers["x-request-id"]
    body = r.json()
    assert body["id"] == f"chatcmpl-{rid}"
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": expected_text(rid, CHAT_PROMPT_LEN, 4)}
    assert body["usage"]["prompt_tokens"] == CHAT_PROMPT_LEN


def test_chat_stream_opens_with_the_role(client: TestClient) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "w1 w2"}]}],
        "max_completion_tokens": 3,
        "stream": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        rid = r.headers["x-request-id"]
        chunks = stream_chunks(r)
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert content == expected_text(rid, CHAT_PROMPT_LEN, 3)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # As OpenAI's: every chunk's choice carries finish_reason and logprobs, null until set;
    # no usage without stream_options.include_usage.
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        assert choice["finish_reason"] is None and choice["logprobs"] is None
        assert "usage" not in chunk


def test_chat_logprobs(client: TestClient) -> None:
    choice = chat(client, max_tokens=2, logprobs=True, top_logprobs=3).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == choice["message"]["content"]
    assert all(len(t["top_logprobs"]) == 3 for t in content)
    assert bytes(content[0]["bytes"]).decode() == content[0]["token"]


def test_chat_without_max_tokens_fills_the_context(client: TestClient) -> None:
    usage = chat(client).json()["usage"]
    assert usage["total_tokens"] == 256  # fake model context; no end token is ever sampled


# ---------------------------------------------------------------------- bad input


BAD_INPUTS: list[tuple[str, Any, int, str | None]] = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 253}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "model": "gpt-9"}, 404, "model"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "stop": list("abcde")}, 400, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "best_of": 2}, 400, "best_of"),
    ("/v1/completions", {"prompt": PROMPT, "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 5000]}, 400, "prompt"),
    (
        "/v1/completions",
        {"prompt": PROMPT, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages.0.role",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_INPUTS)
def test_bad_input_is_refused_with_a_named_field_and_queues_nothing(
    client: TestClient,
    engine: tuple[EngineCore, TimedExecutor],
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)
        assert param in error["message"]
    assert "x-request-id" in r.headers
    assert engine[1].plans == []


def test_bad_priority_header(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": PROMPT}, headers={"X-Priority": "high"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "X-Priority"


def test_priority_reaches_the_engine(engine: tuple[EngineCore, TimedExecutor]) -> None:
    core, _ = engine
    seen: list[int] = []
    add = core.add_request
    core.add_request = lambda r: (seen.append(r.priority), add(r))[1]  # type: ignore[method-assign]
    with client_for(core) as client:
        client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        client.post("/v1/completions", json={"prompt": PROMPT}, headers={"X-Priority": "-3"})
        client.post(
            "/v1/completions",
            json={"prompt": PROMPT, "priority": 7},
            headers={"X-Priority": "-3"},
        )
    assert seen == [0, -3, 7]


def test_ignore_eos_controls_stop_token_ids(engine: tuple[EngineCore, TimedExecutor]) -> None:
    core, _ = engine
    seen: list[tuple[int, ...]] = []
    add = core.add_request
    core.add_request = lambda r: (seen.append(r.sampling.stop_token_ids), add(r))[1]  # type: ignore[method-assign]
    with client_for(core) as client:
        client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "ignore_eos": True})
    assert seen == [(1000,), ()]


# ---------------------------------------------------------------------- limits and auth


def test_body_over_the_limit_is_refused_before_parsing() -> None:
    core, executor = fake_core()
    with client_for(core, max_body_bytes=2048) as client:
        big = {"prompt": "w1 " * 2000}
        r = client.post("/v1/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"
        # Without Content-Length (chunked), the limit holds while reading.
        data = json.dumps(big).encode()
        chunks = iter([data[i : i + 512] for i in range(0, len(data), 512)])
        r = client.post("/v1/completions", content=chunks)
        assert r.status_code == 413
        assert complete(client, max_tokens=1).status_code == 200
    assert len([p for p in executor.plans if p.scheduled]) == 1


def test_api_keys() -> None:
    core, executor = fake_core()
    environ = {"ORCHESTRATOR_API_KEYS": "env-key, second"}
    with client_for(core, api_keys=["config-key"], environ=environ) as client:
        assert complete(client).status_code == 401
        r = complete(client, max_tokens=1)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "authentication_error"
        bad = client.post(
            "/v1/completions",
            json={"prompt": PROMPT},
            headers={"Authorization": "Bearer nope"},
        )
        assert bad.status_code == 401
        assert client.get("/v1/models").status_code == 401
        assert executor.plans == []
        for key in ("config-key", "env-key", "second"):
            ok = client.post(
                "/v1/completions",
                json={"prompt": PROMPT, "max_tokens": 1},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert ok.status_code == 200, key
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200


# ---------------------------------------------------------------------- metrics


def test_metrics_count_requests_tokens_and_latencies(client: TestClient) -> None:
    complete(client, max_tokens=5)
    chat(client, max_tokens=3)
    text = client.get("/metrics").text
    assert metric(text, "orchestrator_requests_total", 'finish_reason="length"') == 2
    assert metric(text, "orchestrator_generation_tokens_total") == 8
    assert metric(text, "orchestrator_prompt_tokens_total") == 4 + CHAT_PROMPT_LEN
    assert metric(text, "orchestrator_time_to_first_token_seconds_count") == 2
    assert metric(text, "orchestrator_time_per_output_token_seconds_count") == 2
    assert metric(text, "orchestrator_inter_token_latency_seconds_count") == 4 + 2
    assert metric(text, "orchestrator_e2e_request_latency_seconds_count") == 2
    assert metric(text, "orchestrator_queue_time_seconds_count") == 2
    assert metric(text, "orchestrator_num_requests_running") == 0
    assert metric(text, "orchestrator_kv_blocks_used") == 0
    assert metric(text, "orchestrator_kv_blocks_total") == 64
    assert metric(text, "orchestrator_executor_info", 'device="fake"') == 1


# ---------------------------------------------------------------------- lifecycle


def test_not_ready_while_loading_then_ready() -> None:
    core, _ = fake_core()
    release = threading.Event()

    def slow_loader() -> LoadedModel:
        assert release.wait(30)
        return LoadedModel(core, WordTokenizer())

    with TestClient(create_app(fake_config(), slow_loader, {})) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/ready").json() == {"status": "loading"}
        r = complete(client)
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "loading"
        release.set()
        wait_until(lambda: client.get("/ready").status_code == 200)
        assert complete(client, max_tokens=1).status_code == 200


def test_failed_load_is_fatal() -> None:
    def broken_loader() -> LoadedModel:
        raise FileNotFoundError("weights.gguf")

    app = create_app(fake_config(), broken_loader, {})
    with TestClient(app) as client:
        lifecycle: GatewayLifecycle = app.state.lifecycle
        wait_until(lifecycle.fatal.is_set)
        assert client.get("/ready").json() == {"status": "load failed"}
        assert complete(client).status_code == 503


def test_draining_refuses_new_requests(client: TestClient) -> None:
    lifecycle: GatewayLifecycle = client.app.state.lifecycle  # type: ignore[attr-defined]
    lifecycle.in_flight.closed = True
    assert client.get("/ready").json() == {"status": "draining"}
    r = complete(client)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "draining"


def crashing_core(after_plans: int) -> EngineCore:
    core, executor = fake_core()
    execute = executor.execute

    def crash(plan: SchedulerOutput) -> StepResult:
        if len(executor.plans) >= after_plans:
            raise RuntimeError("device lost")
        return execute(plan)

    executor.execute = crash  # type: ignore[method-assign]
    return core


def test_engine_crash_is_a_503_and_fatal() -> None:
    with client_for(crashing_core(after_plans=2)) as client:
        r = complete(client, max_tokens=20)
        assert r.status_code == 503
        # The executor's exception text is logged, never returned.
        assert r.json()["error"]["message"] == "the engine stopped after an internal error"
        lifecycle: GatewayLifecycle = client.app.state.lifecycle  # type: ignore[attr-defined]
        wait_until(lifecycle.fatal.is_set)
        assert client.get("/ready").json() == {"status": "engine stopped"}


def test_engine_crash_mid_stream_ends_with_an_error_event() -> None:
    with client_for(crashing_core(after_plans=3)) as client:
        body = {"prompt": PROMPT, "max_tokens": 20, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable"
    assert error["message"] == "the engine stopped after an internal error"
    assert any("choices" in json.loads(e) for e in events[:-2])


class NoTemplateTokenizer(WordTokenizer):
    def encode_chat(self, messages: Any, tools: Any = None) -> list[int]:
        raise ChatTemplateError("this model has no chat template; use /v1/completions")


def test_chat_template_refusal_is_a_400(engine: tuple[EngineCore, TimedExecutor]) -> None:
    core, executor = engine
    app = create_app(fake_config(), lambda: LoadedModel(core, NoTemplateTokenizer()), {})
    with TestClient(app) as client:
        wait_until(lambda: client.get("/ready").status_code == 200)
        r = chat(client)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages"
        assert "chat template" in r.json()["error"]["message"]
        assert complete(client, max_tokens=1).status_code == 200
    assert len([p for p in executor.plans if p.scheduled]) == 1


def test_an_unexpected_error_is_a_500_in_the_openai_format(client: TestClient) -> None:
    lifecycle: GatewayLifecycle = client.app.state.lifecycle  # type: ignore[attr-defined]
    assert lifecycle.serving is not None

    async def broken(*_: Any) -> None:
        raise RuntimeError("secret internals")

    lifecycle.serving.completions = broken  # type: ignore[method-assign]
    r = complete(client)
    assert r.status_code == 500
    assert r.json()["error"] == {
        "message": "internal server error",
        "type": "internal_error",
        "param": None,
        "code": "internal_error",
    }
    assert "x-request-id" in r.headers


def test_router_gauges_under_our_names_and_vllms() -> None:
    """The gauges an endpoint picker reads: ours and vLLM's names, the same values, KV
    usage as a fraction, while one request runs and one waits."""
    core, _ = fake_core(step_time_s=0.02, max_batch_size=1)
    with client_for(core) as client:
        body = {"prompt": PROMPT, "max_tokens": 200, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as running:
            lines = running.iter_lines()
            next(lines)
            with client.stream("POST", "/v1/completions", json=body) as waiting:
                assert waiting.status_code == 200

                def scrape() -> str:
                    return client.get("/metrics").text

                # Gauges are the engine's stats as of its last step.
                wait_until(lambda: metric(scrape(), "orchestrator_num_requests_waiting") == 1)
                text = scrape()
        label = f'model_name="{MODEL}"'
        assert metric(text, "orchestrator_num_requests_running") == 1
        assert metric(text, "vllm:num_requests_running", label) == 1
        assert metric(text, "orchestrator_num_requests_waiting") == 1
        assert metric(text, "vllm:num_requests_waiting", label) == 1
        usage = metric(text, "orchestrator_kv_cache_usage_ratio")
        used = metric(text, "orchestrator_kv_blocks_used")
        assert usage == used / metric(text, "orchestrator_kv_blocks_total")
        assert 0 < usage <= 1
        assert metric(text, "vllm:kv_cache_usage_perc", label) == usage
        assert "# TYPE vllm:kv_cache_usage_perc gauge" in text
        wait_until(lambda: metric(scrape(), "vllm:kv_cache_usage_perc", label) == 0)
        idle = scrape()
        assert metric(idle, "vllm:num_requests_running", label) == 0
