"""PNG plots of simulation results (matplotlib, Agg backend: no display needed).

matplotlib is imported inside each function so the CLI's ``--help`` and runs without
``--plot`` never load it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.common.metrics import RequestRecord
from orchestrator.sim.driver import SimRun
from orchestrator.sim.runner import SimResult


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values_ms: list[float], label: str, bound_ms: float | None) -> None:
    values = sorted(values_ms)
    n = len(values)
    ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=label)
    if bound_ms is not None:
        ax.axvline(bound_ms, color="red", linestyle="--", label=f"SLO {bound_ms:g} ms")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend()


def plot_latency_cdfs(
    records: Sequence[RequestRecord],
    path: Path,
    ttft_bound_s: float | None,
    tpot_bound_s: float | None,
) -> Path:
    """TTFT and TPOT CDFs of completed requests, side by side, with the SLO bounds."""
    plt = _pyplot()
    done = [r for r in records if r.ok]
    ttft = [t * 1e3 for r in done if (t := r.ttft) is not None]
    tpot = [t * 1e3 for r in done if (t := r.tpot) is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    _cdf(left, ttft, "TTFT", None if ttft_bound_s is None else ttft_bound_s * 1e3)
    left.set_xlabel("TTFT (ms)")
    _cdf(right, tpot, "TPOT", None if tpot_bound_s is None else tpot_bound_s * 1e3)
    right.set_xlabel("TPOT (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_goodput_vs_rate(sweep: Sequence[SimResult], path: Path) -> Path:
    """Goodput and completed requests/s against the offered rate, one point per run."""
    plt = _pyplot()
    rates = [r.workload.offered_rate or 0.0 for r in sweep]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rates, [r.report.summary.request_throughput for r in sweep], "o-", label="completed")
    ax.plot(rates, [r.report.summary.goodput for r in sweep], "s-", label="goodput (meets SLO)")
    ax.plot(rates, rates, ":", color="gray", label="offered")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("requests/s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_batch_occupancy(run: SimRun, path: Path, max_batch_size: int) -> Path:
    """Requests in each step over virtual time, one line per replica (the first eight)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, replica in enumerate(run.replicas[:8]):
        tr = replica.trace
        ax.plot(tr.end_times, tr.num_seqs, linewidth=0.7, label=f"replica {i}")
    ax.axhline(max_batch_size, color="red", linestyle="--", label="max_batch_size")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests in step")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(result: SimResult, sweep: Sequence[SimResult], out_dir: Path) -> list[Path]:
    """The three plots of ``orchestrator simulate --plot``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slo = result.report.summary.slo
    paths = [
        plot_latency_cdfs(result.run.records, out_dir / "latency_cdf.png", slo.ttft_s, slo.tpot_s),
        plot_batch_occupancy(
            result.run, out_dir / "batch_occupancy.png", result.report.max_batch_size
        ),
    ]
    if sweep:
        paths.append(plot_goodput_vs_rate(sweep, out_dir / "goodput_vs_rate.png"))
    return paths
