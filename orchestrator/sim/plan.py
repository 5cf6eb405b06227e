"""Capacity planning: the fewest GPUs (replicas x tensor-parallel width) that serve a
rate within an SLO, found by simulating candidate clusters."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from orchestrator.common.capacity import CapacityPlan
from orchestrator.common.deployment import Deployment, DoesNotFitError
from orchestrator.core import format_errors
from orchestrator.sim.config import SimConfig
from orchestrator.sim.runner import SimResult, ceiling_rate, meets, run_simulation


@dataclass(frozen=True)
class Probe:
    """One simulated cluster: ``replicas`` engines of ``tp`` GPUs each."""

    tp: int
    replicas: int
    result: SimResult
    ok: bool

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas


@dataclass(frozen=True)
class TPPlan:
    """What one tensor-parallel width needs. ``skipped`` says why the width cannot work
    at all (then ``memory`` may be ``None``); ``best`` is its smallest cluster that
    holds the SLO (``None`` if none up to the replica limit did)."""

    tp: int
    memory: CapacityPlan | None
    skipped: str | None
    best: Probe | None
    probes: list[Probe]


def with_tp(config: SimConfig, tp: int) -> SimConfig:
    """``config`` with its simulated deployment at tensor-parallel width ``tp``; raises
    ``ValueError`` with the reason when the model cannot be split that way."""
    spec = config.engine.executor
    if not isinstance(spec.options, Deployment):
        raise ValueError(
            "planning needs a simulated deployment (executor: {type: sim, ...}), not the "
            f"{spec.type!r} executor"
        )
    try:
        new = Deployment.model_validate({**spec.options.model_dump(), "tp": tp})
    except ValidationError as err:
        raise ValueError(format_errors(err)) from None
    executor = spec.model_copy(update={"options": new})
    engine = config.engine.model_copy(update={"executor": executor})
    return config.model_copy(update={"engine": engine})


def tp_memory(config: SimConfig) -> CapacityPlan:
    """The per-GPU capacity plan of one replica of ``config`` (a ``with_tp`` result),
    its workspace sized for the engine's scheduler limits; raises ``DoesNotFitError``."""
    options = config.engine.executor.options
    assert isinstance(options, Deployment)  # with_tp checked it
    return options.capacity(config.engine.scheduler, config.engine.cache.block_size)


def _with_replicas(config: SimConfig, replicas: int) -> SimConfig:
    cluster = config.cluster.model_copy(update={"replicas": replicas})
    return config.model_copy(update={"cluster": cluster})


def plan_tp(
    config: SimConfig,
    tp: int,
    attainment: float,
    max_replicas: int,
    on_probe: Callable[[Probe], None] | None = None,
) -> TPPlan:
    """Fewest replicas of width ``tp`` whose simulation has ``attainment`` of requests
    within the SLO: start at the roofline's lower bound, double until one holds, then
    bisect (assumes more replicas never hurt)."""
    try:
        config = with_tp(config, tp)
        memory = tp_memory(config)
    except (ValueError, DoesNotFitError) as err:
        return TPPlan(tp, None, str(err), None, [])
    probes: list[Probe] = []

    def probe(replicas: int) -> Probe:
        result = run_simulation(_with_replicas(config, replicas))
        p = Probe(tp, replicas, result, meets(result.report, attainment))
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p

    rate = config.workload.rate
    low = 1
    if rate is not None:
        low = max(1, math.ceil(rate / ceiling_rate(_with_replicas(config, 1))))
    if low > max_replicas:
        return TPPlan(tp, memory, None, None, probes)
    failed, n = low - 1, low
    best = probe(n)
    while not best.ok:
        failed = n
        if n >= max_replicas:
            return TPPlan(tp, memory, None, None, probes)
        n = min(2 * n, max_replicas)
        best = probe(n)
    while best.replicas - failed > 1:
        mid = (failed + best.replicas) // 2
        p = probe(mid)
        if p.ok:
            best = p
        else:
            failed = mid
    return TPPlan(tp, memory, None, best, probes)


def plan_capacity(
    config: SimConfig,
    tps: Sequence[int],
    attainment: float,
    max_replicas: int,
    on_probe: Callable[[Probe], None] | None = None,
) -> tuple[Probe | None, list[TPPlan]]:
    """The cluster with the fewest GPUs over every width in ``tps`` (ties: the higher
    SLO attainment), and each width's plan."""
    plans = [plan_tp(config, tp, attainment, max_replicas, on_probe) for tp in tps]
    winners = [p.best for p in plans if p.best is not None]
    best = min(
        winners,
        key=lambda p: (p.gpus, -p.result.report.summary.goodput_fraction),
        default=None,
    )
    return best, plans
