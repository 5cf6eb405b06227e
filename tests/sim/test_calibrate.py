"""Calibration: the fit recovers known rates, and the real run writes usable profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.common.specs import load_gpu_spec, load_model_spec
from orchestrator.core.config import EngineConfig
from orchestrator.core.executor import create_executor
from orchestrator.sim.calibrate import SHAPES, fit, main, predict, shape_plan, unit_costs
from orchestrator.sim.config import load_sim_config
from plugins.sim_executor import SimExecutor


def test_shape_plans_give_each_request_its_own_covering_blocks() -> None:
    plan = shape_plan([(1, 256), (100, 0), (3, 30)], block_size=16)
    tables = [s.block_table for s in plan.scheduled]
    assert [len(t) for t in tables] == [17, 7, 3]
    flat = [b for t in tables for b in t]
    assert len(set(flat)) == len(flat) == max(flat) + 1
    assert all(s.sample for s in plan.scheduled)


@pytest.mark.parametrize(
    ("bw", "flops", "attention", "overhead"),
    [(20e9, 0.5e12, 1.0, 3e-3), (8e9, 0.4e12, 0.3, 0.0), (6e9, 0.15e12, 0.05, 0.03)],
)
def test_fit_recovers_the_rates_that_produced_the_timings(
    bw: float, flops: float, attention: float, overhead: float
) -> None:
    units = unit_costs(load_model_spec("smollm2-135m"), "bf16", list(SHAPES.values()), 16)
    measured = [predict(u, bw, flops, attention, overhead) for u in units]
    result = fit(units, measured)
    assert result.max_rel_error < 0.03
    assert result.bandwidth == pytest.approx(bw, rel=0.1)
    assert result.flops == pytest.approx(flops, rel=0.1)
    assert result.attention_efficiency == pytest.approx(attention, rel=0.1)
    assert result.overhead_s == pytest.approx(overhead, abs=0.1 * measured[0])


def test_when_no_shape_is_compute_bound_the_fit_still_predicts() -> None:
    # Every shape streams the same weights, so weight time and the fixed overhead cannot
    # be told apart; the prediction is what must hold.
    units = unit_costs(load_model_spec("smollm2-135m"), "bf16", list(SHAPES.values()), 16)
    measured = [predict(u, 8e9, 2e12, 0.3, 0.0) for u in units]
    assert fit(units, measured).max_rel_error < 0.03
    # A peak above the truth keeps the bandwidth physical; the overhead takes the rest.
    bounded = fit(units, measured, max_bandwidth=12e9)
    assert 8e9 * 0.95 <= bounded.bandwidth <= 12e9
    assert bounded.max_rel_error < 0.03


def test_fit_tolerates_noise() -> None:
    units = unit_costs(load_model_spec("smollm2-135m"), "fp32", list(SHAPES.values()), 16)
    truth = [predict(u, 25e9, 0.3e12, 0.5, 2e-3) for u in units]
    noise = [1.05, 0.97, 1.02, 1.0, 0.95, 1.04, 0.99]
    result = fit(units, [t * k for t, k in zip(truth, noise, strict=True)])
    assert result.max_rel_error < 0.1
    fitted = [
        predict(u, result.bandwidth, result.flops, result.attention_efficiency, result.overhead_s)
        for u in units
    ]
    assert fitted == pytest.approx(truth, rel=0.08)


@pytest.mark.slow
def test_calibrate_writes_a_profile_the_simulator_loads(tmp_path: Path) -> None:
    # A fixed pool: with kv_cache_gib auto, each executor sizes it from the memory
    # available at its start, which other processes move between the two starts.
    config = tmp_path / "torch.yaml"
    config.write_text("executor:\n  type: torch\n  kv_cache_gib: 0.25\n")
    assert main(str(config), tmp_path, repeats=1) == 0
    hardware = load_gpu_spec(tmp_path / "local-cpu.yaml")
    assert 0 < hardware.bw_efficiency <= 1.5 and 0 < hardware.flops_efficiency <= 1.5
    sim = load_sim_config(tmp_path / "sim-local-cpu.yaml")
    executor = create_executor(sim.engine)
    assert isinstance(executor, SimExecutor)
    assert sim.engine.cache.num_blocks is not None
    torch_blocks = create_executor(
        EngineConfig.model_validate({"executor": {"type": "torch", "kv_cache_gib": 0.25}})
    )
    assert sim.engine.cache.num_blocks == torch_blocks.info().num_kv_blocks
    step = executor.execute(shape_plan([(1, 256)] * 8, 16)).duration_s
    assert 1e-4 < step < 10.0
