"""The hermes tool-call format alone: its parser over every split of a text (what a
stream sees) against the whole text, and its grammar compiled and matched with
llguidance; the parser registry against the names the config accepts."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import ConstraintKind, ConstraintSpec
from orchestrator.gateway.config import ServerConfig, ToolCallParserName
from orchestrator.gateway.protocol.chat import FunctionDefinition
from orchestrator.gateway.tool_parsers import TOOL_PARSERS
from orchestrator.gateway.tool_parsers.calls import Parsed
from orchestrator.gateway.tool_parsers.hermes import HermesToolParser
from tests.gateway.constrained import grammar_accepts

NAMES = ["get_weather", "get_time"]


def run(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    """Feed ``text`` cut at ``cuts``; the content and each call's (name, arguments)."""
    parser = HermesToolParser().parser(NAMES)
    out = Parsed()
    start = 0
    for cut in [*cuts, len(text)]:
        out.extend(parser.push(text[start:cut]))
        start = cut
    out.extend(parser.finish())
    calls: list[list[str]] = []
    for piece in out.calls:
        if piece.id is not None:
            assert piece.index == len(calls) and piece.name is not None
            calls.append([piece.name, ""])
        calls[piece.index][1] += piece.arguments
    assert parser.num_calls == len(calls)
    return out.content, [(n, a) for n, a in calls]


TEXTS = [
    ("plain text, no calls", "plain text, no calls", []),
    ("a <b>tag</b> and <tool", "a <b>tag</b> and <tool", []),
    (
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Sure.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        '<tool_call>{"arguments": {"a": [1, {"b": "}"}]}, "name": "get_time"}</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\n',
        "",
        [("get_time", '{"a": [1, {"b": "}"}]}'), ("get_weather", "{}")],
    ),
    (
        '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "get_time", "arguments": {}}]\n</tool_call>',
        "",
        [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")],
    ),
    (
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call> done',
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call> done',
        [],
    ),
    (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
        "",
        [("get_weather", '{"city": "Oslo"}')],
    ),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
        "",
        [("get_weather", '{"city": "Pa')],
    ),
    ("<tool_call>not json at all", "<tool_call>not json at all", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), TEXTS)
def test_every_split_reads_like_the_whole_text(
    text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    assert run(text, []) == (content, calls)
    for cut in range(1, len(text)):
        assert run(text, [cut]) == (content, calls), cut
    assert run(text, list(range(1, len(text)))) == (content, calls)  # one character at a time


def test_arguments_stream_before_the_call_closes() -> None:
    parser = HermesToolParser().parser(NAMES)
    first = parser.push('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert first.calls[0].name == "get_weather" and first.calls[0].id
    assert "".join(p.arguments for p in first.calls) == '{"ci'
    later = parser.push('ty": "Paris"}}\n</tool')
    assert "".join(p.arguments for p in later.calls) == 'ty": "Paris"}'
    assert later.content == ""


WEATHER = FunctionDefinition(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
)
TIME = FunctionDefinition(name="get_time")


def grammar(parallel: bool, *tools: FunctionDefinition) -> ConstraintSpec:
    return ConstraintSpec(
        ConstraintKind.GRAMMAR, HermesToolParser().grammar(tools, parallel), "tools"
    )


def test_the_grammar_forces_calls_to_offered_tools_with_their_schemas() -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "c"}}\n</tool_call>'
    other = '<tool_call>\n{"name": "get_time", "arguments": {"any": 1}}\n</tool_call>'
    both = grammar(True, WEATHER, TIME)
    assert grammar_accepts(both, call)
    assert grammar_accepts(both, other)  # no parameters: any object
    assert grammar_accepts(both, f"{call}\n{other}")
    assert not grammar_accepts(both, "")
    assert not grammar_accepts(both, call.replace('"c"', '"k"'))  # enum held
    assert not grammar_accepts(both, call.replace(', "unit": "c"', ""))  # required held
    assert not grammar_accepts(grammar(False, WEATHER, TIME), f"{call}\n{other}")
    assert not grammar_accepts(grammar(True, WEATHER), other)
    # what the grammar accepts, the parser reads back as the same call
    content, calls = run(f"{call}\n{other}", [])
    assert content == "" and [n for n, _ in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0][1]) == {"city": "Lyon", "unit": "c"}


def test_the_registry_holds_exactly_the_names_the_config_accepts() -> None:
    assert set(TOOL_PARSERS) == set(typing.get_args(ToolCallParserName))
    assert all(fmt.name == name for name, fmt in TOOL_PARSERS.items())
    with pytest.raises(ValueError, match="tool_call_parser"):
        ServerConfig(tool_call_parser="nonexistent")  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_grammar_matches_calls_in_the_default_models_own_tokens() -> None:
    """The executor compiles the grammar over the served model's vocabulary: a call as
    SmolLM2's tokenizer splits it is accepted there too."""
    import llguidance
    import llguidance.hf
    from llguidance import LLMatcher

    from orchestrator.common.model_source import load_tokenizer
    from orchestrator.core.config import ModelConfig

    hf = load_tokenizer(ModelConfig())
    matcher = LLMatcher(
        llguidance.hf.from_tokenizer(hf),
        llguidance.grammar_from("lark", grammar(True, WEATHER, TIME).value),
        log_level=0,
    )
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "f"}}\n</tool_call>'
    matcher.consume_tokens(hf.encode(call, add_special_tokens=False))
    assert not matcher.is_error(), matcher.get_error()
    assert matcher.is_accepting()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
PLAIN = st.text(max_size=20).filter(lambda t: "<tool_call>" not in t)


@given(
    before=PLAIN,
    calls=st.lists(
        st.tuples(
            st.sampled_from(NAMES), st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
        ),
        min_size=1,
        max_size=3,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
@settings(max_examples=150, deadline=None)
def test_any_calls_in_any_split_come_back_whole(
    before: str, calls: list[tuple[str, dict[str, Any]]], cuts: list[int]
) -> None:
    blocks = [
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls
    ]
    text = before + "\n".join(blocks)
    content, parsed = run(text, sorted({c for c in cuts if 0 < c < len(text)}))
    assert content == before.rstrip(" \t\r\n")
    assert [(n, json.loads(a)) for n, a in parsed] == calls
