"""The step-time predictor: the online least-squares fit, its prior, the exact model
wrapper, error tracking, and the engine feeding it every measured step."""

from __future__ import annotations

import random

import pytest

from orchestrator.core import PredictorConfig, StepTimePrior
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.predictor import (
    ErrorWindow,
    LinearStepTimePredictor,
    StepFeatures,
    features_of,
    fit_prior,
)
from orchestrator.core.request import SamplingParams
from tests.factories import make_engine, make_request, plan_entry, run_to_completion


def truth(f: StepFeatures) -> float:
    return 0.004 + 1.5e-4 * f.num_tokens + 3e-4 * f.num_seqs + 2e-6 * f.context_tokens


def random_features(rng: random.Random) -> StepFeatures:
    decodes, prefill = rng.randint(0, 64), rng.choice([0, 0, 32, 128, 512])
    context = decodes * rng.randint(16, 1024)
    return StepFeatures(
        decodes + prefill, decodes + (prefill > 0), decodes + 1, context, context + prefill**2 // 2
    )


def test_the_first_predictions_are_the_prior() -> None:
    prior = StepTimePrior(
        overhead_s=0.01, per_token_s=1e-3, per_seq_s=0, per_context_token_s=0, per_pair_s=0
    )
    predictor = LinearStepTimePredictor(PredictorConfig(prior=prior))
    assert predictor.predict(StepFeatures(100, 1, 1, 0, 0)) == pytest.approx(0.11)


def test_the_online_fit_learns_a_linear_truth_within_a_window() -> None:
    rng = random.Random(3)
    predictor = LinearStepTimePredictor(PredictorConfig(window=128, refit_every=8))
    for _ in range(256):
        f = random_features(rng)
        predictor.observe(f, truth(f))
    errors = ErrorWindow()
    for _ in range(200):
        f = random_features(rng)
        errors.observe(predictor.predict(f), truth(f))
    # The prior's ridge pull (4 steps against 128) leaves a small bias.
    assert errors.median is not None and errors.median < 0.05


def test_the_window_forgets_old_steps() -> None:
    rng = random.Random(4)
    predictor = LinearStepTimePredictor(PredictorConfig(window=64, refit_every=4))
    for _ in range(200):
        f = random_features(rng)
        predictor.observe(f, 3 * truth(f))  # a slower machine, then a faster one
    for _ in range(200):
        f = random_features(rng)
        predictor.observe(f, truth(f))
    f = StepFeatures(200, 20, 20, 5000, 5000)
    assert predictor.predict(f) == pytest.approx(truth(f), rel=0.1)  # not 3x


def test_calibration_fits_a_prior_from_measured_steps() -> None:
    rng = random.Random(5)
    samples = [(f, truth(f)) for f in (random_features(rng) for _ in range(100))]
    prior = fit_prior(samples)
    assert prior.overhead_s == pytest.approx(0.004, rel=0.05)
    assert prior.per_token_s == pytest.approx(1.5e-4, rel=0.05)


def test_features_of_a_plan_count_tokens_context_and_pairs() -> None:
    params = SamplingParams()
    plan = SchedulerOutput(
        [
            plan_entry("a", [1] * 4, 10, (0,), True, params),
            plan_entry("b", [1], 7, (1,), True, params),
        ]
    )
    # pairs: 4 x 10 + 4 x 5 / 2 = 50 for a, 1 x 7 + 1 = 8 for b.
    assert features_of(plan) == StepFeatures(5, 2, 2, 17, 58)


def test_the_engine_observes_every_step_and_tracks_the_error() -> None:
    engine, clock = make_engine(step_time_s=0.02)
    for i in range(6):
        engine.scheduler.add_request(make_request(20, max_tokens=30, request_id=f"r{i}"))
    steps = run_to_completion(engine, clock)
    stats = engine.stats()
    assert engine.step_time_errors.count == sum(1 for s in steps if s.plan.scheduled)
    # A constant 20 ms is learnt: the error is tracked, and the fit ends close.
    assert stats.step_time_error is not None and stats.step_time_error < 0.15
    assert engine.scheduler.predictor.predict(StepFeatures(6, 6, 6, 200, 206)) == pytest.approx(
        0.02, rel=0.1
    )


def test_a_warm_up_stall_does_not_drag_the_fit() -> None:
    rng = random.Random(6)
    predictor = LinearStepTimePredictor(PredictorConfig(window=256, refit_every=8))
    predictor.observe(StepFeatures(1, 1, 1, 0, 1), 1.5)  # the first step: 1.5 s of warm-up
    for _ in range(64):
        f = random_features(rng)
        predictor.observe(f, 10 * truth(f))  # a machine ten times slower than the prior
    # A step of the size the window measured (its smallest steps are left to the
    # prior's anchors, rescaled when the drift was caught, so they come out less close).
    f = StepFeatures(160, 33, 33, 16_000, 16_500)
    assert predictor.predict(f) == pytest.approx(10 * truth(f), rel=0.25)


def test_calibration_is_not_capped() -> None:
    rng = random.Random(8)
    samples = [(f, 100 * truth(f)) for f in (random_features(rng) for _ in range(50))]
    assert fit_prior(samples).overhead_s == pytest.approx(0.4, rel=0.05)


def test_error_window_median_follows_new_observations() -> None:
    errors = ErrorWindow(size=3)
    assert errors.median is None
    errors.observe(1.1, 1.0)  # 10%
    assert errors.median == pytest.approx(0.1)
    errors.observe(1.5, 1.0)  # 50%: the cached median must not be served again
    assert errors.median == pytest.approx(0.3)
    errors.observe(2.0, 0.0)  # actual 0: skipped, median unchanged
    assert errors.median == pytest.approx(0.3)
    for _ in range(3):  # the window drops the old errors
        errors.observe(3.0, 1.0)
    assert errors.median == pytest.approx(2.0)
