"""``POST /v1/completions``: its request (a prompt, token ids, or a batch of either) and
its response and chunk shape (``text_completion``, with the legacy logprobs)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from orchestrator.gateway.protocol.shared import (
    MAX_CHOICES,
    MAX_LOGPROBS,
    MAX_PROMPTS,
    FinishReasonLiteral,
    GenerationRequest,
    ResponseObject,
    TokenId,
    Usage,
    accept_only,
    are_token_ids,
    cross_field_error,
    is_token_id,
)

PromptTokens = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(GenerationRequest):
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
        if are_token_ids(value):
            return value
        if isinstance(value, list) and value:
            batch = all(isinstance(p, str) and p for p in value) or all(map(are_token_ids, value))
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
        accept_only(self, "suffix", lambda v: v == "", '""', "suffix insertion is not supported")
        if self.echo and self.logprobs is not None:
            raise cross_field_error(
                "echo", "echo with logprobs is not supported (no prompt logprobs)"
            )
        return self

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt as a batch: a list of strings or a list of token-id lists."""
        p: Any = self.prompt  # the validator fixed which of the four shapes it is
        if isinstance(p, str) or is_token_id(p[0]):
            return [p]
        return list(p)


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


class CompletionResponse(ResponseObject):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None
