"""Scheduler overhead per step: schedule() + update() with N running decode requests,
with and without a deep waiting queue. No model: the executor's result is made up
outside the timed region.

Run: .venv/bin/python benchmarks/scheduler_overhead.py [--steps 300] [--baseline REV]
The table's last line is the headline: p50 at 256 running, the same with 10,000 waiting,
and how the cost scales from 64 to 1,024 running requests (linear would be 16x).

``--baseline REV`` (default: the last commit before the scheduler became strategies and
policies) also runs that commit's own copy of this script from a temporary git worktree,
alternating rounds with this tree's, and prints the per-cell ratio new/old of the
medians; ``--baseline none`` skips it. The last line then states the ratio at 256
running. Prefix hashing cost (SHA-256 chained over a 2,048-token prompt) is printed too.

``--no-gc`` times this tree's steps with CPython's cyclic collector off (collecting
between cells), to show what the collector adds at each size; it needs ``--baseline
none``.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.core import SchedulerConfig, StepResult
from orchestrator.core.kv.hashing import prefix_hashes, root_hash
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request, SamplingParams
from orchestrator.core.sched.scheduler import Scheduler

PROMPT_LEN = 64
# The main line before the core moved to orchestrator/core with registered strategies.
DEFAULT_BASELINE = "e211ea8"
REPO = Path(__file__).resolve().parents[1]
Cell = tuple[str, int, int]
DECODE_WEIGHT_LOAD_S = 0.0418  # Llama-3-70B BF16 on H100: one decode step's weight load


def build(running: int, waiting: int, policy: str) -> tuple[Scheduler, float]:
    """A scheduler with ``running`` requests past their prefill and ``waiting`` queued."""
    sched = Scheduler(
        SchedulerConfig(
            policy=policy,
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


def measure(running: int, waiting: int, policy: str, steps: int, collector: bool = True) -> float:
    """Median microseconds per step (with CPython's cyclic collector off during the
    steps unless ``collector``)."""
    sched, now = build(running, waiting, policy)
    times = []
    if not collector:
        gc.disable()
    try:
        for _ in range(steps):
            dt, now = step(sched, now)
            times.append(dt)
    finally:
        gc.enable()
        gc.collect()
    assert sched.num_running == running and sched.num_waiting == waiting
    return statistics.median(times) * 1e6


def table(steps: int, collector: bool = True) -> dict[Cell, float]:
    """Median us per step for every (policy, running, waiting) cell, printed as it goes."""
    results: dict[Cell, float] = {}
    print(
        f"{'policy':>8} {'running':>8} {'waiting':>8} {'p50 us/step':>12} {'us/request':>11}"
        f" {'% of 41.8 ms':>12}",
        flush=True,
    )
    for policy in ("fcfs", "priority"):
        for running in (64, 256, 1024):
            for waiting in (0, 10_000):
                us = measure(running, waiting, policy, steps, collector)
                results[(policy, running, waiting)] = us
                print(
                    f"{policy:>8} {running:>8} {waiting:>8} {us:>12.1f} {us / running:>11.2f}"
                    f" {us / 1e6 / DECODE_WEIGHT_LOAD_S * 100:>11.2f}%",
                    flush=True,
                )
    return results


_ROW = re.compile(r"^\s*(fcfs|priority)\s+(\d+)\s+(\d+)\s+([\d.]+)\s")


def baseline_table(worktree: Path, steps: int) -> dict[Cell, float]:
    """Run the baseline commit's own script (its own modules first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(worktree)}
    script = worktree / "benchmarks" / "scheduler_overhead.py"
    out = subprocess.run(
        [sys.executable, str(script), "--steps", str(steps)],
        env=env,
        cwd=worktree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cells = {}
    for line in out.splitlines():
        m = _ROW.match(line)
        if m:
            cells[(m[1], int(m[2]), int(m[3]))] = float(m[4])
    if len(cells) != 12:
        raise RuntimeError(f"baseline printed {len(cells)} rows, expected 12:\n{out}")
    return cells


def hashing_cost_us(repeats: int = 50) -> float:
    """Median us to hash every full block of a 2,048-token prompt (16-token blocks)."""
    root = root_hash("benchmark")
    prompt = [(7 * i + 3) % 32000 for i in range(2048)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        prefix_hashes(root, prompt, 16)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per side")
    parser.add_argument(
        "--baseline", default=DEFAULT_BASELINE, help="git revision to compare with, or none"
    )
    parser.add_argument(
        "--no-gc", action="store_true", help="time this tree with the cyclic collector off"
    )
    args = parser.parse_args()
    compare = args.baseline != "none"
    if args.no_gc and compare:
        # The baseline's own script runs with the collector on: new/old would mislead.
        parser.error("--no-gc times this tree alone: pass --baseline none")
    ours: list[dict[Cell, float]] = []
    theirs: list[dict[Cell, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "baseline"
        if compare:
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(REPO),
                    "worktree",
                    "add",
                    "--detach",
                    str(worktree),
                    args.baseline,
                ],
                check=True,
                capture_output=True,
            )
        try:
            for i in range(args.rounds if compare else 1):
                print(f"-- this tree, round {i + 1}", flush=True)
                ours.append(table(args.steps, collector=not args.no_gc))
                if compare:
                    print(f"-- baseline {args.baseline}, round {i + 1}", flush=True)
                    theirs.append(baseline_table(worktree, args.steps))
        finally:
            if compare:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                    check=False,
                )
    new = {c: statistics.median(r[c] for r in ours) for c in ours[0]}
    if compare:
        old = {c: statistics.median(r[c] for r in theirs) for c in theirs[0]}
        print(
            f"{'policy':>8} {'running':>8} {'waiting':>8} {'new us':>9} {'old us':>9} {'new/old':>8}"
        )
        for c in new:
            print(
                f"{c[0]:>8} {c[1]:>8} {c[2]:>8} {new[c]:>9.1f} {old[c]:>9.1f} {new[c] / old[c]:>7.2f}x"
            )
    print(f"prefix hashing: {hashing_cost_us():.0f} us per 2048-token prompt (128 SHA-256 blocks)")
    x = new[("fcfs", 256, 0)]
    y = new[("fcfs", 256, 10_000)]
    z = new[("fcfs", 1024, 0)] / new[("fcfs", 64, 0)]
    print(
        f"waiting-queue effect at 256 running: {y / x:.2f}x (target < 1.5x); "
        f"linear scaling 1024/64 would be 16x (target < 20x)"
    )
    line = (
        f"scheduler step p50: {x:.0f} us at 256 running, {y:.0f} us at 256 running + "
        f"10000 waiting, scaling 1024/64: {z:.1f}x"
    )
    if compare:
        ratios = [new[c] / old[c] for c in new]
        line += (
            f"; new/old at 256 running: {x / old[('fcfs', 256, 0)]:.2f}x, "
            f"median over cells {statistics.median(ratios):.2f}x"
        )
    print(line)


if __name__ == "__main__":
    main()
