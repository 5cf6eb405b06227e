"""The simulation report: shared metrics plus occupancy, KV usage, causes, utilisation."""

from __future__ import annotations

import pytest
from rich.console import Console

from orchestrator.common.metrics import SLO
from orchestrator.common.workloads import RequestSpec, Workload
from orchestrator.core.config import EngineConfig
from orchestrator.sim.driver import simulate
from orchestrator.sim.report import build_report, print_report, throughput_ceiling
from orchestrator.sim.router import LeastOutstandingTokensRouter, RoundRobinRouter

ENGINE = EngineConfig.model_validate(
    {
        "scheduler": {"max_batch_size": 16, "max_num_tokens": 2048},
        "executor": {
            "type": "sim",
            "model": "llama3-70b",
            "hardware": "h100-sxm",
            "weight_dtype": "fp8",
            "kv_dtype": "fp8",
            "tp": 2,
        },
    }
)


def burst(n: int, prompt: int = 200, output: int = 50) -> Workload:
    return Workload([RequestSpec(i, 0.0, prompt, output) for i in range(n)])


def test_a_lone_request_occupies_one_slot_and_counts_tp_gpus() -> None:
    workload = burst(1)
    report = build_report(simulate(ENGINE, workload, RoundRobinRouter()), ENGINE, workload, SLO())
    assert report.mean_batch_occupancy == pytest.approx(1.0)
    assert report.num_gpus == 2
    s = report.summary
    assert s.output_throughput_per_gpu == pytest.approx(s.output_throughput / 2)
    assert 0 < report.kv_usage_peak < 0.01
    assert sum(report.time_by_cause.values()) == pytest.approx(1.0)


def test_a_saturated_batch_fills_its_slots_and_stays_under_the_ceiling() -> None:
    workload = burst(64)
    run = simulate(ENGINE, workload, RoundRobinRouter())
    report = build_report(run, ENGINE, workload, SLO())
    assert 12 < report.mean_batch_occupancy <= 16
    assert report.utilisation is not None and 0.5 < report.utilisation < 1.0
    assert report.ceiling_tokens_per_s is not None
    assert report.summary.output_throughput < report.ceiling_tokens_per_s


def test_goodput_counts_only_requests_within_the_slo() -> None:
    workload = burst(64)
    run = simulate(ENGINE, workload, RoundRobinRouter())
    ttfts = sorted(r.ttft or 0.0 for r in run.records)
    bound = ttfts[31] + 1e-9  # the first half of the queue meets it
    report = build_report(run, ENGINE, workload, SLO(ttft_s=bound))
    assert report.summary.goodput_fraction == pytest.approx(0.5)


def test_replicas_multiply_gpus_and_the_ceiling() -> None:
    workload = burst(8)
    one = build_report(simulate(ENGINE, workload, RoundRobinRouter()), ENGINE, workload, SLO())
    three = build_report(
        simulate(ENGINE, workload, LeastOutstandingTokensRouter(), replicas=3),
        ENGINE,
        workload,
        SLO(),
    )
    assert three.num_gpus == 6
    assert three.ceiling_tokens_per_s == pytest.approx(3 * (one.ceiling_tokens_per_s or 0))


def test_printed_report_has_the_latency_rows_and_capacity_figures() -> None:
    workload = burst(4)
    report = build_report(
        simulate(ENGINE, workload, RoundRobinRouter()), ENGINE, workload, SLO(0.5, 0.08)
    )
    console = Console(record=True, width=120)
    print_report(report, console)
    text = console.export_text()
    for row in ("TTFT", "TPOT", "ITL", "E2E", "goodput req/s", "utilisation", "KV usage"):
        assert row in text
    assert "TTFT < 500 ms, TPOT < 80 ms" in text
    assert f"{report.summary.output_throughput:,.0f}" in text


def test_gpus_and_kv_tokens_come_from_the_engine_not_the_config() -> None:
    workload = burst(2)
    run = simulate(ENGINE, workload, RoundRobinRouter(), replicas=2)
    report = build_report(run, ENGINE, workload, SLO())
    info = run.replicas[0].core.info
    assert report.num_gpus == 2 * info.num_gpus == 4
    assert report.kv_tokens_per_replica == info.num_kv_blocks * info.block_size
    pinned = ENGINE.model_copy(
        update={"cache": ENGINE.cache.model_copy(update={"num_blocks": 1000})}
    )
    run = simulate(pinned, workload, RoundRobinRouter())
    assert build_report(run, pinned, workload, SLO()).kv_tokens_per_replica == 1000 * 16


def test_the_ceiling_needs_a_simulated_deployment() -> None:
    workload = burst(4)
    assert throughput_ceiling(ENGINE, workload, 1) is not None
    other = EngineConfig.model_validate({"executor": {"type": "torch"}})
    assert throughput_ceiling(other, workload, 1) is None
    assert throughput_ceiling(ENGINE, Workload([]), 1) is None
