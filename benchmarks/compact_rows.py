"""The compact projections (int8 or bfloat16-stored weights of the float32 model)
against the dense float32 matmul, per row count, past the rows the executor's start-up
measurement considers (``row_bound.CANDIDATES``, up to 64).

Times one layer's four projections (QKV, output, gate/up, down) both ways, alternating
round by round on a different layer each time (so the weights come from memory, as in a
step), medians of ``--rounds``. It answers whether a prompt's prefill would gain from
the compact kernels on this CPU: they win while the rows are few enough that reading
the weights binds, and past that both run at the vector multiplier's rate.

Run: ``.venv/bin/python benchmarks/compact_rows.py [--rows 64 128 256 512 2048]
[--format int8]``; for the AVX2 kernels on a CPU with more, hold both sides to AVX2:
``ORCHESTRATOR_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
.venv/bin/python benchmarks/compact_rows.py``. Last line:

    compact/dense projections (<variant>, <format>): 64 rows <a>x, ..., 2048 rows <b>x
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from orchestrator.common.model_source import resolve_source
from orchestrator.core import ModelConfig
from plugins.torch_executor.compact import WeightFormat
from plugins.torch_executor.config import DEFAULT_CACHE_DIR
from plugins.torch_executor.cpu_features import cpu_model
from plugins.torch_executor.executor import TorchExecutor
from plugins.torch_executor.linear import Linear
from plugins.torch_executor.weights import LlamaWeights, cached_gguf_folder, load_folder


def layer_s(
    run: Callable[[Linear, torch.Tensor], torch.Tensor],
    weights: LlamaWeights,
    index: int,
    rows: int,
    gen: torch.Generator,
) -> float:
    """Seconds for layer ``index``'s four projections at ``rows`` rows through ``run``."""
    a = weights.args
    layer = weights.layers[index % len(weights.layers)]
    hidden = torch.randn(rows, a.hidden_size, generator=gen)
    attn = torch.randn(rows, a.num_heads * a.head_dim, generator=gen)
    inter = torch.randn(rows, a.intermediate_size, generator=gen)
    start = time.perf_counter()
    run(layer.qkv, hidden)
    run(layer.o, attn)
    run(layer.gate_up, hidden)
    run(layer.down, inter)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256, 512, 2048])
    parser.add_argument("--format", choices=["int8", "bfloat16"], default="int8")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fmt = WeightFormat(args.format)
    folder = cached_gguf_folder(resolve_source(ModelConfig()), Path(DEFAULT_CACHE_DIR).expanduser())
    weights = load_folder(folder, torch.float32, "cpu")
    # Built for its kernels and compact layouts; every call here passes its own row
    # bound, so the start-up measurement of one is skipped (any compact_max_rows does).
    executor = TorchExecutor(
        weights,
        block_size=16,
        num_blocks=64,
        kernels="auto",
        weights_format=args.format,
        compact_max_rows=64,
    )
    kernels = executor.runner.kernels
    variant = dict(executor.platform).get("kernels", "?")
    print(f"CPU: {cpu_model()}; kernels {variant}; float32 model, {args.format} weights")

    def compact(layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return kernels.compact_linear(fmt, layer, x, max_rows=x.shape[0])

    gen = torch.Generator().manual_seed(0)
    ratios = []
    print(f"{'rows':>6} {'compact ms':>11} {'dense ms':>9} {'compact/dense':>14}")
    with torch.inference_mode():
        turn = 0
        for rows in args.rows:
            for run in (compact, Linear.__call__):  # untimed: first use of a shape
                layer_s(run, weights, 0, rows, gen)
            times: dict[str, list[float]] = {"compact": [], "dense": []}
            for _ in range(args.rounds):
                for name, run in (("compact", compact), ("dense", Linear.__call__)):
                    times[name].append(layer_s(run, weights, turn, rows, gen))
                    turn += 1
            c, d = statistics.median(times["compact"]), statistics.median(times["dense"])
            ratios.append(f"{rows} rows {c / d:.2f}x")
            print(f"{rows:>6} {c * 1e3:>11.2f} {d * 1e3:>9.2f} {c / d:>13.2f}x")
    print(f"compact/dense projections ({variant}, {args.format}): " + ", ".join(ratios))


if __name__ == "__main__":
    main()
