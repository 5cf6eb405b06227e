"""Request fields to the engine's ``ConstraintSpec``: what a choice's output must match.

``response_format`` (chat) and ``structured_outputs`` (both endpoints) map one to one
onto ``ConstraintKind``; a forced tool call (``tool_choice`` ``required`` or a named
function) becomes a Lark grammar written by the configured tool-call format. The
protocol models have already checked shapes, sizes and that at most one is given.
``source`` names the field, so the engine's compile errors can name it back.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core import ConstraintKind, ConstraintSpec
from orchestrator.gateway.errors import APIError
from orchestrator.gateway.protocol import (
    MAX_CONSTRAINT_BYTES,
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    StructuredOutputs,
)
from orchestrator.gateway.tool_parsers import ToolCallFormat

# A grammar for several tools holds each tool's schema: allow their sum, bounded.
MAX_TOOL_GRAMMAR_BYTES = 4 * MAX_CONSTRAINT_BYTES


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def structured_outputs_constraint(so: StructuredOutputs) -> ConstraintSpec:
    (given,) = so.given  # the model checked there is exactly one
    source = f"structured_outputs.{given}"
    if so.json_ is not None:
        return ConstraintSpec(ConstraintKind.JSON_SCHEMA, _json(so.json_), source)
    if so.regex is not None:
        return ConstraintSpec(ConstraintKind.REGEX, so.regex, source)
    if so.choice is not None:
        return ConstraintSpec(ConstraintKind.CHOICE, _json(so.choice), source)
    if so.grammar is not None:
        return ConstraintSpec(ConstraintKind.GRAMMAR, so.grammar, source)
    return ConstraintSpec(ConstraintKind.JSON_OBJECT, "", source)


def completion_constraint(body: CompletionRequest) -> ConstraintSpec | None:
    if body.structured_outputs is None:
        return None
    return structured_outputs_constraint(body.structured_outputs)


def chat_constraint(body: ChatCompletionRequest, tools: ToolCallFormat) -> ConstraintSpec | None:
    """The one constraint of a chat request, if any. ``tool_choice`` ``auto`` is none:
    the model decides whether to call, and the parser reads what it wrote."""
    if body.structured_outputs is not None:
        return structured_outputs_constraint(body.structured_outputs)
    rf = body.response_format
    if rf is not None and rf.type == "json_object":
        return ConstraintSpec(ConstraintKind.JSON_OBJECT, "", "response_format")
    if rf is not None and rf.json_schema is not None:
        schema = _json(rf.json_schema.schema_)
        return ConstraintSpec(ConstraintKind.JSON_SCHEMA, schema, "response_format")
    mode = body.tool_mode
    if mode not in ("required", "named"):
        return None
    offered = [t.function for t in body.tools or []]
    if isinstance(body.tool_choice, NamedToolChoice):
        wanted = body.tool_choice.function.name
        offered = [f for f in offered if f.name == wanted]
    parallel = body.parallel_tool_calls is not False
    grammar = tools.grammar(offered, parallel)
    size = len(grammar.encode())
    if size > MAX_TOOL_GRAMMAR_BYTES:
        raise APIError(
            400,
            f"tools: the tools' schemas make a {size}-byte grammar; at most "
            f"{MAX_TOOL_GRAMMAR_BYTES} (offer fewer or smaller tools)",
            param="tools",
            code="invalid_value",
        )
    return ConstraintSpec(ConstraintKind.GRAMMAR, grammar, "tools")
