"""Choice deltas in OpenAI's shapes: ``text_completion`` and ``chat.completion`` (whole
responses and streamed chunks), including their two logprob formats, and a chat
choice's tool calls (``message.tool_calls``, streamed as ``delta.tool_calls``) read by
the configured tool parser's per-choice parsers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import BaseModel

from orchestrator.core import FinishReason
from orchestrator.gateway.choice import ChoiceDelta, TokenLogprob
from orchestrator.gateway.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    DeltaMessage,
    FunctionCallDelta,
    FunctionCallOut,
    ToolCallDelta,
    ToolCallOut,
    TopLogprob,
)
from orchestrator.gateway.protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
)
from orchestrator.gateway.protocol.shared import FinishReasonLiteral, Usage
from orchestrator.gateway.tokenizer import Tokenizer
from orchestrator.gateway.tool_parsers.calls import CallPiece, ChoiceParser, Parsed


def _api_finish_reason(reason: FinishReason | None) -> FinishReasonLiteral | None:
    """``stop``/``length`` pass through; a request that ends otherwise ends with an error
    (never with a finish reason), so nothing else reaches a response."""
    if reason is FinishReason.STOP:
        return "stop"
    if reason is FinishReason.LENGTH:
        return "length"
    return None


class ResponseBuilder(Protocol):
    """Builds one endpoint's responses and stream chunks from its choices' deltas."""

    def stream_start(self, num_choices: int) -> list[BaseModel]:
        """Chunks sent before any token."""
        ...

    def stream_chunk(self, delta: ChoiceDelta) -> BaseModel | None:
        """The chunk of one delta; ``None`` when it has nothing to send yet (text a
        tool-call parser holds back)."""
        ...

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


class CompletionResponseBuilder:
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


class ChatResponseBuilder:
    """``/v1/chat/completions``; streams open with the assistant role for each choice."""

    def __init__(
        self,
        response_id: str,
        model: str,
        tokenizer: Tokenizer,
        logprobs: bool,
        choice_parser: Callable[[], ChoiceParser] | None = None,
    ) -> None:
        """``choice_parser`` makes one parser per choice when the request offers tools:
        calls in the text become ``tool_calls``, and a choice that made any and
        stopped finishes with ``tool_calls``."""
        self._id = response_id
        self._model = model
        self._created = int(time.time())
        self._tokens = _TokenStrings(tokenizer)
        self._logprobs = logprobs
        self._choice_parser = choice_parser
        self._parsers: dict[int, ChoiceParser] = {}

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

    def stream_chunk(self, delta: ChoiceDelta) -> BaseModel | None:
        logprobs = self._logprobs_of(delta.logprobs) if self._logprobs else None
        finish = _api_finish_reason(delta.finish_reason)
        if self._choice_parser is None:
            message = DeltaMessage(content=delta.text or None)
        else:
            parser = self._parsers.get(delta.index)
            if parser is None:
                parser = self._parsers[delta.index] = self._choice_parser()
            parsed = parser.push(delta.text)
            if delta.finish_reason is not None:
                parsed.extend(parser.finish())
                finish = _tool_finish(finish, parser.num_calls)
            if not parsed.content and not parsed.calls and not delta.logprobs and not finish:
                return None
            message = DeltaMessage(
                content=parsed.content or None, tool_calls=_call_deltas(parsed.calls) or None
            )
        choice = ChatChunkChoice(
            index=delta.index, delta=message, logprobs=logprobs, finish_reason=finish
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
            text = "".join(d.text for d in parts)
            finish = _api_finish_reason(parts[-1].finish_reason if parts else None)
            message = AssistantMessage(content=text)
            if self._choice_parser is not None:
                parser = self._choice_parser()
                parsed = parser.push(text)
                parsed.extend(parser.finish())
                calls = _whole_calls(parsed)
                message = AssistantMessage(
                    content=parsed.content if parsed.content or not calls else None,
                    tool_calls=calls or None,
                )
                finish = _tool_finish(finish, parser.num_calls)
            choices.append(
                ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=finish)
            )
        return ChatCompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )


def _tool_finish(finish: FinishReasonLiteral | None, num_calls: int) -> FinishReasonLiteral | None:
    """A choice that stopped after making calls finishes with ``tool_calls``; one cut
    by ``max_tokens`` keeps ``length`` (its last call may be unfinished)."""
    return "tool_calls" if finish == "stop" and num_calls else finish


def _call_deltas(pieces: Sequence[CallPiece]) -> list[ToolCallDelta]:
    return [
        ToolCallDelta(
            index=p.index,
            id=p.id,
            type="function" if p.id is not None else None,
            function=FunctionCallDelta(name=p.name, arguments=p.arguments),
        )
        for p in pieces
    ]


def _whole_calls(parsed: Parsed) -> list[ToolCallOut]:
    """The pieces of each call joined: the same text a client joining the stream gets."""
    calls: list[ToolCallOut] = []
    for piece in parsed.calls:
        if piece.id is not None and piece.name is not None:
            calls.append(
                ToolCallOut(id=piece.id, function=FunctionCallOut(name=piece.name, arguments=""))
            )
        calls[piece.index].function.arguments += piece.arguments
    return calls
