"""Up to how many rows the compact projections beat the dense matmul the longer batches run
(oneDNN's float32 matmul, or bfloat16 matmuls with ``matmul_dtype: bfloat16``), measured
at start on the CPU the executor runs on.

A few rows read every weight once and wait on memory, so the compact weights, read in
fewer bytes, win; with more rows both are bound by the CPU's multiply rate, and which
wins depends on the CPU (its vector units, VNNI or not, its caches) and the thread
count. On 2 threads of an AMD EPYC (Zen 1), a whole decode step of SmolLM2 ran faster
through the compact stack up to 48 rows and 10% slower at 64, so no fixed bound suits
every CPU.

``measure`` estimates a step's projections both ways at a row count: one layer's four
projections (a different layer each round, so the weights come from memory as in a
step) times the number of layers, plus the LM head, timed on a slice of its outputs and
scaled (both paths split the outputs into independent blocks, so their time follows the
outputs' count). It takes the largest count (``CANDIDATES[-1]``) first: when the compact
weights win there by ``CLEAR_WIN`` they win every smaller count too (fewer rows only
make the projections more bound by memory, where compact weights read fewer bytes), and
that count is the bound. Otherwise it goes up the list from the smallest and stops at
the first count where the dense matmul wins; ``choose`` turns the estimates into the
bound. The whole measurement takes a fraction of a second (about 0.3 s for SmolLM2 on 2
threads of a Zen 1 EPYC, 0.2 s on 2 threads of a Sapphire Rapids Xeon); on a CPU so
slow that going up the list passes ``BUDGET_S``, it stops there and keeps the counts it
measured (under qemu's Haswell emulation oneDNN's float32 matmul ran some 3,000 times
slower than natively, the compact kernels some 100 times: 64 rows took 568 against 14 s
a step, and the whole list 280 s).
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
CLEAR_WIN = 1.2  # dense / compact at the largest count that settles the bound at once
BUDGET_S = 10.0  # seconds after which going up the list stops (a very slow CPU)


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
    budget_s: float = BUDGET_S,
) -> RowBound:
    """Estimate a step's projections over ``fmt`` and through ``dense`` (what runs the
    longer batches: oneDNN's float32 matmul, or ``linear.bfloat16_linear``): at the
    largest of ``CANDIDATES`` first, then up the list until the dense matmul wins or
    ``budget_s`` seconds have passed (module doc). The layers' layouts must be built
    (``ModelRunner`` builds them first)."""
    a = weights.args
    gen = torch.Generator().manual_seed(0)
    layers = weights.layers
    head = weights.lm_head
    slice_rows = max(BLOCK, head.out_features // HEAD_SLICES // BLOCK * BLOCK)
    head_slice = Linear(head.weight[:slice_rows])
    head_scale = head.out_features / slice_rows
    turn = 0

    def estimate(rows: int) -> tuple[float, float]:
        """A step's projections at ``rows`` rows, (compact, dense), medians in seconds."""
        nonlocal turn
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
            for path, times in samples.items():
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
                times.append(len(layers) * (mid - start) + head_scale * (end - mid))
        return statistics.median(samples["compact"]), statistics.median(samples["dense"])

    with torch.inference_mode():
        head_slice.packed_weight()
        if dense is bfloat16_linear:
            head_slice.as_bfloat16().packed_weight()
        if applies(fmt, head_slice.out_features, head_slice.in_features):
            head_slice.compact_weight(fmt)
        return search(estimate, budget_s)


def search(
    estimate: Callable[[int], tuple[float, float]],
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> RowBound:
    """The bound from ``estimate(rows) = (compact, dense)`` seconds: the largest of
    ``CANDIDATES`` when the compact weights win it by ``CLEAR_WIN``, else ``choose`` over
    the counts from the smallest up to the first the dense matmul wins, or to the count
    at which ``clock`` shows ``budget_s`` seconds passed since the start."""
    started = clock()
    largest = CANDIDATES[-1]
    top = estimate(largest)
    if top[0] * CLEAR_WIN <= top[1]:
        return RowBound(largest, {largest: top})
    timings: dict[int, tuple[float, float]] = {}
    for rows in CANDIDATES:
        timings[rows] = top if rows == largest else estimate(rows)
        lost = timings[rows][0] > timings[rows][1]
        if lost or clock() - started > budget_s:
            break
    return RowBound(choose(timings), timings)
