"""One API request in flight: the facts of its HTTP call (``CallInfo``: its id, arrival,
priority header, and the SLO class and tenant its headers name), and its choices with
their engine streams (``Job``), merged into one stream of deltas, with its usage so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HTTPRequest

from orchestrator.common.async_engine import RequestStream
from orchestrator.core import Clock, ConstraintSpec
from orchestrator.gateway.choice import ChoiceDelta, ChoiceState
from orchestrator.gateway.errors import APIError
from orchestrator.gateway.llmd import LlmdHints
from orchestrator.gateway.protocol.shared import PromptTokensDetails, Usage

SLO_CLASS_HEADER = "X-SLO-Class"
MAX_SLO_CLASS_HEADER = 64  # characters, as the body's ``slo_class``


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Per-HTTP-request facts the routes pass down. ``arrival_time`` is on the engine's
    clock (seconds); ``priority_header`` is the validated ``X-Priority`` value, if any."""

    request_id: str
    arrival_time: float
    priority_header: int | None
    http: HTTPRequest

    def slo_class(self, body_class: str | None) -> str | None:
        """The body's ``slo_class`` wins over the ``X-SLO-Class`` header; ``None`` when
        neither names one. The engine rejects an unknown class with a 400 naming
        ``slo_class``."""
        if body_class is not None:
            return body_class
        header = self.http.headers.get(SLO_CLASS_HEADER)
        if header is None:
            return None
        if not 0 < len(header) <= MAX_SLO_CLASS_HEADER or not header.isprintable():
            raise APIError(
                400,
                f"{SLO_CLASS_HEADER}: must be 1 to {MAX_SLO_CLASS_HEADER} printable characters",
                param=SLO_CLASS_HEADER,
                code="invalid_value",
            )
        return header

    def tenant(self, user: str | None, hints: LlmdHints) -> str | None:
        """Whose share of service a request counts against: the API key it authenticated
        with; else (auth off) the ``x-llm-d-inference-fairness-id`` header, which the
        fleet's gateway sets; else the client's own OpenAI ``user`` field."""
        scheme, _, key = self.http.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key:
            return key
        return hints.fairness_id if hints.fairness_id is not None else user


@dataclass
class Job:
    """One API request in flight: its choices and their engine streams."""

    call: CallInfo
    endpoint: str
    prompts: list[list[int]]
    priority: int
    prompt_text: Any
    hints: LlmdHints
    choices_per_prompt: int = 1
    constraint: ConstraintSpec | None = None
    choices: list[ChoiceState] = field(default_factory=list)
    streams: list[RequestStream] = field(default_factory=list)
    status: int = 200
    error: str | None = None
    error_detail: str | None = None
    closed: bool = False

    def fail(self, error: APIError) -> None:
        self.status, self.error, self.error_detail = error.status_code, error.message, error.detail

    @property
    def client_left(self) -> bool:
        """Choices were cut short, and not by an error: the client went away."""
        return self.error is None and not all(c.finished for c in self.choices)

    def usage(self, completion_tokens: int | None = None) -> Usage:
        """Tokens so far (``completion_tokens`` instead of the choices' current count, for
        a chunk that reports usage as of itself). A prompt counts once however many
        choices it has; its cached tokens are the most any of its choices found in the
        prefix cache."""
        prompt = sum(len(p) for p in self.prompts)
        completion = (
            sum(c.num_output_tokens for c in self.choices)
            if completion_tokens is None
            else completion_tokens
        )
        cached = 0
        for start in range(0, len(self.choices), self.choices_per_prompt):
            group = self.choices[start : start + self.choices_per_prompt]
            cached += max(c.num_cached_tokens for c in group)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )

    def cut_by_server(self) -> None:
        """The server cancelled a stream it could not end in time (a forced exit): log it
        as the server's end, not as a client that left."""
        if self.error is None and not all(c.finished for c in self.choices):
            self.fail(APIError(503, "the server shut down before the response completed"))

    async def started(self) -> None:
        """Wait until every choice has its first output or has ended; raises the first
        choice's error (a constraint that failed to compile fails the whole request)."""
        waits = [asyncio.ensure_future(stream.peek()) for stream in self.streams]
        try:
            await asyncio.gather(*waits)
        finally:
            for wait in waits:  # the rest, once one has failed (peeking consumes nothing)
                wait.cancel()

    async def deltas(self, clock: Clock) -> AsyncGenerator[ChoiceDelta, None]:
        """Deltas of every choice in arrival order. Raises the first ``EngineError`` of any
        choice; every engine request still running is aborted when iteration ends."""
        merged: asyncio.Queue[ChoiceDelta | Exception | None] = asyncio.Queue()

        async def pump(choice: ChoiceState, stream: RequestStream) -> None:
            try:
                async for output in stream:
                    merged.put_nowait(choice.advance(output, clock.now()))
                    if choice.finished:
                        break
                merged.put_nowait(None)
            except Exception as exc:
                merged.put_nowait(exc)
            finally:
                stream.close()  # aborts a choice cut short by a stop string

        tasks = [
            asyncio.create_task(pump(c, s)) for c, s in zip(self.choices, self.streams, strict=True)
        ]
        try:
            remaining = len(tasks)
            while remaining:
                item = await merged.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            for stream in self.streams:
                stream.close()
