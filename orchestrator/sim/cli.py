"""``orchestrator simulate | tune | plan | calibrate``: the simulator's sub-commands.

Each handler returns the exit code: 0 on success, 2 for a bad config or argument (the
message names it), 1 when a search finds no configuration that meets the SLO.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.core import ConfigError
from orchestrator.sim.router import ROUTERS

ROUTER_NAMES = list(ROUTERS)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _add_slo_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--slo-ttft-ms", type=_positive_float, required=required, help="TTFT bound")
    p.add_argument("--slo-tpot-ms", type=_positive_float, required=required, help="TPOT bound")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=_positive_float, help="arrival rate (requests/s)")
    p.add_argument("--num-requests", type=_positive_int, help="requests to simulate")
    p.add_argument("--seed", type=int, help="workload seed")


def register(subparsers: Any) -> None:
    """Add ``simulate``, ``tune``, ``plan`` and ``calibrate`` to the main parser."""
    sim = subparsers.add_parser(
        "simulate",
        help="run the scheduler on simulated GPUs and print latency and throughput",
        description="Discrete-event simulation of the real scheduler on a GPU cost model.",
    )
    sim.add_argument("--config", required=True, help="simulation YAML (configs/sim/)")
    _add_workload_args(sim)
    sim.add_argument("--replicas", type=_positive_int, help="engines behind the router")
    sim.add_argument("--router", choices=ROUTER_NAMES, help="how arrivals pick a replica")
    _add_slo_args(sim)
    sim.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR")
    sim.add_argument(
        "--sweep-points",
        type=_positive_int,
        default=8,
        help="rates in the goodput-vs-rate plot (with --plot)",
    )
    sim.set_defaults(func=_simulate)

    tune = subparsers.add_parser(
        "tune",
        help="search scheduler settings for the highest goodput under an SLO",
        description=(
            "Grid over chunk size, max_num_tokens and max_batch_size; without --rate also "
            "searches the highest arrival rate each setting sustains."
        ),
    )
    tune.add_argument("--config", required=True, help="simulation YAML (configs/sim/)")
    _add_slo_args(tune)
    _add_workload_args(tune)
    tune.add_argument("--attainment", type=_fraction, default=0.9, help="share of requests")
    tune.add_argument("--chunk-sizes", type=_positive_int, nargs="+")
    tune.add_argument("--max-num-tokens", type=_positive_int, nargs="+")
    tune.add_argument("--max-batch-sizes", type=_positive_int, nargs="+")
    tune.add_argument(
        "--ttft-margins",
        type=float,
        nargs="+",
        help="SLO admission margins to try (admission.ttft_margin; needs admission: slo)",
    )
    tune.add_argument(
        "--slo-budget",
        choices=("on", "off"),
        nargs="+",
        help="try the SLO-derived token budget on and/or off (slo_budget.enabled)",
    )
    tune.add_argument("--output", default="tuned-engine.yaml", help="where to write the best")
    tune.set_defaults(func=_tune)

    plan = subparsers.add_parser(
        "plan",
        help="fewest GPUs (replicas x TP) that hold an SLO at a rate, and the KV memory plan",
    )
    plan.add_argument("--model", required=True, help="configs/models/ name or YAML path")
    plan.add_argument("--hardware", required=True, help="configs/hardware/ name or YAML path")
    plan.add_argument("--dtype", choices=["bf16", "fp16", "fp8"], default="bf16")
    plan.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp8"], help="default: --dtype")
    plan.add_argument("--tp", type=_positive_int, nargs="+", default=[1, 2, 4, 8])
    plan.add_argument("--rate", type=_positive_float, required=True, help="requests/s")
    _add_slo_args(plan)
    plan.add_argument("--input-len", type=_positive_int, default=512, help="prompt tokens")
    plan.add_argument("--output-len", type=_positive_int, default=256, help="output tokens")
    plan.add_argument("--context-len", type=_positive_int, help="for max sequences in KV")
    plan.add_argument("--num-requests", type=_positive_int, default=500)
    plan.add_argument("--attainment", type=_fraction, default=0.9, help="share of requests")
    plan.add_argument("--max-replicas", type=_positive_int, default=64)
    plan.add_argument("--config", help="simulation YAML for scheduler and cache settings")
    plan.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        help="router in front of the replicas (default: the --config cluster's, else "
        "least_outstanding_tokens)",
    )
    plan.set_defaults(func=_plan)

    cal = subparsers.add_parser(
        "calibrate",
        help="measure this machine with the torch executor and write a hardware profile",
    )
    cal.add_argument("--config", help="engine YAML with a torch executor (default: built-in)")
    cal.add_argument("--output-dir", default="calibration", help="where to write profiles")
    cal.add_argument("--repeats", type=_positive_int, default=5, help="timings per shape")
    cal.set_defaults(func=_calibrate)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _simulate(args: argparse.Namespace) -> int:
    from orchestrator.sim import commands

    try:
        return commands.simulate(args)
    except (ConfigError, ValueError) as err:
        return _fail(str(err))


def _tune(args: argparse.Namespace) -> int:
    from orchestrator.sim import commands

    try:
        return commands.tune(args)
    except (ConfigError, ValueError) as err:
        return _fail(str(err))


def _plan(args: argparse.Namespace) -> int:
    from orchestrator.sim import commands

    try:
        return commands.plan(args)
    except (ConfigError, ValueError) as err:
        return _fail(str(err))


def _calibrate(args: argparse.Namespace) -> int:
    from orchestrator.sim import calibrate

    try:
        return calibrate.main(args.config, Path(args.output_dir), args.repeats)
    except (ConfigError, ValueError) as err:
        return _fail(str(err))
