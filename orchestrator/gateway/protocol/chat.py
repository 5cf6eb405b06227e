"""``POST /v1/chat/completions``: its request (messages, tools, ``response_format``) and
its response and chunk shapes (``chat.completion``, ``chat.completion.chunk``, with
``tool_calls`` whole and streamed)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.gateway.protocol.shared import (
    MAX_DESCRIPTION_LENGTH,
    MAX_LOGPROBS,
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE,
    MAX_NAME_LENGTH,
    MAX_TOKENS_MAX,
    MAX_TOOL_CALL_ID,
    MAX_TOOLS,
    MAX_USER_LENGTH,
    TOOL_NAME_PATTERN,
    FinishReasonLiteral,
    GenerationRequest,
    RequestPart,
    ResponseObject,
    Usage,
    accept_only,
    cross_field_error,
    schema_problem,
)


class TextPart(RequestPart):
    type: Literal["text"]
    text: str


class FunctionCall(RequestPart):
    """A call an assistant message made: ``arguments`` is a JSON object as text."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: str


class ToolCall(RequestPart):
    id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(RequestPart):
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
        accept_only(
            self,
            "function_call",
            lambda v: False,
            "null",
            "the deprecated function_call is not supported; send tool_calls",
        )
        accept_only(self, "audio", lambda v: False, "null", "audio is not supported")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDefinition(RequestPart):
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


class Tool(RequestPart):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(RequestPart):
    name: str = Field(pattern=TOOL_NAME_PATTERN)


class NamedToolChoice(RequestPart):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


class JSONSchemaFormat(RequestPart):
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


class ResponseFormat(RequestPart):
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


class ChatCompletionRequest(GenerationRequest):
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
        accept_only(self, "functions", lambda v: not v, "[]", legacy)
        accept_only(
            self, "function_call", lambda v: v in ("none", "auto"), '"none" or "auto"', legacy
        )
        self._tool_rules()
        accept_only(
            self, "modalities", lambda v: v == ["text"], '["text"]', "the model outputs text"
        )
        accept_only(self, "audio", lambda v: False, "null", "audio output is not supported")
        accept_only(
            self, "prediction", lambda v: False, "null", "predicted outputs are not supported"
        )
        accept_only(
            self,
            "reasoning_effort",
            lambda v: v == "none",
            '"none"',
            "the model does not reason",
        )
        accept_only(
            self, "verbosity", lambda v: v == "medium", '"medium"', "verbosity is not adjustable"
        )
        accept_only(
            self, "web_search_options", lambda v: False, "null", "web search is not supported"
        )
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


class ChatCompletionResponse(ResponseObject):
    object: Literal["chat.completion"] = "chat.completion"
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


class ChatCompletionChunk(ResponseObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
