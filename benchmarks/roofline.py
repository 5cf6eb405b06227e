"""The torch executor's steps against this machine's roofline, measured in one run.

Measures, interleaved round by round so every figure sees the same background load:

- copy bandwidth: a 256 MiB tensor copy, bytes read plus bytes written over its time;
- matmul rates (bfloat16 and float32): the best of a 2048x2048x2048 GEMM and this
  model's four layer GEMMs at 512 rows, i.e. the highest rate the machine showed;
- the executor's decode step at batch 1, 16 and 64 with 256 tokens of context, and a
  prefill chunk of 256 and of 512 tokens (from position 0, sampling its last token).

Steps are timed as the median over ``--repeats`` rounds; the machine's rates as the best
round (the roof is what the machine can do: on a machine shared with other work, a
median copy slows down more than a step does, which would flatter the steps).

Roofline of a decode step: the weight bytes it reads (in the layout its projections run
in: int8 with its scales, bfloat16, or dense) plus the KV bytes (``batch * (context +
1)`` tokens) over the copy bandwidth. Roofline of a prefill chunk: its FLOPs
(every layer's projections for each token, causal attention's QK and PV, the LM head for
the sampled row) over the matmul rate of its dtype. Each step prints as a percentage of
its roofline (100% = at the roof).

Each table is one kernel variant (``--variants``: the one this CPU selects, a list, or
``all`` it can run, each forced as ``ORCHESTRATOR_CPU_ISA`` would) and one setup
(``--setups``: ``dtype/weights`` or ``dtype/weights/matmul_dtype``, the matmuls in the
model's dtype where not given; default what ``dtype: auto``, ``matmul_dtype: auto`` and
``weights: auto`` pick here, then float32 with dense weights as the baseline). A
prefill's roof is the matmul rate of its matmuls' dtype; a decode's KV bytes are the
cache's. The last line, for the first variant and setup, is:

    <variant> <dtype>/<weights>: decode B=1 <a>%, B=64 <b>% of roofline; prefill <c>% of <dtype> matmul

where ``c`` is the lower of the two chunks. Run:
``.venv/bin/python benchmarks/roofline.py`` (about 2 minutes a table on 2 cores);
``--device cuda`` measures a GPU the same way (its own copy bandwidth and GEMM rates).
For the AVX2 path on a CPU with more, also cap oneDNN and MKL (torch's float32 GEMMs):
``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python
benchmarks/roofline.py --variants avx2``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from orchestrator.common.model_source import resolve_source
from orchestrator.core import ModelConfig, SchedulerOutput, shape_plan
from plugins.torch_executor import TorchExecutor, kernel_build
from plugins.torch_executor.config import DEFAULT_CACHE_DIR
from plugins.torch_executor.cpu_features import cpu_model, detect
from plugins.torch_executor.paged import PagedKVCache
from plugins.torch_executor.precision import resolve_dtype, resolve_matmul_dtype, resolve_weights
from plugins.torch_executor.weights import LlamaWeights, cached_gguf_folder, load_folder

BLOCK_SIZE = 16
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXT = 256  # tokens already cached when the decode step runs
PREFILL_CHUNKS = (256, 512)
GEMM_SIZE = 2048


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes, waiting for the device to finish."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


@dataclass
class Probe:
    """One measured thing: a call, and what one call is worth (bytes or FLOPs)."""

    name: str
    fn: Callable[[], object]
    work: float
    samples: list[float]

    @property
    def seconds(self) -> float:
        return statistics.median(self.samples)

    @property
    def best_rate(self) -> float:
        """Work per second in the fastest round."""
        return self.work / min(self.samples)


def decode_plan(batch: int, context: int) -> SchedulerOutput:
    """One decode token per request at position ``context``, each request on blocks of
    its own (``shape_plan``). Cache contents do not change the step's cost."""
    return shape_plan([(1, context)] * batch, BLOCK_SIZE)


def prefill_plan(tokens: int) -> SchedulerOutput:
    return shape_plan([(tokens, 0)], BLOCK_SIZE)


def layer_params(weights: LlamaWeights) -> int:
    return sum(lin.out_features * lin.in_features for lay in weights.layers for lin in lay.linears)


def prefill_flops(weights: LlamaWeights, tokens: int) -> float:
    """Projections for every token, the LM head for the sampled row, and causal
    attention: query i sees i + 1 keys, 2 FLOPs per multiply-add in QK and in PV."""
    a = weights.args
    lm_head = weights.lm_head.out_features * weights.lm_head.in_features
    keys_seen = tokens * (tokens + 1) // 2
    attention = 4 * keys_seen * a.num_heads * a.head_dim * a.num_layers
    return 2 * tokens * layer_params(weights) + 2 * lm_head + attention


def decode_bytes(executor: TorchExecutor, batch: int, context: int) -> float:
    runner = executor.runner
    kv_dtype = runner.cache.k[0].dtype
    kv = PagedKVCache.bytes_per_block(runner.args, 1, kv_dtype) * batch * (context + 1)
    return runner.decode_weight_bytes + kv


def gemm_probes(weights: LlamaWeights, device: torch.device, dtype: torch.dtype) -> list[Probe]:
    """The square GEMM and the model's layer GEMMs at 512 rows, in ``dtype`` (the
    matmuls' dtype)."""
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(dtype)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(dtype)
    probes = [Probe(f"gemm {GEMM_SIZE}^3", lambda: a @ b, 2 * GEMM_SIZE**3, [])]
    layer = weights.layers[0]
    rows = max(PREFILL_CHUNKS)
    x = torch.randn(rows, weights.args.hidden_size, device=device).to(dtype)
    y = torch.randn(rows, weights.args.intermediate_size, device=device).to(dtype)

    linears = [lin if dtype == weights.dtype else lin.as_bfloat16() for lin in layer.linears]
    qkv, o, gate_up, down = linears

    def model_gemms() -> None:
        qkv(x), o(x), gate_up(x), down(y)

    flops = 2 * rows * sum(lin.out_features * lin.in_features for lin in layer.linears)
    probes.append(Probe(f"layer GEMMs x{rows}", model_gemms, flops, []))
    return probes


def step_probe(name: str, executor: TorchExecutor, plan: SchedulerOutput, work: float) -> Probe:
    return Probe(name, lambda: executor.execute(plan), work, [])


def run(
    weights: LlamaWeights,
    repeats: int,
    kernels: Literal["auto", "torch"],
    weights_format: str,
    matmul_dtype: str,
) -> tuple[TorchExecutor, Probe, list[Probe], list[Probe], list[Probe]]:
    device = weights.device
    src = torch.empty(2**28, dtype=torch.uint8, device=device).fill_(1)  # 256 MiB
    dst = torch.empty_like(src)
    copy = Probe("copy 256 MiB", lambda: dst.copy_(src), 2 * src.numel(), [])
    gemms = gemm_probes(weights, device, getattr(torch, matmul_dtype))
    blocks = max(DECODE_BATCHES) * -(-(DECODE_CONTEXT + 1) // BLOCK_SIZE)
    blocks = max(blocks, -(-max(PREFILL_CHUNKS) // BLOCK_SIZE))
    executor = TorchExecutor(
        weights,
        block_size=BLOCK_SIZE,
        num_blocks=blocks,
        kernels=kernels,
        weights_format=weights_format,  # type: ignore[arg-type]
        matmul_dtype=matmul_dtype,  # type: ignore[arg-type]
    )
    decodes = [
        step_probe(
            f"decode B={batch}",
            executor,
            decode_plan(batch, DECODE_CONTEXT),
            decode_bytes(executor, batch, DECODE_CONTEXT),
        )
        for batch in DECODE_BATCHES
    ]
    prefills = [
        step_probe(f"prefill {n}", executor, prefill_plan(n), prefill_flops(weights, n))
        for n in PREFILL_CHUNKS
    ]
    probes = [copy, *gemms, *decodes, *prefills]
    for p in probes:  # warm-up: first-touch allocations, kernel selection, graph capture
        p.fn()
        p.fn()
    for _ in range(repeats):
        for p in probes:
            p.samples.append(timed(p.fn, device))
    return executor, copy, gemms, decodes, prefills


def report(
    weights: LlamaWeights,
    repeats: int,
    kernels: Literal["auto", "torch"],
    weights_format: str,
    matmul_dtype: str,
) -> tuple[float, float, float]:
    """Print one setup's table; return (decode B=1 %, decode B=64 %, worst prefill %)."""
    executor, copy, gemms, decodes, prefills = run(
        weights, repeats, kernels, weights_format, matmul_dtype
    )
    ran = dict(executor.platform)
    executor.shutdown()
    bandwidth = copy.best_rate
    matmul = max(g.best_rate for g in gemms)
    print(
        f"kernels {ran['kernels']}, dtype {ran['dtype']}, weights {ran['weights']}, matmuls "
        f"{ran.get('matmul_dtype', ran['dtype'])}: copy bandwidth {bandwidth / 1e9:.1f} GB/s (median "
        f"{copy.work / copy.seconds / 1e9:.1f}); matmul "
        + ", ".join(f"{g.name} {g.best_rate / 1e12:.2f} TFLOP/s" for g in gemms)
        + f" (roof {matmul / 1e12:.2f})"
    )
    print(f"  {'step':14} {'ms':>8} {'roof ms':>8} {'of roof':>8}   bound by")
    pct: dict[str, float] = {}
    for p in decodes:
        roof = p.work / bandwidth
        pct[p.name] = 100 * roof / p.seconds
        print(
            f"  {p.name:14} {p.seconds * 1e3:8.2f} {roof * 1e3:8.2f} {pct[p.name]:7.0f}%"
            f"   {p.work / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s"
        )
    for p in prefills:
        roof = p.work / matmul
        pct[p.name] = 100 * roof / p.seconds
        print(
            f"  {p.name:14} {p.seconds * 1e3:8.2f} {roof * 1e3:8.2f} {pct[p.name]:7.0f}%"
            f"   {p.work / 1e9:.1f} GFLOP at {matmul / 1e12:.2f} TFLOP/s"
            f" ({p.work / p.seconds / 1e12:.2f} achieved)"
        )
    worst_prefill = min(pct[p.name] for p in prefills)
    return pct["decode B=1"], pct[f"decode B={max(DECODE_BATCHES)}"], worst_prefill


def default_setups(device: str, kernels: str) -> str:
    """What ``dtype``, ``matmul_dtype`` and ``weights: auto`` pick here, then float32
    dense."""
    features = kernel_build.effective(detect())
    dtype, _ = resolve_dtype("auto", device, features)
    matmul, _ = resolve_matmul_dtype("auto", "auto", dtype, device, features)
    loaded = device == "cpu" and kernels == "auto"
    fmt, _ = resolve_weights("auto", dtype, device, loaded, matmul)
    first = f"{dtype}/{fmt}" if matmul == dtype else f"{dtype}/{fmt}/{matmul}"
    return ",".join([first] if first == "float32/dense" else [first, "float32/dense"])


def matmul_of(setup: str) -> str:
    """The matmuls' dtype of a ``dtype/weights[/matmul_dtype]`` setup."""
    parts = setup.split("/")
    return parts[2] if len(parts) > 2 else parts[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--setups",
        help="dtype/weights[/matmul_dtype] (default: auto here, then float32/dense)",
    )
    parser.add_argument(
        "--variants", help="kernel variants, or 'all' this CPU runs (default: its own)"
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--kernels", choices=("auto", "torch"), default="auto", help="the executor's option"
    )
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    features = detect()
    if args.variants == "all":
        variants = [v.name for v in kernel_build.runnable(features)]
    elif args.variants:
        variants = args.variants.split(",")
    else:
        variants = [kernel_build.select_variant(features).name]
    setups = (args.setups or default_setups(args.device, args.kernels)).split(",")
    folder = cached_gguf_folder(resolve_source(ModelConfig()), Path(args.cache_dir).expanduser())
    print(
        f"SmolLM2-135M-Instruct on {args.device} ({cpu_model()}: {' '.join(features.names())}), "
        f"{args.threads} threads, torch {torch.__version__}, kernels={args.kernels}, "
        f"{args.repeats} interleaved rounds (steps: medians, rates: best); decode at context "
        f"{DECODE_CONTEXT}, block size {BLOCK_SIZE}"
    )
    results = {}
    for variant in variants:
        os.environ[kernel_build.ISA_ENV] = variant
        for setup in setups:
            dtype, fmt = setup.split("/")[:2]
            weights = load_folder(folder, getattr(torch, dtype), args.device)
            results[variant, setup] = report(
                weights, args.repeats, args.kernels, fmt, matmul_of(setup)
            )
            del weights
    b1, b64, prefill = results[variants[0], setups[0]]
    print(
        f"{variants[0]} {setups[0]}: decode B=1 {b1:.0f}%, B={max(DECODE_BATCHES)} {b64:.0f}% "
        f"of roofline; prefill {prefill:.0f}% of {matmul_of(setups[0])} matmul"
    )


if __name__ == "__main__":
    main()
