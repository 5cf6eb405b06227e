"""Structured outputs and tool calls through the app, over a fake engine that keeps
the engine side's contract for constraints (``tests/gateway/constrained.py``): what
each request field becomes (the ``ConstraintSpec`` on the submission, checked to
compile and to accept the scripted output with llguidance), the 400s, tool calls in
whole responses and in streams, and a constraint that fails to compile answered as
a 400 before any byte of a stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import ConstraintKind, ConstraintSpec, Submission
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.lifecycle import LoadedModel
from tests.gateway.constrained import ByteTokenizer, ConstrainedCore, grammar_accepts
from tests.gateway.support import sse_events, wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "byte-model"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
TWO_CALLS = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _config() -> ServeConfig:
    return ServeConfig.model_validate(
        {"model": {"name": MODEL, "max_model_len": 4096}, "executor": {"type": "sim"}}
    )


SCRIPTS: dict[str, str] = {}  # a request's last user message -> what the model writes


def _script(submission: Submission) -> str | None:
    text = bytes(t for t in submission.prompt_token_ids if t < 256).decode()
    return next((out for key, out in SCRIPTS.items() if key in text), None)


def _compile_error(spec: ConstraintSpec) -> str | None:
    if "pathological" in spec.value:
        return (
            "the JSON schema did not compile within scheduler.constraints.compile_timeout_s (2 s)"
        )
    return None


@pytest.fixture(scope="module")
def core() -> ConstrainedCore:
    return ConstrainedCore(_script, _compile_error)


@pytest.fixture(scope="module")
def client(core: ConstrainedCore) -> Iterator[TestClient]:
    app = create_app(_config(), lambda: LoadedModel(core, ByteTokenizer()), {})
    with TestClient(app) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        yield c


def chat(client: TestClient, user: str, **body: Any) -> Any:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": user}], **body}
    return client.post("/v1/chat/completions", json=payload)


def stream(client: TestClient, user: str, **body: Any) -> tuple[int, list[Any]]:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": user}],
        "stream": True,
        **body,
    }
    with client.stream("POST", "/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(r.read())]
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    return 200, [json.loads(e) for e in events[:-1]]


def last_spec(core: ConstrainedCore) -> ConstraintSpec | None:
    return core.submissions[-1].constraint


# ---------------------------------------------------------------------- mapping


def test_response_format_json_schema_is_a_schema_constraint_the_output_obeys(
    client: TestClient, core: ConstrainedCore
) -> None:
    SCRIPTS["person one"] = '{"name": "Ada", "age": 36}'
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    r = chat(client, "person one", response_format=fmt)
    assert r.status_code == 200, r.text
    spec = last_spec(core)
    assert spec is not None and spec.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(spec.value) == PERSON and spec.source == "response_format"
    content = r.json()["choices"][0]["message"]["content"]
    assert grammar_accepts(spec, content)
    jsonschema.validate(json.loads(content), PERSON)
    assert not grammar_accepts(spec, '{"name": "Ada"}')  # the grammar really constrains
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_json_object_and_every_structured_outputs_form_map_to_their_kind(
    client: TestClient, core: ConstrainedCore
) -> None:
    cases: list[tuple[str, dict[str, Any], ConstraintKind, str, str]] = [
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_object"}},
            ConstraintKind.JSON_OBJECT,
            "response_format",
            '{"a": 1}',
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"json": PERSON}},
            ConstraintKind.JSON_SCHEMA,
            "structured_outputs.json",
            '{"name": "x", "age": 1}',
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"json": json.dumps(PERSON)}},
            ConstraintKind.JSON_SCHEMA,
            "structured_outputs.json",
            '{"name": "x", "age": 1}',
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"regex": "[0-9]{3}-[a-z]+"}},
            ConstraintKind.REGEX,
            "structured_outputs.regex",
            "123-abc",
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"choice": ["yes", "no"]}},
            ConstraintKind.CHOICE,
            "structured_outputs.choice",
            "no",
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"grammar": 'start: "a"+ "b"'}},
            ConstraintKind.GRAMMAR,
            "structured_outputs.grammar",
            "aaab",
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"json_object": True}},
            ConstraintKind.JSON_OBJECT,
            "structured_outputs.json_object",
            "{}",
        ),
    ]
    for i, (path, fields, kind, source, output) in enumerate(cases):
        key = f"mapping case {i}"
        SCRIPTS[key] = output
        if path == "/v1/completions":
            body = {"model": MODEL, "prompt": key, "max_tokens": 64, **fields}
        else:
            body = {"model": MODEL, "messages": [{"role": "user", "content": key}], **fields}
        r = client.post(path, json=body)
        assert r.status_code == 200, (fields, r.text)
        spec = last_spec(core)
        assert spec is not None and (spec.kind, spec.source) == (kind, source), fields
        choice = r.json()["choices"][0]
        text = choice["text"] if path == "/v1/completions" else choice["message"]["content"]
        assert text == output and grammar_accepts(spec, text), fields


def test_no_constraint_and_no_tools_leave_the_submission_unconstrained(
    client: TestClient, core: ConstrainedCore
) -> None:
    r = chat(
        client,
        "plain",
        max_tokens=3,
        response_format={"type": "text"},
        tools=TOOLS,
        tool_choice="none",
    )
    assert r.status_code == 200
    assert last_spec(core) is None
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "xxx"}


# ---------------------------------------------------------------------- 400s


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}},
        "response_format.json_schema.schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "thing"}},
            }
        },
        "response_format.json_schema.schema",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs",
    ),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": 5}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a" * 70_000}}, "structured_outputs.regex"),
    (
        {
            "structured_outputs": {
                "json": {
                    "type": "object",
                    "properties": {"a": {"type": "array", "items": {"type": "string"}}},
                    "x": "y" * 70_000,
                }
            }
        },
        "structured_outputs.json",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools.1.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
        "tools.0.function.parameters",
    ),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
    ),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_constraints_and_tools_are_a_400_naming_the_field(
    client: TestClient, core: ConstrainedCore, fields: dict[str, Any], param: str
) -> None:
    before = len(core.submissions)
    r = chat(client, "bad", **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert param in error["message"]
    assert len(core.submissions) == before  # nothing reached the engine


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_schema_depth_is_bounded_at_the_api(client: TestClient) -> None:
    assert (
        chat(client, "deep", max_tokens=1, structured_outputs={"json": deep_schema(20)}).status_code
        == 200
    )
    r = chat(client, "deep", structured_outputs={"json": deep_schema(40)})
    assert r.status_code == 400 and "deeper" in r.json()["error"]["message"]


HISTORY_BAD: list[tuple[list[dict[str, Any]], str]] = [
    (
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{oops"},
                    }
                ],
            }
        ],
        "messages.0.tool_calls.0.function.arguments",
    ),
    (
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "[1]"},
                    }
                ],
            }
        ],
        "messages.0.tool_calls.0.function.arguments",
    ),
    (
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "launch", "arguments": "{}"},
                    }
                ],
            }
        ],
        "messages.0.tool_calls.0.function.name",
    ),
    (
        [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "c9", "content": "sunny"},
        ],
        "messages.1.tool_call_id",
    ),
    (
        [
            {
                "role": "user",
                "content": "hi",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ],
            }
        ],
        "messages.0.tool_calls",
    ),
]


@pytest.mark.parametrize(("messages", "param"), HISTORY_BAD, ids=[p for _, p in HISTORY_BAD])
def test_bad_tool_history_is_a_400_naming_the_message(
    client: TestClient, messages: list[dict[str, Any]], param: str
) -> None:
    r = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": TOOLS}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# ---------------------------------------------------------------------- tool calls


def test_required_tool_choice_is_a_grammar_of_calls_and_the_answer_is_tool_calls(
    client: TestClient, core: ConstrainedCore
) -> None:
    SCRIPTS["weather in paris"] = TWO_CALLS
    r = chat(client, "weather in paris", tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    spec = last_spec(core)
    assert spec is not None and spec.kind is ConstraintKind.GRAMMAR and spec.source == "tools"
    assert grammar_accepts(spec, TWO_CALLS)
    assert grammar_accepts(spec, CALL)
    assert not grammar_accepts(spec, "It is sunny.")  # a call is forced
    assert not grammar_accepts(
        spec, CALL.replace('"city"', '"town"')
    )  # arguments follow the schema
    assert not grammar_accepts(spec, CALL.replace("get_weather", "launch"))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    arguments = json.loads(calls[0]["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER)
    assert arguments == {"city": "Paris", "days": 2}
    assert json.loads(calls[1]["function"]["arguments"]) == {}


def test_a_named_function_or_no_parallel_calls_allow_exactly_that(
    client: TestClient, core: ConstrainedCore
) -> None:
    SCRIPTS["only time"] = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    r = chat(
        client,
        "only time",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert r.status_code == 200, r.text
    spec = last_spec(core)
    assert spec is not None
    assert grammar_accepts(spec, SCRIPTS["only time"])
    assert not grammar_accepts(spec, CALL)  # the other tool is not allowed
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    r = chat(client, "only time", tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    spec = last_spec(core)
    assert spec is not None and grammar_accepts(spec, CALL) and not grammar_accepts(spec, TWO_CALLS)


def test_auto_is_unconstrained_and_parsed(client: TestClient, core: ConstrainedCore) -> None:
    SCRIPTS["maybe call"] = "Let me check.\n" + CALL
    r = chat(client, "maybe call", tools=TOOLS)
    assert r.status_code == 200
    assert last_spec(core) is None
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "Let me check."
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    SCRIPTS["just talk"] = "It is <b>sunny</b> in <tool_call>Paris."
    r = chat(client, "just talk", tools=TOOLS)
    assert r.json()["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "It is <b>sunny</b> in <tool_call>Paris."},
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_tools_reach_the_prompt_in_the_formats_system_block_when_the_template_cannot(
    client: TestClient, core: ConstrainedCore
) -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "snow"},
    ]
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    prompt = bytes(t for t in core.submissions[-1].prompt_token_ids if t < 256).decode()
    system = prompt.split("\nuser: ")[0]
    assert system.startswith("system: You are a function calling AI model.")
    assert '"name": "get_weather"' in system and "Be terse." in system
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        in prompt
    )
    assert "user: <tool_response>\nsnow\n</tool_response>" in prompt


def test_a_template_that_renders_tools_gets_them_and_the_messages_as_they_are() -> None:
    tokenizer = ByteTokenizer(renders_tools=True)
    core = ConstrainedCore()
    app = create_app(_config(), lambda: LoadedModel(core, tokenizer), {})
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "snow"},
    ]
    with TestClient(app) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        r = c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 1},
        )
        assert r.status_code == 200
    rendered, tools = tokenizer.rendered[-1]
    assert tools == TOOLS
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert rendered[2] == {"role": "tool", "content": "snow", "tool_call_id": "call_1"}


def test_streamed_tool_calls_have_openais_chunk_shape(client: TestClient) -> None:
    SCRIPTS["stream calls"] = TWO_CALLS
    status, chunks = stream(client, "stream calls", tools=TOOLS, tool_choice="required")
    assert status == 200
    pieces = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    firsts = [p for p in pieces if "id" in p]
    assert [p["index"] for p in firsts] == [0, 1]
    assert all(p["type"] == "function" and p["function"]["name"] for p in firsts)
    assert all("name" not in p["function"] and "id" not in p for p in pieces if p not in firsts)
    arguments = [
        "".join(p["function"].get("arguments", "") for p in pieces if p["index"] == i)
        for i in (0, 1)
    ]
    assert json.loads(arguments[0]) == {"city": "Paris", "days": 2}
    assert json.loads(arguments[1]) == {}
    assert len([p for p in pieces if p["index"] == 0]) > 3  # arguments arrive in pieces
    assert not any(ch["delta"].get("content") for c in chunks for ch in c["choices"])
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == [
        "tool_calls"
    ]


def test_the_official_client_assembles_streamed_calls_like_whole_ones(client: TestClient) -> None:
    SCRIPTS["sdk calls"] = TWO_CALLS
    sdk = openai.OpenAI(
        base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0
    )
    messages: Any = [{"role": "user", "content": "sdk calls"}]
    whole = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required"
    )  # type: ignore[arg-type]
    calls = whole.choices[0].message.tool_calls or []
    joined: dict[int, dict[str, str]] = {}
    for chunk in sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", stream=True
    ):  # type: ignore[arg-type]
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = joined.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += (tc.function and tc.function.name) or ""
            entry["arguments"] += (tc.function and tc.function.arguments) or ""
    assert [(c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        (joined[i]["name"], joined[i]["arguments"]) for i in sorted(joined)
    ]


def test_a_call_cut_by_max_tokens_finishes_with_length(client: TestClient) -> None:
    SCRIPTS["cut call"] = CALL
    r = chat(client, "cut call", tools=TOOLS, tool_choice="required", max_tokens=50)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert CALL.split('"arguments": ')[1].startswith(arguments)  # what was written so far


# ---------------------------------------------------------------------- engine errors


PATHOLOGICAL = {"type": "object", "description": "pathological", "properties": {}}


def test_a_constraint_that_fails_to_compile_is_a_400_whole(client: TestClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PATHOLOGICAL}}
    r = chat(client, "compile", response_format=fmt)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "invalid_constraint"
    assert "compile_timeout_s" in error["message"]
    r = chat(client, "compile", n=2, structured_outputs={"json": PATHOLOGICAL})
    assert r.status_code == 400  # any choice failing fails the whole request
    assert r.json()["error"]["param"] == "structured_outputs.json"


def test_a_constraint_that_fails_to_compile_is_a_400_before_any_stream_byte(
    client: TestClient,
) -> None:
    status, body = stream(client, "compile", n=3, structured_outputs={"json": PATHOLOGICAL})
    assert status == 400
    assert body[0]["error"]["param"] == "structured_outputs.json"
    assert body[0]["error"]["code"] == "invalid_constraint"
    # the server goes on serving, constrained and not
    SCRIPTS["after failure"] = '{"name": "Bo", "age": 2}'
    status, chunks = stream(client, "after failure", structured_outputs={"json": PERSON})
    assert status == 200
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert json.loads(text) == {"name": "Bo", "age": 2}


def test_an_executor_that_cannot_enforce_constraints_is_a_400_naming_the_field() -> None:
    core = ConstrainedCore(enforces=False)
    app = create_app(_config(), lambda: LoadedModel(core, ByteTokenizer()), {})
    with TestClient(app) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        r = chat(c, "x", tools=TOOLS, tool_choice="required")
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "tools"
        assert chat(c, "x", tools=TOOLS, max_tokens=2).status_code == 200  # auto needs no mask
