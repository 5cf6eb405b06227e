"""Factories for requests, plan entries, schedulers and engines over the fake executor."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from orchestrator.core.clock import VirtualClock
from orchestrator.core.config import SchedulerConfig
from orchestrator.core.engine import EngineCore, EngineStep
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import ScheduledRequest
from orchestrator.core.predictor import ModelStepTimePredictor, StepTimePredictor
from orchestrator.core.request import Request, SamplingParams
from orchestrator.core.sched.scheduler import Scheduler
from tests.fakes import FakeExecutor

_ids = itertools.count()


def plan_entry(
    request_id: str,
    token_ids: Sequence[int],
    start_position: int,
    block_table: Sequence[int],
    sample: bool,
    sampling: SamplingParams,
    **facts: Any,
) -> ScheduledRequest:
    """A ``ScheduledRequest`` from its first six fields in order and any other by name
    (the record takes keywords only; tests build many, a row at a time)."""
    return ScheduledRequest(
        request_id=request_id,
        token_ids=token_ids,
        start_position=start_position,
        block_table=block_table,
        sample=sample,
        sampling=sampling,
        **facts,
    )


def make_request(
    prompt_len: int = 8,
    max_tokens: int = 4,
    *,
    request_id: str | None = None,
    priority: int = 0,
    arrival_time: float = 0.0,
    prompt: list[int] | None = None,
    slo_class: str | None = None,
    tenant: str | None = None,
    **sampling: Any,
) -> Request:
    rid = request_id if request_id is not None else f"req-{next(_ids)}"
    tokens = prompt if prompt is not None else [(7 * i + 3) % 1000 for i in range(prompt_len)]
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=max_tokens, **sampling),
        priority=priority,
        arrival_time=arrival_time,
        slo_class=slo_class,
        tenant=tenant,
    )


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 16,
    max_model_len: int = 4096,
    prefix_caching: bool = True,
    predictor: StepTimePredictor | None = None,
    **config: Any,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, prefix_caching)
    return Scheduler(SchedulerConfig(**config), kv, max_model_len, predictor)


def constant_step_time(seconds: float) -> ModelStepTimePredictor:
    """A predictor that knows every step takes ``seconds`` (the fake executor's truth)."""
    return ModelStepTimePredictor(lambda features: seconds)


def make_engine(
    num_blocks: int = 64,
    block_size: int = 16,
    max_model_len: int = 4096,
    step_time_s: float = 0.01,
    exact_predictor: bool = False,
    **config: Any,
) -> tuple[EngineCore, VirtualClock]:
    """An engine over ``FakeExecutor`` on a virtual clock (``step_time_s`` per step);
    with ``exact_predictor`` the scheduler's step-time predictor knows that time."""
    predictor = constant_step_time(step_time_s) if exact_predictor else None
    scheduler = make_scheduler(num_blocks, block_size, max_model_len, predictor=predictor, **config)
    clock = VirtualClock()
    executor = FakeExecutor(num_blocks, block_size, step_time_s)
    return EngineCore(scheduler, executor, clock), clock


def run_step(engine: EngineCore, clock: VirtualClock) -> EngineStep:
    """One step, with the clock moved to its end and the KV integrity checked."""
    step = engine.step()
    clock.advance_to(step.start_time + step.duration_s)
    engine.scheduler.kv.integrity_check()
    return step


def run_to_completion(
    engine: EngineCore, clock: VirtualClock, max_steps: int = 100_000
) -> list[EngineStep]:
    steps = []
    while engine.has_work():
        steps.append(run_step(engine, clock))
        if len(steps) > max_steps:
            raise AssertionError(f"engine still busy after {max_steps} steps")
    return steps
