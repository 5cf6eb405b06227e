"""Property: over generated JSON schemas (nested objects, arrays, enums, numbers with
bounds, optional fields), every output the default model completes under the schema
parses and validates against it, greedy and sampled, through the real engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core import ConstraintKind, ConstraintSpec, EngineCore, FinishReason, Submission
from plugins.torch_executor.weights import LlamaWeights
from tests.e2e.constrained import (
    chat_prompt,
    constrained_engine,
    grammar_backend,
    run,
    sampling,
    text_of,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 64
KEYS = ("id", "name", "tags", "score", "kind", "items")


def _integer(lo: int, span: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": lo + span}


def _number(lo: int, span: int) -> dict[str, Any]:
    return {"type": "number", "minimum": lo, "maximum": lo + span}


LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(_integer, st.integers(-100, 100), st.integers(0, 1000)),
    st.builds(_number, st.integers(-10, 10), st.integers(1, 100)),
    st.lists(
        st.sampled_from(["red", "green", "blue", "north", "south"]),
        min_size=1,
        max_size=4,
        unique=True,
    ).map(lambda values: {"enum": values}),
    st.integers(1, 8).map(lambda n: {"type": "string", "maxLength": n}),
)


@st.composite
def _object(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    required = [k for k in keys if draw(st.booleans())]  # the rest are optional
    return {
        "type": "object",
        "properties": {k: draw(children) for k in keys},
        "required": required,
        "additionalProperties": False,
    }


def _array(items: dict[str, Any], most: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": most}


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(_object(children), st.builds(_array, children, st.integers(1, 3))),
    max_leaves=5,
).map(
    lambda s: (
        s
        if s.get("type") == "object"
        else {
            "type": "object",
            "properties": {"value": s},
            "required": ["value"],
            "additionalProperties": False,
        }
    )
)


@pytest.fixture(scope="module")
def engine(weights_f32: LlamaWeights, cache_dir: Path) -> Any:
    engine = constrained_engine(weights_f32, grammar_backend(weights_f32, cache_dir))
    yield engine
    engine.shutdown()


_seq = iter(range(1_000_000))
# One entry per output of the examples run: whether it completed (ended by its grammar).
_completed: list[bool] = []


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def _outputs_validate(
    engine: EngineCore, tokenizer: Any, schema: dict[str, Any], seed: int
) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    spec = ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(schema))
    prompt = chat_prompt(tokenizer, f"Reply with JSON matching this schema: {json.dumps(schema)}")
    eos = tuple(engine.info.eos_token_ids)
    n = next(_seq)
    subs = [
        Submission(f"g{n}", prompt, sampling(MAX_TOKENS, eos, temperature=0), constraint=spec),
        Submission(
            f"s{n}", prompt, sampling(MAX_TOKENS, eos, temperature=0.8, seed=seed), constraint=spec
        ),
    ]
    done = run(engine, subs)
    for sub in subs:
        result = done[sub.request_id]
        assert result.error is None, result.error
        _completed.append(result.reason is FinishReason.STOP)
        if result.reason is FinishReason.STOP:
            jsonschema.validate(json.loads(text_of(tokenizer, result)), schema)
        else:  # cut off: the output so far is still a prefix the grammar allowed
            assert result.reason is FinishReason.LENGTH and len(result.tokens) == MAX_TOKENS


def test_every_completed_output_validates_against_its_schema(
    engine: EngineCore, tokenizer: Any
) -> None:
    """The property over generated schemas, greedy and sampled; and it is not met only by
    outputs cut off at ``max_tokens``: most outputs complete."""
    _completed.clear()
    _outputs_validate(engine, tokenizer)
    assert sum(_completed) * 2 >= len(_completed), f"completed: {_completed}"
