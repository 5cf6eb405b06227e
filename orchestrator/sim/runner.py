"""One call from a simulation config to its report, and the searches built on it: the
highest arrival rate a configuration sustains under an SLO, and goodput over a rate
sweep."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.common.workloads import Workload, build_workload
from orchestrator.sim.config import SimConfig
from orchestrator.sim.driver import SimRun, simulate
from orchestrator.sim.report import SimReport, build_report, throughput_ceiling
from orchestrator.sim.router import make_router


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    workload: Workload
    run: SimRun
    report: SimReport


def run_simulation(config: SimConfig) -> SimResult:
    """Simulate ``config`` once, deterministically for its workload seed."""
    workload = build_workload(config.workload)
    run = simulate(
        config.engine, workload, make_router(config.cluster.router), config.cluster.replicas
    )
    report = build_report(run, config.engine, workload, config.slo.to_slo())
    return SimResult(config, workload, run, report)


def at_rate(config: SimConfig, rate: float) -> SimConfig:
    return config.model_copy(update={"workload": config.workload.with_rate(rate)})


def ceiling_rate(config: SimConfig) -> float:
    """Requests/s at the roofline ceiling of the cluster: no schedule sustains more."""
    workload = build_workload(config.workload)
    ceiling = throughput_ceiling(config.engine, workload, config.cluster.replicas)
    if ceiling is None:
        raise ValueError(
            "a rate search needs a simulated deployment (executor: {type: sim, ...}), not "
            f"the {config.engine.executor.type!r} executor"
        )
    mean_output = sum(r.output_len for r in workload.requests) / len(workload.requests)
    return ceiling / mean_output


def meets(report: SimReport, attainment: float) -> bool:
    """Whether at least ``attainment`` of the requests met every SLO bound."""
    return report.summary.goodput_fraction >= attainment


@dataclass(frozen=True)
class RateSearch:
    """The highest rate found with ``attainment`` of requests meeting the SLO (``None``
    if even the lowest rate tried fails), with its result, and every probe."""

    rate: float | None
    result: SimResult | None
    probes: list[tuple[float, SimResult]]


def max_sustainable_rate(
    config: SimConfig,
    attainment: float,
    *,
    iterations: int = 7,
    on_probe: Callable[[float, SimResult], None] | None = None,
) -> RateSearch:
    """Bisect the arrival rate between 0 and the roofline ceiling rate (``iterations``
    probes after the first, precision ceiling / 2**iterations), assuming SLO attainment
    falls as the rate rises."""
    hi = ceiling_rate(config)
    lo = 0.0
    best: tuple[float, SimResult] | None = None
    probes: list[tuple[float, SimResult]] = []
    rate = hi / 2
    for _ in range(iterations):
        result = run_simulation(at_rate(config, rate))
        probes.append((rate, result))
        if on_probe is not None:
            on_probe(rate, result)
        if meets(result.report, attainment):
            lo, best = rate, (rate, result)
        else:
            hi = rate
        rate = (lo + hi) / 2
    return RateSearch(best[0] if best else None, best[1] if best else None, probes)


def rate_sweep(config: SimConfig, rates: Sequence[float]) -> list[SimResult]:
    """One simulation per arrival rate, same requests otherwise."""
    return [run_simulation(at_rate(config, r)) for r in rates]
