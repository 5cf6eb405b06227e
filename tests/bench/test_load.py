"""Load shapes: the simulator's seeded arrival processes, the burst, and the connection
pool each shape needs."""

from __future__ import annotations

import itertools
import statistics

import pytest

from orchestrator.bench.load import BurstArrivals, describe, max_in_flight, rate_of, send_offsets
from orchestrator.common.workloads import (
    ClosedLoop,
    GammaArrivals,
    PoissonArrivals,
    WorkloadConfig,
    build_workload,
)


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_poisson_gaps_average_one_over_the_rate():
    offsets = send_offsets(PoissonArrivals(rate=4.0), 5000, seed=1)
    assert offsets[0] == 0.0
    assert offsets == sorted(offsets)
    g = gaps(offsets)
    assert statistics.fmean(g) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.08)


def test_gamma_gaps_have_the_asked_burstiness():
    g = gaps(send_offsets(GammaArrivals(rate=2.0, cv=3.0), 5000, seed=1))
    assert statistics.fmean(g) == pytest.approx(0.5, rel=0.1)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(3.0, rel=0.15)


def test_open_loop_times_are_the_simulators_for_the_same_seed():
    shape = PoissonArrivals(rate=3.0)
    sim = build_workload(WorkloadConfig(arrival=shape, num_requests=50, seed=9)).requests
    assert send_offsets(shape, 50, seed=9) == [r.arrival_time for r in sim]
    assert send_offsets(shape, 50, seed=9) != send_offsets(shape, 50, seed=10)


def test_burst_sends_everything_at_once():
    assert send_offsets(BurstArrivals(), 4, seed=0) == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("shape", "in_flight", "rate", "text"),
    [
        (PoissonArrivals(rate=2.5), 10, 2.5, "poisson 2.5 req/s"),
        (GammaArrivals(rate=1.0, cv=2.0), 10, 1.0, "gamma 1 req/s cv 2"),
        (ClosedLoop(concurrency=4), 4, None, "concurrency 4"),
        (ClosedLoop(concurrency=40, think_time_s=0.5), 10, None, "concurrency 40 think 0.5 s"),
        (BurstArrivals(), 10, None, "burst"),
    ],
)
def test_shape_facts(shape, in_flight, rate, text):
    assert max_in_flight(shape, 10) == in_flight
    assert rate_of(shape) == rate
    assert describe(shape) == text
