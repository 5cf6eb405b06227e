"""What a request's output must match: an opaque constraint spec.

The core never interprets a constraint. It carries the spec from the submission to
the executor, and holds the request back while the executor's grammar backend
compiles it. The grammar library lives with the executor that applies the mask, so
the core imports none.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class ConstraintKind(enum.StrEnum):
    """The forms a constraint takes; the names are vLLM's ``structured_outputs`` keys
    and OpenAI's ``response_format`` types."""

    JSON_SCHEMA = "json_schema"  # value: the JSON Schema, as JSON text
    JSON_OBJECT = "json_object"  # value: "" (any JSON object)
    REGEX = "regex"  # value: the regular expression
    CHOICE = "choice"  # value: a JSON list of the allowed strings
    GRAMMAR = "grammar"  # value: a Lark grammar


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """One request's constraint: its kind and its text (see ``ConstraintKind``).

    ``source`` names the API field it came from (``response_format``, ``tools``,
    ``structured_outputs.regex``), so an error can name what the client sent.
    """

    kind: ConstraintKind
    value: str
    source: str = "response_format"

    def __post_init__(self) -> None:
        if self.kind is not ConstraintKind.JSON_OBJECT and not self.value:
            raise ValueError(f"{self.source}: a {self.kind.value} constraint needs a value")


class ConstraintError(ValueError):
    """A spec the grammar backend cannot compile; the message says what is wrong with it
    (without the API field: the engine adds ``spec.source``)."""


@runtime_checkable
class ConstraintBackend(Protocol):
    """What an executor whose ``info().constraint_kinds`` is not empty also implements:
    the compile step of its grammar library.

    ``compile_constraint(spec)`` turns a spec of one of those kinds into a handle the
    executor later finds in the plan (``ScheduledRequest.constraint``) on every step of
    the request; the core never looks inside it. It is called on a worker thread, never
    the engine thread, possibly for several specs at once, so it must be thread-safe and
    must not touch state the engine thread mutates. It raises ``ConstraintError`` (or any
    exception: the engine reports its text) for a spec it cannot compile, and may take
    long: the engine enforces ``scheduler.constraints.compile_timeout_s`` around it and
    drops a late handle.
    """

    def compile_constraint(self, spec: ConstraintSpec) -> object: ...
