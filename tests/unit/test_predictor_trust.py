"""The step-time predictor on a machine its prior was not made for: the first request
at an idle server, a prior 5x too slow or too fast, calibration at start, and SLO
admission falling back to queue limits while the fit is not trusted."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest

from orchestrator.core import (
    EngineConfig,
    ExecutorSpec,
    OverloadedError,
    PredictorConfig,
    StepTimePrior,
)
from orchestrator.core.clock import VirtualClock
from orchestrator.core.config import SchedulerConfig
from orchestrator.core.engine import EngineCore
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.core.predictor import (
    ErrorWindow,
    LinearStepTimePredictor,
    PredictorState,
    StepFeatures,
    features_of,
    mixed_step,
)
from orchestrator.core.sched.scheduler import Scheduler
from tests.factories import make_request, run_step, run_to_completion
from tests.fakes import FakeExecutor

# The shipped config's old prior: two idle cores of another machine.
SHIPPED_PRIOR = StepTimePrior(
    overhead_s=0.013,
    per_token_s=0.000275,
    per_seq_s=0.00004,
    per_context_token_s=0.0000015,
    per_pair_s=0.0,
)
CLASSES = {"interactive": {"ttft_ms": 3000, "tpot_ms": 1000}}


class LinearCostExecutor(FakeExecutor):
    """A fake whose step takes ``fixed_s + per_token_s x tokens`` (seconds)."""

    def __init__(self, fixed_s: float, per_token_s: float, num_blocks: int = 256) -> None:
        super().__init__(num_blocks, 16, 0.0)
        self.fixed_s, self.per_token_s = fixed_s, per_token_s

    def cost(self, features: StepFeatures) -> float:
        return self.fixed_s + self.per_token_s * features.num_tokens

    def execute(self, plan: SchedulerOutput) -> StepResult:
        result = super().execute(plan)
        return dataclasses.replace(result, duration_s=self.cost(features_of(plan)))


def slo_engine(
    executor: FakeExecutor, prior: StepTimePrior | None
) -> tuple[EngineCore, VirtualClock]:
    config = SchedulerConfig(
        max_num_tokens=256,
        chunk_size=256,
        slo_classes=CLASSES,
        default_slo_class="interactive",
        admission={"type": "slo", "ttft_margin": 0.8},
        slo_budget={"enabled": True},
        predictor=PredictorConfig(prior=prior),
    )
    kv = KVCacheManager(executor.num_blocks, 16, True)
    clock = VirtualClock()
    return EngineCore(Scheduler(config, kv, 4096), executor, clock), clock


def warm_up(engine: EngineCore, clock: VirtualClock) -> None:
    """The load generator's two warm-ups: a 5-token prompt, 8 tokens out, one at a time."""
    for i in range(2):
        request = make_request(5, max_tokens=8, request_id=f"warm-{i}")
        request.arrival_time = clock.now()
        engine.scheduler.add_request(request, clock.now())
        run_to_completion(engine, clock)


def test_decode_only_warm_up_does_not_blow_up_a_prefill_prediction() -> None:
    """The issue's idle-server reproduction: decodes 4x the prior's fixed cost (50 ms
    against 13 ms) used to put the excess on every feature in equal shares, and a
    394-token prefill came out 265x its true 129 ms. The anchors keep it within 2x."""
    executor = LinearCostExecutor(0.05, 0.0002)
    engine, clock = slo_engine(executor, SHIPPED_PRIOR)
    warm_up(engine, clock)
    prefill = mixed_step(0, 0, 394, 2)
    predicted = engine.scheduler.predictor.predict(prefill)
    assert predicted == pytest.approx(executor.cost(prefill), rel=1.0)


@pytest.mark.parametrize("slowdown", [5.0, 0.2], ids=["5x-slower", "5x-faster"])
def test_a_prior_5x_off_admits_the_first_request_and_converges_within_50_steps(
    slowdown: float,
) -> None:
    prior = SHIPPED_PRIOR
    executor = LinearCostExecutor(prior.overhead_s * slowdown, prior.per_token_s * slowdown)
    engine, clock = slo_engine(executor, prior)
    warm_up(engine, clock)
    first = make_request(394, max_tokens=16, request_id="first")
    first.arrival_time = clock.now()
    engine.scheduler.add_request(first, clock.now())  # admitted: no OverloadedError
    rng = random.Random(0)
    for i in range(50):
        if rng.random() < 0.3:
            prompt, out = rng.randint(16, 300), rng.randint(4, 40)
            r = make_request(prompt, max_tokens=out, request_id=f"r{i}")
            r.arrival_time = clock.now()
            with contextlib.suppress(OverloadedError):
                engine.scheduler.add_request(r, clock.now())
        if not engine.has_work():
            continue
        if i == 34:  # the engine's own error window, over the last 16 of the 50 steps
            engine.step_time_errors = ErrorWindow()
        run_step(engine, clock)
    late = engine.step_time_errors.median
    assert late is not None and late < 0.25
    assert engine.scheduler.predictor.trusted


def test_an_unconfirmed_default_prior_falls_back_to_queue_limits() -> None:
    """No prior configured and no calibration: admission predicts nothing and refuses
    nothing beyond the queue limits, even a request the default prior would call late;
    the budget is the full ``max_num_tokens``."""
    engine, clock = slo_engine(LinearCostExecutor(5.0, 0.1), None)
    predictor = engine.scheduler.predictor
    assert predictor.state is PredictorState.UNCALIBRATED
    for i in range(4):
        r = make_request(250, max_tokens=50, request_id=f"r{i}")
        engine.scheduler.add_request(r, clock.now())
        assert r.predicted_ttft_s is None
    assert engine.scheduler.step_budget() == 256
    assert engine.stats().predictor_state is PredictorState.UNCALIBRATED


def test_a_drifting_fit_stops_admission_acting_on_it_until_it_recovers() -> None:
    predictor = LinearStepTimePredictor(PredictorConfig(prior=SHIPPED_PRIOR))
    assert predictor.trusted
    f = mixed_step(4, 512, 64)
    states = []
    for _ in range(40):
        predictor.observe(f, 10 * predictor.predict(f) if not states else 0.5)
        states.append(predictor.state)
    assert PredictorState.DRIFTING in states[:10]
    assert states[-1] is PredictorState.TRUSTED
    assert predictor.predict(f) == pytest.approx(0.5, rel=0.05)


def test_calibration_at_start_fits_the_loaded_executor_and_is_trusted() -> None:
    executor = LinearCostExecutor(0.04, 0.0005)
    config = EngineConfig(
        executor=ExecutorSpec(type="torch"),
        scheduler={
            "max_num_tokens": 256,
            "chunk_size": 256,
            "predictor": {"prior": None},
            "slo_classes": CLASSES,
        },
    )
    kv = KVCacheManager(executor.num_blocks, 16, True)
    engine = EngineCore(Scheduler(config.scheduler, kv, 4096), executor, VirtualClock())
    assert not engine.scheduler.predictor.trusted
    prior = engine.calibrate_predictor(config)
    assert prior is not None
    assert prior.overhead_s == pytest.approx(0.04, rel=0.05)
    assert prior.per_token_s == pytest.approx(0.0005, rel=0.05)
    assert engine.scheduler.predictor.trusted
    # The synthetic requests were named finished, so the executor can drop them.
    assert executor.plans[-1].finished_ids and not executor.plans[-1].scheduled


def test_a_configured_prior_is_an_override_and_skips_calibration() -> None:
    executor = LinearCostExecutor(0.04, 0.0005)
    config = EngineConfig(
        executor=ExecutorSpec(type="torch"),
        scheduler={"predictor": {"prior": SHIPPED_PRIOR.model_dump()}},
    )
    engine, _ = slo_engine(executor, SHIPPED_PRIOR)
    assert engine.calibrate_predictor(config) is None
    assert not executor.plans


def test_no_calibration_without_slo_classes() -> None:
    """Nothing acts on predictions without SLO classes, so start-up times no steps."""
    executor = LinearCostExecutor(0.04, 0.0005)
    config = EngineConfig(
        executor=ExecutorSpec(type="torch"), scheduler={"predictor": {"prior": None}}
    )
    kv = KVCacheManager(executor.num_blocks, 16, True)
    engine = EngineCore(Scheduler(config.scheduler, kv, 4096), executor, VirtualClock())
    assert engine.calibrate_predictor(config) is None
    assert not executor.plans
