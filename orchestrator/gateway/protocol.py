"""The OpenAI API as JSON: request and response models for completions, chat, models and
errors. Nothing outside ``orchestrator.gateway`` imports this module: the serving layer
turns these into engine ``Request``s.

Requests forbid unknown fields (a misspelt parameter is a 400 that names it, not a
silently ignored setting). Extensions to OpenAI's schema: ``top_k``, ``ignore_eos`` and
``priority`` (lower numbers are served first).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_STRINGS = 4
MAX_CHOICES = 16  # n, and prompts x n for a batch of completion prompts
MAX_LOGPROBS = 20


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Request):
    include_usage: bool = False


class _GenerationRequest(_Request):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, description="extension: keep the k likeliest; 0 or -1 disable")
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="extension: do not stop at end-of-sequence")
    priority: int | None = Field(None, description="extension: lower is served first")
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise ValueError("stop must be a string or a list of strings")
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(value)}")
        if any(not s for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported; only 0 is accepted")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``. ``prompt`` is a string, a list of token ids, or a batch
    (list) of either; each prompt gets ``n`` choices."""

    prompt: list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_batch(cls, value: Any) -> Any:
        """Normalise to a batch: a list of strings or a list of token-id lists."""
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value:
            if all(_is_token_id(t) for t in value):
                return [value]
            if all(isinstance(p, str) for p in value):
                return value
            if all(isinstance(p, list) and p and all(map(_is_token_id, p)) for p in value):
                return value
        raise ValueError(
            "prompt must be a non-empty string, a list of token ids, or a list of either"
        )

    @model_validator(mode="after")
    def _batch_size(self) -> CompletionRequest:
        if len(self.prompt) * self.n > MAX_CHOICES:
            raise ValueError(
                f"{len(self.prompt)} prompts x n={self.n} is over {MAX_CHOICES} choices"
            )
        return self


class ChatMessage(_Request):
    """One message; ``content`` may also be a list of text parts, which are joined."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in value
        ):
            return "".join(p["text"] for p in value)
        raise ValueError(
            "content must be a string or a list of text parts "
            "({'type': 'text', 'text': ...}); other part types are not supported"
        )


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``; the prompt is ``messages`` through the model's chat
    template. ``max_completion_tokens`` is the newer name of ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# ---------------------------------------------------------------------- responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReasonLiteral = Literal["stop", "length"]


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


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


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


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


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
