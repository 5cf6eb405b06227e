"""What the scheduler decides each step: plain data, the only thing an executor sees.

Executors never import or mutate ``Request``; they read a ``SchedulerOutput`` and
answer with a ``StepResult``. The torch executor, the simulator and the TensorRT-LLM
adapter all consume the same decision.

The per-request records (``ScheduledRequest``, ``RequestOutput``) are frozen,
keyword-only ``msgspec.Struct`` types with ``gc=False``, as vLLM's engine-core outputs
are: the scheduler makes one of each per running request per step, and a record the
cyclic collector tracks counts toward its young collection, which at a thousand running
requests ran about twice a step (57 us each) with tuple-based records. These records
can never be part of a reference cycle (they hold ids, numbers, token and block
sequences, the request's shared ``SamplingParams`` and constraint handle; nothing holds
a record but the lists that carry it), so leaving them untracked loses nothing.
Building one by keyword is a single C call: about 90 ns for eleven fields, against 230
for a NamedTuple built through a keyword function (CPython 3.11 on an Intel Xeon of the
Sapphire Rapids class).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from orchestrator.core.request import FinishReason, SamplingParams


class ScheduledRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One request's share of a step.

    ``token_ids`` sit at positions ``start_position .. start_position + len(token_ids) - 1``
    (a read-only sequence: a decode's one token is a tuple shared with other plans).
    ``block_table`` lists the KV block ids that hold positions ``0 ..`` (block ``i`` holds
    positions ``[i * block_size, (i + 1) * block_size)``) and covers every position up to
    the last one run this step. ``sample`` is true when this step's last token is the
    last known token of the request, so the executor must return the next token.
    Every position before ``start_position`` is already in the KV cache (computed
    earlier or a prefix-cache hit). ``priority`` is the request's (lower first), for an
    executor that queues work of its own (TensorRT-LLM's waiting queue); ``slo_class``,
    ``tenant`` and ``arrival_time`` (seconds, engine clock) are its other facts, for an
    executor that schedules inside itself with the same policies (TensorRT-LLM's
    in-executor mode). ``constraint`` is what the executor's ``ConstraintBackend.compile_constraint``
    returned for the request's constraint (the same object on every step of the
    request), or ``None`` for an unconstrained request; the executor masks the tokens
    it samples for the request with it.
    """

    request_id: str
    token_ids: Sequence[int]
    start_position: int
    block_table: Sequence[int]
    sample: bool
    sampling: SamplingParams
    priority: int = 0
    slo_class: str | None = None
    tenant: str | None = None
    arrival_time: float = 0.0
    constraint: object | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Positions this request attends over after this step (cached plus new)."""
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The plan for one step.

    ``preempted_ids`` and ``finished_ids`` name requests whose KV blocks were freed since
    the previous step (preempted, finished, or aborted), so an executor can drop any
    per-request state it keeps (e.g. a seeded generator).
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class TokenLogprobs(NamedTuple):
    """Log-probability of the chosen token and the top alternatives (``(token, logprob)``,
    best first)."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class StepCost:
    """Predicted time of one step by cause, in seconds.

    ``weights_s`` streams the weights; ``kv_s`` reads cached K/V and writes new K/V;
    ``dense_compute_s`` and ``attention_compute_s`` are the FLOPs of the two kernel
    kinds at the achievable peak; ``comms_s`` the tensor-parallel all-reduces;
    ``overhead_s`` the fixed per-step cost. Memory and compute overlap within a kernel
    kind, so ``total_s`` takes the larger of each pair.
    """

    weights_s: float
    kv_s: float
    dense_compute_s: float
    attention_compute_s: float
    comms_s: float
    overhead_s: float

    @property
    def compute_s(self) -> float:
        return self.dense_compute_s + self.attention_compute_s

    @property
    def dense_s(self) -> float:
        return max(self.weights_s, self.dense_compute_s)

    @property
    def attention_s(self) -> float:
        return max(self.kv_s, self.attention_compute_s)

    @property
    def total_s(self) -> float:
        return self.dense_s + self.attention_s + self.comms_s + self.overhead_s

    def attributed(self) -> tuple[float, float, float, float, float]:
        """``total_s`` split into (weights, kv, compute, comms, overhead): each kernel
        kind's time goes to whichever of memory and compute bound it."""
        compute = 0.0
        weights, kv = self.weights_s, self.kv_s
        if self.dense_compute_s > weights:
            compute, weights = self.dense_compute_s, 0.0
        if self.attention_compute_s > kv:
            compute, kv = compute + self.attention_compute_s, 0.0
        return (weights, kv, compute, self.comms_s, self.overhead_s)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What an executor did with a ``SchedulerOutput``.

    ``sampled`` has one token per scheduled request whose ``sample`` was true, and no
    other, except those in ``failed``. ``failed`` maps the requests the executor could
    not run to a message saying why; the scheduler ends them with an error and every
    other request carries on. ``logprobs`` holds entries only for requests that asked
    for them. ``duration_s`` is the step's time in seconds: measured by a real executor,
    predicted by the simulator. ``cost`` explains the duration by cause, from an
    executor whose ``info().reports_step_cost`` is true (the simulator); else ``None``.
    ``kv_free_blocks`` is the executor's own count of free KV blocks (of
    ``info().block_size`` tokens), from an executor that owns its KV cache and read it
    during this step (TensorRT-LLM's iteration statistics); ``None`` when it has no fresh
    count. Admission then uses the tighter of this count and the KV manager's.
    """

    sampled: dict[str, int]
    duration_s: float
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    cost: StepCost | None = None
    kv_free_blocks: int | None = None


class RequestOutput(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one step produced for one request: its new token (if it sampled) and, when it
    ended, why. ``new_logprobs`` is parallel to ``new_token_ids`` when logprobs were
    asked for, else empty. ``num_output_tokens`` is the total so far. ``error`` says why
    the request ended with an error (then ``finish_reason`` is ``ERROR``).
    ``first_scheduled_time`` (seconds, engine clock) is when the request first ran, so
    queue time is that minus its arrival; ``num_cached_tokens`` counts its prompt tokens
    served from the prefix cache at first admission. ``error_code`` names the reason of an
    error the engine chose (``ttft_deadline_passed``: shed while waiting, past its SLO
    class's TTFT deadline); ``None`` for executor failures. These are copies, so a reader
    on another thread never sees the scheduler's live state."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_logprobs: tuple[TokenLogprobs, ...]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0
    error_code: str | None = None
