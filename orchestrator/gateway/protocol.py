"""The OpenAI API as JSON: request and response models for completions, chat, models and
errors. Nothing outside ``orchestrator.gateway`` imports this module: the serving layer
turns these into engine ``Submission``s.

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
``orchestrator.gateway.constraints`` turns the fields into the engine's
``ConstraintSpec``.
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
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
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


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: Any) -> bool:
    """A non-empty list of token ids within the schema's bounds."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(_is_token_id(t) and 0 <= t <= TOKEN_ID_MAX for t in value)
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


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Body(_Request):
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


def _only(data: _Request, field: str, allowed: Callable[[Any], bool], what: str, why: str) -> None:
    """Raise unless ``data.<field>`` is unset or passes ``allowed``."""
    value = getattr(data, field)
    if value is not None and not allowed(value):
        raise cross_field_error(field, f"{why}; only {what} is accepted")


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a JSON schema's shape, or ``None``: it must be a JSON object
    of at most ``MAX_CONSTRAINT_BYTES``, nested at most ``MAX_SCHEMA_DEPTH`` deep, whose
    ``type``, ``properties``, ``required``, ``items`` and ``enum`` keywords have the
    shapes JSON Schema gives them. Whether it compiles is the executor's check.
    Iterative, so deep nesting cannot overflow the stack."""
    if not isinstance(schema, dict):
        return "must be a JSON object (a JSON Schema)"
    size = _json_bytes(schema)
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


class StreamOptions(_Request):
    """``include_usage``: a final chunk with no choices carries the usage.
    ``continuous_usage_stats`` (vLLM's extension): every chunk also carries the usage
    so far. ``include_obfuscation`` is accepted and changes nothing (no chunk is
    padded)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None
    include_obfuscation: bool | None = None


ConstraintText = Annotated[str, Field(min_length=1, max_length=MAX_CONSTRAINT_BYTES)]


class StructuredOutputs(_Request):
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
        if self.choice is not None and _json_bytes(self.choice) > MAX_CONSTRAINT_BYTES:
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


class _GenerationRequest(_Body):
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
    def _generation_rules(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise cross_field_error("stream_options", "stream_options requires stream: true")
        zero = "0"
        _only(self, "presence_penalty", lambda v: v == 0, zero, "penalties are not supported")
        _only(self, "frequency_penalty", lambda v: v == 0, zero, "penalties are not supported")
        _only(self, "logit_bias", lambda v: not v, "{}", "logit bias is not supported")
        _only(self, "repetition_penalty", lambda v: v == 1, "1", "penalties are not supported")
        _only(self, "min_p", lambda v: v == 0, zero, "min_p is not supported")
        _only(self, "skip_special_tokens", bool, "true", "special tokens are always skipped")
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


PromptTokens = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``. ``prompt`` is a string, a list of token ids, or a batch
    (list) of up to 16 of either; each prompt gets ``n`` choices."""

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[
            list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)
        ]
        | PromptTokens
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=MAX_PROMPTS)]
    ) = Field(description=f"a string, token ids, or a list of up to {MAX_PROMPTS} of either")
    echo: bool | None = Field(None, description="prepend the prompt to each choice's text")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES, description="only equal to n")
    suffix: str | None = Field(None, description='only "" (no insertion)')

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        """One clear message for a wrong ``prompt``, instead of one per union branch."""
        if isinstance(value, str) and value:
            return value
        if _token_ids(value):
            return value
        if isinstance(value, list) and value:
            batch = all(isinstance(p, str) and p for p in value) or all(map(_token_ids, value))
            if batch and len(value) > MAX_PROMPTS:
                raise ValueError(f"{len(value)} prompts in one request; at most {MAX_PROMPTS}")
            if batch:
                return value
        raise ValueError(
            "prompt must be a non-empty string, a non-empty list of token ids, or a list of either"
        )

    @model_validator(mode="after")
    def _completion_rules(self) -> CompletionRequest:
        prompts = len(self.prompts)
        n = self.n or 1
        if prompts * n > MAX_CHOICES:
            raise cross_field_error(
                "n", f"{prompts} prompts x n={n} is over {MAX_CHOICES} choices per request"
            )
        if self.best_of is not None and self.best_of != n:
            raise cross_field_error(
                "best_of", f"best_of must equal n ({n}): choices are not ranked server-side"
            )
        _only(self, "suffix", lambda v: v == "", '""', "suffix insertion is not supported")
        if self.echo and self.logprobs is not None:
            raise cross_field_error(
                "echo", "echo with logprobs is not supported (no prompt logprobs)"
            )
        return self

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a batch: a list of strings or a list of token-id lists."""
        p: Any = self.prompt  # the validator fixed which of the four shapes it is
        if isinstance(p, str) or _is_token_id(p[0]):
            return [p]
        return list(p)


class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    """A call an assistant message made: ``arguments`` is a JSON object as text."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: str


class ToolCall(_Request):
    id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Request):
    """One message. ``content`` is a string or a list of text parts (joined); an
    assistant message's may be null when it carries ``tool_calls``. A ``tool`` message
    answers an earlier call: ``tool_call_id`` names it."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_LENGTH)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, min_length=1, max_length=MAX_TOOL_CALL_ID)
    function_call: dict[str, Any] | None = Field(None, description="only null")
    refusal: str | None = None
    audio: dict[str, Any] | None = Field(None, description="only null")
    annotations: list[dict[str, Any]] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, value: Any) -> Any:
        """Text parts only: this server's models read text."""
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"part {i} has type {kind!r}: only text parts "
                        "({'type': 'text', 'text': ...}) are supported"
                    )
            return value
        raise ValueError("content must be a string or a list of text parts")

    @model_validator(mode="after")
    def _message_rules(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant"):
            raise cross_field_error("content", f"a {self.role} message needs content")
        if self.role == "tool" and self.tool_call_id is None:
            raise cross_field_error(
                "tool_call_id", "a tool message needs tool_call_id (the call it answers)"
            )
        if self.role != "tool" and self.tool_call_id is not None:
            raise cross_field_error("tool_call_id", "only a tool message has tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise cross_field_error("tool_calls", "only an assistant message has tool_calls")
        for i, call in enumerate(self.tool_calls or []):
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError as err:
                raise cross_field_error(
                    f"tool_calls.{i}.function.arguments", f"arguments is not valid JSON: {err}"
                ) from None
            if not isinstance(arguments, dict):
                raise cross_field_error(
                    f"tool_calls.{i}.function.arguments", "arguments must be a JSON object"
                )
        _only(
            self,
            "function_call",
            lambda v: False,
            "null",
            "the deprecated function_call is not supported; send tool_calls",
        )
        _only(self, "audio", lambda v: False, "null", "audio is not supported")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDefinition(_Request):
    """A tool the model may call. ``parameters`` is the JSON schema of its arguments
    (absent: any JSON object). ``strict`` is accepted; calls are always held to the
    schema when a call is forced (``tool_choice`` ``required`` or named)."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_LENGTH)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_shape(self) -> FunctionDefinition:
        if self.parameters is not None and (problem := schema_problem(self.parameters)) is not None:
            raise cross_field_error("parameters", f"parameters {problem}")
        return self


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Request):
    name: str = Field(pattern=TOOL_NAME_PATTERN)


class NamedToolChoice(_Request):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


class JSONSchemaFormat(_Request):
    """``response_format.json_schema``: the output is JSON matching ``schema``."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION_LENGTH)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_shape(self) -> JSONSchemaFormat:
        if (problem := schema_problem(self.schema_)) is not None:
            raise cross_field_error("schema", f"schema {problem}")
        return self


class ResponseFormat(_Request):
    """``text`` (no constraint), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise cross_field_error("json_schema", 'type "json_schema" needs json_schema')
        if self.type != "json_schema" and self.json_schema is not None:
            raise cross_field_error(
                "json_schema", f'json_schema is only for type "json_schema", not {self.type!r}'
            )
        return self


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``; the prompt is ``messages`` through the model's chat
    template. ``max_completion_tokens`` is the newer name of ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='default "auto" with tools, else "none"'
    )
    parallel_tool_calls: bool | None = Field(None, description="default true")
    functions: list[dict[str, Any]] | None = Field(
        None, description="only [] (deprecated: send tools)"
    )
    function_call: Literal["none", "auto"] | dict[str, Any] | None = Field(
        None, description='only "none" or "auto" (deprecated: send tool_choice)'
    )
    response_format: ResponseFormat | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    metadata: (
        Annotated[
            dict[
                Annotated[str, Field(max_length=MAX_METADATA_KEY)],
                Annotated[str, Field(max_length=MAX_METADATA_VALUE)],
            ],
            Field(max_length=MAX_METADATA_PAIRS),
        ]
        | None
    ) = None
    prompt_cache_key: str | None = Field(None, max_length=MAX_USER_LENGTH)
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None
    safety_identifier: str | None = Field(None, max_length=MAX_USER_LENGTH)
    modalities: list[Literal["text", "audio"]] | None = Field(None, description='only ["text"]')
    audio: dict[str, Any] | None = Field(None, description="only null")
    prediction: dict[str, Any] | None = Field(None, description="only null")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description='only "none" (the model does not reason)'
    )
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description='only "medium"')
    web_search_options: dict[str, Any] | None = Field(None, description="only null")

    @model_validator(mode="after")
    def _chat_rules(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise cross_field_error("top_logprobs", "top_logprobs requires logprobs: true")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise cross_field_error(
                "max_completion_tokens", "give max_tokens or max_completion_tokens, not both"
            )
        legacy = "the deprecated functions/function_call are not supported; send tools"
        _only(self, "functions", lambda v: not v, "[]", legacy)
        _only(self, "function_call", lambda v: v in ("none", "auto"), '"none" or "auto"', legacy)
        self._tool_rules()
        _only(self, "modalities", lambda v: v == ["text"], '["text"]', "the model outputs text")
        _only(self, "audio", lambda v: False, "null", "audio output is not supported")
        _only(self, "prediction", lambda v: False, "null", "predicted outputs are not supported")
        _only(
            self,
            "reasoning_effort",
            lambda v: v == "none",
            '"none"',
            "the model does not reason",
        )
        _only(self, "verbosity", lambda v: v == "medium", '"medium"', "verbosity is not adjustable")
        _only(self, "web_search_options", lambda v: False, "null", "web search is not supported")
        return self

    def _tool_rules(self) -> None:
        """Tools named once each; a forced choice names a tool there is; history calls
        name offered tools and tool messages answer earlier calls; at most one
        constraint (a forced tool call, ``response_format``, ``structured_outputs``)."""
        if (
            not self.tools
            and self.tool_choice in (None, "none", "auto")
            and self.response_format is None
            and self.structured_outputs is None
            and not any(m.tool_calls or m.role == "tool" for m in self.messages)
        ):
            return  # nothing tool-related: a plain request pays no more than before
        names: list[str] = []
        for i, tool in enumerate(self.tools or []):
            if tool.function.name in names:
                raise cross_field_error(
                    f"tools.{i}.function.name", f"tool {tool.function.name!r} is defined twice"
                )
            names.append(tool.function.name)
        choice = self.tool_choice
        if choice == "required" and not names:
            raise cross_field_error("tool_choice", 'tool_choice "required" needs tools')
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            offered = ", ".join(names) or "none"
            raise cross_field_error(
                "tool_choice",
                f"tool_choice names {choice.function.name!r}, which is not in tools "
                f"(offered: {offered})",
            )
        call_ids: set[str] = set()
        for m, message in enumerate(self.messages):
            for c, call in enumerate(message.tool_calls or []):
                if names and call.function.name not in names:
                    raise cross_field_error(
                        f"messages.{m}.tool_calls.{c}.function.name",
                        f"the call names {call.function.name!r}, which is not in tools",
                    )
                call_ids.add(call.id)
            if message.role == "tool" and message.tool_call_id not in call_ids:
                raise cross_field_error(
                    f"messages.{m}.tool_call_id",
                    "a tool message must answer a call of an earlier assistant message "
                    "(no earlier tool_calls entry has this id)",
                )
        constraints = self.constraint_fields
        if len(constraints) > 1:
            raise cross_field_error(
                constraints[1],
                f"give one constraint per request, not {' and '.join(constraints)}",
            )

    @property
    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        """What the tools do: ``none`` (no tools, or ``tool_choice: "none"``), ``auto``
        (the model may call them), ``required`` (at least one call) or ``named``."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return "required" if self.tool_choice == "required" else "auto"

    @property
    def constraint_fields(self) -> list[str]:
        """The fields of this request that constrain its output. Tools with
        ``tool_choice`` ``auto`` count too: a constrained answer could never be a call."""
        fields = []
        if self.response_format is not None and self.response_format.type != "text":
            fields.append("response_format")
        if self.structured_outputs is not None:
            fields.append("structured_outputs")
        if self.tool_mode != "none":
            fields.append("tool_choice" if self.tool_mode != "auto" else "tools")
        return fields

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


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


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReasonLiteral | None = None


def _now() -> int:
    return int(time.time())


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class FunctionCallOut(BaseModel):
    name: str
    arguments: str = Field(description="the arguments as JSON text, as the model wrote them")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    """``content`` is null when the answer is only tool calls; ``tool_calls`` appears
    only when there are some."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonLiteral | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """One piece of a streamed call: the first piece of a call has its ``id``,
    ``type`` and ``function.name``; later pieces add to ``function.arguments``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data["function"] = {k: v for k, v in data["function"].items() if v is not None}
        return {k: v for k, v in data.items() if v is not None}


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonLiteral | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
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
