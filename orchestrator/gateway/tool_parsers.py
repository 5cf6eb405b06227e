"""Tool-call formats of model families, by the name ``server.tool_call_parser`` gives
(vLLM's and trtllm-serve's ``--tool-call-parser`` names).

A format knows four things about its family: how to describe the tools in a prompt
whose chat template cannot (``system_prompt``), how to write earlier calls and tool
results into the history (``render_history``), the Lark grammar (llguidance's dialect)
that forces a call (``grammar``), and how to read calls back out of generated text,
token by token (``parser``). The grammar is only text here: the executor compiles it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.gateway.protocol import FunctionDefinition

# An omitted ``parameters`` means any JSON object (OpenAI's functions without a schema).
ANY_OBJECT: dict[str, Any] = {"type": "object"}
CALL_ID_HEX = 24  # characters of randomness in a call id ("call_" + hex)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:CALL_ID_HEX]}"


@dataclass(frozen=True, slots=True)
class CallPiece:
    """A piece of a streamed call. ``index`` counts the choice's calls from 0; the
    first piece of a call carries ``id`` and ``name``; ``arguments`` is the next
    stretch of its arguments text (possibly empty)."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class Parsed:
    """What a stretch of generated text turned into: plain ``content`` and call pieces."""

    content: str = ""
    calls: list[CallPiece] = field(default_factory=list)

    def extend(self, other: Parsed) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


class ToolCallParser(Protocol):
    """Reads one choice's text, in pieces, into content and calls. ``push`` returns
    what can be told so far; ``finish`` (once, at the end) returns the rest.
    ``num_calls`` counts the calls found. Pushing a text whole or in any split gives
    the same content and the same calls."""

    @property
    def num_calls(self) -> int: ...

    def push(self, text: str) -> Parsed: ...

    def finish(self) -> Parsed: ...


class ToolCallFormat(Protocol):
    name: str

    def system_prompt(self, tools: Sequence[FunctionDefinition]) -> str:
        """The tools described for a system message, for templates that cannot."""
        ...

    def render_history(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages with earlier calls and tool results written as text, as the
        family writes them, so a template that knows only text renders them."""
        ...

    def grammar(self, tools: Sequence[FunctionDefinition], parallel: bool) -> str:
        """A Lark grammar whose sentences are one call (``parallel``: one or more) of
        one of ``tools``, each call's arguments held to that tool's schema."""
        ...

    def parser(self, names: Sequence[str]) -> ToolCallParser:
        """A parser for one choice; ``names`` are the tools a call may name."""
        ...


# ---------------------------------------------------------------------- hermes


HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"


class HermesFormat:
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

    def parser(self, names: Sequence[str]) -> ToolCallParser:
        return HermesParser(names)


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


class HermesParser:
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


# ---------------------------------------------------------------------- registry

# Keyed by the names ``server.tool_call_parser`` accepts (``ToolCallParserName`` in
# config.py lists the same; a test keeps the two equal).
TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {"hermes": HermesFormat()}


def tool_call_format(name: str) -> ToolCallFormat:
    """The format named ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        raise KeyError(
            f"unknown tool_call_parser {name!r}; known: {', '.join(TOOL_CALL_FORMATS)}"
        ) from None
