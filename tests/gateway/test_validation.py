"""Input the API must refuse with a 400 that names the field, and input it must accept,
over the fake engine in process. One section per class of defect: unbounded values that
reach the engine, text that is not valid Unicode, rules across fields, loose JSON types,
and fields that OpenAI clients send at values that change nothing. Every refusal also
checks that nothing reached the engine and that the server still serves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import EngineCore, Submission
from orchestrator.gateway.protocol.shared import MAX_STOP_LENGTH
from tests.gateway.support import (
    MODEL,
    TimedExecutor,
    client_for,
    fake_core,
    sse_events,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

PROMPT = "w1 w2 w3 w4"
CHAT = [{"role": "user", "content": "w1 w2"}]


@pytest.fixture
def engine() -> tuple[EngineCore, TimedExecutor]:
    # The priority policy: its sort key is where a huge priority used to overflow.
    return fake_core(policy="priority")


@pytest.fixture
def seen(engine: tuple[EngineCore, TimedExecutor]) -> list[Submission]:
    """Every submission that reached the core."""
    core, _ = engine
    submissions: list[Submission] = []
    add = core.add_request

    def recording_add(submission: Submission) -> None:
        submissions.append(submission)
        add(submission)

    core.add_request = recording_add  # type: ignore[method-assign]
    return submissions


@pytest.fixture
def client(
    engine: tuple[EngineCore, TimedExecutor], seen: list[Submission]
) -> Iterator[TestClient]:
    with client_for(engine[0]) as c:
        yield c


def post(client: TestClient, path: str, body: Any, **headers: str) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={"content-type": "application/json"})
    return client.post(path, json=body, headers=headers)


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": CHAT, "max_tokens": 2, **fields}


def assert_refused(r: httpx.Response, param: str, *words: str) -> None:
    """A 400 in OpenAI's format whose ``param`` is ``param`` and whose message names it
    (and says each of ``words``)."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: "), error
    for word in words:
        assert word in error["message"], error


def assert_still_serving(client: TestClient) -> None:
    r = client.post("/v1/completions", json=completion())
    assert r.status_code == 200, r.text
    assert client.get("/ready").status_code == 200


# ---------------------------------------------------------------------- bounded values

OUT_OF_RANGE: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", completion(priority=10**400), "priority"),
    ("/v1/completions", completion(priority=2**31), "priority"),
    ("/v1/completions", completion(priority=-(2**31)), "priority"),
    ("/v1/chat/completions", chat(priority=2**63), "priority"),
    ("/v1/completions", completion(seed=2**63), "seed"),
    ("/v1/completions", completion(seed=-(2**63) - 1), "seed"),
    ("/v1/completions", completion(top_k=2**31), "top_k"),
    ("/v1/completions", completion(top_k=-2), "top_k"),
    ("/v1/completions", completion(n=17), "n"),
    ("/v1/completions", completion(max_tokens=2**31), "max_tokens"),
    (
        "/v1/chat/completions",
        chat(max_tokens=None, max_completion_tokens=0),
        "max_completion_tokens",
    ),
    ("/v1/completions", completion(logprobs=21), "logprobs"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/completions", completion(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("/v1/completions", completion(stop="x" * (MAX_STOP_LENGTH + 1)), "stop"),
    ("/v1/completions", completion(stop=[""]), "stop"),
    ("/v1/completions", completion(prompt=["w1"] * 17), "prompt"),
    ("/v1/completions", completion(prompt=[1, 2**31]), "prompt"),
    ("/v1/completions", completion(prompt=[1, 1001]), "prompt"),  # outside the vocabulary
    ("/v1/completions", completion(temperature=2.5), "temperature"),
    ("/v1/completions", completion(top_p=0), "top_p"),
    ("/v1/completions", completion(user="u" * 257), "user"),
]


@pytest.mark.parametrize(("path", "body", "param"), OUT_OF_RANGE)
def test_out_of_range_values_are_refused_before_the_engine(
    client: TestClient, seen: list[Submission], path: str, body: dict[str, Any], param: str
) -> None:
    assert_refused(post(client, path, body), param)
    assert seen == []
    assert_still_serving(client)


# "+0.0" and "2.0": lax parsing read them as integers while the schema says integer.
@pytest.mark.parametrize("value", [str(2**31), str(10**400), "high", "1.5", "+0.0", "2.0"])
def test_an_invalid_priority_header_is_refused(
    client: TestClient, seen: list[Submission], value: str
) -> None:
    r = client.post("/v1/completions", json=completion(), headers={"X-Priority": value})
    assert_refused(r, "X-Priority")
    assert seen == []
    assert_still_serving(client)


def test_the_extreme_priorities_are_served(client: TestClient, seen: list[Submission]) -> None:
    """The documented range's edges reach the priority policy's sort key and come back."""
    for priority in (2**31 - 1, -(2**31 - 1)):
        assert post(client, "/v1/completions", completion(priority=priority)).status_code == 200
    r = client.post("/v1/completions", json=completion(), headers={"X-Priority": str(2**31 - 1)})
    assert r.status_code == 200
    assert [s.priority for s in seen] == [2**31 - 1, -(2**31 - 1), 2**31 - 1]


def test_seeds_wrap_into_64_unsigned_bits(client: TestClient, seen: list[Submission]) -> None:
    assert post(client, "/v1/completions", completion(seed=-1)).status_code == 200
    assert post(client, "/v1/completions", completion(seed=2**63 - 1, n=2)).status_code == 200
    assert [s.sampling.seed for s in seen] == [2**64 - 1, 2**63 - 1, 2**63]


def test_tiny_temperatures_are_greedy(client: TestClient, seen: list[Submission]) -> None:
    for temperature in (5e-324, 1e-9, 1e-5):
        assert (
            post(client, "/v1/completions", completion(temperature=temperature)).status_code == 200
        )
    assert [s.sampling.temperature for s in seen] == [0.0, 0.0, 1e-5]


# ---------------------------------------------------------------------- text encoding

LONE_SURROGATE = b'"w1 \\ud800 w2"'  # JSON escapes of half a UTF-16 pair

BAD_TEXT: list[tuple[str, bytes, str]] = [
    ("/v1/completions", b'{"prompt": ' + LONE_SURROGATE + b"}", "prompt"),
    ("/v1/completions", b'{"prompt": ["w1", ' + LONE_SURROGATE + b"]}", "prompt.1"),
    ("/v1/completions", b'{"prompt": "w1", "stop": [' + LONE_SURROGATE + b"]}", "stop.0"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": ' + LONE_SURROGATE + b"}]}",
        "messages.0.content",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "ok"}, '
        b'{"type": "text", "text": ' + LONE_SURROGATE + b"}]}]}",
        "messages.0.content.1.text",
    ),
    ("/v1/completions", b'{"prompt": "w1", "\\udfff": 1}', "(key)"),
]


@pytest.mark.parametrize(("path", "raw", "param"), BAD_TEXT)
def test_lone_surrogates_are_a_400_naming_the_field(
    client: TestClient, seen: list[Submission], path: str, raw: bytes, param: str
) -> None:
    assert_refused(post(client, path, raw), param, "surrogate")
    assert seen == []
    assert_still_serving(client)


def test_a_valid_surrogate_pair_is_one_character(client: TestClient) -> None:
    r = post(client, "/v1/completions", b'{"prompt": "w1 \\ud83d\\ude00", "max_tokens": 1}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [b'{"prompt": "w1 \xff\xfe"}', b'{"prompt": "\xc3("}'])
def test_bytes_that_are_not_utf8_are_a_400(
    client: TestClient, seen: list[Submission], raw: bytes
) -> None:
    r = post(client, "/v1/completions", raw)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"
    assert "UTF-8" in r.json()["error"]["message"]
    assert seen == []
    assert_still_serving(client)


# ---------------------------------------------------------------------- rules across fields

CROSS_FIELD: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    (
        "/v1/chat/completions",
        chat(max_tokens=3, max_completion_tokens=3),
        "max_completion_tokens",
        ("max_tokens",),
    ),
    ("/v1/completions", completion(prompt=["w1"] * 17), "prompt", ("17", "16")),
    ("/v1/completions", completion(prompt=["w1"] * 5, n=4), "n", ("5 prompts", "16")),
    ("/v1/chat/completions", chat(top_logprobs=2), "top_logprobs", ("logprobs",)),
    ("/v1/chat/completions", chat(logprobs=False, top_logprobs=2), "top_logprobs", ("logprobs",)),
    (
        "/v1/completions",
        completion(stream_options={"include_usage": True}),
        "stream_options",
        ("stream",),
    ),
    (
        "/v1/chat/completions",
        chat(stream=False, stream_options={"include_usage": True}),
        "stream_options",
        ("stream",),
    ),
    ("/v1/completions", completion(best_of=2), "best_of", ("n",)),
    ("/v1/completions", completion(echo=True, logprobs=1), "echo", ("logprobs",)),
    ("/v1/completions", completion(min_tokens=2), "min_tokens", ("ignore_eos",)),
    (
        "/v1/completions",
        completion(min_tokens=3, ignore_eos=True),
        "min_tokens",
        ("max_tokens",),
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": None}]},
        "messages.0.content",
        ("content",),
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "words"), CROSS_FIELD)
def test_rules_across_fields_name_the_fields(
    client: TestClient,
    seen: list[Submission],
    path: str,
    body: dict[str, Any],
    param: str,
    words: tuple[str, ...],
) -> None:
    assert_refused(post(client, path, body), param, *words)
    assert seen == []


# ---------------------------------------------------------------------- strict JSON types

LOOSE_TYPES: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/completions", completion(max_tokens="4"), "max_tokens", "a string"),
    ("/v1/completions", completion(max_tokens=True), "max_tokens", "a boolean"),
    ("/v1/completions", completion(max_tokens=4.0), "max_tokens", "a number"),
    ("/v1/completions", completion(stream="yes"), "stream", "a string"),
    ("/v1/completions", completion(stream=1), "stream", "an integer"),
    ("/v1/completions", completion(n="2"), "n", "a string"),
    ("/v1/completions", completion(seed=1.0), "seed", "a number"),
    ("/v1/completions", completion(temperature="0.5"), "temperature", "a string"),
    ("/v1/completions", completion(echo="false"), "echo", "a string"),
    ("/v1/completions", completion(prompt=[True, 2]), "prompt", "prompt must be"),
    ("/v1/chat/completions", chat(logprobs="true"), "logprobs", "a string"),
    (
        "/v1/chat/completions",
        chat(max_tokens=None, max_completion_tokens="9"),
        "max_completion_tokens",
        "a string",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": 5}]),
        "messages.0.content",
        "content",
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "got"), LOOSE_TYPES)
def test_json_types_are_strict(
    client: TestClient,
    seen: list[Submission],
    path: str,
    body: dict[str, Any],
    param: str,
    got: str,
) -> None:
    assert_refused(post(client, path, body), param, got)
    assert seen == []


def test_integers_are_accepted_for_numbers(client: TestClient) -> None:
    assert post(client, "/v1/completions", completion(temperature=1, top_p=1)).status_code == 200


# ---------------------------------------------------------------------- fields that change nothing

ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", completion(echo=False, best_of=1, logit_bias=None, suffix=None, stop=None)),
    (
        "/v1/completions",
        completion(logit_bias={}, suffix="", user="alice", seed=None, logprobs=None),
    ),
    ("/v1/completions", completion(presence_penalty=0, frequency_penalty=0.0, n=1, best_of=1)),
    ("/v1/completions", completion(temperature=None, top_p=None, top_k=None, n=None, stream=None)),
    ("/v1/completions", completion(repetition_penalty=1.0, min_p=0, skip_special_tokens=True)),
    ("/v1/completions", completion(min_tokens=2, ignore_eos=True)),
    ("/v1/completions", completion(min_tokens=0)),
    (
        "/v1/chat/completions",
        chat(
            user="bob",
            parallel_tool_calls=True,
            service_tier="auto",
            store=False,
            metadata={"team": "search"},
            tools=[],
            tool_choice="none",
            response_format={"type": "text"},
            logprobs=False,
            top_logprobs=None,
            modalities=["text"],
            reasoning_effort="none",
            verbosity="medium",
            prompt_cache_key="k",
            safety_identifier="s",
            audio=None,
            prediction=None,
            web_search_options=None,
            functions=None,
            function_call=None,
            logit_bias={},
            stop=None,
        ),
    ),
    ("/v1/chat/completions", chat(store=True, service_tier="priority", tool_choice="auto")),
    (
        "/v1/chat/completions",
        chat(
            messages=[
                {"role": "system", "content": "be brief", "name": "policy"},
                {"role": "user", "content": "w1"},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [],
                    "annotations": [],
                    "audio": None,
                    "function_call": None,
                },
                {"role": "developer", "content": [{"type": "text", "text": "w2"}]},
            ]
        ),
    ),
]


@pytest.mark.parametrize(("path", "body"), ACCEPTED)
def test_fields_at_values_that_change_nothing_are_accepted(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    r = post(client, path, body)
    assert r.status_code == 200, r.text


UNHONOURABLE: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", completion(logit_bias={"5": 10}), "logit_bias"),
    ("/v1/completions", completion(suffix="tail"), "suffix"),
    ("/v1/completions", completion(presence_penalty=0.5), "presence_penalty"),
    ("/v1/completions", completion(repetition_penalty=1.1), "repetition_penalty"),
    ("/v1/completions", completion(min_p=0.1), "min_p"),
    ("/v1/completions", completion(skip_special_tokens=False), "skip_special_tokens"),
    ("/v1/completions", completion(frequency_penalty="0"), "frequency_penalty"),
    ("/v1/completions", completion(temperatur=0.5), "temperatur"),  # a typo is not ignored
    (
        "/v1/chat/completions",
        chat(functions=[{"name": "f", "parameters": {"type": "object"}}]),
        "functions",
    ),
    ("/v1/chat/completions", chat(function_call={"name": "f"}), "function_call"),
    ("/v1/chat/completions", chat(tool_choice="required"), "tool_choice"),
    ("/v1/chat/completions", chat(modalities=["text", "audio"]), "modalities"),
    ("/v1/chat/completions", chat(reasoning_effort="high"), "reasoning_effort"),
    ("/v1/chat/completions", chat(service_tier="platinum"), "service_tier"),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages.0.content",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]),
        "messages.0.tool_calls.0.type",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "tool", "content": "x"}]),
        "messages.0.tool_call_id",
    ),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "function", "content": "x"}]),
        "messages.0.role",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), UNHONOURABLE)
def test_values_the_server_cannot_honour_are_a_400_naming_the_field(
    client: TestClient, seen: list[Submission], path: str, body: dict[str, Any], param: str
) -> None:
    assert_refused(post(client, path, body), param)
    assert seen == []


# ---------------------------------------------------------------------- honoured extensions


def test_echo_prepends_the_prompt(client: TestClient) -> None:
    body = completion(echo=True)
    whole = post(client, "/v1/completions", body).json()["choices"][0]["text"]
    assert whole.startswith(PROMPT) and len(whole) > len(PROMPT)
    tokens = post(client, "/v1/completions", completion(prompt=[5, 6], echo=True)).json()
    assert tokens["choices"][0]["text"].startswith(" w5 w6")
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert texts[0] == PROMPT
    assert len(texts) == 3  # the echo, then one chunk per token


def test_continuous_usage_stats_put_usage_on_every_chunk(client: TestClient) -> None:
    body = completion(
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = list(sse_events(r.iter_lines()))
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3]
    assert all(c["usage"]["prompt_tokens"] == 4 for c in chunks)
    assert chunks[-1]["choices"] == []  # the final usage chunk


def test_a_repeated_prompt_reports_cached_tokens(client: TestClient) -> None:
    prompt = " ".join(f"w{i}" for i in range(1, 60))  # 59 tokens: three full 16-token blocks
    first = post(client, "/v1/completions", completion(prompt=prompt)).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    second = post(client, "/v1/completions", completion(prompt=prompt, n=2)).json()["usage"]
    assert second["prompt_tokens"] == 59
    # Counted once per prompt however many choices share it.
    assert 0 < second["prompt_tokens_details"]["cached_tokens"] <= 48
    body = chat(messages=[{"role": "user", "content": prompt}], stream=True)
    body["stream_options"] = {"include_usage": True}
    for _ in range(2):
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            usage = json.loads(list(sse_events(r.iter_lines()))[-2])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0


# ---------------------------------------------------------------------- server limits


def test_default_chat_max_tokens_and_the_limit(engine: tuple[EngineCore, TimedExecutor]) -> None:
    core, _ = engine
    with client_for(core, default_chat_max_tokens=5, max_tokens_limit=8) as client:
        body = {"messages": CHAT}
        assert post(client, "/v1/chat/completions", body).json()["usage"]["completion_tokens"] == 5
        r = post(client, "/v1/chat/completions", {**body, "max_completion_tokens": 8})
        assert r.json()["usage"]["completion_tokens"] == 8
        assert_refused(
            post(client, "/v1/chat/completions", {**body, "max_completion_tokens": 9}),
            "max_completion_tokens",
            "8",
        )
        assert_refused(post(client, "/v1/completions", completion(max_tokens=9)), "max_tokens")
        # A completion without max_tokens keeps OpenAI's 16 only up to the limit.
        r = post(client, "/v1/completions", {"prompt": PROMPT})
        assert r.json()["usage"]["completion_tokens"] == 8
    with client_for(core, max_tokens_limit=3) as client:
        # The default never exceeds the limit.
        r = post(client, "/v1/chat/completions", {"messages": CHAT})
        assert r.json()["usage"]["completion_tokens"] == 3


def test_the_chat_default_shrinks_to_the_room_the_prompt_leaves(
    engine: tuple[EngineCore, TimedExecutor],
) -> None:
    core, _ = engine
    with client_for(core, default_chat_max_tokens=200) as client:
        long = " ".join(["w7"] * 100)
        r = post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
        usage = r.json()["usage"]
        assert usage["total_tokens"] == 256  # the fake model's context, not a 400
        wait_until(lambda: core.stats().num_running == 0)
