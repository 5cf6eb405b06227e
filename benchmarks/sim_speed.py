"""How fast the simulator runs: 10,000 requests of Llama-3-70B (FP8, 2x H100) at
10 req/s, from the shipped config.

Prints the run's CPU and wall time against the 10 s target, the simulated serving time
it covered (the baseline: how much faster than real time), and where the CPU time went:
the scheduler and KV manager (EngineCore.step without the executor), the cost model
(SimExecutor.execute), and the event loop around them. The last line is simulated steps
per second.

Run: .venv/bin/python benchmarks/sim_speed.py [--requests 10000] [--rate 10]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from orchestrator.common.workloads import build_workload
from orchestrator.core import EngineCore
from orchestrator.sim.config import load_sim_config
from orchestrator.sim.driver import simulate
from orchestrator.sim.report import build_report
from orchestrator.sim.router import make_router
from plugins.sim_executor import SimExecutor

CONFIG = "configs/sim/llama3-70b-fp8-h100-tp2.yaml"
TARGET_S = 10.0


def timed(owner: Any, name: str, totals: dict[str, float]) -> Callable[[], None]:
    """Wrap ``owner.name`` so its CPU time adds to ``totals[name]``; returns the undo."""
    original = getattr(owner, name)

    def wrapper(self: Any, *args: Any) -> Any:
        t = time.process_time()
        try:
            return original(self, *args)
        finally:
            totals[name] += time.process_time() - t

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    base = load_sim_config(CONFIG)
    config = base.model_copy(
        update={"workload": base.workload.with_rate(args.rate).with_num_requests(args.requests)}
    )

    # Plain run first: the headline figures carry no instrumentation overhead.
    workload = build_workload(config.workload)
    router = make_router(config.cluster.router)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = simulate(config.engine, workload, router, config.cluster.replicas)
    cpu_sim = time.process_time() - cpu0
    report = build_report(run, config.engine, workload, config.slo.to_slo())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    steps = run.num_steps

    totals = {"step": 0.0, "execute": 0.0}
    undo = [timed(EngineCore, "step", totals), timed(SimExecutor, "execute", totals)]
    try:
        cpu1 = time.process_time()
        simulate(
            config.engine, workload, make_router(config.cluster.router), config.cluster.replicas
        )
        cpu_instrumented = time.process_time() - cpu1
    finally:
        for u in undo:
            u()
    scheduler = totals["step"] - totals["execute"]
    loop = cpu_instrumented - totals["step"]

    print(f"config: {CONFIG}, {args.requests:,} requests at {args.rate:g} req/s")
    print(f"completed: {report.summary.num_completed:,}, steps: {steps:,}")
    print(
        f"CPU time: {cpu:.2f} s (target < {TARGET_S:.0f} s): simulation {cpu_sim:.2f} s, "
        f"report {cpu - cpu_sim:.2f} s; wall time {wall:.2f} s"
    )
    print(
        f"simulated serving time: {run.end_time:,.0f} s = {run.end_time / cpu:,.0f}x faster "
        "than real time"
    )
    print(
        "simulation CPU by part (instrumented run): "
        f"scheduler + KV {scheduler / cpu_instrumented:.0%}, "
        f"cost model {totals['execute'] / cpu_instrumented:.0%}, "
        f"event loop and records {loop / cpu_instrumented:.0%}"
    )
    print(f"simulated steps per second: {steps / cpu_sim:,.0f}")


if __name__ == "__main__":
    main()
