"""Batching strategies: how one step is composed from running and waiting requests.
Chosen by ``scheduler.batching`` in config (a key of ``BATCHING_STRATEGIES``).

Each strategy composes the scheduler's mechanisms (decode first, prefill chunks,
admission, priority preemption), so a new strategy is a new class here, not a branch
in ``Scheduler.schedule``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from orchestrator.core.sched.step import StepState

if TYPE_CHECKING:
    from orchestrator.core.sched.scheduler import Scheduler


class BatchingStrategy(Protocol):
    """Fills one step.

    ``chunks_prefill``: whether a prompt may be prefilled over several steps; when false,
    a request's prompt plus ``max_tokens`` must fit one step's budget (admission checks).
    """

    chunks_prefill: bool

    def fill(self, scheduler: Scheduler, step: StepState, now: float) -> None: ...


class ContinuousBatching:
    """Iteration-level batching with chunked prefill (Orca + Sarathi-Serve): running
    requests decode first, the rest of the budget goes to prefill chunks of at most
    ``chunk_size`` tokens, and waiting requests join any step that has room."""

    chunks_prefill = True

    def fill(self, scheduler: Scheduler, step: StepState, now: float) -> None:
        scheduler.preempt_for_priority(step, now)
        scheduler.schedule_running(step, now)
        if not step.kv_preempted:
            scheduler.admit_waiting(step, now, whole_prompts=False)


class PrefillFirstBatching:
    """Iteration-level batching without chunking: whenever waiting prompts fit, a
    prefill-only step runs them whole while decodes wait (what chunked prefill improves
    on)."""

    chunks_prefill = False

    def fill(self, scheduler: Scheduler, step: StepState, now: float) -> None:
        if scheduler.admit_waiting(step, now, whole_prompts=True):
            return
        scheduler.preempt_for_priority(step, now)
        scheduler.schedule_running(step, now)
        if not step.kv_preempted:
            scheduler.admit_waiting(step, now, whole_prompts=True)


class StaticBatching:
    """Request-level batching, kept only as the benchmarks' baseline: a batch is
    admitted when nothing runs, with KV reserved for each request's whole lifetime, and
    no request joins until every one of the batch has finished."""

    chunks_prefill = True

    def fill(self, scheduler: Scheduler, step: StepState, now: float) -> None:
        if not scheduler.running:
            scheduler.admit_static_batch(now)
        scheduler.schedule_running(step, now)


BATCHING_STRATEGIES: dict[str, type[BatchingStrategy]] = {
    "continuous": ContinuousBatching,
    "prefill_first": PrefillFirstBatching,
    "static": StaticBatching,
}
