"""Load shapes: when each request of a workload is sent.

Open-loop shapes fix every send time up front, independent of how fast the server
answers: Poisson and gamma (bursty) arrivals are the simulator's own
(``orchestrator.common.workloads``, the same times for the same seed), and a burst sends
everything at once. The closed loop keeps ``concurrency`` requests in flight, each
client sending its next request ``think_time_s`` after its previous one finished.
"""

from __future__ import annotations

from typing import Literal

from orchestrator.common.workloads import (
    ClosedLoop,
    GammaArrivals,
    PoissonArrivals,
    WorkloadConfig,
    build_workload,
)
from orchestrator.core import StrictModel


class BurstArrivals(StrictModel):
    """Every request sent at time 0: the one-shot burst."""

    type: Literal["burst"] = "burst"


OpenLoop = PoissonArrivals | GammaArrivals | BurstArrivals
LoadShape = OpenLoop | ClosedLoop


def send_offsets(shape: OpenLoop, num_requests: int, seed: int) -> list[float]:
    """Send time of each request in seconds after the run starts (the first at 0)."""
    if isinstance(shape, BurstArrivals):
        return [0.0] * num_requests
    workload = build_workload(WorkloadConfig(arrival=shape, num_requests=num_requests, seed=seed))
    return [r.arrival_time for r in workload.requests]


def max_in_flight(shape: LoadShape, num_requests: int) -> int:
    """The most requests this shape can have open at once (sizes the connection pool)."""
    if isinstance(shape, ClosedLoop):
        return min(shape.concurrency, num_requests)
    return num_requests


def rate_of(shape: LoadShape) -> float | None:
    """The offered rate in requests per second; ``None`` for a burst or a closed loop."""
    return shape.rate if isinstance(shape, PoissonArrivals | GammaArrivals) else None


def describe(shape: LoadShape) -> str:
    """A short human-readable name, e.g. ``poisson 4 req/s``."""
    if isinstance(shape, PoissonArrivals):
        return f"poisson {shape.rate:g} req/s"
    if isinstance(shape, GammaArrivals):
        return f"gamma {shape.rate:g} req/s cv {shape.cv:g}"
    if isinstance(shape, ClosedLoop):
        think = f" think {shape.think_time_s:g} s" if shape.think_time_s else ""
        return f"concurrency {shape.concurrency}{think}"
    return "burst"
