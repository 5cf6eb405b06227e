"""Scheduler overhead per step: schedule() + update() with N running decode requests,
with and without a deep waiting queue. No model: the executor's result is made up
outside the timed region.

Run: .venv/bin/python benchmarks/scheduler_overhead.py [--steps 300]
The last line is the headline: p50 at 256 running, the same with 10,000 waiting, and
how the cost scales from 64 to 1,024 running requests (linear would be 16x).
"""

from __future__ import annotations

import argparse
import statistics
import time

from orchestrator.core import SchedulerConfig, StepResult
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request, SamplingParams
from orchestrator.core.sched.scheduler import Scheduler

PROMPT_LEN = 64
DECODE_WEIGHT_LOAD_S = 0.0418  # Llama-3-70B BF16 on H100: one decode step's weight load


def build(running: int, waiting: int, policy: str) -> tuple[Scheduler, float]:
    """A scheduler with ``running`` requests past their prefill and ``waiting`` queued."""
    sched = Scheduler(
        SchedulerConfig(
            policy=policy,  # type: ignore[arg-type]
            max_batch_size=running,
            max_num_tokens=max(2048, running),
            max_waiting_requests=waiting + running,
            max_waiting_tokens=(waiting + running) * PROMPT_LEN,
        ),
        KVCacheManager(num_blocks=running * 64, block_size=16),
        max_model_len=1_000_000,
    )
    params = SamplingParams(max_tokens=2_000, temperature=0)
    for i in range(running):
        prompt = [(i * 31 + j) % 32000 for j in range(PROMPT_LEN)]
        sched.add_request(Request(f"run-{i}", prompt, params, priority=i % 4))
    now = 0.0
    while any(r.num_uncomputed_tokens > 1 for r in sched.running) or sched.num_waiting:
        now = step(sched, now)[1]
    for i in range(waiting):
        prompt = [(i * 17 + j) % 32000 for j in range(PROMPT_LEN)]
        sched.add_request(
            Request(f"wait-{i}", prompt, params, priority=4 + i % 4, arrival_time=now)
        )
    return sched, now


def step(sched: Scheduler, now: float) -> tuple[float, float]:
    """One step; returns (seconds spent in schedule + update, next time)."""
    t0 = time.perf_counter()
    plan = sched.schedule(now)
    t1 = time.perf_counter()
    result = StepResult({s.request_id: 7 for s in plan.scheduled if s.sample}, duration_s=0.04)
    t2 = time.perf_counter()
    sched.update(plan, result, now + 0.04)
    t3 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), now + 0.04


def measure(running: int, waiting: int, policy: str, steps: int) -> float:
    """Median microseconds per step."""
    sched, now = build(running, waiting, policy)
    times = []
    for _ in range(steps):
        dt, now = step(sched, now)
        times.append(dt)
    assert sched.num_running == running and sched.num_waiting == waiting
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    results: dict[tuple[str, int, int], float] = {}
    print(
        f"{'policy':>8} {'running':>8} {'waiting':>8} {'p50 us/step':>12} {'us/request':>11}"
        f" {'% of 41.8 ms':>12}"
    )
    for policy in ("fcfs", "priority"):
        for running in (64, 256, 1024):
            for waiting in (0, 10_000):
                us = measure(running, waiting, policy, args.steps)
                results[(policy, running, waiting)] = us
                print(
                    f"{policy:>8} {running:>8} {waiting:>8} {us:>12.1f} {us / running:>11.2f}"
                    f" {us / 1e6 / DECODE_WEIGHT_LOAD_S * 100:>11.2f}%"
                )
    x = results[("fcfs", 256, 0)]
    y = results[("fcfs", 256, 10_000)]
    z = results[("fcfs", 1024, 0)] / results[("fcfs", 64, 0)]
    print(
        f"waiting-queue effect at 256 running: {y / x:.2f}x (target < 1.5x); "
        f"linear scaling 1024/64 would be 16x (target < 20x)"
    )
    print(
        f"scheduler step p50: {x:.0f} us at 256 running, {y:.0f} us at 256 running + "
        f"10000 waiting, scaling 1024/64: {z:.1f}x"
    )


if __name__ == "__main__":
    main()
