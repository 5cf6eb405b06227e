"""The ``ToolParser`` every tool-call format is, the owner of a chat request's tool
calling, and the record of what it makes of one request (``ChatTools``).

The serving layer asks the configured parser once per request (``for_request``): it
computes the tools the request offers, once; renders the prompt (a chat template that
renders tools gets the tools and the messages as they are; one that does not, as
SmolLM2-135M-Instruct's, gets the format's own rendering: the tools as a system prompt,
before any system message of the client's, and earlier calls and results written as
text); writes the grammar that forces a call (``tool_choice`` ``required`` or a named
function); and hands back a maker of one parser per choice, which the response builder
runs over the choice's text, streamed or whole. With ``tool_choice: "none"`` no tools
are rendered and nothing is parsed.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from orchestrator.core import ConstraintKind, ConstraintSpec
from orchestrator.gateway.errors import APIError
from orchestrator.gateway.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionDefinition,
    NamedToolChoice,
)
from orchestrator.gateway.protocol.shared import MAX_CONSTRAINT_BYTES
from orchestrator.gateway.tool_parsers.calls import ChoiceParser

# An omitted ``parameters`` means any JSON object (OpenAI's functions without a schema).
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# A grammar for several tools holds each tool's schema: allow their sum, bounded.
MAX_TOOL_GRAMMAR_BYTES = 4 * MAX_CONSTRAINT_BYTES


@dataclass(frozen=True, slots=True)
class ChatTools:
    """What a ``ToolParser`` makes of one chat request. ``messages`` and
    ``template_tools`` are the chat template's two arguments; ``constraint`` is the
    grammar of calls when a call is forced, else ``None``; ``choice_parser`` makes one
    parser per choice when the request offers tools (``None``: the text is all
    content)."""

    messages: list[dict[str, Any]]
    template_tools: list[dict[str, Any]] | None = None
    constraint: ConstraintSpec | None = None
    choice_parser: Callable[[], ChoiceParser] | None = None


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as chat templates read them (``developer`` as ``system``; an
    assistant's ``tool_calls`` with ``arguments`` as an object; ``tool`` results with
    their ``tool_call_id``). Content is text ("" when null)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        # "developer" is OpenAI's newer name for system instructions.
        entry: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": m.text,
        }
        if m.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": json.loads(c.function.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        out.append(entry)
    return out


class ToolParser(ABC):
    """One model family's tool-call format (vLLM's ``ToolParser``): the one owner of a
    chat request's tool calling. ``for_request`` is the only question the serving layer
    asks; a format writes the four things it differs in: ``system_prompt``,
    ``render_history``, ``grammar`` and ``parser``. A parser holds no per-request state
    (one instance serves every request); a choice's state lives in its ``parser``."""

    name: ClassVar[str]

    def for_request(self, body: ChatCompletionRequest, native: bool) -> ChatTools:
        """The prompt, the forced-call constraint and the choices' parsers of ``body``.
        ``native``: the chat template renders tools itself. Raises ``APIError`` (400,
        ``tools``) when the tools' grammar is over ``MAX_TOOL_GRAMMAR_BYTES``."""
        if not body.tools and not any(m.tool_calls or m.role == "tool" for m in body.messages):
            # The common case, kept as cheap as a plain chat request was.
            plain = [
                {"role": "system" if m.role == "developer" else m.role, "content": m.text}
                for m in body.messages
            ]
            return ChatTools(plain)
        offered = [] if body.tool_mode == "none" else [t.function for t in body.tools or []]
        constraint = self._forced_call(body, offered)
        messages, template_tools = self._prompt(body.messages, offered, native)
        names = [t.name for t in offered]
        return ChatTools(
            messages,
            template_tools,
            constraint,
            partial(self.parser, names) if names else None,
        )

    def _forced_call(
        self, body: ChatCompletionRequest, offered: list[FunctionDefinition]
    ) -> ConstraintSpec | None:
        """The grammar of calls ``tool_choice`` forces, if it forces one. ``auto`` forces
        none: the model decides whether to call, and the parser reads what it wrote."""
        if body.tool_mode not in ("required", "named"):
            return None
        if isinstance(body.tool_choice, NamedToolChoice):
            wanted = body.tool_choice.function.name
            offered = [f for f in offered if f.name == wanted]
        grammar = self.grammar(offered, parallel=body.parallel_tool_calls is not False)
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

    def _prompt(
        self, messages: Sequence[ChatMessage], offered: list[FunctionDefinition], native: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The chat template's messages and ``tools`` argument."""
        rendered = template_messages(messages)
        if native:
            schemas = [
                {"type": "function", "function": t.model_dump(exclude_none=True)} for t in offered
            ]
            return rendered, schemas or None
        if any(m.get("tool_calls") or m["role"] == "tool" for m in rendered):
            rendered = self.render_history(rendered)
        if offered:
            prompt = self.system_prompt(offered)
            if rendered and rendered[0]["role"] == "system":
                rendered[0] = {"role": "system", "content": f"{prompt}\n\n{rendered[0]['content']}"}
            else:
                rendered.insert(0, {"role": "system", "content": prompt})
        return rendered, None

    @abstractmethod
    def system_prompt(self, tools: Sequence[FunctionDefinition]) -> str:
        """The tools described for a system message, for templates that cannot."""

    @abstractmethod
    def render_history(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages with earlier calls and tool results written as text, as the
        family writes them, so a template that knows only text renders them."""

    @abstractmethod
    def grammar(self, tools: Sequence[FunctionDefinition], parallel: bool) -> str:
        """A Lark grammar whose sentences are one call (``parallel``: one or more) of
        one of ``tools``, each call's arguments held to that tool's schema."""

    @abstractmethod
    def parser(self, names: Sequence[str]) -> ChoiceParser:
        """A parser for one choice; ``names`` are the tools a call may name."""
