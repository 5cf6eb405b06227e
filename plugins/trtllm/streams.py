"""Token streams of the requests running inside TensorRT-LLM's executor.

The executor runs its own loop and streams each request's tokens as they come, usually
ahead of our steps; each stream buffers them until the scheduler asks for the next one.
Responses are read through the attributes listed in ``plugins.trtllm.names``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stream:
    """One request from its enqueue to its final response.

    ``pending`` holds ``(token, logprob)`` pairs not yet handed out (``logprob`` is
    ``None`` unless the request asked for log-probabilities). ``last_token`` is the last
    token handed out; the scheduler runs it as the next decode token.
    """

    engine_id: int
    wants_logprobs: bool
    pending: deque[tuple[int, float | None]] = field(default_factory=deque)
    last_token: int | None = None
    final: bool = False
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ready(self) -> bool:
        """A step may stop waiting for this request: a token is buffered or none will come."""
        return bool(self.pending) or self.final

    def take(self) -> tuple[int, float | None]:
        token, logprob = self.pending.popleft()
        self.last_token = token
        return token, logprob


class Streams:
    """The live streams by our request id, and the executor's ids that map to them."""

    def __init__(self) -> None:
        self._by_request: dict[str, Stream] = {}
        self._by_engine: dict[int, str] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request

    def get(self, request_id: str) -> Stream:
        return self._by_request[request_id]

    def add(self, request_id: str, engine_id: int, wants_logprobs: bool) -> Stream:
        if request_id in self._by_request:
            raise ValueError(f"request {request_id!r} already runs in the executor")
        stream = Stream(engine_id, wants_logprobs)
        self._by_request[request_id] = stream
        self._by_engine[engine_id] = request_id
        return stream

    def drop(self, request_id: str) -> Stream | None:
        """Forget a request; returns its stream (``None`` if it had none)."""
        stream = self._by_request.pop(request_id, None)
        if stream is not None:
            del self._by_engine[stream.engine_id]
        return stream

    def route(self, response: Any) -> None:
        """Apply one executor ``Response`` to its stream. Responses of requests already
        dropped (cancelled, finished) are ignored: the executor still sends the final
        response of a cancelled request."""
        request_id = self._by_engine.get(response.request_id)
        if request_id is None:
            return
        stream = self._by_request[request_id]
        if response.has_error():
            stream.error = response.error_msg
            stream.final = True
            return
        result = response.result
        tokens = list(result.output_token_ids[0])  # beam 0: beam width is 1
        logprobs: list[float | None] = [None] * len(tokens)
        if stream.wants_logprobs and tokens and result.log_probs is not None:
            # The engine executor sends the log-probabilities of all tokens so far with
            # each streamed response; the tail is this response's (also right if only
            # the new ones come).
            logprobs = list(result.log_probs[0][-len(tokens) :])
        stream.pending.extend(zip(tokens, logprobs, strict=True))
        if result.is_final:
            stream.final = True
            stream.finish_reason = result.finish_reasons[0].name
