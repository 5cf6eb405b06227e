"""What both generation endpoints share: the bounds, the strict request base and its
checks, the fields of completions and chat completions alike (``GenerationRequest``),
usage, and the models and error bodies.

Requests accept OpenAI's whole request schema, with strict JSON types (``"4"``, ``4.0``
and ``true`` are not integers; ``"yes"`` is not a boolean) and every value bounded
(the ``*_MAX``/``MAX_*`` constants below; ``/openapi.json`` states each one). A field
the server cannot honour is accepted only at the values that change nothing
(``NOOP_VALUES``); any other value is a 400 that names the field, as is an unknown
field (a misspelt parameter is an error, not a silently ignored setting). Errors of
rules that span fields name the fields too: they are raised as
``PydanticCustomError`` with the field in ``ctx["param"]``.

Extensions to OpenAI's schema (vLLM's names): ``top_k``, ``ignore_eos``, ``min_tokens``
(only where it cannot matter), ``priority`` (lower is served first), ``slo_class``
(a configured SLO class; also the ``X-SLO-Class`` header),
``stream_options.continuous_usage_stats`` (usage on every chunk),
``structured_outputs`` (one of ``json``, ``regex``, ``choice``, ``grammar``,
``json_object``: the output must match it; both endpoints), and
``repetition_penalty``/``min_p``/``skip_special_tokens`` at their neutral values.

Structured outputs and tools are checked here for shape and size only (a schema must
be a JSON object, at most ``MAX_CONSTRAINT_BYTES`` of JSON, nested at most
``MAX_SCHEMA_DEPTH`` deep); whether a grammar compiles is the executor's to say, and
``orchestrator.gateway.constraints`` (and, for a forced tool call, the tool parser) turns
the fields into the engine's ``ConstraintSpec``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# ---------------------------------------------------------------------- limits

MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256  # characters per stop string (matching cost grows with it)
MAX_CHOICES = 16  # n, and prompts x n for a batch of completion prompts
MAX_PROMPTS = MAX_CHOICES  # prompts in one completions batch
MAX_LOGPROBS = 20
INT32_MAX = 2**31 - 1
MAX_TOKENS_MAX = INT32_MAX  # schema bound; the model's context bounds it further
TOKEN_ID_MAX = INT32_MAX  # schema bound; the vocabulary bounds it further
TOP_K_MAX = INT32_MAX
PRIORITY_MIN, PRIORITY_MAX = -INT32_MAX, INT32_MAX
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # OpenAI's int64
MAX_USER_LENGTH = 256  # also the engine's tenant key
MAX_SLO_CLASS_LENGTH = 64
MAX_NAME_LENGTH = 256
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits
# Structured outputs. One constraint's text (a schema as JSON, a regex, a grammar, the
# choices as JSON) is at most this many bytes: the grammar compiler's time grows with
# it, and the engine enforces its own limit and a compile timeout too.
MAX_CONSTRAINT_BYTES = 65_536
MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays in one JSON schema
MAX_CHOICE_OPTIONS = 256  # structured_outputs.choice
MAX_TOOLS = 128  # OpenAI's limit
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names
MAX_TOOL_CALL_ID = 256
MAX_DESCRIPTION_LENGTH = 8192  # characters of a tool's or schema's description
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def are_token_ids(value: Any) -> bool:
    """A non-empty list of token ids within the schema's bounds."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(is_token_id(t) and 0 <= t <= TOKEN_ID_MAX for t in value)
    )


def cross_field_error(param: str, message: str) -> PydanticCustomError:
    """A validation error about ``param`` (a field path relative to the model that
    raises it) that the error mapping reports as ``<path>: <message>`` with that
    ``param``; ``message`` should name every field involved."""
    return PydanticCustomError("invalid_combination", message, {"param": param})


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_bad_text(value: Any) -> str | None:
    """The dotted path of the first string (or key) in a parsed JSON value that is not
    valid Unicode (it holds a lone UTF-16 surrogate such as ``"\\ud800"``), or ``None``.
    Iterative, so however deep the nesting, it cannot overflow the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        children: list[tuple[str, Any]] = []
        if isinstance(item, str):
            if not _valid_text(item):
                return path or "(body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                key = str(key)
                if not _valid_text(key):
                    return f"{path}.(key)" if path else "(key)"
                children.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            children = [(f"{path}.{i}" if path else str(i), c) for i, c in enumerate(item)]
        stack.extend(reversed(children))  # depth-first, in document order
    return None


class RequestPart(BaseModel):
    """Any object of a request body: an unknown field, a loose type (``"4"`` for 4) or a
    non-finite number is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RequestBody(RequestPart):
    """A whole request body: every string in it must be valid Unicode, since the
    tokenizer (and the log line) cannot take a lone surrogate."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        bad = _first_bad_text(data)
        if bad is not None:
            raise PydanticCustomError(
                "invalid_unicode",
                "text contains a lone UTF-16 surrogate; strings must be valid Unicode",
                {"param": bad},
            )
        return data


def accept_only(
    data: RequestPart, field: str, allowed: Callable[[Any], bool], what: str, why: str
) -> None:
    """Raise unless ``data.<field>`` is unset or passes ``allowed``."""
    value = getattr(data, field)
    if value is not None and not allowed(value):
        raise cross_field_error(field, f"{why}; only {what} is accepted")


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a JSON schema's shape, or ``None``: it must be a JSON object
    of at most ``MAX_CONSTRAINT_BYTES``, nested at most ``MAX_SCHEMA_DEPTH`` deep, whose
    ``type``, ``properties``, ``required``, ``items`` and ``enum`` keywords have the
    shapes JSON Schema gives them. Whether it compiles is the executor's check.
    Iterative, so deep nesting cannot overflow the stack."""
    if not isinstance(schema, dict):
        return "must be a JSON object (a JSON Schema)"
    size = json_bytes(schema)
    if size > MAX_CONSTRAINT_BYTES:
        return f"is {size} bytes of JSON; at most {MAX_CONSTRAINT_BYTES}"
    stack: list[tuple[str, Any, int]] = [("", schema, 0)]
    while stack:
        path, node, depth = stack.pop()
        where = f" at {path}" if path else ""
        if isinstance(node, bool):
            continue  # true/false are schemas too
        if not isinstance(node, dict):
            return f"has a subschema{where} that is not an object"
        if depth > MAX_SCHEMA_DEPTH:
            return f"nests deeper than {MAX_SCHEMA_DEPTH} levels"
        kind = node.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is not None and not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
            return f"has type {kind!r}{where}; JSON Schema types are {sorted(JSON_TYPES)}"
        required = node.get("required")
        if required is not None and not (
            isinstance(required, list) and all(isinstance(r, str) for r in required)
        ):
            return f"has a required{where} that is not a list of strings"
        enum = node.get("enum")
        if enum is not None and not isinstance(enum, list):
            return f"has an enum{where} that is not a list"
        properties = node.get("properties")
        if properties is not None:
            if not isinstance(properties, dict):
                return f"has properties{where} that are not an object"
            stack.extend(
                (f"{path}.properties.{k}".lstrip("."), v, depth + 1) for k, v in properties.items()
            )
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                stack.append((f"{path}.{key}".lstrip("."), node[key], depth + 1))
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            subs = node.get(key)
            if subs is not None:
                if not isinstance(subs, list):
                    return f"has a {key}{where} that is not a list"
                stack.extend(
                    (f"{path}.{key}.{i}".lstrip("."), v, depth + 1) for i, v in enumerate(subs)
                )
        for key in ("$defs", "definitions"):
            defs = node.get(key)
            if isinstance(defs, dict):
                stack.extend(
                    (f"{path}.{key}.{k}".lstrip("."), v, depth + 1) for k, v in defs.items()
                )
    return None


Probability = Annotated[float, Field(ge=0, le=1)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]


class StreamOptions(RequestPart):
    """``include_usage``: a final chunk with no choices carries the usage.
    ``continuous_usage_stats`` (vLLM's extension): every chunk also carries the usage
    so far. ``include_obfuscation`` is accepted and changes nothing (no chunk is
    padded)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None
    include_obfuscation: bool | None = None


ConstraintText = Annotated[str, Field(min_length=1, max_length=MAX_CONSTRAINT_BYTES)]


class StructuredOutputs(RequestPart):
    """vLLM's ``structured_outputs`` extension: exactly one of ``json`` (a JSON schema,
    as an object or as JSON text), ``regex``, ``choice`` (the output is one of these
    strings), ``grammar`` (llguidance's Lark dialect) or ``json_object: true`` (any
    JSON object)."""

    json_: dict[str, Any] | ConstraintText | None = Field(None, alias="json")
    regex: ConstraintText | None = None
    choice: (
        Annotated[
            list[Annotated[str, Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_CHOICE_OPTIONS),
        ]
        | None
    ) = None
    grammar: ConstraintText | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = self.given
        if len(given) != 1:
            named = ", ".join(given) if given else "none"
            raise cross_field_error(
                given[1] if len(given) > 1 else "json",
                f"give exactly one of json, regex, choice, grammar, json_object (given: {named})",
            )
        if isinstance(self.json_, str):
            try:
                parsed = json.loads(self.json_)
            except ValueError as err:
                raise cross_field_error("json", f"json is not valid JSON: {err}") from None
            self.json_ = parsed
        if self.json_ is not None and (problem := schema_problem(self.json_)) is not None:
            raise cross_field_error("json", f"json {problem}")
        if self.choice is not None and json_bytes(self.choice) > MAX_CONSTRAINT_BYTES:
            raise cross_field_error("choice", f"choice is over {MAX_CONSTRAINT_BYTES} bytes")
        return self

    @property
    def given(self) -> list[str]:
        """The fields set (``json_object: false`` counts as unset)."""
        fields = {
            "json": self.json_ is not None,
            "regex": self.regex is not None,
            "choice": self.choice is not None,
            "grammar": self.grammar is not None,
            "json_object": bool(self.json_object),
        }
        return [name for name, isset in fields.items() if isset]


class GenerationRequest(RequestBody):
    """Fields shared by completions and chat completions. ``None`` means OpenAI's
    default throughout."""

    model: str | None = Field(None, description="must be the served model's name if given")
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS_MAX, description="output tokens per choice"
    )
    temperature: float | None = Field(
        None, ge=0, le=2, description="default 1; 0 (or below 1e-5) is greedy"
    )
    top_p: float | None = Field(None, gt=0, le=1, description="default 1")
    top_k: int | None = Field(
        None, ge=-1, le=TOP_K_MAX, description="extension: keep the k likeliest; 0 or -1 off"
    )
    seed: int | None = Field(
        None, ge=SEED_MIN, le=SEED_MAX, description="choice i of a prompt uses seed + i"
    )
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = (
        Field(None, description=f"up to {MAX_STOP_STRINGS} strings, never returned")
    )
    n: int | None = Field(None, ge=1, le=MAX_CHOICES, description="choices per prompt")
    stream: bool | None = None
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    ignore_eos: bool | None = Field(None, description="extension: do not stop at end-of-sequence")
    min_tokens: int | None = Field(
        None,
        ge=0,
        le=MAX_TOKENS_MAX,
        description="extension: accepted where it changes nothing (0, or with ignore_eos "
        "and no stop strings)",
    )
    priority: int | None = Field(
        None, ge=PRIORITY_MIN, le=PRIORITY_MAX, description="extension: lower is served first"
    )
    slo_class: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SLO_CLASS_LENGTH,
        description="extension: the configured SLO class to serve the request under",
    )
    user: str | None = Field(None, max_length=MAX_USER_LENGTH)
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="only 0")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="only 0")
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="only {} (the sampler has no logit bias)"
    )
    repetition_penalty: float | None = Field(None, gt=0, le=2, description="extension: only 1")
    min_p: Probability | None = Field(None, description="extension: only 0")
    skip_special_tokens: bool | None = Field(None, description="extension: only true")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="extension (vLLM's): the output must match one constraint"
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        """One clear message for a wrong ``stop``, instead of one per union branch."""
        strings = [value] if isinstance(value, str) else value
        if value is None or (
            isinstance(strings, list)
            and len(strings) <= MAX_STOP_STRINGS
            and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in strings)
        ):
            return value
        raise ValueError(
            f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings, each "
            f"1 to {MAX_STOP_LENGTH} characters"
        )

    @model_validator(mode="after")
    def _generation_rules(self) -> GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise cross_field_error("stream_options", "stream_options requires stream: true")
        zero = "0"
        accept_only(self, "presence_penalty", lambda v: v == 0, zero, "penalties are not supported")
        accept_only(
            self, "frequency_penalty", lambda v: v == 0, zero, "penalties are not supported"
        )
        accept_only(self, "logit_bias", lambda v: not v, "{}", "logit bias is not supported")
        accept_only(
            self, "repetition_penalty", lambda v: v == 1, "1", "penalties are not supported"
        )
        accept_only(self, "min_p", lambda v: v == 0, zero, "min_p is not supported")
        accept_only(self, "skip_special_tokens", bool, "true", "special tokens are always skipped")
        if self.min_tokens:
            if not self.ignore_eos or self.stop_strings:
                raise cross_field_error(
                    "min_tokens",
                    "min_tokens above 0 is only honoured with ignore_eos: true and no stop "
                    "strings (each choice then runs to max_tokens)",
                )
            if self.output_limit is not None and self.min_tokens > self.output_limit:
                raise cross_field_error(
                    "min_tokens", "min_tokens must not exceed max_tokens/max_completion_tokens"
                )
        return self

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def output_limit(self) -> int | None:
        """Output tokens per choice the client asked for, if any."""
        return self.max_tokens

    @property
    def output_limit_field(self) -> str:
        return "max_tokens"

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.continuous_usage_stats)


# The fields accepted only at values that change nothing, with those values, for the
# documentation (docs/gateway.md lists the same).
NOOP_VALUES: dict[str, str] = {
    "presence_penalty, frequency_penalty": "0",
    "logit_bias": "{}",
    "best_of": "equal to n",
    "suffix": '""',
    "min_tokens": "0, or any value up to max_tokens with ignore_eos and no stop",
    "repetition_penalty": "1",
    "min_p": "0",
    "skip_special_tokens": "true",
    "functions (deprecated; send tools)": "[]",
    "function_call (deprecated; send tool_choice)": '"none" or "auto"',
    "modalities": '["text"]',
    "reasoning_effort": '"none"',
    "verbosity": '"medium"',
    "audio, prediction, web_search_options, messages[].function_call": "null",
}


# ---------------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens served from the prefix cache")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


FinishReasonLiteral = Literal["stop", "length", "tool_calls"]  # tool_calls: chat only


def unix_time() -> int:
    return int(time.time())


class ResponseObject(BaseModel):
    """What a generation response or chunk begins with, in this order: its ``id``, its
    ``object`` type (each subclass fixes it), its creation time (Unix seconds) and the
    ``model``."""

    id: str
    object: str
    created: int = Field(default_factory=unix_time)
    model: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=unix_time)
    owned_by: str = "orchestrator"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
