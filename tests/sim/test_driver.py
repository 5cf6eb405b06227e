"""The discrete-event driver over the real EngineCore and Scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.common.metrics import RequestRecord
from orchestrator.common.workloads import (
    ClosedLoop,
    FixedLength,
    PoissonArrivals,
    RequestSpec,
    UniformLength,
    Workload,
    WorkloadConfig,
    build_workload,
)
from orchestrator.core.clock import VirtualClock
from orchestrator.core.config import EngineConfig, SchedulerConfig
from orchestrator.core.engine import EngineCore
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.sched.scheduler import Scheduler
from orchestrator.sim.driver import Replica, SimRun, Simulation, simulate, synthetic_prompt
from orchestrator.sim.router import RoundRobinRouter, make_router
from tests.fakes import FakeExecutor

STEP = 0.01  # FakeExecutor's step time (s)


def fake_replicas(
    n: int, clock: VirtualClock, num_blocks: int = 256, max_model_len: int = 4096, **sched: Any
) -> list[Replica]:
    replicas = []
    for _ in range(n):
        kv = KVCacheManager(num_blocks, 16)
        scheduler = Scheduler(SchedulerConfig(**sched), kv, max_model_len)
        replicas.append(Replica(EngineCore(scheduler, FakeExecutor(num_blocks, 16, STEP), clock)))
    return replicas


def run_fake(
    workload: Workload, replicas: int = 1, router: str = "round_robin", **kw: Any
) -> SimRun:
    clock = VirtualClock()
    return Simulation(
        fake_replicas(replicas, clock, **kw), clock, workload, make_router(router)
    ).run()


def sim_engine(**scheduler: Any) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "scheduler": scheduler,
            "executor": {"type": "sim", "model": "llama3-8b", "hardware": "h100-sxm"},
        }
    )


def by_id(run: SimRun) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in run.records}


def test_a_lone_request_gets_exact_token_times_from_the_steps() -> None:
    # 40-token prompt in chunks of 16: three prefill steps, then one token per step.
    run = run_fake(
        Workload([RequestSpec(0, 1.0, 40, 5)]), chunk_size=16, max_num_tokens=16, max_batch_size=4
    )
    (record,) = run.records
    assert record.arrival_time == 1.0
    assert record.token_times == pytest.approx([1.0 + STEP * k for k in range(3, 8)])
    assert record.ttft == pytest.approx(3 * STEP)
    assert record.tpot == pytest.approx(STEP)
    assert run.end_time == pytest.approx(1.0 + 7 * STEP)


def test_arrivals_at_one_instant_share_the_first_step() -> None:
    workload = Workload([RequestSpec(i, 0.0, 8, 2) for i in range(4)])
    run = run_fake(workload)
    assert run.replicas[0].trace.num_seqs[0] == 4
    assert [r.ttft for r in run.records] == pytest.approx([STEP] * 4)


def test_a_request_arriving_mid_step_waits_for_the_next_step() -> None:
    workload = Workload([RequestSpec(0, 0.0, 8, 10), RequestSpec(1, 0.005, 8, 1)])
    run = by_id(run_fake(workload))
    # The second arrives during step 1 [0, 0.01) and is prefilled in step 2 [0.01, 0.02).
    assert run["req-1"].token_times == pytest.approx((0.02,))
    assert run["req-1"].ttft == pytest.approx(0.015)


def test_every_request_finishes_with_its_output_length_and_kv_is_clean() -> None:
    config = WorkloadConfig(
        arrival=PoissonArrivals(rate=40),
        num_requests=120,
        prompt_len=UniformLength(low=1, high=600),
        output_len=UniformLength(low=1, high=80),
    )
    workload = build_workload(config)
    run = simulate(sim_engine(chunk_size=128, max_num_tokens=512), workload, RoundRobinRouter())
    records = by_id(run)
    assert len(records) == 120
    for spec in workload.requests:
        r = records[f"req-{spec.index}"]
        assert r.ok and r.num_output_tokens == spec.output_len == len(r.token_times)
        assert r.num_prompt_tokens == spec.prompt_len
        assert list(r.token_times) == sorted(r.token_times) and r.token_times[0] > r.arrival_time
    kv = run.replicas[0].core.scheduler.kv
    kv.integrity_check()
    assert kv.num_used_blocks == 0


def test_runs_are_deterministic_for_a_seed() -> None:
    config = WorkloadConfig(
        arrival=PoissonArrivals(rate=30),
        num_requests=60,
        prompt_len=UniformLength(low=10, high=300),
        output_len=UniformLength(low=1, high=40),
    )
    first = simulate(
        sim_engine(), build_workload(config), make_router("least_outstanding_tokens"), 2
    )
    again = simulate(
        sim_engine(), build_workload(config), make_router("least_outstanding_tokens"), 2
    )
    assert first.records == again.records
    other = build_workload(config.model_copy(update={"seed": 9}))
    assert simulate(sim_engine(), other, RoundRobinRouter(), 2).records != first.records


def test_saturated_replica_time_is_the_sum_of_its_step_durations() -> None:
    workload = Workload([RequestSpec(i, 0.0, 100, 20) for i in range(10)])
    run = simulate(sim_engine(), workload, RoundRobinRouter())
    assert run.end_time == pytest.approx(sum(run.replicas[0].trace.durations))
    assert sum(run.replicas[0].time_by_cause) == pytest.approx(run.end_time)


def test_closed_loop_keeps_at_most_concurrency_in_flight_and_honours_think_time() -> None:
    wl = build_workload(
        WorkloadConfig(
            arrival=ClosedLoop(concurrency=3, think_time_s=0.05),
            num_requests=12,
            prompt_len=FixedLength(value=8),
            output_len=UniformLength(low=1, high=6),
        )
    )
    run = run_fake(wl)
    assert len(run.records) == 12 and all(r.ok for r in run.records)
    spans = [(r.arrival_time, r.token_times[-1]) for r in run.records]
    for t, _ in spans:
        in_flight = sum(1 for a, e in spans if a <= t < e)
        assert in_flight <= 3
    finishes = sorted(e for _, e in spans)
    later_arrivals = sorted(a for a, _ in spans)[3:]
    assert later_arrivals == pytest.approx([f + 0.05 for f in finishes[:9]])


def test_requests_that_can_never_run_are_recorded_as_400_and_the_rest_complete() -> None:
    workload = Workload([RequestSpec(0, 0.0, 90, 20), RequestSpec(1, 0.0, 10, 5)])
    run = by_id(run_fake(workload, max_model_len=100))
    assert run["req-0"].status_code == 400 and not run["req-0"].ok
    assert "over the model's maximum context" in (run["req-0"].error or "")
    assert run["req-1"].ok


def test_a_full_waiting_queue_answers_429() -> None:
    workload = Workload([RequestSpec(i, 0.0, 8, 2) for i in range(5)])
    run = run_fake(workload, max_waiting_requests=2)
    codes = sorted(r.status_code or 0 for r in run.records)
    assert codes == [0, 0, 429, 429, 429]


def test_round_robin_spreads_requests_over_replicas() -> None:
    workload = Workload([RequestSpec(i, 0.0, 8, 4) for i in range(6)])
    run = run_fake(workload, replicas=3)
    assert [r.trace.num_seqs[0] for r in run.replicas] == [2, 2, 2]


def test_least_outstanding_tokens_sends_work_to_the_emptier_replica() -> None:
    # One long request lands on replica 0; the short ones then all go to replica 1 while
    # replica 0 still owes more tokens than replica 1 does.
    workload = Workload(
        [RequestSpec(0, 0.0, 500, 200)] + [RequestSpec(i, 0.1, 8, 4) for i in range(1, 4)]
    )
    run = run_fake(workload, replicas=2, router="least_outstanding_tokens")
    first, second = run.replicas
    assert max(first.trace.num_seqs) == 1
    assert max(second.trace.num_seqs) == 3
    assert first.outstanding_tokens == second.outstanding_tokens == 0


def test_static_and_unchunked_modes_run_every_request_to_completion() -> None:
    config = WorkloadConfig(
        arrival=PoissonArrivals(rate=50),
        num_requests=40,
        prompt_len=UniformLength(low=10, high=400),
        output_len=UniformLength(low=1, high=50),
    )
    for scheduler in ({"batching": "static", "max_batch_size": 8}, {"batching": "prefill_first"}):
        run = simulate(sim_engine(**scheduler), build_workload(config), RoundRobinRouter())
        assert sum(r.ok for r in run.records) == 40, scheduler


def test_synthetic_prompts_share_no_prefix() -> None:
    prompts = {tuple(synthetic_prompt(i, 20)[:2]) for i in range(100_000)}
    assert len(prompts) == 100_000
    assert synthetic_prompt(7, 1) == [7]
