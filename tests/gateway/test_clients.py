"""Clients work unmodified: the exact request bodies GuideLLM, AIPerf, LangChain's OpenAI
wrappers and the official ``openai`` client send (``data/client_bodies/``, sources in its
README) are answered in full, and the official client itself runs against the app (it
takes any ``httpx.Client``, here Starlette's in-process one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import EngineCore, WallClock
from tests.factories import make_scheduler
from tests.gateway.support import MODEL, TimedExecutor, client_for, sse_events

pytestmark = pytest.mark.timeout(120)

BODIES = sorted((Path(__file__).parent / "data" / "client_bodies").glob("*.json"))
CONTEXT = 2048  # like the served model's: clients' defaults (LangChain's 256 tokens) fit


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    executor = TimedExecutor(num_blocks=512, block_size=16, step_time_s=0.0005)
    scheduler = make_scheduler(num_blocks=512, block_size=16, max_model_len=CONTEXT)
    with client_for(EngineCore(scheduler, executor, WallClock())) as c:
        yield c


def load(path: Path) -> tuple[str, dict[str, Any]]:
    case = json.loads(path.read_text().replace('"$MODEL"', json.dumps(MODEL)))
    return case["path"], case["body"]


def test_every_client_fixture_is_read() -> None:
    assert len(BODIES) >= 13
    readme = (BODIES[0].parent / "README.md").read_text()
    for path in BODIES:
        assert f"`{path.name}`" in readme  # each names its source


@pytest.mark.parametrize("fixture", BODIES, ids=[p.stem for p in BODIES])
def test_client_bodies_are_answered_in_full(client: TestClient, fixture: Path) -> None:
    path, body = load(fixture)
    n = (body.get("n") or 1) * (len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1)
    if not body.get("stream"):
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert len(answer["choices"]) == n
        assert all(c["finish_reason"] in ("stop", "length") for c in answer["choices"])
        assert answer["usage"]["completion_tokens"] > 0
        assert "cached_tokens" in answer["usage"]["prompt_tokens_details"]
        return
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    finished = [ch for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert len(finished) == n
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] > 0
        assert "cached_tokens" in chunks[-1]["usage"]["prompt_tokens_details"]
    if options.get("continuous_usage_stats"):
        assert all("usage" in c for c in chunks)
    if body.get("ignore_eos") and body.get("min_tokens"):
        assert chunks[-1]["usage"]["completion_tokens"] == body["max_completion_tokens"]


@pytest.fixture(scope="module")
def sdk(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0
    )


def test_the_official_client_chat(sdk: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "w1 w2"}]
    whole = sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=5,
        temperature=0,
        seed=3,
        n=2,
        stop=["zzz"],
        user="u",
        store=False,
        metadata={"k": "v"},
        parallel_tool_calls=False,
        service_tier="auto",
        logprobs=True,
        top_logprobs=1,
        logit_bias={},
    )
    assert [c.finish_reason for c in whole.choices] == ["length", "length"]
    assert whole.usage is not None and whole.usage.completion_tokens == 10
    assert whole.usage.prompt_tokens_details is not None
    assert whole.usage.prompt_tokens_details.cached_tokens is not None
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_the_official_client_completions_and_models(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == [MODEL]
    whole = sdk.completions.create(
        model=MODEL, prompt=["w1 w2", "w3"], max_tokens=3, echo=True, best_of=1, suffix=None
    )
    prompts = ["w1 w2", "w3"]
    assert all(c.text.startswith(p) for c, p in zip(whole.choices, prompts, strict=True))
    assert all(len(c.text) > len(p) for c, p in zip(whole.choices, prompts, strict=True))
    streamed = list(
        sdk.completions.create(model=MODEL, prompt="w1", max_tokens=3, stream=True, logprobs=1)
    )
    assert len([c for c in streamed if c.choices]) == 3


def test_the_official_client_sees_a_named_param_on_a_400(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model=MODEL, prompt="w1", max_tokens=2, logit_bias={"3": 5})
    assert refused.value.param == "logit_bias"
    assert refused.value.code == "invalid_value"
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="gpt-9", prompt="w1", max_tokens=2)
