"""The engine step: schedule, execute, update. Pure Python; the same code serves real
traffic on a wall clock and runs the simulator on a virtual one."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.clock import Clock, WallClock
from orchestrator.core.config import EngineConfig
from orchestrator.core.executor import Executor, create_executor
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import RequestOutput, SchedulerOutput, StepResult
from orchestrator.core.request import Request
from orchestrator.core.sched.scheduler import Scheduler

__all__ = ["EngineCore", "EngineStats", "EngineStep", "RequestOutput"]


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One step: the plan, what it produced, when it began and how long it took (s).
    Tokens of the step are stamped ``start_time + duration_s``."""

    outputs: list[RequestOutput]
    plan: SchedulerOutput
    start_time: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for metrics. ``kv_blocks_used`` counts blocks held by live requests."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int


def _model_max_len(config: EngineConfig, executor: Executor) -> int:
    """The context limit: the config's, else the executor's ``max_model_len`` if it has
    one. The config may lower the model's limit, never raise it."""
    own = getattr(executor, "max_model_len", None)
    configured = config.model.max_model_len
    if configured is None:
        if own is None:
            raise ValueError("model.max_model_len is required for this executor")
        return int(own)
    if own is not None and configured > own:
        raise ValueError(
            f"model.max_model_len={configured} exceeds the model's own limit of {own} tokens"
        )
    return configured


class EngineCore:
    """Joins a scheduler and an executor. Not thread-safe: one thread calls every method
    (the async engine serialises submissions and aborts onto its loop thread)."""

    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        executor: Executor | None = None,
        clock: Clock | None = None,
    ) -> EngineCore:
        """Build the engine a config describes. The KV pool holds the executor's capacity,
        or ``cache.num_blocks`` if that is smaller."""
        executor = executor if executor is not None else create_executor(config)
        capacity = executor.kv_capacity()
        num_blocks = min(config.cache.num_blocks or capacity, capacity)
        kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
        scheduler = Scheduler(config.scheduler, kv, _model_max_len(config, executor))
        return cls(scheduler, executor, clock if clock is not None else WallClock())

    def add_request(self, request: Request) -> None:
        """Queue a request; raises ``AdmissionError`` or ``OverloadedError`` with nothing
        queued. The caller stamps ``arrival_time`` on this engine's clock (the gateway at
        HTTP arrival, the simulator at the simulated arrival)."""
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> Request | None:
        """Drop a request; its blocks are free before the next step."""
        return self.scheduler.abort(request_id, self.clock.now())

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> EngineStep:
        start = self.clock.now()
        plan = self.scheduler.schedule(start)
        if plan.scheduled or plan.finished_ids or plan.preempted_ids:
            result = self.executor.execute(plan)
        else:
            result = StepResult(sampled={}, duration_s=0.0)
        outputs = self.scheduler.update(plan, result, start + result.duration_s)
        return EngineStep(outputs, plan, start, result.duration_s)

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.kv.num_used_blocks,
            kv_blocks_total=s.kv.num_blocks,
            num_preemptions=s.num_preemptions,
        )

    def shutdown(self) -> None:
        self.executor.shutdown()
