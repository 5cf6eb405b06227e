"""Our constraint specs as TensorRT-LLM guides: which kinds each grammar backend
enforces, and the ``GuidedDecodingParams`` field and value a spec becomes. Nothing here
imports TensorRT-LLM; ``translate.sampling_params`` builds the object.

The kinds follow what TensorRT-LLM's matcher factories compile
(tensorrt_llm/_torch/pyexecutor/grammar_matcher.py at 0fccc5b9): both backends take a
JSON schema (``json``), any JSON object (``json_object``) and a regular expression
(``regex``); ``grammar`` is EBNF on xgrammar and Lark on llguidance. Our grammars are
llguidance's Lark dialect, so xgrammar refuses the ``grammar`` kind; a choice becomes a
grammar of quoted alternatives in the backend's own syntax. Without a backend
TensorRT-LLM runs no guided decoder, so no kind is enforced.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from orchestrator.core import ConstraintError, ConstraintKind, ConstraintSpec

_ALWAYS = frozenset(
    {
        ConstraintKind.JSON_SCHEMA,
        ConstraintKind.JSON_OBJECT,
        ConstraintKind.REGEX,
        ConstraintKind.CHOICE,
    }
)
KINDS: dict[str | None, frozenset[ConstraintKind]] = {
    None: frozenset(),
    "xgrammar": _ALWAYS,
    "llguidance": _ALWAYS | {ConstraintKind.GRAMMAR},
}


class Guide(NamedTuple):
    """One ``GuidedDecodingParams`` keyword and its value."""

    field: str
    value: str | bool


def constraint_kinds(backend: str | None) -> frozenset[ConstraintKind]:
    """The kinds TensorRT-LLM enforces with ``backend`` (``None``: none)."""
    return KINDS[backend]


def guide_of(spec: ConstraintSpec, backend: str) -> Guide:
    """The guide for ``spec`` on ``backend`` (one of its ``KINDS``). Checks what can be
    checked without the backend (JSON that parses, a list of strings) and raises
    ``ConstraintError`` otherwise; the backend compiles the rest inside TensorRT-LLM."""
    kind, value = spec.kind, spec.value
    if kind not in KINDS[backend]:
        raise ConstraintError(f"TensorRT-LLM's {backend} backend does not take {kind.value}")
    if kind is ConstraintKind.JSON_OBJECT:
        return Guide("json_object", True)
    if kind is ConstraintKind.REGEX:
        return Guide("regex", value)
    if kind is ConstraintKind.GRAMMAR:
        return Guide("grammar", value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise ConstraintError(f"not valid JSON: {err}") from None
    if kind is ConstraintKind.JSON_SCHEMA:
        if not isinstance(parsed, dict | bool):
            raise ConstraintError("a JSON schema must be an object or a boolean")
        return Guide("json", value)
    if not parsed or not all(isinstance(c, str) and c for c in parsed):
        raise ConstraintError("a choice must be a non-empty list of non-empty strings")
    # JSON string literals are valid string literals in both Lark and xgrammar's EBNF;
    # non-ASCII text is kept as it is rather than as \\u escapes.
    alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in parsed)
    rule = "start: " if backend == "llguidance" else "root ::= "
    return Guide("grammar", rule + alternatives)
