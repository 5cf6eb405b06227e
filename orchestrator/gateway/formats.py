"""Choice deltas in OpenAI's shapes: ``text_completion`` and ``chat.completion`` (whole
responses and streamed chunks), including their two logprob formats."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel

from orchestrator.core import FinishReason
from orchestrator.gateway.choice import ChoiceDelta, TokenLogprob
from orchestrator.gateway.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    FinishReasonLiteral,
    TopLogprob,
    Usage,
)
from orchestrator.gateway.tokenizer import Tokenizer


def _api_finish_reason(reason: FinishReason | None) -> FinishReasonLiteral | None:
    """``stop``/``length`` pass through; a request that ends otherwise ends with an error
    (never with a finish reason), so nothing else reaches a response."""
    if reason is FinishReason.STOP:
        return "stop"
    if reason is FinishReason.LENGTH:
        return "length"
    return None


class ResponseFormat(Protocol):
    """Shapes one endpoint's responses."""

    def stream_start(self, num_choices: int) -> list[BaseModel]:
        """Chunks sent before any token."""
        ...

    def stream_chunk(self, delta: ChoiceDelta) -> BaseModel: ...

    def stream_usage(self, usage: Usage) -> BaseModel:
        """The final chunk of ``stream_options.include_usage``: no choices, the usage."""
        ...

    def response(self, deltas: Sequence[ChoiceDelta], num_choices: int, usage: Usage) -> BaseModel:
        """The whole response from every delta of every choice, in arrival order."""
        ...


class _TokenStrings:
    """Token text and bytes for logprobs, as the tokenizer spells them."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def bytes(self, token_id: int) -> bytes:
        return self._tokenizer.token_bytes(token_id)

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def _by_choice(deltas: Sequence[ChoiceDelta], num_choices: int) -> list[list[ChoiceDelta]]:
    grouped: list[list[ChoiceDelta]] = [[] for _ in range(num_choices)]
    for delta in deltas:
        grouped[delta.index].append(delta)
    return grouped


class CompletionFormat:
    """``/v1/completions``; ``logprobs`` is the legacy per-token list format. ``echo``
    holds each choice's prompt text when the client asked for it: a whole response
    prepends it to the choice's text, a stream sends it as each choice's first chunk."""

    def __init__(
        self,
        response_id: str,
        model: str,
        tokenizer: Tokenizer,
        logprobs: bool,
        echo: Sequence[str] | None = None,
    ) -> None:
        self._id = response_id
        self._model = model
        self._created = int(time.time())
        self._tokens = _TokenStrings(tokenizer)
        self._logprobs = logprobs
        self._echo = echo

    def _logprobs_of(self, tokens: Sequence[TokenLogprob], offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for t in tokens:
            text = self._tokens.text(t.token_id)
            out.tokens.append(text)
            out.token_logprobs.append(t.logprob)
            out.top_logprobs.append({self._tokens.text(i): lp for i, lp in t.top})
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def stream_start(self, num_choices: int) -> list[BaseModel]:
        if self._echo is None:
            return []
        return [
            CompletionResponse(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[CompletionChoice(index=i, text=self._echo[i])],
            )
            for i in range(num_choices)
        ]

    def stream_chunk(self, delta: ChoiceDelta) -> BaseModel:
        logprobs = self._logprobs_of(delta.logprobs, delta.text_offset) if self._logprobs else None
        choice = CompletionChoice(
            index=delta.index,
            text=delta.text,
            logprobs=logprobs,
            finish_reason=_api_finish_reason(delta.finish_reason),
        )
        return CompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=[choice]
        )

    def stream_usage(self, usage: Usage) -> BaseModel:
        return CompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=[], usage=usage
        )

    def response(self, deltas: Sequence[ChoiceDelta], num_choices: int, usage: Usage) -> BaseModel:
        choices = []
        for index, parts in enumerate(_by_choice(deltas, num_choices)):
            logprobs = None
            if self._logprobs:
                logprobs = CompletionLogprobs()
                for d in parts:
                    piece = self._logprobs_of(d.logprobs, d.text_offset)
                    logprobs.tokens += piece.tokens
                    logprobs.token_logprobs += piece.token_logprobs
                    logprobs.top_logprobs += piece.top_logprobs
                    logprobs.text_offset += piece.text_offset
            prefix = self._echo[index] if self._echo is not None else ""
            choices.append(
                CompletionChoice(
                    index=index,
                    text=prefix + "".join(d.text for d in parts),
                    logprobs=logprobs,
                    finish_reason=_api_finish_reason(parts[-1].finish_reason if parts else None),
                )
            )
        return CompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )


class ChatFormat:
    """``/v1/chat/completions``; streams open with the assistant role for each choice."""

    def __init__(self, response_id: str, model: str, tokenizer: Tokenizer, logprobs: bool) -> None:
        self._id = response_id
        self._model = model
        self._created = int(time.time())
        self._tokens = _TokenStrings(tokenizer)
        self._logprobs = logprobs

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(
            token=self._tokens.text(token_id),
            logprob=logprob,
            bytes=list(self._tokens.bytes(token_id)),
        )

    def _logprobs_of(self, tokens: Sequence[TokenLogprob]) -> ChatLogprobs:
        content = []
        for t in tokens:
            chosen = self._top(t.token_id, t.logprob)
            top = [self._top(i, lp) for i, lp in t.top]
            content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=top))
        return ChatLogprobs(content=content)

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> BaseModel:
        return ChatCompletionChunk(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )

    def stream_start(self, num_choices: int) -> list[BaseModel]:
        return [
            self._chunk(
                [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))]
            )
            for i in range(num_choices)
        ]

    def stream_chunk(self, delta: ChoiceDelta) -> BaseModel:
        choice = ChatChunkChoice(
            index=delta.index,
            delta=DeltaMessage(content=delta.text or None),
            logprobs=self._logprobs_of(delta.logprobs) if self._logprobs else None,
            finish_reason=_api_finish_reason(delta.finish_reason),
        )
        return self._chunk([choice])

    def stream_usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, deltas: Sequence[ChoiceDelta], num_choices: int, usage: Usage) -> BaseModel:
        choices = []
        for index, parts in enumerate(_by_choice(deltas, num_choices)):
            logprobs = None
            if self._logprobs:
                logprobs = self._logprobs_of([t for d in parts for t in d.logprobs])
            choices.append(
                ChatChoice(
                    index=index,
                    message=AssistantMessage(content="".join(d.text for d in parts)),
                    logprobs=logprobs,
                    finish_reason=_api_finish_reason(parts[-1].finish_reason if parts else None),
                )
            )
        return ChatCompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
