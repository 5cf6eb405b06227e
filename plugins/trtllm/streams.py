"""Token streams of the requests running inside TensorRT-LLM, in either mode.

TensorRT-LLM runs its own loop and streams each request's tokens as they come, usually
ahead of our steps; each stream buffers them until the scheduler asks for the next one.
A backend reports what it heard as ``Update``s, keyed by the submission id it handed out
when the request was sent; ``Streams`` applies them on the thread that runs ``execute``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Update:
    """What TensorRT-LLM reported for one submission: new output tokens, in order, with
    their log-probabilities (``None`` where it sent none); ``final`` when no more will
    come, with TensorRT-LLM's finish reason; ``error`` when it failed the request."""

    submission: int
    tokens: Sequence[int] = ()
    logprobs: Sequence[float | None] = ()
    final: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Stream:
    """One request from its submission to its final update.

    ``pending`` holds ``(token, logprob)`` pairs not yet handed out (``logprob`` is
    ``None`` unless the request asked for log-probabilities). ``last_token`` is the last
    token handed out; the scheduler runs it as the next decode token.
    """

    submission: int
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
    """The live streams by our request id, and the submission ids that map to them."""

    def __init__(self) -> None:
        self._by_request: dict[str, Stream] = {}
        self._by_submission: dict[int, str] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request

    def get(self, request_id: str) -> Stream:
        return self._by_request[request_id]

    def add(self, request_id: str, submission: int, wants_logprobs: bool) -> Stream:
        if request_id in self._by_request:
            raise ValueError(f"request {request_id!r} already runs in TensorRT-LLM")
        stream = Stream(submission, wants_logprobs)
        self._by_request[request_id] = stream
        self._by_submission[submission] = request_id
        return stream

    def drop(self, request_id: str) -> Stream | None:
        """Forget a request; returns its stream (``None`` if it had none)."""
        stream = self._by_request.pop(request_id, None)
        if stream is not None:
            del self._by_submission[stream.submission]
        return stream

    def route(self, update: Update) -> None:
        """Apply one update to its stream. Updates of requests already dropped
        (cancelled, finished) are ignored: TensorRT-LLM still sends the final update of
        a cancelled request. So are updates after a stream's final one: a request ended
        on our side (a refusal inside the loop, in-executor mode) is aborted after its
        final update, and TensorRT-LLM's own ending of it comes later."""
        request_id = self._by_submission.get(update.submission)
        if request_id is None:
            return
        stream = self._by_request[request_id]
        if stream.final:
            return
        if update.error is not None:
            stream.error = update.error
            stream.final = True
            return
        logprobs: Sequence[float | None] = (
            update.logprobs
            if stream.wants_logprobs and update.logprobs
            else [None] * len(update.tokens)
        )
        stream.pending.extend(zip(update.tokens, logprobs, strict=True))
        if update.final:
            stream.final = True
            stream.finish_reason = update.finish_reason
