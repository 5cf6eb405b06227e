"""The serving layer: OpenAI requests in, engine submissions out, and back.

For each API request it validates what the schema cannot (model name, prompt length
against the context, output tokens against the server's limit), builds one engine
``Submission`` per choice with ``SamplingParams`` (end-of-sequence ids as stop tokens
unless ``ignore_eos``) and the request's output constraint (structured outputs, a
forced tool call), submits them, and turns their output streams into a JSON response or
server-sent events. A constrained stream starts only once every choice's first output
(or its end) has arrived: a constraint the engine cannot compile is then still a 400,
never an error event after a 200. It also closes the loop on every request: aborts what
is still running when the client leaves, records metrics and writes one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from orchestrator.common.async_engine import AsyncEngine, InvalidConstraintError
from orchestrator.core import (
    EngineError,
    FinishReason,
    OverloadedError,
    SamplingParams,
    Submission,
)
from orchestrator.gateway.choice import ChoiceDelta, ChoiceState
from orchestrator.gateway.config import ObjectiveConfig
from orchestrator.gateway.constraints import chat_constraint, completion_constraint
from orchestrator.gateway.errors import APIError, to_api_error
from orchestrator.gateway.formats import (
    ChatResponseBuilder,
    CompletionResponseBuilder,
    ResponseBuilder,
)
from orchestrator.gateway.job import CallInfo, Job
from orchestrator.gateway.lifecycle import InFlight
from orchestrator.gateway.llmd import LlmdHints, read_hints
from orchestrator.gateway.metrics import GatewayMetrics
from orchestrator.gateway.middleware import mark_logged
from orchestrator.gateway.protocol.chat import ChatCompletionRequest
from orchestrator.gateway.protocol.completions import CompletionRequest
from orchestrator.gateway.protocol.shared import Usage
from orchestrator.gateway.tokenizer import ChatTemplateError, Tokenizer
from orchestrator.gateway.tool_parsers.base import ToolParser
from orchestrator.gateway.tool_parsers.hermes import HermesToolParser

logger = logging.getLogger("orchestrator.gateway.requests")

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer
# Temperatures below this are greedy: dividing logits by a smaller one overflows float32
# (and the distribution is one-hot to float precision anyway).
GREEDY_BELOW_TEMPERATURE = 1e-5
SEED_MODULUS = 2**64  # choice seeds wrap into the unsigned 64 bits executors take
MAX_LOGGED_NAME = 64  # characters of a client-supplied name echoed in an error message


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """Output-token settings of the server (``ServerConfig``): the chat default when a
    request gives none (``None``: the rest of the context) and the most any choice may
    ask for (``None``: only the context limits it)."""

    default_chat_max_tokens: int | None = None
    max_tokens_limit: int | None = None


class OpenAIServing:
    """Completions and chat completions over an ``AsyncEngine``."""

    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Tokenizer,
        model_name: str,
        metrics: GatewayMetrics,
        in_flight: InFlight,
        log_prompts: bool = False,
        limits: ServingLimits | None = None,
        tenant_classes: Mapping[str, str] | None = None,
        tool_parser: ToolParser | None = None,
        objectives: Mapping[str, ObjectiveConfig] | None = None,
    ) -> None:
        """``tenant_classes`` (``server.tenant_slo_classes``) maps a tenant to the SLO
        class of its requests that name none; without one the engine applies
        ``scheduler.default_slo_class``. ``tool_parser`` (``server.tool_call_parser``)
        prompts, constrains and parses tool calls; default ``hermes``. ``objectives``
        (``server.objectives``) maps an llm-d objective name to a priority and SLO
        class (``llmd.read_hints``)."""
        self._engine = engine
        self._tokenizer = tokenizer
        self.model_name = model_name
        self._metrics = metrics
        self._in_flight = in_flight
        self._log_prompts = log_prompts
        self._limits = limits or ServingLimits()
        self._tenant_classes = tenant_classes or {}
        self._tool_parser = tool_parser or HermesToolParser()
        self._objectives = objectives or {}

    def now(self) -> float:
        """The engine clock (seconds): request arrival and token times use it."""
        return self._engine.clock.now()

    # ------------------------------------------------------------------ endpoints

    async def completions(self, body: CompletionRequest, call: CallInfo) -> Response:
        self._check_model(body.model)
        hints = read_hints(call.http.headers, self._objectives)
        batch: list[str | list[int]] = list(body.prompts)
        prompts = [self._completion_prompt(p, i, len(batch)) for i, p in enumerate(batch)]
        max_tokens = body.max_tokens
        if max_tokens is None:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
            if self._limits.max_tokens_limit is not None:
                max_tokens = min(max_tokens, self._limits.max_tokens_limit)
        else:
            self._check_limit(max_tokens, "max_tokens")
        for prompt in prompts:
            self._check_context(prompt, max_tokens, "max_tokens")
        n = body.n or 1
        echo = None
        if body.echo:
            texts = [p if isinstance(p, str) else self._tokenizer.decode(p) for p in batch]
            echo = [text for text in texts for _ in range(n)]
        builder = CompletionResponseBuilder(
            f"cmpl-{call.request_id}",
            self.model_name,
            self._tokenizer,
            body.logprobs is not None,
            echo=echo,
        )
        priority = self._priority(body.priority, call, hints)
        job = Job(
            call,
            "completions",
            prompts,
            priority,
            body.prompt,
            hints,
            choices_per_prompt=n,
            constraint=completion_constraint(body),
        )
        return await self._run(job, body, builder, max_tokens, body.logprobs)

    async def chat(self, body: ChatCompletionRequest, call: CallInfo) -> Response:
        self._check_model(body.model)
        hints = read_hints(call.http.headers, self._objectives)
        # The tool parser is asked once: the prompt, a forced call's grammar, the parsers.
        tools = self._tool_parser.for_request(body, self._tokenizer.renders_tools)
        constraint = tools.constraint or chat_constraint(body)
        try:
            prompt = self._tokenizer.encode_chat(tools.messages, tools.template_tools)
        except ChatTemplateError as err:
            raise APIError(
                400, f"messages: {err}", param="messages", code="invalid_value"
            ) from None
        except Exception as exc:
            raise _untokenizable("messages", exc) from None
        limit_field = body.output_limit_field
        room = self._engine.max_model_len - len(prompt)
        if room < 1:
            raise APIError(
                400,
                f"messages: the prompt has {len(prompt)} tokens, leaving no room in the "
                f"model's context of {self._engine.max_model_len} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = body.output_limit
        if max_tokens is None:
            # A default never fails a request: it shrinks to what the context leaves.
            max_tokens = min(
                room,
                self._limits.default_chat_max_tokens or room,
                self._limits.max_tokens_limit or room,
            )
        else:
            self._check_limit(max_tokens, limit_field)
        self._check_context(prompt, max_tokens, limit_field)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        builder = ChatResponseBuilder(
            f"chatcmpl-{call.request_id}",
            self.model_name,
            self._tokenizer,
            bool(body.logprobs),
            choice_parser=tools.choice_parser,
        )
        priority = self._priority(body.priority, call, hints)
        job = Job(
            call,
            "chat",
            [prompt],
            priority,
            tools.messages,
            hints,
            choices_per_prompt=body.n or 1,
            constraint=constraint,
        )
        return await self._run(job, body, builder, max_tokens, logprobs)

    # ------------------------------------------------------------------ validation

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            shown = model if len(model) <= MAX_LOGGED_NAME else model[:MAX_LOGGED_NAME] + "…"
            raise APIError(
                404,
                f"model {shown!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def _completion_prompt(self, prompt: str | list[int], index: int, count: int) -> list[int]:
        param = "prompt" if count == 1 else f"prompt.{index}"
        if isinstance(prompt, str):
            try:
                ids = self._tokenizer.encode(prompt)
            except Exception as exc:
                raise _untokenizable(param, exc) from None
        else:
            vocab = self._tokenizer.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(
                    400,
                    f"{param}: token id {bad} is outside the vocabulary [0, {vocab})",
                    param=param,
                    code="invalid_value",
                )
            ids = list(prompt)
        if not ids:
            raise APIError(400, f"{param}: the prompt is empty", param=param, code="invalid_value")
        return ids

    def _check_limit(self, max_tokens: int, limit_field: str) -> None:
        limit = self._limits.max_tokens_limit
        if limit is not None and max_tokens > limit:
            raise APIError(
                400,
                f"{limit_field}: {max_tokens} is over this server's limit of {limit} output "
                "tokens per choice",
                param=limit_field,
                code="invalid_value",
            )

    def _check_context(self, prompt: Sequence[int], max_tokens: int, limit_field: str) -> None:
        limit = self._engine.max_model_len
        if len(prompt) + max_tokens > limit:
            raise APIError(
                400,
                f"{limit_field}: {max_tokens} output tokens plus the prompt's {len(prompt)} "
                f"tokens is {len(prompt) + max_tokens}, over the model's context of {limit} "
                "tokens",
                param=limit_field,
                code="context_length_exceeded",
            )

    @staticmethod
    def _priority(body_priority: int | None, call: CallInfo, hints: LlmdHints) -> int:
        """The body's ``priority``, else the ``X-Priority`` header, else the priority of
        the request's llm-d objective (``server.objectives``), else 0. All are held to
        the same range (the API's and the config's bounds)."""
        for priority in (body_priority, call.priority_header, hints.priority):
            if priority is not None:
                return priority
        return 0

    # ------------------------------------------------------------------ generation

    @staticmethod
    def _sampling(
        body: CompletionRequest | ChatCompletionRequest,
        max_tokens: int,
        logprobs: int | None,
        stop_ids: tuple[int, ...],
        choice: int,
    ) -> SamplingParams:
        temperature = 1.0 if body.temperature is None else body.temperature
        if temperature < GREEDY_BELOW_TEMPERATURE:
            temperature = 0.0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(body.top_k or 0, 0),
            # Choices of one prompt must differ, yet stay reproducible.
            seed=None if body.seed is None else (body.seed + choice) % SEED_MODULUS,
            stop_token_ids=stop_ids,
            logprobs=logprobs,
        )

    async def _run(
        self,
        job: Job,
        body: CompletionRequest | ChatCompletionRequest,
        builder: ResponseBuilder,
        max_tokens: int,
        logprobs: int | None,
    ) -> Response:
        stop_ids = () if body.ignore_eos else self._tokenizer.eos_token_ids
        n = job.choices_per_prompt
        num_choices = len(job.prompts) * n
        self._in_flight.acquire()
        try:
            for prompt_index, prompt in enumerate(job.prompts):
                for k in range(n):
                    index = prompt_index * n + k
                    sampling = self._sampling(body, max_tokens, logprobs, stop_ids, k)
                    request_id = job.call.request_id
                    if num_choices > 1:
                        request_id = f"{request_id}-{index}"
                    await self._submit(job, index, request_id, prompt, sampling, body)
        except EngineError as exc:
            error = to_api_error(exc)
            job.fail(error)
            if isinstance(exc, OverloadedError):
                self._metrics.rejected.inc()
            self._close(job)
            raise error from None
        except BaseException:
            job.fail(APIError(500, "submission interrupted"))
            self._close(job)
            raise
        if body.stream and job.constraint is not None:
            try:
                if not await _unless_disconnected(job.call.http, job.started()):
                    self._close(job)
                    return Response(status_code=CLIENT_CLOSED_REQUEST)
            except Exception as exc:
                error = self._api_error(job, exc)
                job.fail(error)
                self._close(job)
                raise error from None
        if body.stream:
            return _SSEResponse(
                self._sse(job, builder, body.include_usage_in_stream, body.continuous_usage),
                on_close=lambda: self._close(job),
                on_cancel=lambda: job.cut_by_server(),
            )
        return await self._respond(job, builder)

    @staticmethod
    def _api_error(job: Job, exc: BaseException) -> APIError:
        """``to_api_error``, with a constraint error naming the field it came from."""
        if (
            isinstance(exc, InvalidConstraintError)
            and exc.param is None
            and job.constraint is not None
        ):
            exc = InvalidConstraintError(str(exc), param=job.constraint.source)
        return to_api_error(exc)

    async def _submit(
        self,
        job: Job,
        index: int,
        request_id: str,
        prompt: list[int],
        sampling: SamplingParams,
        body: CompletionRequest | ChatCompletionRequest,
    ) -> None:
        hints = job.hints
        tenant = job.call.tenant(body.user, hints)
        # The request's own class, then its llm-d objective's, then its tenant's; the
        # engine applies ``default_slo_class`` to one that still names none.
        slo_class = job.call.slo_class(body.slo_class)
        if slo_class is None:
            slo_class = hints.slo_class
        if slo_class is None and tenant is not None:
            slo_class = self._tenant_classes.get(tenant)
        request = Submission(
            request_id=request_id,
            prompt_token_ids=tuple(prompt),
            sampling=sampling,
            priority=job.priority,
            arrival_time=job.call.arrival_time,
            slo_class=slo_class,
            tenant=tenant,
            constraint=job.constraint,
            ttft_target_s=hints.ttft_target_s,
            tpot_target_s=hints.tpot_target_s,
        )
        choice = ChoiceState(index, request, self._tokenizer, body.stop_strings)
        job.streams.append(await self._engine.submit(request))
        job.choices.append(choice)

    async def _respond(self, job: Job, builder: ResponseBuilder) -> Response:
        deltas: list[ChoiceDelta] = []

        async def collect() -> None:
            async with contextlib.aclosing(job.deltas(self._engine.clock)) as stream:
                async for delta in stream:
                    deltas.append(delta)

        try:
            if not await _unless_disconnected(job.call.http, collect()):
                return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            error = self._api_error(job, exc)
            job.fail(error)
            raise error from None
        finally:
            self._close(job)
        body = builder.response(deltas, len(job.choices), job.usage())
        return JSONResponse(body.model_dump(mode="json"))

    async def _sse(
        self, job: Job, builder: ResponseBuilder, include_usage: bool, continuous_usage: bool
    ) -> AsyncIterator[str]:
        try:
            for chunk in builder.stream_start(len(job.choices)):
                yield _sse_data(chunk, job.usage() if continuous_usage else None)
            # Tokens per choice as of the deltas sent so far: the choices themselves may
            # already be further along than the delta being sent.
            sent: dict[int, int] = {}
            async with contextlib.aclosing(job.deltas(self._engine.clock)) as stream:
                async for delta in stream:
                    sent[delta.index] = delta.num_output_tokens
                    piece = None if delta.is_empty else builder.stream_chunk(delta)
                    if piece is not None:
                        usage = job.usage(sum(sent.values())) if continuous_usage else None
                        yield _sse_data(piece, usage)
            if include_usage:
                yield _sse_data(builder.stream_usage(job.usage()))
        except Exception as exc:
            # Headers are sent: the error travels as a final event, as OpenAI does.
            error = self._api_error(job, exc)
            job.fail(error)
            yield f"data: {json.dumps(error.body())}\n\n"
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------------ bookkeeping

    def _close(self, job: Job) -> None:
        """Abort what still runs, record metrics, log one line, release the slot.
        Idempotent: both the response and its stream may call it."""
        if job.closed:
            return
        job.closed = True
        for stream in job.streams:
            stream.close()
        self._in_flight.release()
        now = self._engine.clock.now()
        arrival = job.call.arrival_time
        reasons = []
        for choice in job.choices:
            reason = choice.finish_reason or (
                FinishReason.ABORT if job.client_left else FinishReason.ERROR
            )
            reasons.append(reason.value)
            queued = (
                choice.first_scheduled_time - arrival
                if choice.first_scheduled_time is not None
                else None
            )
            self._metrics.observe_request(choice.record(arrival), reason, queued)
        usage = job.usage()
        if job.choices:  # a request refused at admission used nothing
            self._metrics.observe_usage(usage.prompt_tokens, usage.completion_tokens)
        first_tokens = [c.token_times[0] for c in job.choices if c.token_times]
        entry: dict[str, Any] = {
            "request_id": job.call.request_id,
            "method": job.call.http.method,
            "path": job.call.http.url.path,
            "endpoint": job.endpoint,
            "status": CLIENT_CLOSED_REQUEST if job.client_left else job.status,
            "priority": job.priority,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "completion_tokens": usage.completion_tokens,
            "ttft_s": round(min(first_tokens) - arrival, 4) if first_tokens else None,
            "total_s": round(now - arrival, 4),
            "finish_reason": reasons[0] if len(reasons) == 1 else (reasons or None),
        }
        if job.error:
            entry["error"] = job.error
        if job.error_detail:
            entry["error_detail"] = job.error_detail
        if self._log_prompts:
            entry["prompt"] = job.prompt_text
        logger.info(json.dumps(entry))
        mark_logged(job.call.http.scope)


def _untokenizable(param: str, exc: Exception) -> APIError:
    """400 for text the tokenizer refused (the schema already rules out invalid Unicode,
    so this is unexpected: the cause is logged, not returned)."""
    logger.warning("the tokenizer refused %s", param, exc_info=exc)
    return APIError(
        400, f"{param}: the text could not be tokenized", param=param, code="invalid_value"
    )


def _sse_data(chunk: BaseModel, usage: Usage | None = None) -> str:
    """One SSE event. Like OpenAI's, every streamed choice carries ``finish_reason`` and
    ``logprobs`` (null until set); unset delta fields and an absent ``usage`` are left out.
    ``usage`` (continuous usage stats) is set on the chunk if given."""
    data = chunk.model_dump(mode="json")
    if usage is not None:
        data["usage"] = usage.model_dump(mode="json")
    if data.get("usage") is None:
        data.pop("usage", None)
    for choice in data.get("choices", []):
        delta = choice.get("delta")
        if delta is not None:
            choice["delta"] = {k: v for k, v in delta.items() if v is not None}
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _unless_disconnected(http: HTTPRequest, work: Awaitable[None]) -> bool:
    """Run ``work`` unless the client disconnects first (then cancel it). True if it
    completed."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(http))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            return True
        return False
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _wait_for_disconnect(http: HTTPRequest) -> None:
    # The body has been read, so the next ASGI message is the disconnect.
    while (await http.receive())["type"] != "http.disconnect":
        pass


class _SSEResponse(StreamingResponse):
    """Server-sent events that run ``on_close`` however the response ends, even if the
    client leaves before the first chunk (when the body iterator never starts), and
    ``on_cancel`` first when the server cancels it. (A client's disconnect ends the
    response normally: Starlette stops streaming when it sees one.)"""

    def __init__(
        self,
        content: AsyncIterator[str],
        on_close: Callable[[], None],
        on_cancel: Callable[[], None],
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close
        self._on_cancel = on_cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            self._on_cancel()
            raise
        finally:
            self._on_close()
