"""Tables for the terminal (rich): one run, a sweep over rates, and two runs side by
side. Every number comes from a ``Summary`` of ``orchestrator.common.metrics``; latencies are
shown in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rich.table import Table

from orchestrator.bench.results import BenchReport, RunSummary
from orchestrator.common.metrics import PERCENTILES, SLO, Distribution, Summary

_LATENCIES: tuple[tuple[str, Callable[[Summary], Distribution]], ...] = (
    ("TTFT", lambda s: s.ttft),
    ("TPOT", lambda s: s.tpot),
    ("ITL", lambda s: s.itl),
    ("E2E", lambda s: s.e2e),
)


def slo_text(slo: SLO) -> str:
    """``TTFT ≤ 500 ms, TPOT ≤ 80 ms``, or ``no SLO``."""
    parts = []
    if slo.ttft_s is not None:
        parts.append(f"TTFT ≤ {slo.ttft_s * 1000:g} ms")
    if slo.tpot_s is not None:
        parts.append(f"TPOT ≤ {slo.tpot_s * 1000:g} ms")
    return ", ".join(parts) or "no SLO"


def errors_text(s: Summary) -> str:
    """``none``, or the failed requests by HTTP status (or error, where none)."""
    if not s.errors_by_status:
        return "none"
    return ", ".join(f"{k}: {v}" for k, v in sorted(s.errors_by_status.items()))


def latency_table(s: Summary) -> Table:
    """Mean and percentiles of TTFT, TPOT, ITL and E2E, in milliseconds."""
    table = Table()
    table.add_column("Latency (ms)")
    for head in ("mean", *(f"p{q}" for q in PERCENTILES)):
        table.add_column(head, justify="right")
    for name, pick in _LATENCIES:
        d = pick(s)
        table.add_row(name, _ms(d.mean), *(_ms(d.p[q]) for q in PERCENTILES))
    return table


def totals_table(s: Summary) -> Table:
    """Request counts, errors, duration, throughput and goodput of one run."""
    table = Table(show_header=False)
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    table.add_row("Requests", f"{s.num_completed} completed of {s.num_requests}")
    table.add_row("Failed", f"{s.num_errors} ({errors_text(s)})" if s.num_errors else "0")
    table.add_row("Duration", f"{_fixed(s.duration_s, 2)} s")
    table.add_row("Output tokens", str(s.output_tokens))
    table.add_row("Output throughput", f"{_fixed(s.output_throughput, 1)} tok/s")
    table.add_row("Request throughput", f"{_fixed(s.request_throughput, 3)} req/s")
    table.add_row(
        f"Goodput ({slo_text(s.slo)})",
        f"{_fixed(s.goodput, 3)} req/s ({_pct(s.goodput_fraction)} of requests)",
    )
    return table


def sweep_table(runs: Sequence[RunSummary]) -> Table:
    """One row per run: throughput, goodput and the headline latencies (ms)."""
    table = Table()
    for head in ("Load", "req/s", "tok/s", "goodput req/s", "good"):
        table.add_column(head, justify="right")
    for q in (50, 99):
        table.add_column(f"TTFT p{q}", justify="right")
    for q in (50, 99):
        table.add_column(f"TPOT p{q}", justify="right")
    table.add_column("failed", justify="right")
    for run in runs:
        s = run.summary
        table.add_row(
            run.description,
            _fixed(s.request_throughput, 3),
            _fixed(s.output_throughput, 1),
            _fixed(s.goodput, 3),
            _pct(s.goodput_fraction),
            _ms(s.ttft.p[50]),
            _ms(s.ttft.p[99]),
            _ms(s.tpot.p[50]),
            _ms(s.tpot.p[99]),
            str(s.num_errors),
        )
    return table


def compare_tables(a: BenchReport, b: BenchReport) -> list[Table]:
    """``a`` and ``b`` side by side, run by run, with the ratio ``b / a`` of each
    metric. Both must hold the same number of runs."""
    tables = []
    for ra, rb in zip(a.runs, b.runs, strict=True):
        title = f"{b.label} vs {a.label}: {ra.description}"
        if rb.description != ra.description:
            title += f" / {rb.description}"
        table = Table(title=title, title_justify="left")
        table.add_column("Metric")
        table.add_column(a.label, justify="right")
        table.add_column(b.label, justify="right")
        table.add_column(f"{b.label}/{a.label}", justify="right")
        for name, pick, fmt in _compared(ra.summary):
            va, vb = pick(ra.summary), pick(rb.summary)
            table.add_row(name, fmt(va), fmt(vb), ratio_text(va, vb))
        tables.append(table)
    return tables


def ratio_text(a: float, b: float) -> str:
    """``b / a`` as ``1.85x`` (two significant digits below 0.1: ``0.0029x``); ``-``
    when undefined."""
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return "-"
    ratio = b / a
    return f"{ratio:.2f}x" if abs(ratio) >= 0.1 or ratio == 0 else f"{ratio:.2g}x"


def _compared(
    s: Summary,
) -> list[tuple[str, Callable[[Summary], float], Callable[[float], str]]]:
    def tok(x: float) -> str:
        return _fixed(x, 1)

    def req(x: float) -> str:
        return _fixed(x, 3)

    rows: list[tuple[str, Callable[[Summary], float], Callable[[float], str]]] = [
        ("Output throughput (tok/s)", lambda s: s.output_throughput, tok),
        ("Request throughput (req/s)", lambda s: s.request_throughput, req),
        (f"Goodput (req/s, {slo_text(s.slo)})", lambda s: s.goodput, req),
        ("Goodput fraction", lambda s: s.goodput_fraction, _pct),
    ]
    for name, pick in _LATENCIES:
        for q in PERCENTILES:
            rows.append((f"{name} p{q} (ms)", _percentile_of(pick, q), _ms))
    rows.append(("Failed requests", lambda s: float(s.num_errors), lambda x: f"{x:.0f}"))
    return rows


def _percentile_of(pick: Callable[[Summary], Distribution], q: int) -> Callable[[Summary], float]:
    return lambda s: pick(s).p[q]


def _ms(seconds: float) -> str:
    return _fixed(seconds * 1000, 1)


def _fixed(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _pct(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{fraction * 100:.1f}%"
