"""What a choice's tool-call parser reads out of generated text: call pieces (with
OpenAI's call ids) and content, and the ``ChoiceParser`` protocol every format's parser
keeps. The response builder turns these into OpenAI's ``tool_calls``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

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


class ChoiceParser(Protocol):
    """Reads one choice's text, in pieces, into content and calls. ``push`` returns
    what can be told so far; ``finish`` (once, at the end) returns the rest.
    ``num_calls`` counts the calls found. Pushing a text whole or in any split gives
    the same content and the same calls."""

    @property
    def num_calls(self) -> int: ...

    def push(self, text: str) -> Parsed: ...

    def finish(self) -> Parsed: ...
