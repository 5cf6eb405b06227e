"""Scheduler tuning: the chunk size, token budget and batch cap, optionally the SLO
admission margin and the SLO-derived budget (and, unless fixed, the arrival rate), with
the highest goodput under an SLO."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core import EngineConfig, SchedulerConfig
from orchestrator.sim.config import SimConfig
from orchestrator.sim.runner import (
    SimResult,
    at_rate,
    ceiling_rate,
    max_sustainable_rate,
    meets,
    run_simulation,
)

DEFAULT_CHUNK_SIZES = (256, 512, 1024, 2048)
DEFAULT_MAX_NUM_TOKENS = (2048, 4096, 8192)
DEFAULT_MAX_BATCH_SIZES = (64, 128, 256)


@dataclass(frozen=True, slots=True)
class Knobs:
    """One setting. ``ttft_margin`` (``admission.ttft_margin``) and ``slo_budget``
    (``slo_budget.enabled``) are ``None`` where the config's own value stays."""

    chunk_size: int
    max_num_tokens: int
    max_batch_size: int
    ttft_margin: float | None = None
    slo_budget: bool | None = None


def knob_grid(
    chunk_sizes: Sequence[int],
    max_num_tokens: Sequence[int],
    max_batch_sizes: Sequence[int],
    ttft_margins: Sequence[float | None] = (None,),
    slo_budgets: Sequence[bool | None] = (None,),
) -> list[Knobs]:
    """Every combination the scheduler accepts (a chunk no larger than the budget, the
    batch cap no larger than the budget)."""
    return [
        Knobs(c, t, b, m, s)
        for c, t, b, m, s in itertools.product(
            chunk_sizes, max_num_tokens, max_batch_sizes, ttft_margins, slo_budgets
        )
        if c <= t and b <= t
    ]


def with_knobs(config: SimConfig, knobs: Knobs) -> SimConfig:
    data = config.engine.scheduler.model_dump()
    data.update(
        chunk_size=knobs.chunk_size,
        max_num_tokens=knobs.max_num_tokens,
        max_batch_size=knobs.max_batch_size,
    )
    if knobs.ttft_margin is not None:
        data["admission"]["ttft_margin"] = knobs.ttft_margin
    if knobs.slo_budget is not None:
        data["slo_budget"]["enabled"] = knobs.slo_budget
    scheduler = SchedulerConfig.model_validate(data)
    engine = config.engine.model_copy(update={"scheduler": scheduler})
    return config.model_copy(update={"engine": engine})


@dataclass(frozen=True)
class Trial:
    """A setting and its best run: the highest rate tried that met the SLO attainment
    (rate search), or the fixed rate. ``result`` is ``None`` when no rate tried met it."""

    knobs: Knobs
    rate: float | None
    result: SimResult | None

    @property
    def goodput(self) -> float:
        """Requests/s within the SLO at the offered rate: the rate times the share of
        requests that met it. (A finite run's completed/s also counts the drain after
        the last arrival, which would favour short runs over the steady state.)"""
        if self.result is None or self.rate is None:
            return 0.0
        return self.rate * self.result.report.summary.goodput_fraction

    def sort_key(self) -> tuple[float, float]:
        if self.result is None:
            return (0.0, 0.0)
        ttft = self.result.report.summary.ttft.p[90]
        return (self.goodput, -ttft if ttft == ttft else -math.inf)


def tune(
    config: SimConfig,
    grid: Sequence[Knobs],
    attainment: float,
    rate: float | None = None,
    *,
    iterations: int = 6,
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Score every setting in ``grid``, best first.

    With ``rate``, each setting runs at that rate and its goodput is the score. Without,
    the score is the goodput at the highest rate the setting sustains with
    ``attainment`` of requests within the SLO: the first setting's rate is bisected
    between 0 and the roofline ceiling; each later one is first tried at the best rate
    so far and bisected above it only if it holds there (a setting that cannot hold the
    incumbent's rate cannot beat it).
    """
    trials: list[Trial] = []
    best_rate = 0.0
    for knobs in grid:
        cfg = with_knobs(config, knobs)
        if rate is not None:
            trial = Trial(knobs, rate, run_simulation(at_rate(cfg, rate)))
        elif best_rate == 0.0:
            search = max_sustainable_rate(cfg, attainment, iterations=iterations)
            trial = Trial(knobs, search.rate, search.result)
        else:
            trial = _challenge(cfg, knobs, best_rate, attainment, iterations)
        if trial.rate is not None and trial.result is not None:
            best_rate = max(best_rate, trial.rate)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
    return sorted(trials, key=Trial.sort_key, reverse=True)


def _challenge(
    cfg: SimConfig, knobs: Knobs, incumbent: float, attainment: float, iterations: int
) -> Trial:
    first = run_simulation(at_rate(cfg, incumbent))
    if not meets(first.report, attainment):
        return Trial(knobs, None, None)
    lo, hi = incumbent, max(incumbent, ceiling_rate(cfg))
    best = (incumbent, first)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        result = run_simulation(at_rate(cfg, mid))
        if meets(result.report, attainment):
            lo, best = mid, (mid, result)
        else:
            hi = mid
    return Trial(knobs, best[0], best[1])


def engine_yaml(engine: EngineConfig) -> dict[str, Any]:
    """An engine config as plain data that ``load_engine_config`` reads back, with the
    executor section flat (``{type: NAME, ...options}``) as people write it."""
    data = engine.model_dump(mode="json")
    spec = engine.executor
    options = spec.options.model_dump(mode="json") if spec.options is not None else {}
    data["executor"] = {"type": spec.type, **options}
    return data
