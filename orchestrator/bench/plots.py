"""PNG plots of a benchmark (matplotlib, Agg backend, imported only when plotting):
TTFT and TPOT CDFs, and for a sweep goodput and p99 TTFT against the offered rate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.bench.report import slo_text
from orchestrator.bench.results import RunSummary
from orchestrator.common.metrics import RequestRecord


def plot_cdfs(runs: Sequence[tuple[str, Sequence[RequestRecord]]], out_dir: Path) -> list[Path]:
    """``ttft_cdf.png`` and ``tpot_cdf.png`` in ``out_dir``: one line per (label,
    records) run, over its completed requests, in milliseconds."""
    metrics: list[tuple[str, str, Callable[[RequestRecord], float | None]]] = [
        ("TTFT", "ttft_cdf.png", lambda r: r.ttft),
        ("TPOT", "tpot_cdf.png", lambda r: r.tpot),
    ]
    paths = []
    for name, filename, pick in metrics:
        fig, ax = _figure()
        for label, records in runs:
            values = sorted(v * 1000 for r in records if r.ok and (v := pick(r)) is not None)
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, fractions, where="post", label=label)
        ax.set_title(f"{name} CDF")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of completed requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        paths.append(_save(fig, out_dir / filename))
    return paths


def plot_sweep(runs: Sequence[RunSummary], out_dir: Path) -> list[Path]:
    """``goodput_vs_rate.png`` and ``p99_ttft_vs_rate.png`` over the runs that have an
    offered rate (a sweep); nothing when fewer than two do."""
    rated = sorted((r for r in runs if r.rate is not None), key=lambda r: r.rate or 0.0)
    if len(rated) < 2:
        return []
    rates = [r.rate for r in rated]
    slo = slo_text(rated[0].summary.slo)

    fig, ax = _figure()
    ax.plot(rates, [r.summary.request_throughput for r in rated], "o-", label="throughput")
    ax.plot(rates, [r.summary.goodput for r in rated], "s-", label=f"goodput ({slo})")
    ax.set_title("Throughput and goodput vs offered rate")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("completed requests/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    goodput = _save(fig, out_dir / "goodput_vs_rate.png")

    fig, ax = _figure()
    ax.plot(rates, [r.summary.ttft.p[99] * 1000 for r in rated], "o-")
    ax.set_title("p99 TTFT vs offered rate")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("p99 TTFT (ms)")
    ax.grid(alpha=0.3)
    ttft = _save(fig, out_dir / "p99_ttft_vs_rate.png")
    return [goodput, ttft]


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6.4, 4.0), dpi=100)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
