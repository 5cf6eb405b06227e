"""Request fields to the engine's ``ConstraintSpec``: what a choice's output must match.

``response_format`` (chat) and ``structured_outputs`` (both endpoints) map one to one
onto ``ConstraintKind``; a forced tool call (``tool_choice`` ``required`` or a named
function) is the configured tool parser's (``tool_parsers``). The protocol models have
already checked shapes, sizes and that at most one is given. ``source`` names the field,
so the engine's compile errors can name it back.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core import ConstraintKind, ConstraintSpec
from orchestrator.gateway.protocol.chat import ChatCompletionRequest
from orchestrator.gateway.protocol.completions import CompletionRequest
from orchestrator.gateway.protocol.shared import StructuredOutputs


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


def chat_constraint(body: ChatCompletionRequest) -> ConstraintSpec | None:
    """The constraint of a chat request's ``structured_outputs`` or ``response_format``,
    if it has one (a forced tool call is the tool parser's)."""
    if body.structured_outputs is not None:
        return structured_outputs_constraint(body.structured_outputs)
    rf = body.response_format
    if rf is not None and rf.type == "json_object":
        return ConstraintSpec(ConstraintKind.JSON_OBJECT, "", "response_format")
    if rf is not None and rf.json_schema is not None:
        schema = _json(rf.json_schema.schema_)
        return ConstraintSpec(ConstraintKind.JSON_SCHEMA, schema, "response_format")
    return None
