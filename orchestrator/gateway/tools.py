"""Chat messages and tools to what the chat template renders.

Messages become the dicts Hugging Face chat templates read (``developer`` as
``system``; an assistant's ``tool_calls`` with ``arguments`` as an object; ``tool``
results with their ``tool_call_id``). A template that renders tools (it writes the
``tools`` it is given) gets them and the messages as they are. One that does not (as
SmolLM2-135M-Instruct's) gets the tool-call format's own rendering instead: the tools
as a system prompt (before any system message of the client's) and earlier calls and
results written as text. With ``tool_choice: "none"`` no tools are rendered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from orchestrator.gateway.protocol import ChatCompletionRequest, ChatMessage, FunctionDefinition
from orchestrator.gateway.tool_parsers import ToolCallFormat


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as chat templates read them. Content is text ("" when null)."""
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


def offered_tools(body: ChatCompletionRequest) -> list[FunctionDefinition]:
    """The tools the prompt describes: none with ``tool_choice: "none"``."""
    if body.tool_mode == "none":
        return []
    return [t.function for t in body.tools or []]


def prompt_messages(
    body: ChatCompletionRequest, native: bool, fmt: ToolCallFormat
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the ``tools`` argument for the chat template. ``native``: the
    template renders tools itself."""
    if not body.tools and not any(m.tool_calls or m.role == "tool" for m in body.messages):
        # The common case, kept as cheap as a plain chat request was.
        plain = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text}
            for m in body.messages
        ]
        return plain, None
    messages = template_messages(body.messages)
    tools = offered_tools(body)
    if native:
        schemas = [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in tools]
        return messages, schemas or None
    has_history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if has_history:
        messages = fmt.render_history(messages)
    if tools:
        prompt = fmt.system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": f"{prompt}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    return messages, None
