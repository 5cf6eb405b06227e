"""Does the simulator predict the real engine? Calibrate the cost model on this machine,
then serve one workload twice: on the torch executor in real time, and in the simulator
with the calibrated profile. Prints measured vs predicted TTFT p50, TPOT p50 and output
throughput with the error of each (target: each within 15%).

The workload is a closed loop (8 clients, 32 requests, prompts 64-384 tokens, outputs
16-96 tokens, fixed seed), so it loads any machine the same way whatever its speed. The
default engine pins torch to one thread: on a machine shared with other jobs a
multi-threaded step waits on its slowest thread and step times swing tenfold, which
measures the neighbours rather than the engine (``--config`` measures any other engine).

Run: .venv/bin/python benchmarks/sim_fidelity.py [--config ENGINE_YAML] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from orchestrator.common.metrics import RequestRecord, Summary, summarize
from orchestrator.common.workloads import (
    ClosedLoop,
    UniformLength,
    Workload,
    WorkloadConfig,
    build_workload,
)
from orchestrator.core import (
    EngineConfig,
    EngineCore,
    Executor,
    SamplingParams,
    Submission,
    VirtualClock,
    WallClock,
    create_executor,
)
from orchestrator.sim.calibrate import calibrate, torch_engine
from orchestrator.sim.config import load_sim_config
from orchestrator.sim.driver import Simulation, build_replicas, synthetic_prompt
from orchestrator.sim.router import RoundRobinRouter

TARGET = 0.15
WORKLOAD = WorkloadConfig(
    arrival=ClosedLoop(concurrency=8),
    num_requests=32,
    prompt_len=UniformLength(low=64, high=384),
    output_len=UniformLength(low=16, high=96),
    seed=0,
)


def run_real(
    engine: EngineConfig, executor: Executor, workload: Workload
) -> tuple[list[RequestRecord], float]:
    """Serve a closed-loop workload on the wall clock; token times are when ``step()``
    returned them. Returns the records and the run's duration (s), times from its start."""
    assert workload.concurrency is not None
    clock = WallClock()
    core = EngineCore.from_config(engine, executor=executor, clock=clock)
    start = clock.now()
    pending = iter(workload.requests)
    live: dict[str, tuple[float, list[float]]] = {}
    records: list[RequestRecord] = []

    def submit() -> None:
        spec = next(pending, None)
        if spec is None:
            return
        rid = f"req-{spec.index}"
        now = clock.now()
        params = SamplingParams(max_tokens=spec.output_len, temperature=0.0)
        prompt = synthetic_prompt(spec.index, spec.prompt_len)
        core.add_request(Submission(rid, prompt, params, arrival_time=now))
        live[rid] = (now - start, [])

    for _ in range(workload.concurrency):
        submit()
    while core.has_work():
        step = core.step()
        now = clock.now() - start
        for out in step.outputs:
            arrival, times = live[out.request_id]
            times.extend([now] * len(out.new_token_ids))
            if out.finished:
                del live[out.request_id]
                records.append(
                    RequestRecord(
                        out.request_id,
                        arrival,
                        tuple(times),
                        out.num_prompt_tokens,
                        out.num_output_tokens,
                    )
                )
                submit()
    return records, clock.now() - start


def run_sim(sim_config_path: Path, workload: Workload) -> tuple[list[RequestRecord], float]:
    engine = load_sim_config(sim_config_path).engine
    clock = VirtualClock()
    run = Simulation(build_replicas(engine, 1, clock), clock, workload, RoundRobinRouter()).run()
    return run.records, run.end_time


def compare(measured: Summary, predicted: Summary) -> list[tuple[str, float, float, float]]:
    rows = [
        ("TTFT p50 (ms)", measured.ttft.p[50] * 1e3, predicted.ttft.p[50] * 1e3),
        ("TPOT p50 (ms)", measured.tpot.p[50] * 1e3, predicted.tpot.p[50] * 1e3),
        ("output tok/s", measured.output_throughput, predicted.output_throughput),
    ]
    return [(name, m, p, p / m - 1) for name, m, p in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="engine YAML with a torch executor (default built-in)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per calibration shape")
    args = parser.parse_args()
    engine = (
        torch_engine(args.config)
        if args.config
        else EngineConfig.model_validate({"executor": {"type": "torch", "num_threads": 1}})
    )
    workload = build_workload(WORKLOAD)
    executor = create_executor(engine)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("calibrating:")
            _, sim_path = calibrate(engine, executor, Path(tmp), args.repeats)
            started = time.perf_counter()
            real_records, real_duration = run_real(engine, executor, workload)
            real_wall = time.perf_counter() - started
            sim_records, sim_duration = run_sim(sim_path, workload)
    finally:
        executor.shutdown()
    measured = summarize(real_records, real_duration)
    predicted = summarize(sim_records, sim_duration)
    print(
        f"workload: closed loop of {workload.concurrency} clients, {len(workload.requests)} "
        f"requests; real run {real_wall:.1f} s, simulated {sim_duration:.1f} s"
    )
    print(f"{'metric':<16}{'measured':>12}{'predicted':>12}{'error':>9}")
    rows = compare(measured, predicted)
    for name, m, p, err in rows:
        print(f"{name:<16}{m:>12,.1f}{p:>12,.1f}{err:>+9.1%}")
    worst = max(abs(err) for *_, err in rows)
    verdict = "within" if worst <= TARGET else "OUTSIDE"
    print(f"worst error {worst:.1%}: {verdict} the {TARGET:.0%} target")


if __name__ == "__main__":
    main()
