"""What a simulation run means: the shared serving metrics plus what only a simulator
knows (batch occupancy, KV usage, where the step time went, utilisation)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from orchestrator.common.deployment import Deployment
from orchestrator.common.metrics import (
    PERCENTILES,
    SLO,
    ClassSummary,
    Summary,
    summarize,
    summarize_by_class,
)
from orchestrator.common.workloads import Workload
from orchestrator.core import EngineConfig
from orchestrator.sim.driver import SimRun

CAUSES = ("weights", "kv", "compute", "comms", "overhead")


@dataclass(frozen=True)
class SimReport:
    """A run in numbers.

    ``num_gpus`` counts every replica's accelerators (``ExecutorInfo.num_gpus``);
    ``kv_tokens_per_replica`` is the KV pool one replica runs with, in tokens.
    ``mean_batch_occupancy`` is requests per step weighted by step time;
    ``kv_usage_mean``/``kv_usage_peak`` are fractions of the KV blocks held by live
    requests. ``ceiling_tokens_per_s`` is the roofline's output tokens/s of all
    replicas decoding full batches of this workload, and ``utilisation`` the achieved
    output throughput over it (``None`` unless the engine is a simulated deployment).
    ``time_by_cause`` splits busy step time into weights, kv, compute, comms and
    overhead (fractions; empty without a cost model). ``by_class`` has one entry per SLO
    class in the workload (attainment against the class's own targets, refusals by reason,
    TTFT prediction error); requests of a class are judged by its targets in ``summary``
    too. ``step_time_error`` is the median relative error of the engine's step-time
    predictor (0 for the simulated deployment, whose predictor is its cost model).
    """

    summary: Summary
    replicas: int
    num_gpus: int
    kv_tokens_per_replica: int
    max_batch_size: int
    offered_rate: float | None
    mean_batch_occupancy: float
    kv_usage_mean: float
    kv_usage_peak: float
    num_preemptions: int
    num_steps: int
    ceiling_tokens_per_s: float | None
    utilisation: float | None
    time_by_cause: dict[str, float]
    wall_time_s: float
    by_class: dict[str, ClassSummary]
    step_time_error: float | None


def build_report(run: SimRun, engine: EngineConfig, workload: Workload, slo: SLO) -> SimReport:
    replicas = len(run.replicas)
    # Replicas are identical (one engine config), so the first speaks for all.
    first = run.replicas[0].core
    num_gpus = replicas * first.info.num_gpus
    class_slos = class_slos_of(engine)
    summary = summarize(run.records, run.end_time, slo, num_gpus, class_slos)
    by_class = (
        summarize_by_class(run.records, class_slos, slo)
        if any(r.slo_class is not None for r in run.records)
        else {}
    )

    busy = seqs = kv_area = 0.0
    kv_peak = 0.0
    causes = [0.0] * len(CAUSES)
    for replica in run.replicas:
        tr = replica.trace
        busy += sum(tr.durations)
        seqs += sum(n * d for n, d in zip(tr.num_seqs, tr.durations, strict=True))
        kv_area += sum(u * d for u, d in zip(tr.kv_usage, tr.durations, strict=True))
        kv_peak = max(kv_peak, max(tr.kv_usage, default=0.0))
        causes = [a + b for a, b in zip(causes, replica.time_by_cause, strict=True)]

    ceiling = throughput_ceiling(engine, workload, replicas)
    total_cause = sum(causes)
    return SimReport(
        summary=summary,
        replicas=replicas,
        num_gpus=num_gpus,
        kv_tokens_per_replica=first.stats().kv_blocks_total * engine.cache.block_size,
        max_batch_size=engine.scheduler.max_batch_size,
        offered_rate=workload.offered_rate,
        mean_batch_occupancy=seqs / busy if busy else 0.0,
        kv_usage_mean=kv_area / busy if busy else 0.0,
        kv_usage_peak=kv_peak,
        num_preemptions=run.num_preemptions,
        num_steps=run.num_steps,
        ceiling_tokens_per_s=ceiling,
        utilisation=summary.output_throughput / ceiling if ceiling else None,
        time_by_cause=(
            {c: v / total_cause for c, v in zip(CAUSES, causes, strict=True)} if total_cause else {}
        ),
        wall_time_s=run.wall_time_s,
        by_class=by_class,
        step_time_error=first.stats().step_time_error,
    )


def class_slos_of(engine: EngineConfig) -> dict[str, SLO]:
    """The engine's SLO classes as metric SLOs (seconds)."""
    return {
        name: SLO(c.ttft_s, c.tpot_s, None if c.e2e_ms is None else c.e2e_ms / 1e3)
        for name, c in engine.scheduler.slo_classes.items()
    }


def throughput_ceiling(engine: EngineConfig, workload: Workload, replicas: int) -> float | None:
    """Output tokens/s of ``replicas`` engines decoding full batches of this workload's
    mean request on the roofline; ``None`` unless ``engine``'s executor options are a
    simulated ``Deployment`` (or the workload is empty).

    The ceiling is a property of the deployment (its capacity plan and cost model, both
    in ``orchestrator/common``), not of a running executor, so it is computed from the
    config: the report needs no executor internals, and a rate search can bound its
    rates before anything runs. An executor configured by any other record has no
    roofline to compare against.
    """
    options = engine.executor.options
    if not isinstance(options, Deployment) or not workload.requests:
        return None
    n = len(workload.requests)
    prompt = sum(r.prompt_len for r in workload.requests) / n
    output = sum(r.output_len for r in workload.requests) / n
    return options.decode_ceiling(engine.scheduler, engine.cache, prompt, output) * replicas


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:,.1f}"


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None or math.isnan(fraction) else f"{fraction:.1%}"


def latency_table(summary: Summary) -> Table:
    table = Table(title="Latency (ms)")
    table.add_column("metric")
    for col in ("mean", *(f"p{q}" for q in PERCENTILES)):
        table.add_column(col, justify="right")
    for name, dist in (
        ("TTFT", summary.ttft),
        ("TPOT", summary.tpot),
        ("ITL", summary.itl),
        ("E2E", summary.e2e),
    ):
        table.add_row(name, _ms(dist.mean), *(_ms(dist.p[q]) for q in PERCENTILES))
    return table


def totals_table(report: SimReport) -> Table:
    s = report.summary
    slo = s.slo
    bounds = ", ".join(
        f"{name} < {value * 1e3:g} ms"
        for name, value in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
        if value is not None
    )
    table = Table(title="Throughput and capacity")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests (completed / errors)", f"{s.num_completed:,} / {s.num_errors:,}"),
        ("replicas x GPUs", f"{report.replicas} x {report.num_gpus // report.replicas}"),
        ("KV tokens per replica", f"{report.kv_tokens_per_replica:,}"),
        (
            "offered rate (req/s)",
            "-" if report.offered_rate is None else f"{report.offered_rate:.2f}",
        ),
        ("simulated time (s)", f"{s.duration_s:,.1f}"),
        ("output tok/s", f"{s.output_throughput:,.0f}"),
        ("output tok/s per GPU", f"{s.output_throughput_per_gpu:,.0f}"),
        ("requests/s", f"{s.request_throughput:.2f}"),
        ("SLO", bounds or "none"),
        ("goodput req/s", f"{s.goodput:.2f}"),
        ("requests meeting SLO", _pct(s.goodput_fraction)),
        (
            "mean batch occupancy",
            f"{report.mean_batch_occupancy:.1f} / {report.max_batch_size}",
        ),
        ("KV usage mean / peak", f"{_pct(report.kv_usage_mean)} / {_pct(report.kv_usage_peak)}"),
        ("preemptions", f"{report.num_preemptions:,}"),
        ("steps", f"{report.num_steps:,}"),
    ]
    if report.ceiling_tokens_per_s is not None:
        rows.append(("roofline ceiling tok/s", f"{report.ceiling_tokens_per_s:,.0f}"))
        rows.append(("utilisation", _pct(report.utilisation)))
    if report.time_by_cause:
        causes = "/".join(report.time_by_cause)
        split = " / ".join(f"{v:.0%}" for v in report.time_by_cause.values())
        rows.append((f"step time: {causes}", split))
    for name, value in rows:
        table.add_row(name, value)
    return table


def class_table(report: SimReport) -> Table:
    table = Table(title="SLO classes")
    for col in ("class", "TTFT / TPOT (ms)", "requests", "met SLO", "attainment"):
        table.add_column(col, justify="left" if col == "class" else "right")
    table.add_column("refused or ended (by reason)")
    table.add_column("TTFT prediction error", justify="right")
    for c in report.by_class.values():
        targets = " / ".join(
            "-" if v is None else f"{v * 1e3:g}" for v in (c.slo.ttft_s, c.slo.tpot_s)
        )
        reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(c.rejections.items())) or "-"
        table.add_row(
            c.name,
            targets,
            f"{c.num_requests:,}",
            f"{c.num_met:,}",
            _pct(c.attainment),
            reasons,
            _pct(c.ttft_prediction_error),
        )
    return table


def print_report(report: SimReport, console: Console | None = None) -> None:
    console = console or Console()
    console.print(latency_table(report.summary))
    console.print(totals_table(report))
    if report.by_class:
        console.print(class_table(report))
