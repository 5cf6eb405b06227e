"""The engine step: schedule, execute, update. Pure Python; the same code serves real
traffic on a wall clock and runs the simulator on a virtual one."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.clock import Clock, WallClock
from orchestrator.core.config import EngineConfig
from orchestrator.core.executor import Executor, ExecutorInfo, create_executor
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import RequestOutput, SchedulerOutput, StepCost, StepResult
from orchestrator.core.predictor import ErrorWindow, StepTimePredictor, features_of
from orchestrator.core.request import Request, Submission
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
    cost: StepCost | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for metrics. ``kv_blocks_used`` counts blocks held by live requests.
    ``step_time_error`` and ``ttft_prediction_error`` are the median relative errors
    ``|predicted - actual| / actual`` of the step-time predictor over recent steps and of
    SLO admission's TTFT predictions over recent first tokens (``None`` before the first);
    ``num_shed`` counts waiting requests ended past their TTFT deadline.
    ``rejections``: ``(slo_class, code, count)`` of refusals since start (class ``""``
    for requests without one); ``ttft_prediction_error_by_class``: ``(slo_class,
    error)`` for each class with a prediction so far."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int
    step_time_error: float | None = None
    ttft_prediction_error: float | None = None
    num_shed: int = 0
    rejections: tuple[tuple[str, str, int], ...] = ()
    ttft_prediction_error_by_class: tuple[tuple[str, float], ...] = ()


def _checked_info(config: EngineConfig, info: ExecutorInfo) -> tuple[int, int]:
    """The KV pool size (blocks) and context limit (tokens) an engine runs with, from the
    executor's ``info()`` and the config; raises ``ValueError`` naming what disagrees.

    The pool holds the executor's blocks, or ``cache.num_blocks`` if that is smaller. The
    config may lower the model's context limit, never raise it.
    """
    if info.num_kv_blocks < 1:
        raise ValueError(f"the executor reports {info.num_kv_blocks} KV blocks; it needs one")
    if info.block_size != config.cache.block_size:
        raise ValueError(
            f"the executor's KV blocks hold {info.block_size} tokens but cache.block_size "
            f"is {config.cache.block_size}; set cache.block_size to {info.block_size}"
        )
    num_blocks = min(config.cache.num_blocks or info.num_kv_blocks, info.num_kv_blocks)
    own, configured = info.max_model_len, config.model.max_model_len
    if configured is None:
        if own is None:
            raise ValueError("model.max_model_len is required for this executor")
        return num_blocks, own
    if own is not None and configured > own:
        raise ValueError(
            f"model.max_model_len={configured} exceeds the model's own limit of {own} tokens"
        )
    return num_blocks, configured


class EngineCore:
    """Joins a scheduler and an executor. Not thread-safe: one thread calls every method
    (the async engine serialises submissions and aborts onto its loop thread)."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        clock: Clock,
        info: ExecutorInfo | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.info = info if info is not None else executor.info()
        self.step_time_errors = ErrorWindow()
        # The plan of the step in progress (or the last one): a crash report shows it.
        self.last_plan: SchedulerOutput | None = None

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens one request may hold."""
        return self.scheduler.max_model_len

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        executor: Executor | None = None,
        clock: Clock | None = None,
        predictor: StepTimePredictor | None = None,
    ) -> EngineCore:
        """Build the engine a config describes; the executor's ``info()`` is read once
        here and checked against the config (``ValueError`` names the mismatch).
        ``predictor`` predicts step times (default: an online fit to measured steps,
        ``scheduler.predictor``; the simulator passes its cost model)."""
        executor = executor if executor is not None else create_executor(config)
        info = executor.info()
        num_blocks, max_model_len = _checked_info(config, info)
        cache = config.cache
        kv = KVCacheManager(
            num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            headroom_blocks=cache.admission_headroom_blocks,
            hash_seed=cache.prefix_hash_seed,
        )
        scheduler = Scheduler(config.scheduler, kv, max_model_len, predictor)
        return cls(scheduler, executor, clock if clock is not None else WallClock(), info)

    def add_request(self, submission: Submission) -> float | None:
        """Queue a submission; raises ``AdmissionError`` or ``OverloadedError`` with nothing
        queued. The caller stamps ``arrival_time`` on this engine's clock. Returns the
        TTFT (s) SLO admission predicted for it, or ``None`` when none ran."""
        request = Request.from_submission(submission)
        self.scheduler.add_request(request, self.clock.now())
        return request.predicted_ttft_s

    def abort(self, request_id: str) -> bool:
        """Drop a request; its blocks are free before the next step. Returns whether a
        live request had that id."""
        return self.scheduler.abort(request_id, self.clock.now()) is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> EngineStep:
        start = self.clock.now()
        plan = self.last_plan = self.scheduler.schedule(start)
        if plan.scheduled:
            # Every executor's steps are predicted and observed the same way, so the
            # error is tracked (and the online fit learns) whatever runs the plan.
            features = features_of(plan)
            predictor = self.scheduler.predictor
            predicted = predictor.predict(features)
            result = self.executor.execute(plan)
            predictor.observe(features, result.duration_s)
            self.step_time_errors.observe(predicted, result.duration_s)
        elif plan.finished_ids or plan.preempted_ids:
            result = self.executor.execute(plan)
        else:
            result = StepResult(sampled={}, duration_s=0.0)
        outputs = self.scheduler.update(plan, result, start + result.duration_s)
        return EngineStep(outputs, plan, start, result.duration_s, result.cost)

    def stats(self) -> EngineStats:
        s, slo = self.scheduler, self.scheduler.slo
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.kv.num_used_blocks,
            kv_blocks_total=s.kv.num_blocks,
            num_preemptions=s.num_preemptions,
            step_time_error=self.step_time_errors.median,
            ttft_prediction_error=slo.ttft_errors.median,
            num_shed=slo.num_shed,
            rejections=tuple(
                (slo_class or "", code, count)
                for (slo_class, code), count in sorted(
                    slo.rejections.items(), key=lambda item: (item[0][0] or "", item[0][1])
                )
            ),
            ttft_prediction_error_by_class=tuple(
                (name, error)
                for name, window in sorted(slo.ttft_errors_by_class.items())
                if (error := window.median) is not None
            ),
        )

    def dump_state(self) -> str:
        """What the engine was doing, for a crash report: ``stats()`` and the last plan
        (per request: id, tokens, start position, blocks held, whether it samples; the
        ids preempted and finished). Token ids are left out: they are users' text."""
        plan = self.last_plan
        if plan is None:
            planned = "no plan yet"
        else:
            entries = ", ".join(
                f"{s.request_id}: {len(s.token_ids)} tokens at {s.start_position}, "
                f"{len(s.block_table)} blocks{', samples' if s.sample else ''}"
                for s in plan.scheduled
            )
            planned = (
                f"{len(plan.scheduled)} scheduled [{entries}]; preempted "
                f"{plan.preempted_ids}; finished {plan.finished_ids}"
            )
        return f"stats: {self.stats()}; last plan: {planned}"

    def shutdown(self) -> None:
        self.executor.shutdown()
