"""Structured outputs and tool calls end to end: the embedded SmolLM2-135M through the
torch executor behind real uvicorn on 127.0.0.1 (configs/serve/smollm2-cpu.yaml),
driven by the official ``openai`` client.

``client.chat.completions.parse`` with a pydantic ``response_format`` must return the
parsed object, and ``tool_choice="required"`` must return calls whose arguments
validate against the tool's schema: the constraint is what makes a 135M model do this.
An executor that cannot enforce constraints refuses them with a 400 naming the field;
then these tests skip, saying so. Any other failure to constrain fails them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from orchestrator.gateway.config import load_serve_config
from tests.gateway.support import running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve" / "smollm2-cpu.yaml"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": WEATHER,
        },
    }
]


class Capital(BaseModel):
    country: str = Field(max_length=32)
    capital: str = Field(max_length=32)
    population_millions: int = Field(ge=0, le=100)


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    config = load_serve_config(CONFIG)
    with running_server(config, ready_timeout_s=600) as (base, _):
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model() -> str:
    return load_serve_config(CONFIG).model.name


def skip_if_not_enforced(refusal: openai.BadRequestError, field: str) -> None:
    """Skip when the executor said it cannot enforce constraints (the engine's 400 at
    submission names the constraint's field); re-raise any other 400."""
    named = refusal.param == field or (refusal.param is None and field in refusal.message)
    if refusal.code == "request_not_admissible" and named:
        pytest.skip(f"the running executor cannot enforce constraints: {refusal.message}")
    raise refusal


def test_parse_with_a_pydantic_model_returns_the_parsed_object(
    client: openai.OpenAI, model: str
) -> None:
    messages: Any = [{"role": "user", "content": "Describe France: its capital and population."}]
    try:
        completion = client.chat.completions.parse(
            model=model, messages=messages, response_format=Capital, max_tokens=80, temperature=0
        )
    except openai.BadRequestError as refusal:
        skip_if_not_enforced(refusal, "response_format")
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    parsed = choice.message.parsed
    assert isinstance(parsed, Capital)
    assert Capital.model_validate_json(choice.message.content or "") == parsed


def test_required_tool_choice_returns_calls_matching_the_schema(
    client: openai.OpenAI, model: str
) -> None:
    messages: Any = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    try:
        completion = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
        )
    except openai.BadRequestError as refusal:
        skip_if_not_enforced(refusal, "tools")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_streamed_required_tool_call_assembles_to_a_valid_call(
    client: openai.OpenAI, model: str
) -> None:
    messages: Any = [{"role": "user", "content": "Weather in Rome, in celsius?"}]
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            # One call: with parallel calls allowed the grammar admits more, and the
            # small model may keep calling until max_tokens.
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
            stream=True,
        )
        chunks = list(stream)
    except openai.BadRequestError as refusal:
        skip_if_not_enforced(refusal, "tools")
    name, arguments, finish = "", "", None
    for chunk in chunks:
        for choice in chunk.choices:
            for piece in choice.delta.tool_calls or []:
                assert piece.index == 0
                name += (piece.function and piece.function.name) or ""
                arguments += (piece.function and piece.function.arguments) or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)
