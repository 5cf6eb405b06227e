"""Capacity planning, rate search and tuning on the simulator."""

from __future__ import annotations

import pytest

from orchestrator.common.workloads import FixedLength, PoissonArrivals, WorkloadConfig
from orchestrator.core.config import EngineConfig
from orchestrator.sim.config import SimConfig, SLOConfig
from orchestrator.sim.plan import plan_capacity, plan_tp, with_tp
from orchestrator.sim.runner import ceiling_rate, max_sustainable_rate, meets, run_simulation
from orchestrator.sim.tune import Knobs, knob_grid, tune, with_knobs


def config(rate: float = 4.0, model: str = "llama3-70b", n: int = 120) -> SimConfig:
    engine = EngineConfig.model_validate(
        {
            "executor": {
                "type": "sim",
                "model": model,
                "hardware": "h100-sxm",
                "weight_dtype": "fp8",
                "kv_dtype": "fp8",
            }
        }
    )
    workload = WorkloadConfig(
        arrival=PoissonArrivals(rate=rate),
        num_requests=n,
        prompt_len=FixedLength(value=512),
        output_len=FixedLength(value=128),
    )
    return SimConfig(engine=engine, workload=workload, slo=SLOConfig(ttft_ms=500, tpot_ms=40))


def test_plan_finds_the_smallest_replica_count_that_meets_the_slo() -> None:
    cfg = config(rate=12)
    plan = plan_tp(cfg, 2, attainment=0.9, max_replicas=16)
    assert plan.best is not None and plan.best.ok
    n = plan.best.replicas
    # The search must have seen the count just below fail (or start from 1).
    below = [p for p in plan.probes if p.replicas == n - 1]
    assert n == 1 or (below and not below[0].ok)


def test_more_traffic_never_needs_fewer_gpus() -> None:
    low, _ = plan_capacity(config(rate=3), [2], 0.9, 16)
    high, _ = plan_capacity(config(rate=24), [2], 0.9, 16)
    assert low is not None and high is not None
    assert high.gpus > low.gpus


def test_a_width_the_model_cannot_split_into_is_skipped_with_the_reason() -> None:
    plan = plan_tp(config(), 3, attainment=0.9, max_replicas=4)
    assert plan.best is None and plan.skipped is not None
    assert "tp=3 does not divide the 64 attention heads" in plan.skipped
    with pytest.raises(ValueError, match="does not divide"):
        with_tp(config(), 3)


def test_plan_gives_up_at_the_replica_limit() -> None:
    plan = plan_tp(config(rate=200), 1, attainment=0.99, max_replicas=2)
    assert plan.best is None and plan.skipped is None


def test_rate_search_brackets_the_knee_of_slo_attainment() -> None:
    cfg = config(model="llama3-8b").model_copy(update={"slo": SLOConfig(ttft_ms=100)})
    search = max_sustainable_rate(cfg, 0.9, iterations=6)
    assert search.rate is not None and search.result is not None
    assert meets(search.result.report, 0.9)
    assert 0 < search.rate < ceiling_rate(cfg)
    failing = [r for r, res in search.probes if not meets(res.report, 0.9)]
    assert failing and min(failing) > search.rate


def test_knob_grid_drops_settings_the_scheduler_rejects() -> None:
    grid = knob_grid([256, 4096], [2048], [64, 4096])
    assert grid == [Knobs(256, 2048, 64)]


def test_tune_at_a_fixed_rate_prefers_batching_when_one_at_a_time_cannot_keep_up() -> None:
    cfg = config(rate=8, model="llama3-8b", n=80)
    grid = [Knobs(512, 2048, 1), Knobs(512, 2048, 64)]
    trials = tune(cfg, grid, attainment=0.9, rate=8)
    assert trials[0].knobs.max_batch_size == 64
    assert trials[0].goodput > trials[1].goodput


def test_tune_with_rate_search_scores_each_setting_by_the_rate_it_sustains() -> None:
    cfg = config(model="llama3-8b", n=80)
    grid = [Knobs(512, 2048, 4), Knobs(512, 2048, 128)]
    best, worse = tune(cfg, grid, attainment=0.9, iterations=5)
    assert best.knobs.max_batch_size == 128
    assert best.rate is not None and best.result is not None
    assert worse.rate is None or worse.rate < best.rate
    rerun = run_simulation(
        with_knobs(cfg, best.knobs).model_copy(
            update={"workload": cfg.workload.with_rate(best.rate)}
        )
    )
    assert meets(rerun.report, 0.9)
