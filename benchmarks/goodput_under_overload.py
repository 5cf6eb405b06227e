"""Goodput under overload: fcfs, priority and SLO-aware scheduling in the simulator.

Llama-3-70B FP8 on two H100s (configs/sim/llama3-70b-fp8-h100-tp2.yaml), Poisson
arrivals, every request with the config's SLO (TTFT 500 ms, TPOT 80 ms) in two tiers:
30% ``premium`` (priority 0) and 70% ``standard`` (priority 1), so ``priority`` has
something to order. First the saturation rate is found in
this run: the highest rate at which ``fcfs`` keeps 90% of requests within their SLO
(bisection). Then 0.5, 0.8, 1.0, 1.25, 1.5 and 2.0 x that rate are offered to:

- ``fcfs``: arrival order, queue limits only (today's default);
- ``priority``: lower priority first with aging, queue limits only;
- ``slo``: earliest TTFT deadline first (``policy: slo``), SLO admission (refuse with a
  computed Retry-After when the predicted TTFT, corrected by its measured error, exceeds
  the class target; ``admission.error_quantile`` at its default), the SLO-derived token
  budget, and shedding of waiting requests 1 s past their deadline.

Goodput is requests meeting their class's SLO per second of offered traffic (offered
rate x attainment), so a run's drain after the last arrival does not count. Per cell it
prints goodput, attainment and the share refused or shed.

Then a sweep of ``slo`` against ``fcfs`` (the baseline) at 0.5, 1, 1.5, 2 and 4 x the
saturation rate, each as a short burst (``--burst`` requests, 64) and sustained
(``--requests``): per cell the slo/fcfs goodput ratio, and for each policy the requests
that met their SLO beside those refused (429) and shed, plus slo's regretted refusals
(``EngineStats.regretted_refusals``: refused, yet the queue drained in time for them).

Then learning from regret (``admission.learn_from_regret``) on and off, for ``slo`` on
bursty arrivals (gamma gaps with a coefficient of variation of 3: bursts with idle
spells between them, where a refusal can be followed by unused capacity) at 0.8, 1 and
1.5 x the saturation rate: requests within SLO, refused and regretted for each.

Run: .venv/bin/python benchmarks/goodput_under_overload.py [--requests 800] [--burst 64]
[--sweep-only] [--plot PATH]
The last line is the headline:
``slo/fcfs goodput: 0.8x load <A>x, 1.5x load <B>x, 2x load <C>x; slo at 2x keeps <D>% of
its peak goodput``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from orchestrator.common.workloads import GammaArrivals, TrafficClass
from orchestrator.core import SchedulerConfig
from orchestrator.sim.config import SimConfig, load_sim_config
from orchestrator.sim.runner import SimResult, at_rate, max_sustainable_rate, run_simulation

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/sim/llama3-70b-fp8-h100-tp2.yaml"
LOADS = (0.5, 0.8, 1.0, 1.25, 1.5, 2.0)
SWEEP_LOADS = (0.5, 1.0, 1.5, 2.0, 4.0)
BURSTY_LOADS = (0.8, 1.0, 1.5)
BURSTY_CV = 3.0
CLASSES = {
    "premium": {"ttft_ms": 500, "tpot_ms": 80},
    "standard": {"ttft_ms": 500, "tpot_ms": 80},
}
MIX = {
    "premium": TrafficClass(share=0.3, priority=0),
    "standard": TrafficClass(share=0.7, priority=1),
}
POLICIES: dict[str, dict[str, object]] = {
    "fcfs": {"policy": "fcfs"},
    "priority": {"policy": "priority"},
    "slo": {
        "policy": "slo",
        "admission": {"type": "slo", "shed_after_deadline_s": 1.0},
        "slo_budget": {"enabled": True},
    },
}


def with_policy(config: SimConfig, name: str, learn_from_regret: bool = True) -> SimConfig:
    data = config.engine.scheduler.model_dump()
    data.update(slo_classes=CLASSES, default_slo_class="standard", **POLICIES[name])
    data["admission"] = {**data.get("admission", {}), "learn_from_regret": learn_from_regret}
    engine = config.engine.model_copy(update={"scheduler": SchedulerConfig.model_validate(data)})
    return config.model_copy(update={"engine": engine})


def base_config(num_requests: int) -> SimConfig:
    config = load_sim_config(CONFIG)
    workload = config.workload.model_copy(update={"num_requests": num_requests, "slo_classes": MIX})
    return config.model_copy(update={"workload": workload})


def goodput(result: SimResult) -> float:
    """Requests/s meeting their SLO, per second of offered traffic."""
    rate = result.workload.offered_rate or math.nan
    return rate * result.report.summary.goodput_fraction


def refused_share(result: SimResult) -> float:
    s = result.report.summary
    return s.num_errors / s.num_requests if s.num_requests else math.nan


def outcome(result: SimResult) -> tuple[int, int, int, int]:
    """Requests that met their SLO, were refused (429), were shed, and refusals regretted."""
    classes = result.report.by_class.values()
    met = sum(c.num_met for c in classes)
    shed = sum(c.rejections.get("ttft_deadline_passed", 0) for c in classes)
    refused = sum(c.num_rejected for c in classes) - shed
    regretted = sum(
        n for replica in result.run.replicas for _, n in replica.core.stats().regretted_refusals
    )
    return met, refused, shed, regretted


def sweep(base: SimConfig, saturation: float, burst: int, sustained: int) -> None:
    """Print slo against fcfs over ``SWEEP_LOADS``, as a burst and as sustained load."""
    print(
        f"\nsweep: slo vs fcfs (baseline); met / refused / shed of the requests sent; "
        f"burst = {burst} requests, sustained = {sustained}"
    )
    print(
        f"{'shape':>9} {'load':>5} {'slo/fcfs':>8}  {'slo met/ref/shed':>17} "
        f"{'regret':>6}  {'fcfs met/ref/shed':>17}"
    )
    for shape, n in (("burst", burst), ("sustained", sustained)):
        workload = base.workload.model_copy(update={"num_requests": n})
        config = base.model_copy(update={"workload": workload})
        for load in SWEEP_LOADS:
            slo = run_simulation(at_rate(with_policy(config, "slo"), saturation * load))
            fcfs = run_simulation(at_rate(with_policy(config, "fcfs"), saturation * load))
            g_slo, g_fcfs = goodput(slo), goodput(fcfs)
            ratio = f"{g_slo / g_fcfs:.2f}x" if g_fcfs > 0 else "inf"
            s_met, s_ref, s_shed, s_regret = outcome(slo)
            f_met, f_ref, f_shed, _ = outcome(fcfs)
            print(
                f"{shape:>9} {load:>4}x {ratio:>8}  {f'{s_met}/{s_ref}/{s_shed}':>17} "
                f"{s_regret:>6}  {f'{f_met}/{f_ref}/{f_shed}':>17}"
            )
    print()


def learning(base: SimConfig, saturation: float) -> None:
    """Print ``slo`` with and without learning from regret on bursty arrivals."""
    arrival = GammaArrivals(rate=1.0, cv=BURSTY_CV)
    bursty = base.model_copy(
        update={"workload": base.workload.model_copy(update={"arrival": arrival})}
    )
    print(
        f"learning from regret, slo on bursty arrivals (gamma, cv {BURSTY_CV:g}, "
        f"{base.workload.num_requests} requests); met / refused / regretted"
    )
    print(f"{'load':>5} {'learning':>17} {'without':>17} {'met, on/off':>12}")
    for load in BURSTY_LOADS:
        row = []
        for learn in (True, False):
            result = run_simulation(at_rate(with_policy(bursty, "slo", learn), saturation * load))
            met, refused, _, regretted = outcome(result)
            row.append((met, refused, regretted))
        (on, off) = row
        print(
            f"{load:>4}x {f'{on[0]}/{on[1]}/{on[2]}':>17} {f'{off[0]}/{off[1]}/{off[2]}':>17} "
            f"{on[0] / max(off[0], 1):>11.3f}x"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800, help="requests per run")
    parser.add_argument("--burst", type=int, default=64, help="requests in a short burst")
    parser.add_argument(
        "--sweep-only", action="store_true", help="only the slo-vs-fcfs sweep, no headline"
    )
    parser.add_argument("--plot", type=Path, default=REPO / "docs/goodput_under_overload.png")
    args = parser.parse_args(argv)

    base = base_config(args.requests)
    search = max_sustainable_rate(with_policy(base, "fcfs"), 0.9, iterations=7)
    if search.rate is None:
        print("fcfs met the SLO at no rate tried", file=sys.stderr)
        return 1
    saturation = search.rate
    print(f"saturation rate (fcfs, 90% within SLO): {saturation:.2f} req/s")
    sweep(base, saturation, args.burst, args.requests)
    learning(base, saturation)
    if args.sweep_only:
        return 0
    print(f"{'load':>5} {'policy':>9} {'goodput':>9} {'attain':>7} {'refused':>8} {'ttft err':>9}")
    table: dict[str, dict[float, float]] = {name: {} for name in POLICIES}
    for load in LOADS:
        for name in POLICIES:
            result = run_simulation(at_rate(with_policy(base, name), saturation * load))
            table[name][load] = g = goodput(result)
            errors = [
                c.ttft_prediction_error
                for c in result.report.by_class.values()
                if c.ttft_prediction_error is not None
            ]
            err = f"{max(errors):.1%}" if errors else "-"
            print(
                f"{load:>4}x {name:>9} {g:>9.2f} {result.report.summary.goodput_fraction:>7.1%} "
                f"{refused_share(result):>8.1%} {err:>9}"
            )
    if args.plot:
        write_plot(args.plot, table, saturation)
        print(f"wrote {args.plot}")
    slo, fcfs = table["slo"], table["fcfs"]

    def ratio(load: float) -> str:
        return f"{slo[load] / fcfs[load]:.2f}" if fcfs[load] > 0 else "inf"

    keeps = slo[2.0] / max(slo.values()) * 100
    print(
        f"slo/fcfs goodput: 0.8x load {ratio(0.8)}x, 1.5x load {ratio(1.5)}x, "
        f"2x load {ratio(2.0)}x; slo at 2x keeps {keeps:.0f}% of its peak goodput"
    )
    return 0


def write_plot(path: Path, table: dict[str, dict[float, float]], saturation: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("fcfs", "priority", "slo"):
        loads = sorted(table[name])
        ax.plot([saturation * x for x in loads], [table[name][x] for x in loads], "o-", label=name)
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("goodput (req/s meeting SLO)")
    ax.set_title("Llama-3-70B FP8, 2x H100 (simulated)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
