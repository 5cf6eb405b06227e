"""Batching strategies: how one step is composed from running and waiting requests.
Chosen by ``scheduler.batching`` in config (a key of ``BATCHING_STRATEGIES``, which a
unit test checks against the config's ``BatchingName``).

Each strategy composes the scheduler's mechanisms (``Mechanisms``: decode first,
prefill chunks, admission, priority preemption), so a new strategy is a new class here,
not a branch in ``Scheduler.schedule``.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request
from orchestrator.core.sched.preemption import priority_victim
from orchestrator.core.sched.queue import RequestQueue
from orchestrator.core.sched.step import StepState


class Mechanisms(Protocol):
    """What a strategy may call on the scheduler (``Scheduler`` provides it); times are
    seconds on the engine clock.

    ``preempt``: recompute-mode preemption of one running request (its blocks freed, its
    tokens kept, requeued). ``schedule_running``: decode tokens first, then prefill chunks for
    running requests part-way through their prompt, preempting for KV blocks as needed
    (``step.kv_preempted`` then tells). ``admit_waiting``: waiting requests in policy
    order get a first chunk (their whole prompt with ``whole_prompts``); returns
    whether any was admitted. ``start_running``: an admitted request joins the running
    set (the static baseline admits its own batches with it).
    """

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def kv(self) -> KVCacheManager: ...

    @property
    def waiting(self) -> RequestQueue: ...

    @property
    def num_running(self) -> int: ...

    @property
    def running(self) -> list[Request]: ...

    @property
    def preempt_for_priority(self) -> bool: ...

    def preempt(self, step: StepState, request: Request, now: float) -> None: ...

    def schedule_running(self, step: StepState, now: float) -> None: ...

    def admit_waiting(self, step: StepState, now: float, whole_prompts: bool) -> bool: ...

    def start_running(self, request: Request, now: float) -> None: ...


def yield_to_waiting(scheduler: Mechanisms, step: StepState, now: float) -> None:
    """With priority preemption on, evict the worst running requests that rank below the
    best waiting one while the batch is full or its first chunk does not fit."""
    if not scheduler.preempt_for_priority:
        return
    candidate = scheduler.waiting.peek()
    if candidate is None:
        return
    config, kv, running = scheduler.config, scheduler.kv, scheduler.running
    first_chunk = min(candidate.num_tokens, config.chunk_size)
    while running:
        batch_full = len(running) >= config.max_batch_size
        kv_short = kv.blocks_for(first_chunk) > kv.num_free_blocks
        if not (batch_full or kv_short):
            return
        victim = priority_victim(running, candidate, config.max_preemptions)
        if victim is None:
            return
        scheduler.preempt(step, victim, now)


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
        yield_to_waiting(scheduler, step, now)
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
        yield_to_waiting(scheduler, step, now)
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
            self._admit_batch(scheduler, now)
        scheduler.schedule_running(step, now)

    @staticmethod
    def _admit_batch(scheduler: Mechanisms, now: float) -> None:
        """Admit up to ``max_batch_size`` requests whose whole-lifetime KV fits together."""
        kv, waiting = scheduler.kv, scheduler.waiting
        free = kv.num_free_blocks
        while scheduler.num_running < scheduler.config.max_batch_size:
            request = waiting.peek()
            if request is None:
                break
            remaining_out = request.sampling.max_tokens - request.num_output_tokens
            need = kv.blocks_for(request.num_tokens + remaining_out)
            if need > free:
                break
            free -= need
            waiting.pop()
            kv.allocate(request, 0, kv.find_cached_prefix(request))
            request.num_computed_tokens = len(kv.block_table(request.request_id)) * kv.block_size
            scheduler.start_running(request, now)


BATCHING_STRATEGIES: dict[str, type[BatchingStrategy]] = {
    "continuous": ContinuousBatching,
    "prefill_first": PrefillFirstBatching,
    "static": StaticBatching,
}
