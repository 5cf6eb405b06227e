"""What the scheduler decides each step: plain data, the only thing an executor sees.

Executors never import or mutate ``Request``; they read a ``SchedulerOutput`` and
answer with a ``StepResult``. Per-request records are NamedTuples: immutable and cheap
to build, since the scheduler makes one per running request per step. The torch executor, the simulator and the TensorRT-LLM
adapter all consume the same decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from orchestrator.core.request import FinishReason, SamplingParams


class ScheduledRequest(NamedTuple):
    """One request's share of a step.

    ``token_ids`` sit at positions ``start_position .. start_position + len(token_ids) - 1``.
    ``block_table`` lists the KV block ids that hold positions ``0 ..`` (block ``i`` holds
    positions ``[i * block_size, (i + 1) * block_size)``) and covers every position up to
    the last one run this step. ``sample`` is true when this step's last token is the
    last known token of the request, so the executor must return the next token.
    ``num_cached_tokens`` is ``start_position``: everything before it is already in the
    KV cache (computed earlier or a prefix-cache hit).
    """

    request_id: str
    token_ids: list[int]
    start_position: int
    block_table: Sequence[int]
    sample: bool
    sampling: SamplingParams

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
class StepResult:
    """What an executor did with a ``SchedulerOutput``.

    ``sampled`` has one token per scheduled request whose ``sample`` was true, and no
    other, except those in ``failed``. ``failed`` maps the requests the executor could
    not run to a message saying why; the scheduler ends them with an error and every
    other request carries on. ``logprobs`` holds entries only for requests that asked
    for them. ``duration_s`` is the step's time in seconds: measured by a real executor,
    predicted by the simulator.
    """

    sampled: dict[str, int]
    duration_s: float
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class RequestOutput(NamedTuple):
    """What one step produced for one request: its new token (if it sampled) and, when it
    ended, why. ``new_logprobs`` is parallel to ``new_token_ids`` when logprobs were
    asked for, else empty. ``num_output_tokens`` is the total so far. ``error`` says why
    the executor failed the request (then ``finish_reason`` is ``ERROR``)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_logprobs: tuple[TokenLogprobs, ...]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
