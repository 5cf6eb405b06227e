"""Drives a seeded workload through the in-executor scheduler on the fake PyExecutor
loop and through ``EngineCore`` on the sim executor, with the same core config, so the
two decision sequences can be compared (tests, and ``scripts/compare_in_executor.py``).

Both sides run the same KV allocation rule (``KVCacheManager(mirror_executor=True)``:
whole prompt on the first chunk, TensorRT-LLM's), the same step times (the sim executor's cost model of each
plan) and the same tokens (the sim executor's position rule), so any difference in
decisions would be the adapter's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.common.deployment import Deployment
from orchestrator.core.clock import VirtualClock
from orchestrator.core.config import EngineConfig, SchedulerConfig
from orchestrator.core.engine import EngineCore
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.predictor import StepTimePredictor
from orchestrator.core.request import SamplingParams, Submission
from orchestrator.core.sched.scheduler import Scheduler
from plugins.sim_executor.executor import SimExecutor
from plugins.trtllm.in_executor.adapter import (
    CoreRequestScheduler,
    KvSource,
    TrtllmTypes,
    in_loop_engine,
)
from tests.trtllm.fake_pyexecutor import (
    OUTPUT_TYPES,
    FakeKvCacheManager,
    FakeLlmRequest,
    FakePyExecutor,
    LlmRequestState,
    position_sampler,
)

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Job:
    request_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int
    arrival_time: float


def seeded_workload(seed: int, n: int = 24) -> list[Job]:
    """``n`` requests with prompts of 20-300 tokens, 4-40 output tokens, priorities 0-2
    and Poisson-like arrivals over about 40 ms."""
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.expovariate(600.0)
        prompt = tuple(rng.randrange(1, 30000) for _ in range(rng.randint(20, 300)))
        jobs.append(Job(i + 1, prompt, rng.randint(4, 40), rng.randint(0, 2), t))
    return jobs


def types(line: str = "1.3") -> TrtllmTypes:
    return TrtllmTypes(
        OUTPUT_TYPES[line],
        LlmRequestState.CONTEXT_INIT,
        LlmRequestState.GENERATION_IN_PROGRESS,
        LlmRequestState.GENERATION_COMPLETE,
    )


def loop_engine(
    config: SchedulerConfig,
    num_blocks: int,
    clock: VirtualClock,
    predictor: StepTimePredictor | None = None,
) -> EngineCore:
    """An ``in_loop_engine`` for ``config`` over ``num_blocks`` blocks of ``BLOCK_SIZE``."""
    engine = EngineConfig.model_validate(
        {
            "cache": {"block_size": BLOCK_SIZE},
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
        }
    ).model_copy(update={"scheduler": config})
    return in_loop_engine(engine, num_blocks, 1 << 16, clock, predictor)


def sim_executor(num_blocks: int) -> SimExecutor:
    deployment = Deployment(model="smollm2-135m", hardware="l40s")
    config = SchedulerConfig()
    capacity = replace(deployment.capacity(config, BLOCK_SIZE), kv_blocks=num_blocks)
    return SimExecutor(deployment.cost_model(), capacity)


def plan_record(plan: SchedulerOutput) -> tuple[Any, ...]:
    """What a plan decided: (id, start, tokens, samples) per request, and the ids
    preempted and finished since the last plan (as sets: their order is not a decision)."""
    scheduled = tuple(
        (s.request_id, s.start_position, s.num_tokens, s.sample) for s in plan.scheduled
    )
    return scheduled, frozenset(plan.preempted_ids), frozenset(plan.finished_ids)


def run_engine_core(
    jobs: list[Job], config: SchedulerConfig, num_blocks: int, max_steps: int = 5000
) -> list[tuple[Any, ...]]:
    """The decisions of ``EngineCore`` on the sim executor, one record per step."""
    executor = sim_executor(num_blocks)
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, False, mirror_executor=True)
    clock = VirtualClock()
    engine = EngineCore(Scheduler(config, kv, 1 << 16), executor, clock)
    pending = list(jobs)
    records = []
    while pending or engine.has_work():
        if not engine.has_work():
            clock.advance_to(max(clock.now(), pending[0].arrival_time))
        while pending and pending[0].arrival_time <= clock.now():
            job = pending.pop(0)
            engine.add_request(
                Submission(
                    str(job.request_id),
                    job.prompt,
                    SamplingParams(max_tokens=job.max_tokens, temperature=0),
                    priority=job.priority,
                    arrival_time=job.arrival_time,
                )
            )
        step = engine.step()
        clock.advance_to(step.start_time + step.duration_s)
        kv.integrity_check()
        records.append(plan_record(step.plan))
        if len(records) > max_steps:
            raise AssertionError("EngineCore still busy")
    return records


@dataclass
class InExecutorRun:
    records: list[tuple[Any, ...]]
    adapter: CoreRequestScheduler
    loop: FakePyExecutor
    kv_agreed: bool  # the core's free blocks equal TensorRT-LLM's once a batch is allocated


def run_in_executor(
    jobs: list[Job],
    config: SchedulerConfig,
    num_blocks: int,
    max_steps: int = 5000,
    line: str = "1.3",
) -> InExecutorRun:
    """The decisions of our scheduler inside the fake executor loop, one per iteration."""
    from plugins.trtllm.in_executor.facts import FactsChannel, RequestFacts

    cost_model = sim_executor(num_blocks).cost_model
    trt_kv = FakeKvCacheManager(num_blocks, BLOCK_SIZE)
    clock = VirtualClock()
    facts = FactsChannel()
    engine = loop_engine(config, num_blocks, clock)
    mirror = engine.scheduler.kv
    adapter = CoreRequestScheduler(
        engine,
        types(line),
        KvSource(trt_kv),
        facts=facts,
        record=True,
    )
    agreed = True

    def after(out: Any) -> None:
        nonlocal agreed
        plan = adapter.last_plan
        assert plan is not None
        if plan.scheduled or plan.preempted_ids or plan.finished_ids:
            clock.advance_to(clock.now() + cost_model.step_cost(plan).total_s)
        mirror.integrity_check()
        # TensorRT-LLM frees an ended request at once, the core at the next call.
        agreed = agreed and mirror.num_free_blocks <= trt_kv.num_free

    def allocated() -> None:
        nonlocal agreed  # both pictures after the same allocations: equal
        agreed = agreed and mirror.num_free_blocks == trt_kv.num_free

    loop = FakePyExecutor(
        adapter,
        trt_kv,
        position_sampler(cost_model.model.vocab_size),
        on_iteration=after,
        on_allocated=allocated,
    )
    pending = list(jobs)
    while pending or loop.has_work() or adapter.scheduler.has_work():
        if not (loop.has_work() or adapter.scheduler.has_work()):
            clock.advance_to(max(clock.now(), pending[0].arrival_time))
        while pending and pending[0].arrival_time <= clock.now():
            job = pending.pop(0)
            with facts.submitting() as staged:
                loop.submit(FakeLlmRequest(job.request_id, list(job.prompt), job.max_tokens))
                staged[job.request_id] = RequestFacts(job.priority, arrival_time=job.arrival_time)
        loop.iterate()
        if len(adapter.plans) > max_steps:
            raise AssertionError("the executor loop is still busy")
    return InExecutorRun([plan_record(p) for p in adapter.plans], adapter, loop, agreed)


def describe(record: tuple[Any, ...]) -> str:
    scheduled, preempted, finished = record
    parts = [
        f"{rid}:{'+' if start == 0 and n > 1 else ''}{n}@{start}" for rid, start, n, _ in scheduled
    ]
    text = " ".join(parts) or "-"
    if preempted:
        text += f" | preempted {sorted(preempted, key=int)}"
    if finished:
        text += f" | finished {sorted(finished, key=int)}"
    return text
