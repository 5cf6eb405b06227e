"""Bodies of ``simulate``, ``tune`` and ``plan``: argument overrides on a config, the
search, and what is printed and written."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from orchestrator.common.deployment import Deployment
from orchestrator.common.workloads import FixedLength, PoissonArrivals, WorkloadConfig
from orchestrator.core import EngineConfig, ExecutorSpec, ModelConfig
from orchestrator.sim.config import ClusterConfig, SimConfig, SLOConfig, load_sim_config
from orchestrator.sim.plan import Probe, TPPlan, plan_capacity
from orchestrator.sim.plots import write_plots
from orchestrator.sim.report import print_report
from orchestrator.sim.runner import SimResult, ceiling_rate, rate_sweep, run_simulation
from orchestrator.sim.tune import (
    DEFAULT_CHUNK_SIZES,
    DEFAULT_MAX_BATCH_SIZES,
    DEFAULT_MAX_NUM_TOKENS,
    Trial,
    engine_yaml,
    knob_grid,
)
from orchestrator.sim.tune import (
    tune as tune_grid,
)


def _override(config: SimConfig, args: argparse.Namespace) -> SimConfig:
    """Apply the workload, cluster and SLO flags the sub-command has and the user set."""
    workload = config.workload
    if getattr(args, "rate", None) is not None:
        workload = workload.with_rate(args.rate)
    if getattr(args, "num_requests", None) is not None:
        workload = workload.with_num_requests(args.num_requests)
    if getattr(args, "seed", None) is not None:
        workload = workload.model_copy(update={"seed": args.seed})
    cluster = config.cluster
    if getattr(args, "replicas", None) is not None:
        cluster = cluster.model_copy(update={"replicas": args.replicas})
    if getattr(args, "router", None) is not None:
        cluster = cluster.model_copy(update={"router": args.router})
    slo = config.slo
    if args.slo_ttft_ms is not None:
        slo = slo.model_copy(update={"ttft_ms": args.slo_ttft_ms})
    if args.slo_tpot_ms is not None:
        slo = slo.model_copy(update={"tpot_ms": args.slo_tpot_ms})
    return config.model_copy(update={"workload": workload, "cluster": cluster, "slo": slo})


def simulate(args: argparse.Namespace) -> int:
    config = _override(load_sim_config(args.config), args)
    console = Console()
    result = run_simulation(config)
    print_report(result.report, console)
    if args.plot:
        sweep: list[SimResult] = []
        if config.workload.rate is not None:
            top = ceiling_rate(config)
            rates = [top * (i + 1) / args.sweep_points for i in range(args.sweep_points)]
            sweep = rate_sweep(config, rates)
        for path in write_plots(result, sweep, Path(args.plot)):
            console.print(f"wrote {path}")
    return 0


def tune(args: argparse.Namespace) -> int:
    config = _override(load_sim_config(args.config), args)
    if args.num_requests is None:
        config = config.model_copy(update={"workload": config.workload.with_num_requests(300)})
    grid = knob_grid(
        args.chunk_sizes or DEFAULT_CHUNK_SIZES,
        args.max_num_tokens or DEFAULT_MAX_NUM_TOKENS,
        args.max_batch_sizes or DEFAULT_MAX_BATCH_SIZES,
        args.ttft_margins or (None,),
        [s == "on" for s in args.slo_budget] if args.slo_budget else (None,),
    )
    if not grid:
        raise ValueError("no setting in the grid has chunk size and batch cap <= max_num_tokens")
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("tuning", total=len(grid))

        def advance(trial: Trial) -> None:
            k = trial.knobs
            progress.update(
                task,
                advance=1,
                description=f"chunk {k.chunk_size} tokens {k.max_num_tokens} batch {k.max_batch_size}",
            )

        trials = tune_grid(config, grid, args.attainment, args.rate, on_trial=advance)
    out = Console()
    out.print(_trials_table(trials[:10]))
    best = trials[0]
    if best.result is None:
        out.print(f"no setting met the SLO for {args.attainment:.0%} of requests at any rate tried")
        return 1
    engine = best.result.config.engine
    path = Path(args.output)
    header = (
        f"# Tuned by `orchestrator tune` for TTFT {config.slo.ttft_ms} ms / TPOT "
        f"{config.slo.tpot_ms} ms: goodput {best.goodput:.2f} req/s"
        + (f" at {best.rate:.2f} req/s offered" if best.rate is not None else "")
        + ".\n# The executor is the simulated one; set a real executor to serve with it.\n"
    )
    path.write_text(header + yaml.safe_dump(engine_yaml(engine), sort_keys=False))
    k = best.knobs
    slo_knobs = "".join(
        f" {name}={value}"
        for name, value in (("ttft_margin", k.ttft_margin), ("slo_budget", k.slo_budget))
        if value is not None
    )
    out.print(
        f"best: chunk_size={k.chunk_size} max_num_tokens={k.max_num_tokens} "
        f"max_batch_size={k.max_batch_size}{slo_knobs}; goodput {best.goodput:.2f} req/s; "
        f"wrote {path}"
    )
    return 0


def _trials_table(trials: list[Trial]) -> Table:
    table = Table(title="Best settings (goodput = rate x share within SLO)")
    for col in (
        "chunk",
        "max tokens",
        "max batch",
        "TTFT margin",
        "SLO budget",
        "rate req/s",
        "in SLO",
        "goodput",
    ):
        table.add_column(col, justify="right")
    table.add_column("TTFT p90 ms", justify="right")
    table.add_column("TPOT p90 ms", justify="right")
    for t in trials:
        k = t.knobs
        knobs = (
            str(k.chunk_size),
            str(k.max_num_tokens),
            str(k.max_batch_size),
            "-" if k.ttft_margin is None else f"{k.ttft_margin:g}",
            "-" if k.slo_budget is None else ("on" if k.slo_budget else "off"),
        )
        if t.result is None or t.rate is None:
            table.add_row(*knobs, "< best", *["-"] * 4)
            continue
        s = t.result.report.summary
        table.add_row(
            *knobs,
            f"{t.rate:.2f}",
            f"{s.goodput_fraction:.1%}",
            f"{t.goodput:.2f}",
            f"{s.ttft.p[90] * 1e3:.0f}",
            f"{s.tpot.p[90] * 1e3:.1f}",
        )
    return table


def _plan_config(args: argparse.Namespace) -> SimConfig:
    kv_dtype = args.kv_dtype or args.dtype
    chosen = {
        "model": args.model,
        "hardware": args.hardware,
        "weight_dtype": args.dtype,
        "kv_dtype": kv_dtype,
    }
    base = load_sim_config(args.config) if args.config else None
    # A --config deployment's runtime figures (KV fraction, runtime reserve, overheads)
    # describe the same serving stack, so they stay; the flags choose model, GPU and
    # precision, and the planner each TP width.
    inherited = (
        base.engine.executor.options.model_dump(exclude={"tp"})
        if base is not None and isinstance(base.engine.executor.options, Deployment)
        else {}
    )
    options = Deployment.model_validate({**inherited, **chosen})
    workload = WorkloadConfig(
        arrival=PoissonArrivals(rate=args.rate),
        num_requests=args.num_requests,
        prompt_len=FixedLength(value=args.input_len),
        output_len=FixedLength(value=args.output_len),
    )
    slo = SLOConfig(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
    router = getattr(args, "router", None)
    if base is not None:
        engine = base.engine.model_copy(
            update={"executor": ExecutorSpec(type="sim", options=options)}
        )
        cluster = base.cluster
        if router is not None:
            cluster = ClusterConfig(replicas=cluster.replicas, router=router)
        return SimConfig(engine=engine, workload=workload, cluster=cluster, slo=slo)
    model = ModelConfig(name=options.model_spec().name, source=args.model)
    engine = EngineConfig(model=model, executor=ExecutorSpec(type="sim", options=options))
    cluster = ClusterConfig() if router is None else ClusterConfig(router=router)
    return SimConfig(engine=engine, workload=workload, cluster=cluster, slo=slo)


def plan(args: argparse.Namespace) -> int:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None:
        raise ValueError("give at least one bound: --slo-ttft-ms and/or --slo-tpot-ms")
    config = _plan_config(args)
    console = Console()
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("planning", total=None)

        def seen(p: Probe) -> None:
            progress.update(task, description=f"tp={p.tp} x {p.replicas} replicas")

        best, plans = plan_capacity(config, args.tp, args.attainment, args.max_replicas, seen)
    context = args.context_len or args.input_len + args.output_len
    console.print(_memory_table(plans, context))
    console.print(_plan_table(plans))
    # Reasons are sentences; printed whole, they stay readable (and greppable).
    for p in plans:
        if p.skipped is not None:
            console.print(f"tp={p.tp} skipped: {p.skipped}", soft_wrap=True, highlight=False)
    if best is None:
        console.print(
            f"no cluster of up to {args.max_replicas} replicas holds the SLO for "
            f"{args.attainment:.0%} of requests at {args.rate:g} req/s"
        )
        return 1
    s = best.result.report.summary
    console.print(
        f"fewest GPUs: {best.gpus} ({best.replicas} replicas x tp={best.tp}); "
        f"{s.goodput_fraction:.1%} of requests within the SLO, "
        f"TTFT p90 {s.ttft.p[90] * 1e3:.0f} ms, TPOT p90 {s.tpot.p[90] * 1e3:.1f} ms"
    )
    return 0


def _memory_table(plans: list[TPPlan], context: int) -> Table:
    table = Table(title=f"KV memory plan per replica, context {context} tokens")
    columns = (
        "tp",
        "weights GB/GPU",
        "workspace GB/GPU",
        "KV GB/GPU",
        "KV B/token/GPU",
        "KV tokens",
        "max seqs",
    )
    for col in columns:
        table.add_column(col, justify="right")
    for p in plans:
        m = p.memory
        if m is None:
            table.add_row(str(p.tp), "skipped", *[""] * (len(columns) - 2))
            continue
        table.add_row(
            str(p.tp),
            f"{m.weight_bytes / 1e9:.1f}",
            f"{m.workspace_bytes / 1e9:.1f}",
            f"{m.kv_pool_bytes / 1e9:.1f}",
            f"{m.kv_bytes_per_token:,}",
            f"{m.kv_tokens:,}",
            f"{m.sequences_at(context):,}",
        )
    return table


def _plan_table(plans: list[TPPlan]) -> Table:
    table = Table(title="Smallest cluster per tensor-parallel width")
    for col in ("tp", "replicas", "GPUs", "in SLO", "TTFT p90 ms", "TPOT p90 ms", "tok/s/GPU"):
        table.add_column(col, justify="right")
    for p in plans:
        if p.best is None:
            reason = "skipped" if p.skipped else "none within the limit"
            table.add_row(str(p.tp), reason, *[""] * 5)
            continue
        s = p.best.result.report.summary
        table.add_row(
            str(p.tp),
            str(p.best.replicas),
            str(p.best.gpus),
            f"{s.goodput_fraction:.1%}",
            f"{s.ttft.p[90] * 1e3:.0f}",
            f"{s.tpot.p[90] * 1e3:.1f}",
            f"{s.output_throughput_per_gpu:,.0f}",
        )
    return table
