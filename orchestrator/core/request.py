"""Requests as the scheduler sees them: token counts and one ordered status.

There is no prefill/decode flag. A request has ``num_prompt_tokens``,
``num_computed_tokens`` (tokens whose KV is in the cache) and its output tokens;
the scheduler gives it ``n`` tokens per step. A request samples a new token in a
step exactly when that step's tokens reach the end of its known tokens.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.core.constraint import ConstraintSpec

# One-token sequences, shared by every decode of that token. A decode step would
# otherwise build a list per running request: with the plan entry and the output, three
# objects the cyclic collector counts, which at about a thousand running requests ran
# its young collection four times a step instead of twice. Bounded by the vocabulary;
# past ``_SHARED_ONE_TOKEN_MAX`` distinct ids (none has that many) a fresh tuple.
_SHARED_ONE_TOKEN: dict[int, tuple[int]] = {}
_SHARED_ONE_TOKEN_MAX = 1 << 18


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; ordered so that ``status >= FINISHED_STOPPED`` means finished.

    ``WAITING_FOR_GRAMMAR``: accepted, but its constraint is still compiling; it is not
    in the waiting queue and cannot be scheduled until the compile succeeds (then
    ``WAITING``) or fails (then ``FINISHED_ERROR``).
    """

    WAITING_FOR_GRAMMAR = 0
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


class FinishReason(enum.StrEnum):
    """Why a request ended; the values are the OpenAI API's ``finish_reason`` where it has one."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each output token.

    ``temperature == 0`` is greedy. ``top_k == 0`` and ``top_p == 1`` disable those
    filters. ``seed`` makes sampling reproducible per request whatever else is in the
    batch. ``stop_token_ids`` end the request when sampled (the serving layer adds the
    model's end-of-sequence ids unless the client asked to ignore them).
    ``logprobs``: ``None`` returns none, ``0`` the chosen token's, ``N`` also the top N.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be between 0 and 20, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True, slots=True)
class Submission:
    """What a caller hands the engine: one request, immutable once made.

    ``arrival_time`` is seconds on the engine's clock, stamped by the submitter (the
    gateway at HTTP arrival, the simulator at the simulated arrival); policies order by
    it and TTFT counts from it. Lower ``priority`` is served first. ``slo_class`` names
    a configured SLO class (the gateway has already applied a tenant's default class;
    ``None`` leaves ``default_slo_class``) and ``tenant`` the party whose share of service
    is counted (an API key or the client's ``user`` field); both are ``None`` when unused.
    ``constraint``, when set, is what the output must match (structured outputs, tool
    calls); the engine refuses it when its executor cannot enforce one.
    ``ttft_target_s`` / ``tpot_target_s`` (seconds) are the request's own SLO targets:
    each, when set, replaces its class's target of that name for this request alone
    (deadline order, SLO admission, the SLO token budget and shedding read it), and a
    request with one has targets even without a class; ``None`` keeps the class's.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    arrival_time: float = 0.0
    slo_class: str | None = None
    tenant: str | None = None
    constraint: ConstraintSpec | None = None
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None

    def __post_init__(self) -> None:
        # Callers may pass any sequence; a tuple keeps the record immutable.
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt")
        for name in ("ttft_target_s", "tpot_target_s"):
            value = getattr(self, name)
            # ``not 0 < value < inf`` also refuses NaN, which compares false to everything.
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")


@dataclass(eq=False, slots=True)
class Request:
    """The scheduler's private, mutable state of one request (made from a
    ``Submission``; nothing outside the core holds one).

    Times are seconds on the engine's clock; ``arrival_time`` is set by the submitter
    (policies order by it, and TTFT counts from it). ``num_computed_tokens`` counts the tokens
    (prompt first, then output) whose KV is cached; preemption by recompute resets it to
    0 and keeps ``output_token_ids``, so on resumption prompt and output are recomputed.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    # Prompt tokens found in the prefix cache when the request was first admitted.
    num_cached_prompt_tokens: int = 0
    slo_class: str | None = None
    tenant: str | None = None
    # The request's own SLO targets (s), from its submission: each replaces its class's.
    own_ttft_s: float | None = None
    own_tpot_s: float | None = None
    # Set at submission from its own targets, else its SLO class's (seconds, engine
    # clock): its TTFT target, the time its first token is due (its arrival when it has
    # no TTFT target) and its TPOT target.
    ttft_target_s: float | None = None
    ttft_deadline: float = 0.0
    tpot_target_s: float | None = None
    # The TTFT (s) admission predicted for it, when SLO admission ran, and the prompt
    # tokens it found in the prefix cache then (the prediction does not count them).
    predicted_ttft_s: float | None = None
    num_expected_cached_tokens: int = 0
    # What the output must match (``None``: nothing), and, once the executor's grammar
    # backend compiled it, the handle the plan carries to the executor (opaque here).
    constraint: ConstraintSpec | None = None
    constraint_handle: object | None = None

    @classmethod
    def from_submission(cls, submission: Submission) -> Request:
        return cls(
            submission.request_id,
            list(submission.prompt_token_ids),
            submission.sampling,
            priority=submission.priority,
            arrival_time=submission.arrival_time,
            slo_class=submission.slo_class,
            tenant=submission.tenant,
            constraint=submission.constraint,
            own_ttft_s=submission.ttft_target_s,
            own_tpot_s=submission.tpot_target_s,
        )

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens known so far."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_expected_prefill_tokens(self) -> int:
        """Tokens still to compute before the next one is sampled, less those SLO
        admission expects the prefix cache to supply while the request has run nothing."""
        cached = self.num_expected_cached_tokens if self.num_computed_tokens == 0 else 0
        return self.num_uncomputed_tokens - cached

    def token_ids(self, start: int, stop: int) -> Sequence[int]:
        """Token ids at positions ``[start, stop)`` of prompt followed by output: a new
        list, or for one output position a shared, immutable one-token tuple."""
        n_prompt = len(self.prompt_token_ids)
        if stop <= n_prompt:
            return self.prompt_token_ids[start:stop]
        if start >= n_prompt:
            if stop - start == 1:
                return _one_token(self.output_token_ids[start - n_prompt])
            return self.output_token_ids[start - n_prompt : stop - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n_prompt]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return FINISH_REASONS.get(self.status)


def _one_token(token: int) -> tuple[int]:
    """``(token,)``, the same object for every call with that token while the table has
    room."""
    shared = _SHARED_ONE_TOKEN.get(token)
    if shared is None:
        shared = (token,)
        if len(_SHARED_ONE_TOKEN) < _SHARED_ONE_TOKEN_MAX:
            _SHARED_ONE_TOKEN[token] = shared
    return shared
