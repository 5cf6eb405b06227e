"""Batching strategies: how one step is composed from running and waiting requests.
Chosen by ``scheduler.batching`` in config (a key of ``BATCHING_STRATEGIES``, which a
unit test checks against the config's ``BatchingName``).

Each strategy composes the scheduler's mechanisms (``Mechanisms``: decode first,
prefill chunks, admission, priority preemption), so a new strategy is a new class here,
not a branch in ``Scheduler.schedule``.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.core.sched.step import StepState


class Mechanisms(Protocol):
    """What a strategy may call on the scheduler (``Scheduler`` provides it); times are
    seconds on the engine clock.

    ``yield_to_waiting``: with priority preemption on, the worst running requests that
    rank below the best waiting one yield while the batch is full or its first chunk
    does not fit. ``schedule_running``: decode tokens first, then prefill chunks for
    running requests part-way through their prompt, preempting for KV blocks as needed
    (``step.kv_preempted`` then tells). ``admit_waiting``: waiting requests in policy
    order get a first chunk (their whole prompt with ``whole_prompts``); returns
    whether any was admitted. ``admit_static_batch``: a batch whose whole-lifetime KV
    fits, reserved up front.
    """

    @property
    def num_running(self) -> int: ...

    def yield_to_waiting(self, step: StepState, now: float) -> None: ...

    def schedule_running(self, step: StepState, now: float) -> None: ...

    def admit_waiting(self, step: StepState, now: float, whole_prompts: bool) -> bool: ...

    def admit_static_batch(self, now: float) -> None: ...


class BatchingStrategy(Protocol):
    """Fills one step.

    ``chunks_prefill``: whether a prompt may be prefilled over several steps; when false,
    a request's prompt plus ``max_tokens`` must fit one step's budget (admission checks).
    """

    chunks_prefill: bool

    def fill(self, scheduler: Mechanisms, step: StepState, now: float) -> None: ...


class ContinuousBatching:
    """Iteration-level batching with chunked prefill (Orca + Sarathi-Serve): running
    requests decode first, the rest of the budget goes to prefill chunks of at most
    ``chunk_size`` tokens, and waiting requests join any step that has room."""

    chunks_prefill = True

    def fill(self, scheduler: Mechanisms, step: StepState, now: float) -> None:
        scheduler.yield_to_waiting(step, now)
        scheduler.schedule_running(step, now)
        if not step.kv_preempted:
            scheduler.admit_waiting(step, now, whole_prompts=False)


class PrefillFirstBatching:
    """Iteration-level batching without chunking: whenever waiting prompts fit, a
    prefill-only step runs them whole while decodes wait (what chunked prefill improves
    on)."""

    chunks_prefill = False

    def fill(self, scheduler: Mechanisms, step: StepState, now: float) -> None:
        if scheduler.admit_waiting(step, now, whole_prompts=True):
            return
        scheduler.yield_to_waiting(step, now)
        scheduler.schedule_running(step, now)
        if not step.kv_preempted:
            scheduler.admit_waiting(step, now, whole_prompts=True)


class StaticBatching:
    """Request-level batching, kept only as the benchmarks' baseline: a batch is
    admitted when nothing runs, with KV reserved for each request's whole lifetime, and
    no request joins until every one of the batch has finished."""

    chunks_prefill = True

    def fill(self, scheduler: Mechanisms, step: StepState, now: float) -> None:
        if not scheduler.num_running:
            scheduler.admit_static_batch(now)
        scheduler.schedule_running(step, now)


BATCHING_STRATEGIES: dict[str, type[BatchingStrategy]] = {
    "continuous": ContinuousBatching,
    "prefill_first": PrefillFirstBatching,
    "static": StaticBatching,
}
