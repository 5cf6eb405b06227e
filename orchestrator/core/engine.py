"""The engine step: schedule, execute, update. Pure Python; the same code serves real
traffic on a wall clock and runs the simulator on a virtual one."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.calibration import calibrate_prior, startup_shapes
from orchestrator.core.clock import Clock, WallClock
from orchestrator.core.config import EngineConfig, StepTimePrior
from orchestrator.core.constraint import ConstraintBackend
from orchestrator.core.executor import Executor, ExecutorInfo, create_executor
from orchestrator.core.kv.events import KVEventSink
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import RequestOutput, SchedulerOutput, StepCost, StepResult
from orchestrator.core.predictor import (
    ErrorWindow,
    LinearStepTimePredictor,
    PredictorState,
    StepTimePredictor,
    features_of,
)
from orchestrator.core.request import Request, Submission
from orchestrator.core.sched.constraints import ConstraintCompiles
from orchestrator.core.sched.scheduler import Scheduler

__all__ = ["EngineCore", "EngineStats", "EngineStep", "RequestOutput"]

logger = logging.getLogger(__name__)

# Longest wait (s) of an idle step for a grammar compile to end: it bounds how long a
# submission or abort waits behind a step in which nothing but compiles is in flight.
IDLE_COMPILE_WAIT_S = 0.005

# What the log says when the step-time predictor's state changes.
_STATE_MESSAGES = {
    PredictorState.TRUSTED: (
        "step-time predictor trusted: SLO admission and the SLO budget act on its predictions"
    ),
    PredictorState.UNCALIBRATED: (
        "step-time predictor uncalibrated (default prior): SLO admission falls back to "
        "queue limits and the SLO budget to max_num_tokens until measured steps confirm it"
    ),
    PredictorState.DRIFTING: (
        "step-time predictor drifting (recent error over its bound, or the step cost "
        "changed): SLO admission falls back to queue limits and the SLO budget to "
        "max_num_tokens until the fit recovers"
    ),
}


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
    error)`` for each class with a prediction so far; ``regretted_refusals``:
    ``(slo_class, count)`` of refusals since start whose request, by the queue's drain
    after them, would have met its TTFT target (``TtftOutcomes``, docs/slo.md)."""

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
    regretted_refusals: tuple[tuple[str, int], ...] = ()
    predictor_state: PredictorState = PredictorState.TRUSTED


def _pool_and_context_limit(config: EngineConfig, info: ExecutorInfo) -> tuple[int, int]:
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
        self._predictor_state = scheduler.predictor.state
        self._kv_event_sink: KVEventSink | None = None
        self.kv_event_sink_errors = 0

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
        ``scheduler.predictor``; the simulator passes its cost model). Constrained
        requests compile through the executor when its ``info().constraint_kinds`` has
        any (it must then implement ``ConstraintBackend``); others are refused."""
        executor = executor if executor is not None else create_executor(config)
        info = executor.info()
        num_blocks, max_model_len = _pool_and_context_limit(config, info)
        cache = config.cache
        kv = KVCacheManager(
            num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            headroom_blocks=cache.admission_headroom_blocks,
            hash_seed=cache.prefix_hash_seed,
            hash_scheme=cache.prefix_hash,
            mirror_executor=info.mirrors_executor_kv,
        )
        backend = None
        if info.constraint_kinds:
            if not isinstance(executor, ConstraintBackend):
                raise ValueError(
                    "the executor reports constraint kinds but has no compile_constraint"
                )
            backend = executor
        constraints = ConstraintCompiles(
            config.scheduler.constraints, backend, info.constraint_kinds
        )
        scheduler = Scheduler(config.scheduler, kv, max_model_len, predictor, constraints)
        return cls(scheduler, executor, clock if clock is not None else WallClock(), info)

    def attach_kv_event_sink(self, sink: KVEventSink) -> None:
        """Send this engine's KV events (``orchestrator.core.kv.events``) to ``sink`` from
        now on: ``sink.publish(events)`` once per step that produced any, after the
        scheduler's update, on the engine's thread. An exception from the sink is logged
        and counted (``kv_event_sink_errors``), never raised: the engine carries on and
        those events are lost. The engine owns the sink from now on and closes it in
        ``shutdown``. Attach before the first step (blocks cached earlier are never
        reported); ``RuntimeError`` if a sink is already attached. With prefix caching
        off nothing is cached, so there are no events."""
        if self._kv_event_sink is not None:
            raise RuntimeError("a KV event sink is already attached to this engine")
        self.scheduler.kv.record_events()
        self._kv_event_sink = sink

    def _publish_kv_events(self, sink: KVEventSink) -> None:
        events = self.scheduler.kv.take_events()
        if not events:
            return
        try:
            sink.publish(events)
        except Exception:
            self.kv_event_sink_errors += 1
            n = self.kv_event_sink_errors
            # 1st, 2nd, 4th, 8th... failure: a sink that keeps failing must not flood the
            # log once per step, nor go silent after its first failure.
            if n & (n - 1) == 0:
                logger.exception("the KV event sink failed (%d times); its events are lost", n)

    def calibrate_predictor(self, config: EngineConfig) -> StepTimePrior | None:
        """Before serving: fit the step-time predictor's prior to steps timed on this
        executor (``calibration.startup_shapes``), unless ``scheduler.predictor`` sets a
        prior (an override) or turns calibration off, the config has no SLO classes (then
        no decision reads a prediction, and the steps would only delay ``/ready``), or the
        predictor is a model of its own (the simulator's). Logs and returns the fitted
        prior (seconds per unit), or ``None`` when none ran (and logs the predictor's
        state if it is not trusted and SLO classes would act on it)."""
        predictor = self.scheduler.predictor
        settings = config.scheduler.predictor
        if not config.scheduler.slo_classes:
            return None
        skip = settings.prior is not None or not settings.calibrate_at_start
        if skip or not isinstance(predictor, LinearStepTimePredictor):
            if not predictor.trusted:
                logger.warning(_STATE_MESSAGES[predictor.state])
            return None
        kv = self.scheduler.kv
        shapes = startup_shapes(config.scheduler, kv.num_blocks, kv.block_size)
        prior, measured = calibrate_prior(
            self.executor, shapes, kv.block_size, settings.calibration_repeats
        )
        predictor.calibrate(prior)
        self._note_predictor_state()
        logger.info(
            "step-time predictor calibrated on %d shapes (median of %d steps each, after "
            "a discarded first): %s; measured %s",
            len(shapes),
            settings.calibration_repeats,
            ", ".join(f"{k}={v:.3g}" for k, v in prior.model_dump().items()),
            ", ".join(f"{_describe(s)} {t * 1e3:.1f} ms" for s, t in measured),
        )
        return prior

    def _note_predictor_state(self) -> None:
        """Log a change of the predictor's state (it changes on the engine thread)."""
        state = self.scheduler.predictor.state
        if state is not self._predictor_state:
            self._predictor_state = state
            log = logger.info if state is PredictorState.TRUSTED else logger.warning
            log(_STATE_MESSAGES[state])

    def add_request(self, submission: Submission) -> float | None:
        """Queue a submission; raises ``AdmissionError`` or ``OverloadedError`` with nothing
        queued (``AdmissionError`` naming ``constraint.source`` for a constraint the
        executor cannot enforce). The caller stamps ``arrival_time`` on this engine's
        clock. Returns the TTFT (s) SLO admission predicted for it, or ``None`` when
        none ran. A constrained request's grammar starts compiling here, off this
        thread; one that does not compile ends before any token, with error code
        ``invalid_constraint``."""
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
        plan = self.plan_step(start)
        if plan.scheduled or plan.finished_ids or plan.preempted_ids:
            result = self.executor.execute(plan)
        else:
            if self.scheduler.constraints:
                # Only compiles are in flight: wait for one rather than spin.
                self.scheduler.constraints.wait(IDLE_COMPILE_WAIT_S)
            result = StepResult(sampled={}, duration_s=0.0)
        return self.finish_step(plan, result, start)

    def plan_step(self, start: float) -> SchedulerOutput:
        """The first half of ``step``: the plan of a step starting at ``start``
        (seconds). For a loop that runs plans itself (an executor that calls the engine,
        TensorRT-LLM's in-executor mode), ``finish_step`` is the second half."""
        plan = self.last_plan = self.scheduler.schedule(start)
        return plan

    def finish_step(self, plan: SchedulerOutput, result: StepResult, start: float) -> EngineStep:
        """The second half of ``step``: what running ``plan`` (begun at ``start``) did,
        applied. Every executor's steps are predicted and observed the same way, so the
        error is tracked (and the online fit learns) whatever runs the plan."""
        if plan.scheduled:
            features = features_of(plan)
            predictor = self.scheduler.predictor
            self.step_time_errors.observe(predictor.predict(features), result.duration_s)
            predictor.observe(features, result.duration_s)
            self._note_predictor_state()
        outputs = self.scheduler.update(plan, result, start + result.duration_s)
        if self._kv_event_sink is not None:
            self._publish_kv_events(self._kv_event_sink)
        return EngineStep(outputs, plan, start, result.duration_s, result.cost)

    def stats(self) -> EngineStats:
        s = self.scheduler
        slo = s.slo.figures()
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.kv.num_used_blocks,
            kv_blocks_total=s.kv.num_blocks,
            num_preemptions=s.num_preemptions,
            step_time_error=self.step_time_errors.median,
            ttft_prediction_error=slo.ttft_prediction_error,
            predictor_state=s.predictor.state,
            num_shed=slo.num_shed,
            rejections=slo.rejections,
            ttft_prediction_error_by_class=slo.ttft_prediction_error_by_class,
            regretted_refusals=s.admission.outcomes.regretted_refusals(s.room, self.clock.now()),
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
        """Stop grammar compiles, shut the executor down and close the KV event sink."""
        self.scheduler.constraints.shutdown()
        try:
            self.executor.shutdown()
        finally:
            sink, self._kv_event_sink = self._kv_event_sink, None
            if sink is not None:
                sink.close()


def _describe(shape: Sequence[tuple[int, int]]) -> str:
    """``prefill 256``, ``decode x8 @128``, ``256 + decode x8`` for a calibration shape."""
    prefill = [n for n, _ in shape if n > 1]
    decodes = [c for n, c in shape if n == 1]
    parts = [f"prefill {prefill[0]}"] if prefill else []
    if decodes:
        parts.append(f"decode x{len(decodes)} @{decodes[0]}")
    return " + ".join(parts)
