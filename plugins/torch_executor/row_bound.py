"""Up to how many rows the compact projections beat the dense matmul the longer batches run
(oneDNN's float32 matmul, or bfloat16 matmuls with ``matmul_dtype: bfloat16``), measured
at start on the CPU the executor runs on.

A few rows read every weight once and wait on memory, so the compact weights, read in
fewer bytes, win; with more rows both are bound by the CPU's multiply rate, and which
wins depends on the CPU (its vector units, VNNI or not, its caches) and the thread
count. On 2 threads of an AMD EPYC (Zen 1), a whole decode step of SmolLM2 ran faster
through the compact stack up to 48 rows and 10% slower at 64, so no fixed bound suits
every CPU.

``measure`` estimates a step's projections both ways at a rising list of row counts
(``CANDIDATES``): one layer's four projections (a different layer each round, so the
weights come from memory as in a step) times the number of layers, plus the LM head,
timed on a slice of its outputs and scaled (both paths split the outputs into
independent blocks, so their time follows the outputs' count). It stops at the first
count where the dense matmul wins; ``choose`` turns the estimates into the bound. The
whole measurement takes a fraction of a second (about 0.3 s for SmolLM2 on 2 threads of
a Zen 1 EPYC).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from plugins.torch_executor.compact import BLOCK, WeightFormat, applies
from plugins.torch_executor.linear import Linear, bfloat16_linear
from plugins.torch_executor.native import Kernels
from plugins.torch_executor.weights import LlamaWeights

CANDIDATES = (4, 8, 16, 24, 32, 48, 64)
ROUNDS = 3  # per row count and path, alternating; the median of each is compared


@dataclass(frozen=True, slots=True)
class RowBound:
    """The bound (rows) and the estimates behind it: ``timings[rows] = (compact,
    dense)``, a step's projections in seconds (medians), for each row count measured."""

    rows: int
    timings: dict[int, tuple[float, float]]

    def describe(self) -> str:
        cells = ", ".join(
            f"{r}: {c * 1e3:.2f}/{d * 1e3:.2f} ms" for r, (c, d) in self.timings.items()
        )
        return f"compact projections up to {self.rows} rows (compact/dense per step: {cells})"


def choose(timings: dict[int, tuple[float, float]]) -> int:
    """The largest row count of an unbroken run, from the smallest, where the compact
    projections were no slower than the dense ones; 1 when they lost at the first."""
    rows = 1
    for r in sorted(timings):
        compact, dense = timings[r]
        if compact > dense:
            break
        rows = r
    return rows


HEAD_SLICES = 16  # the LM head is timed on 1 / HEAD_SLICES of its outputs


def measure(
    kernels: Kernels,
    weights: LlamaWeights,
    fmt: WeightFormat,
    dense: Callable[[Linear, torch.Tensor], torch.Tensor] = Linear.__call__,
) -> RowBound:
    """Estimate a step's projections over ``fmt`` and through ``dense`` (what runs the
    longer batches: oneDNN's float32 matmul, or ``linear.bfloat16_linear``) for
    ``CANDIDATES`` rows (module doc). The layers' layouts must be built (``ModelRunner``
    builds them first)."""
    a = weights.args
    gen = torch.Generator().manual_seed(0)
    layers = weights.layers
    head = weights.lm_head
    slice_rows = max(BLOCK, head.out_features // HEAD_SLICES // BLOCK * BLOCK)
    head_slice = Linear(head.weight[:slice_rows])
    head_scale = head.out_features / slice_rows
    with torch.inference_mode():
        head_slice.packed_weight()
        if dense is bfloat16_linear:
            head_slice.as_bfloat16().packed_weight()
        if applies(fmt, head_slice.out_features, head_slice.in_features):
            head_slice.compact_weight(fmt)
        timings: dict[int, tuple[float, float]] = {}
        turn = 0
        for rows in CANDIDATES:
            hidden = torch.randn(rows, a.hidden_size, generator=gen)
            attn = torch.randn(rows, a.num_heads * a.head_dim, generator=gen)
            inter = torch.randn(rows, a.intermediate_size, generator=gen)
            samples: dict[str, list[float]] = {"compact": [], "dense": []}
            # Untimed first: oneDNN builds its primitive for a new row count on first use.
            for linear, x in ((layers[0].qkv, hidden), (layers[0].o, attn),
                              (layers[0].gate_up, hidden), (layers[0].down, inter),
                              (head_slice, hidden)):  # fmt: skip
                dense(linear, x)
            for _ in range(ROUNDS):
                for path, estimate in samples.items():
                    layer = layers[turn % len(layers)]
                    turn += 1
                    run = (
                        partial(kernels.compact_linear, fmt, max_rows=rows)
                        if path == "compact"
                        else dense
                    )
                    start = time.perf_counter()
                    run(layer.qkv, hidden), run(layer.o, attn)
                    run(layer.gate_up, hidden), run(layer.down, inter)
                    mid = time.perf_counter()
                    run(head_slice, hidden)
                    end = time.perf_counter()
                    estimate.append(len(layers) * (mid - start) + head_scale * (end - mid))
            timings[rows] = (
                statistics.median(samples["compact"]),
                statistics.median(samples["dense"]),
            )
            if timings[rows][0] > timings[rows][1]:
                break
    return RowBound(choose(timings), timings)
