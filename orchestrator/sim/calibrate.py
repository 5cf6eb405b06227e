"""``orchestrator calibrate``: fit the cost model to this machine.

It times the torch executor on a few batch shapes (decode batches over a cached context,
prefill chunks, one mixed step: the small batches and contexts a CPU serves), times a large copy and a large matmul for the machine's
peak bandwidth and FLOP rate, and fits four numbers so that the roofline predicts the
measured steps: the achieved fractions of peak bandwidth and of peak FLOPs (the dense
kernels), the attention kernels' efficiency relative to those, and a fixed per-step
overhead. It writes the result as a hardware profile (the
``configs/hardware/`` format) and a simulation config that uses it, ready for
``benchmarks/sim_fidelity.py``.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.common.cost_model import CostModel
from orchestrator.common.deployment import Deployment
from orchestrator.common.specs import DType, GPUSpec, ModelSpec, load_model_spec
from orchestrator.core import (
    EngineConfig,
    Executor,
    ExecutorSpec,
    StepCost,
    create_executor,
    features_of,
    fit_prior,
    load_engine_config,
    shape_plan,
    time_step,
)

# (new tokens, cached positions) per request of each measured step.
SHAPES: dict[str, list[tuple[int, int]]] = {
    "decode x1 @128": [(1, 128)],
    "decode x8 @256": [(1, 256)] * 8,
    "decode x32 @256": [(1, 256)] * 32,
    # More context per request than the others: K/V reads then weigh against the
    # weights, which tells the bandwidth apart from the fixed overhead.
    "decode x16 @768": [(1, 768)] * 16,
    "prefill 128": [(128, 0)],
    "prefill 384": [(384, 0)],
    "mixed 256 + decode x8": [(256, 0)] + [(1, 256)] * 8,
}

TORCH_TO_SPEC_DTYPE: dict[str, DType] = {"float32": "fp32", "bfloat16": "bf16"}
# The torch executor's compact weight formats (``info().platform["weights"]``).
WEIGHT_FORMAT_TO_SPEC_DTYPE: dict[str, DType] = {"int8": "int8", "bfloat16": "bf16"}

# The torch executor serves one model per process; its dimensions live in configs/models.
EMBEDDED_SPECS = {"embedded:smollm2-135m-instruct": "smollm2-135m"}


# The simulator's bound on every efficiency factor (GPUSpec and ``attention_efficiency``).
MAX_EFFICIENCY = 1.5


@dataclass(frozen=True, slots=True)
class Fit:
    """Effective bandwidth (bytes/s) and FLOP rate (FLOP/s) of the dense kernels, the
    attention kernels' efficiency relative to them, the per-step overhead (s), and the
    worst relative error of the fitted model over the measured shapes."""

    bandwidth: float
    flops: float
    attention_efficiency: float
    overhead_s: float
    max_rel_error: float


def predict(
    cost: StepCost, bandwidth: float, flops: float, attention_efficiency: float, overhead_s: float
) -> float:
    """Step time for a cost computed at unit rates (bytes and FLOPs in the fields), as
    ``CostModel`` would predict it with these rates."""
    dense = max(cost.weights_s / bandwidth, cost.dense_compute_s / flops)
    attention = max(cost.kv_s / bandwidth, cost.attention_compute_s / flops)
    return dense + attention / attention_efficiency + overhead_s


def fit(
    units: Sequence[StepCost],
    measured: Sequence[float],
    max_bandwidth: float = math.inf,
    max_flops: float = math.inf,
) -> Fit:
    """Least squares on relative error. For given dense rates a step's time is linear in
    the attention factor (1 / efficiency) and the overhead, so those two are solved in
    closed form at each point of a log-spaced grid of bandwidth and FLOP rate; the grid
    is refined around its best point.

    The rates stay at or below ``max_bandwidth`` and ``max_flops``. Where every shape
    streams the weights at the same cost, weight time and overhead cannot be told apart;
    the bound keeps the bandwidth physical and leaves the rest to the overhead."""
    pairs = list(zip(units, measured, strict=True))

    def solve(bw: float, fl: float) -> tuple[float, float, float]:
        """(loss, attention factor, overhead) at these dense rates."""
        rows = [
            (
                max(u.weights_s / bw, u.dense_compute_s / fl) / m,
                max(u.kv_s / bw, u.attention_compute_s / fl) / m,
                1.0 / m,
            )
            for u, m in pairs
        ]
        best = (math.inf, 1.0, 0.0)
        for factor, overhead in _attention_and_overhead(rows):
            loss = sum((x + factor * y + overhead * z - 1) ** 2 for x, y, z in rows)
            best = min(best, (loss, factor, overhead))
        return best

    # Start where each shape alone would put the rates if it were bound by them.
    bw0 = statistics.median((u.weights_s + u.kv_s) / m for u, m in pairs)
    fl0 = statistics.median(u.compute_s / m for u, m in pairs)
    center = (bw0, fl0)
    # A wide first pass (the max() kinks make the loss bumpy), then tighter ones.
    for span, points in ((1e4, 48), (10.0, 24), (2.0, 16), (1.2, 16), (1.05, 16)):
        grid_bw = _logspace(center[0] / math.sqrt(span), center[0] * math.sqrt(span), points)
        grid_fl = _logspace(center[1] / math.sqrt(span), center[1] * math.sqrt(span), points)
        grid_bw = sorted({min(b, max_bandwidth) for b in grid_bw})
        grid_fl = sorted({min(f, max_flops) for f in grid_fl})
        center = min(((b, f) for b in grid_bw for f in grid_fl), key=lambda p: solve(*p)[0])
    bw, fl = center
    _, factor, overhead = solve(bw, fl)
    efficiency = 1.0 / factor
    worst = max(abs(predict(u, bw, fl, efficiency, overhead) / m - 1) for u, m in pairs)
    return Fit(bw, fl, efficiency, overhead, worst)


def _attention_and_overhead(
    rows: Sequence[tuple[float, float, float]],
) -> list[tuple[float, float]]:
    """Candidate (attention factor c, overhead o) minimising sum (x + c y + o z - 1)^2:
    the unconstrained solution, the one with no overhead, and the one at the factor's
    floor (efficiency at its maximum), each clamped to the feasible region."""
    syy = sum(y * y for _, y, _ in rows)
    szz = sum(z * z for _, _, z in rows)
    syz = sum(y * z for _, y, z in rows)
    ry = sum(y * (1 - x) for x, y, _ in rows)
    rz = sum(z * (1 - x) for x, _, z in rows)
    floor = 1.0 / MAX_EFFICIENCY
    candidates = [(ry / syy, 0.0)]
    det = syy * szz - syz * syz
    if det > 0:
        candidates.append(((ry * szz - rz * syz) / det, (rz * syy - ry * syz) / det))
    candidates.append((floor, (rz - floor * syz) / szz))
    return [(max(c, floor), max(o, 0.0)) for c, o in candidates]


def _logspace(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def peak_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of the best of ``repeats`` copies of an ``nbytes`` tensor (read plus write)."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def peak_flops(torch_dtype: str, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` ``n x n`` matmuls in ``torch_dtype``."""
    import torch

    a = torch.randn(n, n).to(getattr(torch, torch_dtype))
    b = torch.randn(n, n).to(getattr(torch, torch_dtype))
    best = math.inf
    for _ in range(repeats + 1):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def spec_name_for(engine: EngineConfig) -> str:
    """The ``configs/models`` name of the model the torch executor serves."""
    source = engine.model.source
    if source in EMBEDDED_SPECS:
        return EMBEDDED_SPECS[source]
    raise ValueError(
        f"calibration needs the model's dimensions in configs/models/; no spec is known "
        f"for {source!r} (known: {', '.join(EMBEDDED_SPECS)})"
    )


def unit_costs(
    model: ModelSpec,
    dtype: DType,
    shapes: Sequence[Sequence[tuple[int, int]]],
    block_size: int,
    weight_dtype: DType | None = None,
) -> list[StepCost]:
    """Each shape's cost model at unit rates: the fields hold bytes and FLOPs. Weights are
    in ``weight_dtype`` (``dtype`` when ``None``), the KV cache in ``dtype``."""
    unit = GPUSpec(name="unit", memory_bytes=1.0, hbm_bw=1.0, bf16_flops=1.0, interconnect_bw=1.0)
    cost_model = CostModel(model, unit, weight_dtype=weight_dtype or dtype, kv_dtype=dtype)
    return [cost_model.step_cost(shape_plan(s, block_size)) for s in shapes]


def torch_engine(config_path: str | None) -> EngineConfig:
    """The engine config to calibrate: ``config_path``, else the built-in default."""
    engine = (
        load_engine_config(config_path)
        if config_path
        else EngineConfig(executor=ExecutorSpec(type="torch"))
    )
    # A check of the config, not of an executor: calibration reads the torch executor's
    # own options (its dtype) and needs the model's dimensions, which only a torch config
    # names; ExecutorInfo carries neither.
    if engine.executor.type != "torch":
        raise ValueError(f"calibration runs the torch executor, not {engine.executor.type!r}")
    return engine


def calibrate(
    engine: EngineConfig, executor: Executor, output_dir: Path, repeats: int
) -> tuple[Path, Path]:
    """Time ``executor`` (the torch executor ``engine`` describes) on every shape, fit
    the cost model, write the hardware profile and the simulation config; returns their
    paths."""
    # What the executor resolved (``dtype: auto``, the weight format), as it reports it.
    ran = dict(executor.info().platform)
    torch_dtype = ran.get("dtype", str(engine.executor.options.dtype))
    dtype = TORCH_TO_SPEC_DTYPE[torch_dtype]
    weight_dtype = WEIGHT_FORMAT_TO_SPEC_DTYPE.get(ran.get("weights", "dense"), dtype)
    spec_name = spec_name_for(engine)
    block_size = engine.cache.block_size
    measured = {}
    for name, shape in SHAPES.items():
        measured[name] = time_step(executor, shape_plan(shape, block_size), repeats)
        print(f"  {name:<24} {measured[name] * 1e3:8.1f} ms", flush=True)
    write_predictor_prior(output_dir, block_size, measured)
    units = unit_costs(
        load_model_spec(spec_name), dtype, list(SHAPES.values()), block_size, weight_dtype
    )
    bw_peak, fl_peak = peak_bandwidth(), peak_flops(torch_dtype)
    result = fit(
        units,
        list(measured.values()),
        max_bandwidth=bw_peak * MAX_EFFICIENCY,
        max_flops=fl_peak * MAX_EFFICIENCY,
    )
    # min(): the grid's cap can land a rounding error above the bound.
    bw_eff = min(result.bandwidth / bw_peak, MAX_EFFICIENCY)
    fl_eff = min(result.flops / fl_peak, MAX_EFFICIENCY)
    print(
        f"effective bandwidth {result.bandwidth / 1e9:.1f} GB/s ({bw_eff:.0%} of "
        f"{bw_peak / 1e9:.1f}), effective FLOPs {result.flops / 1e12:.3f} TFLOP/s "
        f"({fl_eff:.0%} of {fl_peak / 1e12:.3f}), attention efficiency "
        f"{result.attention_efficiency:.2f}, step overhead {result.overhead_s * 1e3:.2f} ms; "
        f"worst fit error {result.max_rel_error:.0%}"
    )
    return write_profiles(
        output_dir,
        engine,
        spec_name,
        (dtype, weight_dtype),
        (bw_peak, bw_eff),
        (fl_peak, fl_eff),
        result,
        executor.info().num_kv_blocks,
    )


def main(config_path: str | None, output_dir: Path, repeats: int) -> int:
    """``orchestrator calibrate``."""
    engine = torch_engine(config_path)
    spec_name_for(engine)  # fail before the model loads
    executor = create_executor(engine)
    try:
        paths = calibrate(engine, executor, output_dir, repeats)
    finally:
        executor.shutdown()
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


def write_predictor_prior(output_dir: Path, block_size: int, measured: dict[str, float]) -> Path:
    """Fit the engine's linear step-time model to the measured shapes (seconds) and write
    it as a ``scheduler.predictor.prior`` section, so that a served engine's online fit
    starts from this machine's figures instead of the defaults."""
    prior = fit_prior(
        (features_of(shape_plan(SHAPES[name], block_size)), seconds)
        for name, seconds in measured.items()
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "predictor-prior.yaml"
    path.write_text(
        "# Written by `orchestrator calibrate`: the step-time predictor's prior for this\n"
        "# machine; copy it into a serve config's scheduler section.\n"
        + yaml.safe_dump({"predictor": {"prior": prior.model_dump()}}, sort_keys=False)
    )
    print(f"step-time predictor prior: {prior.model_dump()} (wrote {path})")
    return path


def write_profiles(
    output_dir: Path,
    engine: EngineConfig,
    spec_name: str,
    dtypes: tuple[DType, DType],
    bandwidth: tuple[float, float],
    flops: tuple[float, float],
    result: Fit,
    kv_blocks: int,
) -> tuple[Path, Path]:
    """The hardware profile (``bandwidth`` and ``flops`` are (peak, efficiency) pairs)
    and a simulation config of the same engine on it, its KV pool pinned to the torch
    executor's ``kv_blocks``; ``dtypes``: the executor's (activations and KV, weights)."""
    dtype, weight_dtype = dtypes
    output_dir.mkdir(parents=True, exist_ok=True)
    hardware = GPUSpec(
        name="local-cpu",
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        hbm_bw=bandwidth[0],
        bf16_flops=flops[0],
        interconnect_bw=bandwidth[0],  # one device: never used
        bw_efficiency=bandwidth[1],
        flops_efficiency=flops[1],
    )
    hw_path = output_dir / "local-cpu.yaml"
    hw_path.write_text(
        f"# Written by `orchestrator calibrate`: this machine under the torch executor in "
        f"{dtype}\n# (FLOP rates are for that dtype).\n"
        + yaml.safe_dump(hardware.model_dump(), sort_keys=False)
    )
    sim_options = Deployment(
        model=spec_name,
        hardware=str(hw_path.resolve()),
        weight_dtype=weight_dtype,
        kv_dtype=dtype,
        tp=1,
        step_overhead_s=result.overhead_s,
        allreduce_latency_s=0.0,
        attention_efficiency=result.attention_efficiency,
    )
    data: dict[str, Any] = {
        "engine": {
            "model": engine.model.model_dump(mode="json"),
            "scheduler": engine.scheduler.model_dump(mode="json"),
            "cache": {**engine.cache.model_dump(mode="json"), "num_blocks": kv_blocks},
            "executor": {"type": "sim", **sim_options.model_dump(mode="json")},
        }
    }
    sim_path = output_dir / "sim-local-cpu.yaml"
    sim_path.write_text(
        "# Written by `orchestrator calibrate`: the calibrated engine in the simulator.\n"
        + yaml.safe_dump(data, sort_keys=False)
    )
    return hw_path, sim_path
