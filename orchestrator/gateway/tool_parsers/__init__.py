"""Tool calling, one owner per tool-call format of a model family (vLLM's tool parsers),
by the name ``server.tool_call_parser`` gives (vLLM's and trtllm-serve's
``--tool-call-parser`` names): ``base.py`` holds the ``ToolParser`` every format is and
what it makes of a request, one module per format the rest (``hermes.py``)."""

from __future__ import annotations

from orchestrator.gateway.tool_parsers.base import ToolParser
from orchestrator.gateway.tool_parsers.hermes import HermesToolParser

# Keyed by the names ``server.tool_call_parser`` accepts (``ToolCallParserName`` in
# config.py lists the same; a test keeps the two equal).
TOOL_PARSERS: dict[str, ToolParser] = {"hermes": HermesToolParser()}


def tool_parser(name: str) -> ToolParser:
    """The parser named ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise KeyError(
            f"unknown tool_call_parser {name!r}; known: {', '.join(TOOL_PARSERS)}"
        ) from None
