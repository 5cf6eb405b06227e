"""Synthetic and recorded workloads: when requests arrive and how long they are.

Open-loop arrivals (Poisson, or gamma for bursts) fix every arrival time up front;
closed-loop arrivals keep ``concurrency`` requests in flight, each client sending its
next request when the previous one finishes. Lengths come from fixed, uniform or
log-normal distributions, or everything from a JSONL trace. Arrival times and lengths
draw from separate random streams of one seed, so a sweep over the rate keeps the same
lengths.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from orchestrator.core import StrictModel


class FixedLength(StrictModel):
    type: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def sample(self, rng: random.Random) -> int:
        return self.value


class UniformLength(StrictModel):
    """Integers uniform on ``[low, high]``, both included."""

    type: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high})")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


class LogNormalLength(StrictModel):
    """``median x exp(sigma x N(0, 1))``, rounded and clipped to ``[low, high]``."""

    type: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    low: int = Field(1, ge=1)
    high: int = Field(1_000_000, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LogNormalLength:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high})")
        return self

    def sample(self, rng: random.Random) -> int:
        value = round(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return min(max(value, self.low), self.high)


LengthDist = Annotated[FixedLength | UniformLength | LogNormalLength, Field(discriminator="type")]


class PoissonArrivals(StrictModel):
    """Exponential gaps at ``rate`` requests per second."""

    type: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0)


class GammaArrivals(StrictModel):
    """Gamma-distributed gaps at ``rate`` requests per second; ``cv`` is the gaps'
    coefficient of variation (1 is Poisson, above 1 bursty)."""

    type: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0)
    cv: float = Field(2.0, gt=0)


class ClosedLoop(StrictModel):
    """``concurrency`` clients, each sending its next request ``think_time_s`` seconds
    after its previous one finished."""

    type: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1)
    think_time_s: float = Field(0.0, ge=0)


Arrivals = Annotated[PoissonArrivals | GammaArrivals | ClosedLoop, Field(discriminator="type")]


# What a workload section leaves out.
DEFAULT_ARRIVAL = PoissonArrivals(rate=1.0)
DEFAULT_NUM_REQUESTS = 1000
DEFAULT_PROMPT = FixedLength(value=512)
DEFAULT_OUTPUT = FixedLength(value=256)


class TrafficClass(StrictModel):
    """A share of a workload's requests sent with one SLO class and priority."""

    share: float = Field(gt=0)
    priority: int = 0


class WorkloadConfig(StrictModel):
    """What a simulation serves. Left out: Poisson arrivals at 1 request/s, 1,000
    requests, 512-token prompts, 256-token outputs, seed 0.

    With ``trace`` (a JSONL file, one object per line with ``arrival_time`` in seconds,
    ``prompt_tokens`` and ``output_tokens``), the trace gives arrival times and lengths,
    so ``arrival``, ``prompt_len`` and ``output_len`` must be left out; ``num_requests``
    then takes the first requests of the trace (all of them when ``None``).

    ``slo_classes`` splits the requests among SLO classes (names the engine config
    defines) in proportion to each ``share``, with that class's priority; ``tenants``
    splits them among tenants in proportion to the given rates (e.g. ``{heavy: 10,
    light: 1}``: two Poisson streams, one ten times the other). Both draw from their own
    random stream, so adding them keeps arrivals and lengths unchanged.
    """

    arrival: Arrivals | None = None
    num_requests: int | None = Field(None, ge=1)
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    trace: str | None = None
    seed: int = 0
    slo_classes: dict[str, TrafficClass] = Field(default_factory=dict)
    tenants: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _positive_tenant_rates(self) -> WorkloadConfig:
        for name, rate in self.tenants.items():
            if not rate > 0:
                raise ValueError(f"tenants.{name}: the rate share must be positive")
        return self

    @model_validator(mode="after")
    def _trace_excludes_synthetic(self) -> WorkloadConfig:
        if self.trace is not None:
            given = [
                k for k in ("arrival", "prompt_len", "output_len") if getattr(self, k) is not None
            ]
            if given:
                raise ValueError(f"a trace gives arrivals and lengths; remove {', '.join(given)}")
        return self

    @property
    def rate(self) -> float | None:
        """Configured open-loop arrival rate (requests/s); ``None`` for a closed loop or
        a trace."""
        if self.trace is not None or isinstance(self.arrival, ClosedLoop):
            return None
        return (self.arrival or DEFAULT_ARRIVAL).rate

    def with_rate(self, rate: float) -> WorkloadConfig:
        """The same workload at ``rate`` requests per second (open loop only)."""
        arrival = self.arrival or DEFAULT_ARRIVAL
        if self.trace is not None or isinstance(arrival, ClosedLoop):
            raise ValueError("an arrival rate applies to poisson or gamma arrivals only")
        return self.model_copy(update={"arrival": arrival.model_copy(update={"rate": rate})})

    def with_num_requests(self, n: int) -> WorkloadConfig:
        return self.model_copy(update={"num_requests": n})


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: ``arrival_time`` in seconds (open loop; a closed loop sets
    the time when a client is free), prompt and output lengths in tokens."""

    index: int
    arrival_time: float
    prompt_len: int
    output_len: int
    slo_class: str | None = None
    tenant: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in sending order; ``concurrency`` is set for a closed loop."""

    requests: list[RequestSpec]
    concurrency: int | None = None
    think_time_s: float = 0.0

    @property
    def offered_rate(self) -> float | None:
        """Mean arrival rate of an open-loop workload (requests/s); ``None`` for a
        closed loop or fewer than two requests."""
        if self.concurrency is not None or len(self.requests) < 2:
            return None
        span = self.requests[-1].arrival_time - self.requests[0].arrival_time
        return (len(self.requests) - 1) / span if span > 0 else None


def build_workload(config: WorkloadConfig) -> Workload:
    """Draw the requests ``config`` describes, the same ones for the same seed."""
    workload = _draw(config)
    if not config.slo_classes and not config.tenants:
        return workload
    rng = random.Random(f"{config.seed}:mix")
    classes = list(config.slo_classes.items())
    tenants = list(config.tenants.items())
    specs = []
    for spec in workload.requests:
        slo_class, priority, tenant = None, 0, None
        if classes:
            name, traffic = rng.choices(classes, weights=[c.share for _, c in classes])[0]
            slo_class, priority = name, traffic.priority
        if tenants:
            tenant = rng.choices([t for t, _ in tenants], weights=[w for _, w in tenants])[0]
        specs.append(
            RequestSpec(
                spec.index,
                spec.arrival_time,
                spec.prompt_len,
                spec.output_len,
                slo_class,
                tenant,
                priority,
            )
        )
    return Workload(specs, workload.concurrency, workload.think_time_s)


def _draw(config: WorkloadConfig) -> Workload:
    if config.trace is not None:
        return read_trace(config.trace, config.num_requests)
    n = config.num_requests or DEFAULT_NUM_REQUESTS
    arrival = config.arrival or DEFAULT_ARRIVAL
    prompt = config.prompt_len or DEFAULT_PROMPT
    output = config.output_len or DEFAULT_OUTPUT
    len_rng = random.Random(f"{config.seed}:lengths")
    lengths = [(prompt.sample(len_rng), output.sample(len_rng)) for _ in range(n)]
    if isinstance(arrival, ClosedLoop):
        specs = [RequestSpec(i, 0.0, p, o) for i, (p, o) in enumerate(lengths)]
        return Workload(specs, arrival.concurrency, arrival.think_time_s)
    times = _arrival_times(arrival, n, random.Random(f"{config.seed}:arrivals"))
    return Workload(
        [RequestSpec(i, t, p, o) for i, (t, (p, o)) in enumerate(zip(times, lengths, strict=True))]
    )


def _arrival_times(
    arrival: PoissonArrivals | GammaArrivals, n: int, rng: random.Random
) -> list[float]:
    if isinstance(arrival, PoissonArrivals):
        gaps = [rng.expovariate(arrival.rate) for _ in range(n)]
    else:
        shape = 1.0 / arrival.cv**2
        scale = 1.0 / (arrival.rate * shape)
        gaps = [rng.gammavariate(shape, scale) for _ in range(n)]
    # The first request arrives at 0 so that runs at different rates start together.
    times, t = [], 0.0
    for gap in [0.0, *gaps[1:]]:
        t += gap
        times.append(t)
    return times


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file and line."""


def read_trace(path: str | Path, limit: int | None = None) -> Workload:
    """Read a JSONL trace; requests are sorted by arrival time."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise TraceError(f"{path}: cannot read trace: {err.strerror}") from None
    rows: list[tuple[float, int, int]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            row = (float(obj["arrival_time"]), int(obj["prompt_tokens"]), int(obj["output_tokens"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise TraceError(
                f"{path}:{lineno}: expected {{arrival_time, prompt_tokens, output_tokens}}: {err}"
            ) from None
        if row[0] < 0 or row[1] < 1 or row[2] < 1:
            raise TraceError(f"{path}:{lineno}: negative time or length below 1: {line.strip()}")
        rows.append(row)
    if not rows:
        raise TraceError(f"{path}: the trace has no requests")
    rows.sort(key=lambda r: r[0])
    rows = rows[:limit] if limit is not None else rows
    return Workload([RequestSpec(i, t, p, o) for i, (t, p, o) in enumerate(rows)])
