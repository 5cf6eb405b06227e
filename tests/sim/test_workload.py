"""Workloads: arrival processes, length distributions, traces, determinism."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.common.workloads import (
    ClosedLoop,
    FixedLength,
    GammaArrivals,
    LogNormalLength,
    PoissonArrivals,
    TraceError,
    UniformLength,
    WorkloadConfig,
    build_workload,
    read_trace,
)


def gaps(config: WorkloadConfig) -> list[float]:
    times = [r.arrival_time for r in build_workload(config).requests]
    return [b - a for a, b in itertools.pairwise(times)]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    config = WorkloadConfig(
        arrival=PoissonArrivals(rate=5),
        num_requests=50,
        prompt_len=UniformLength(low=10, high=1000),
        output_len=LogNormalLength(median=100, sigma=1),
    )
    assert build_workload(config) == build_workload(config)
    other = config.model_copy(update={"seed": 1})
    assert build_workload(other).requests != build_workload(config).requests


def test_poisson_gaps_average_one_over_the_rate_with_cv_one() -> None:
    g = gaps(WorkloadConfig(arrival=PoissonArrivals(rate=4), num_requests=4000))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.25, rel=0.05)
    assert statistics.pstdev(g) / mean == pytest.approx(1.0, rel=0.08)


def test_gamma_arrivals_are_bursty_at_the_same_mean_rate() -> None:
    g = gaps(WorkloadConfig(arrival=GammaArrivals(rate=4, cv=3), num_requests=4000))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.25, rel=0.1)
    assert statistics.pstdev(g) / mean == pytest.approx(3.0, rel=0.15)


def test_first_request_arrives_at_zero_and_times_never_decrease() -> None:
    reqs = build_workload(
        WorkloadConfig(arrival=PoissonArrivals(rate=9), num_requests=100)
    ).requests
    assert reqs[0].arrival_time == 0.0
    assert all(a.arrival_time <= b.arrival_time for a, b in itertools.pairwise(reqs))


def test_changing_the_rate_keeps_the_lengths() -> None:
    config = WorkloadConfig(
        arrival=PoissonArrivals(rate=1),
        num_requests=30,
        prompt_len=UniformLength(low=1, high=4000),
        output_len=UniformLength(low=1, high=4000),
    )
    slow, fast = build_workload(config), build_workload(config.with_rate(50))
    assert [(r.prompt_len, r.output_len) for r in slow.requests] == [
        (r.prompt_len, r.output_len) for r in fast.requests
    ]
    assert fast.requests[-1].arrival_time < slow.requests[-1].arrival_time
    assert fast.offered_rate == pytest.approx(50, rel=0.5)


def test_lengths_follow_their_distributions_and_bounds() -> None:
    config = WorkloadConfig(
        num_requests=3000,
        prompt_len=LogNormalLength(median=200, sigma=0.8, low=20, high=900),
        output_len=UniformLength(low=5, high=9),
    )
    reqs = build_workload(config).requests
    prompts = [r.prompt_len for r in reqs]
    assert min(prompts) >= 20 and max(prompts) <= 900
    assert min(prompts) == 20 and max(prompts) == 900  # the tails are clipped, not dropped
    assert statistics.median(prompts) == pytest.approx(200, rel=0.08)
    assert {r.output_len for r in reqs} == {5, 6, 7, 8, 9}


def test_fixed_lengths_and_defaults() -> None:
    reqs = build_workload(WorkloadConfig(num_requests=3, output_len=FixedLength(value=7))).requests
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(512, 7)] * 3


def test_closed_loop_carries_its_concurrency_and_no_rate() -> None:
    config = WorkloadConfig(arrival=ClosedLoop(concurrency=8, think_time_s=0.5), num_requests=20)
    wl = build_workload(config)
    assert (wl.concurrency, wl.think_time_s, len(wl.requests)) == (8, 0.5, 20)
    assert wl.offered_rate is None and config.rate is None
    with pytest.raises(ValueError, match="poisson or gamma"):
        config.with_rate(3.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"prompt_len": {"type": "uniform", "low": 9, "high": 3}}, "low \\(9\\) exceeds high"),
        ({"arrival": {"type": "poisson", "rate": 0}}, "greater than 0"),
        ({"output_len": {"type": "zipf", "value": 1}}, "does not match any of the expected tags"),
        ({"trace": "t.jsonl", "arrival": {"type": "poisson", "rate": 1}}, "remove arrival"),
    ],
)
def test_invalid_workloads_are_rejected(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkloadConfig.model_validate(data)


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_trace_gives_times_and_lengths_sorted_by_arrival(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"arrival_time": 2.0, "prompt_tokens": 30, "output_tokens": 3},
            {"arrival_time": 0.5, "prompt_tokens": 10, "output_tokens": 1},
            {"arrival_time": 1.0, "prompt_tokens": 20, "output_tokens": 2},
        ],
    )
    wl = build_workload(WorkloadConfig(trace=str(path), num_requests=2))
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in wl.requests] == [
        (0.5, 10, 1),
        (1.0, 20, 2),
    ]
    assert len(read_trace(path).requests) == 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"arrival_time": 1, "prompt_tokens": 5}', "t.jsonl:2: expected"),
        ("not json", "t.jsonl:2: expected"),
        ('{"arrival_time": -1, "prompt_tokens": 5, "output_tokens": 1}', "t.jsonl:2: negative"),
    ],
)
def test_bad_trace_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_missing_or_empty_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")
