"""Hermes' tool-call format (NousResearch Hermes 2 Pro; vLLM's ``hermes`` parser), the
one SmolLM2 was tuned on, and its streaming parser."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.gateway.protocol.chat import FunctionDefinition
from orchestrator.gateway.tool_parsers.base import ANY_OBJECT, ToolParser
from orchestrator.gateway.tool_parsers.calls import CallPiece, ChoiceParser, Parsed, new_call_id

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"


class HermesToolParser(ToolParser):
    """Hermes' format (NousResearch Hermes 2 Pro; vLLM's ``hermes`` parser), also what
    SmolLM2 was tuned on: each call is ``<tool_call>`` + a JSON object ``{"name": ...,
    "arguments": {...}}`` + ``</tool_call>``; tools are listed as JSON inside
    ``<tools></tools>`` in the system prompt; tool results come back as
    ``<tool_response>`` blocks. The parser also reads a block holding a JSON list of
    such objects (the form Ollama's SmolLM2 template writes)."""

    name = "hermes"

    def system_prompt(self, tools: Sequence[FunctionDefinition]) -> str:
        listed = "\n".join(
            json.dumps({"type": "function", "function": t.model_dump(exclude_none=True)})
            for t in tools
        )
        return (
            "You are a function calling AI model. You are provided with function "
            "signatures within <tools></tools> XML tags. You may call one or more "
            "functions to assist with the user query. Don't make assumptions about what "
            "values to plug into functions. Here are the available tools:\n"
            f"<tools>\n{listed}\n</tools>\n"
            "For each function call return a JSON object with the function name and "
            "arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>"
        )

    def render_history(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for message in messages:
            if message["role"] == "assistant" and message.get("tool_calls"):
                blocks = [
                    f"{HERMES_OPEN}\n"
                    + json.dumps(
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    )
                    + f"\n{HERMES_CLOSE}"
                    for c in message["tool_calls"]
                ]
                text = "\n".join([message["content"], *blocks] if message["content"] else blocks)
                out.append({"role": "assistant", "content": text})
            elif message["role"] == "tool":
                # Hermes and SmolLM2 read tool results as a user turn.
                text = f"<tool_response>\n{message['content']}\n</tool_response>"
                out.append({"role": "user", "content": text})
            else:
                out.append({"role": message["role"], "content": message["content"]})
        return out

    def grammar(self, tools: Sequence[FunctionDefinition], parallel: bool) -> str:
        rules = []
        for i, tool in enumerate(tools):
            schema = {
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    "arguments": tool.parameters if tool.parameters is not None else ANY_OBJECT,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            rules.append(f'call_{i}: "{HERMES_OPEN}\\n" args_{i} "\\n{HERMES_CLOSE}"')
            rules.append(f"args_{i}: %json {json.dumps(schema)}")
        calls = " | ".join(f"call_{i}" for i in range(len(tools)))
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return "\n".join([start, f"call: {calls}", *rules]) + "\n"

    def parser(self, names: Sequence[str]) -> ChoiceParser:
        return HermesChoiceParser(names)


@dataclass(slots=True)
class _Fields:
    """The top-level keys of a (possibly unfinished) JSON object: each key's value as
    a span of the text; ``end`` is ``None`` while the value is unfinished."""

    spans: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    is_object: bool = True


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """The index after the string starting at ``text[i] == '"'``, or ``None`` if it is
    unfinished."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at ``i``, or ``None`` if unfinished."""
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    while i < len(text) and text[i] not in ",}] \t\r\n":
        i += 1
    return i if i < len(text) else None  # a number may still grow


def _scan_object(text: str) -> _Fields:
    """The top-level fields of the JSON object ``text`` begins (after whitespace)."""
    found = _Fields()
    i = _skip_ws(text, 0)
    if i >= len(text):
        return found
    if text[i] != "{":
        found.is_object = False
        return found
    i += 1
    while True:
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != '"':
            return found
        key_end = _string_end(text, i)
        if key_end is None:
            return found
        try:
            key = json.loads(text[i:key_end])
        except ValueError:
            return found
        i = _skip_ws(text, key_end)
        if i >= len(text) or text[i] != ":":
            return found
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            return found
        end = _value_end(text, i)
        found.spans[key] = (i, end)
        if end is None:
            return found
        i = _skip_ws(text, end)
        if i >= len(text) or text[i] != ",":
            return found
        i += 1


class HermesChoiceParser:
    """Content passes through; a ``<tool_call>`` block becomes a call as soon as its
    ``name`` is a known tool, and its ``arguments`` object streams out as the model
    writes it. A block that names no known tool (or is not JSON) is content, as the
    model wrote it. Whitespace right before a call, and after the last one, is
    dropped; a text prefix that could begin ``<tool_call>`` is held back until it
    cannot."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)
        self._outside = ""  # text not yet classified, outside any block
        self._block: str | None = None  # the open block's text after <tool_call>
        self._call: CallPiece | None = None  # the open block's call, once named
        self._sent_args = 0  # characters of the open call's arguments sent
        self._dropped = ""  # whitespace dropped before the open block
        self._num_calls = 0

    @property
    def num_calls(self) -> int:
        return self._num_calls

    def push(self, text: str) -> Parsed:
        out = Parsed()
        while text:
            if self._block is None:
                text = self._push_outside(text, out)
            else:
                text = self._push_block(text, out)
        return out

    def finish(self) -> Parsed:
        out = Parsed()
        if self._block is not None:
            if self._call is not None:
                out.calls.extend(self._arguments(self._block, final=True))
            else:
                out.content += self._dropped + HERMES_OPEN + self._block
            self._block = None
        elif self._outside.strip() or not self._num_calls:
            out.content += self._outside
        self._outside = ""
        return out

    def _push_outside(self, text: str, out: Parsed) -> str:
        buffer = self._outside + text
        start = buffer.find(HERMES_OPEN)
        if start >= 0:
            before = buffer[:start]
            self._emit_content(before, out, final=True)
            # Kept in case the block turns out to be text after all.
            self._dropped = before[len(before.rstrip(" \t\r\n")) :]
            self._outside = ""
            self._block, self._call, self._sent_args = "", None, 0
            return buffer[start + len(HERMES_OPEN) :]
        # Hold back a tail that could begin the open tag, and whitespace (it may only
        # separate calls).
        hold = next(
            (
                k
                for k in range(min(len(HERMES_OPEN) - 1, len(buffer)), 0, -1)
                if HERMES_OPEN.startswith(buffer[-k:])
            ),
            0,
        )
        self._outside = self._emit_content(buffer[: len(buffer) - hold], out, final=False)
        self._outside += buffer[len(buffer) - hold :]
        return ""

    @staticmethod
    def _emit_content(text: str, out: Parsed, final: bool) -> str:
        """Send ``text`` but its trailing whitespace, which is returned (held back)
        until more text shows whether it only separates calls; right before a block
        (``final``) it is dropped."""
        body = text.rstrip(" \t\r\n")
        out.content += body
        return "" if final else text[len(body) :]

    def _push_block(self, text: str, out: Parsed) -> str:
        assert self._block is not None
        block = self._block + text
        close = block.find(HERMES_CLOSE)
        inner = block if close < 0 else block[:close]
        self._block = inner
        if self._call is None:
            self._name_call(inner, out)
        if self._call is not None:
            out.calls.extend(self._arguments(inner, final=close >= 0))
        if close < 0:
            return ""
        if self._call is None:
            self._close_unnamed(inner, out)
        self._block, self._call = None, None
        return block[close + len(HERMES_CLOSE) :]

    def _name_call(self, inner: str, out: Parsed) -> None:
        fields = _scan_object(inner)
        span = fields.spans.get("name")
        if span is None or span[1] is None or inner[span[0]] != '"':
            return
        name = json.loads(inner[span[0] : span[1]])
        if name in self._names:
            self._call = CallPiece(self._num_calls, "", new_call_id(), name)
            self._num_calls += 1
            self._sent_args = 0
            out.calls.append(self._call)

    def _arguments(self, inner: str, final: bool) -> list[CallPiece]:
        """The next stretch of the open call's arguments text. An object streams as it
        grows; another value (a string holding JSON, a number) goes out whole."""
        assert self._call is not None
        span = _scan_object(inner).spans.get("arguments")
        if span is None:
            if final and self._sent_args == 0:
                return [CallPiece(self._call.index, "{}")]
            return []
        start, end = span
        raw = inner[start : end if end is not None else len(inner)]
        if inner[start] not in "{[":
            if end is None and not final:
                return []
            if inner[start] == '"' and end is not None:
                raw = json.loads(raw)  # arguments written as a JSON string
            if self._sent_args:
                return []
            self._sent_args = len(raw) or 1
            return [CallPiece(self._call.index, raw)]
        piece = raw[self._sent_args :]
        self._sent_args = len(raw)
        return [CallPiece(self._call.index, piece)] if piece else []

    def _close_unnamed(self, inner: str, out: Parsed) -> None:
        """A finished block that named no tool: a JSON list of calls (Ollama's SmolLM2
        form), else content as written."""
        try:
            value = json.loads(inner)
        except ValueError:
            value = None
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) and v.get("name") in self._names for v in value)
        ):
            for v in value:
                arguments = v.get("arguments", {})
                text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                out.calls.append(CallPiece(self._num_calls, text, new_call_id(), v["name"]))
                self._num_calls += 1
            return
        out.content += self._dropped + HERMES_OPEN + inner + HERMES_CLOSE
