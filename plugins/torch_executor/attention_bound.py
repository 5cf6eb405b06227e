"""Up to how many rows a request's slice of a step attends through the paged kernel
rather than SDPA, measured at start on the CPU the executor runs on.

The paged kernel (``paged_attention_rows`` in csrc/ops.h) attends row by row over the
cache in place; SDPA's fused CPU kernel takes a chunk's scores in blocked matmuls over
a gathered context. Which is faster depends on the CPU, on the thread count and on the
kernels torch has for it, so no fixed bound suits every CPU:

- on one thread of an earlier CPU, one SmolLM2 layer after 256 cached tokens took 150
  against 178 us at 16 rows (kernel against SDPA) and 298 against 218 us at 32;
- on 2 threads of an AMD EPYC (Zen 4: AVX-512 with BF16, no AMX), the kernel won at
  every chunk measured, whole prefill steps included: a 256-token prompt 172 against
  206 ms (bfloat16), 313 against 345 ms (float32), a 512-token chunk after 1,536
  cached tokens 742 against 980 ms.

``measure`` times one layer's attention both ways (the RoPE and cache write, then the
attention itself, as a step runs them) on one sequence's chunk of a rising number of
rows (``CANDIDATES``), twice a round: from position 0 (a prompt's first chunk, whose
keys SDPA takes from the projection) and after as many cached tokens (a later chunk,
whose context SDPA gathers), summed. It stops at the first row count where SDPA wins;
``choose`` turns the timings into the bound. On 2 threads of that EPYC the measurement
takes about 0.1 s for SmolLM2, 0.2 s on 2 threads of a Sapphire Rapids Xeon. On a CPU so
slow that it passes ``BUDGET_S`` it stops there, and the kernel takes no more rows than
the largest count it measured: under qemu's Haswell emulation 128 rows took some 200
times as long as natively, and the whole list would have taken about 7 minutes.

The bound only moves work between two exact computations of the same attention; each
rounds differently, so greedy outputs near a tie may differ between CPUs that chose
differently (as they may with ``row_bound``'s choice). On one machine a sequence's rows
attend the same way whatever shares their step (``SequenceSlice.first_kernel_row``).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from plugins.torch_executor.model import RotaryTable
from plugins.torch_executor.native import Kernels
from plugins.torch_executor.paged import (
    KERNEL_MAX_ROWS,
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    build_step,
)
from plugins.torch_executor.weights import ModelArgs

CANDIDATES = (32, 64, 128, 256, 512)
ROUNDS = 3  # per row count and path, alternating; the median of each is compared
BUDGET_S = 10.0  # seconds after which the measurement takes no further row count
EVERY_CHUNK = sys.maxsize  # the bound when the kernel never lost: every slice takes it
BLOCK_SIZE = 16  # the measurement's own cache; attention's cost does not depend on it


@dataclass(frozen=True, slots=True)
class AttentionBound:
    """The bound (rows) and the timings behind it: ``timings[rows] = (kernel, sdpa)``,
    one layer's attention of a chunk of ``rows`` rows from position 0 plus one after
    ``rows`` cached tokens, in seconds (medians), for each row count measured;
    ``complete``: false when the measurement stopped at its time budget."""

    rows: int
    timings: dict[int, tuple[float, float]]
    complete: bool = True

    def describe(self) -> str:
        cells = ", ".join(
            f"{r}: {k * 1e3:.2f}/{s * 1e3:.2f} ms" for r, (k, s) in self.timings.items()
        )
        reach = "every chunk" if self.rows == EVERY_CHUNK else f"chunks up to {self.rows} rows"
        stopped = "" if self.complete else "; stopped at its time budget"
        return f"paged-kernel attention for {reach} (kernel/SDPA per layer: {cells}{stopped})"


def choose(timings: dict[int, tuple[float, float]], complete: bool = True) -> int:
    """The largest row count of an unbroken run, from the smallest, where the kernel
    was no slower than SDPA; when it never lost, ``EVERY_CHUNK`` if the measurement was
    ``complete`` (the two scale alike past the largest count measured: both read each
    row's context once per row block), else the largest count measured;
    ``KERNEL_MAX_ROWS`` when it lost at the first."""
    rows = KERNEL_MAX_ROWS
    for r in sorted(timings):
        kernel, sdpa = timings[r]
        if kernel > sdpa:
            return rows
        rows = r
    return EVERY_CHUNK if timings and complete else rows


def measure(
    kernels: Kernels,
    args: ModelArgs,
    rope: RotaryTable,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    budget_s: float = BUDGET_S,
) -> AttentionBound | None:
    """Time one layer's attention through the kernel and through SDPA for the
    ``CANDIDATES`` that fit ``rope``'s positions, taking no further count once
    ``budget_s`` seconds have passed (module doc), in ``dtype`` over a cache of
    ``kv_dtype`` (``None``: ``dtype``); ``None`` when none fits (a model length under 64
    tokens)."""
    fitting = [r for r in CANDIDATES if 2 * r <= rope.cos.shape[0]]
    if not fitting:
        return None
    one_layer = dataclasses.replace(args, num_layers=1)
    blocks = -(-2 * fitting[-1] // BLOCK_SIZE)
    cache = PagedKVCache(one_layer, blocks, BLOCK_SIZE, kv_dtype or dtype)
    table = list(range(blocks))
    gen = torch.Generator().manual_seed(0)
    width = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim

    def attention(rows: int, cached: int, kernel_max_rows: int) -> Callable[[], object]:
        chunk = SequenceSlice(0, rows, cached, table, False)
        step = build_step([chunk], BLOCK_SIZE, rope, cache.scratch_block, kernel_max_rows)
        attend = PagedAttention(cache, step, one_layer, rope, kernels)
        qkv = torch.randn(rows, width, generator=gen).to(dtype)
        return lambda: attend(0, qkv)

    def time_count(rows: int) -> tuple[float, float]:
        """One layer's attention of ``rows`` rows both ways, (kernel, SDPA), medians in
        seconds."""
        # kernel_max_rows = rows: the whole chunk through the kernel; 1: through SDPA
        # (a slice that does not sample keeps no rows for the kernel).
        paths = {
            path: [attention(rows, cached, bound) for cached in (0, rows)]
            for path, bound in (("kernel", rows), ("sdpa", 1))
        }
        for calls in paths.values():  # untimed first: first-use allocations
            for call in calls:
                call()
        samples: dict[str, list[float]] = {path: [] for path in paths}
        for _ in range(ROUNDS):
            for path, calls in paths.items():
                start = time.perf_counter()
                for call in calls:
                    call()
                samples[path].append(time.perf_counter() - start)
        return statistics.median(samples["kernel"]), statistics.median(samples["sdpa"])

    with torch.inference_mode():
        return scan(time_count, fitting, budget_s)


def scan(
    time_count: Callable[[int], tuple[float, float]],
    counts: list[int],
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> AttentionBound:
    """The bound from ``time_count(rows) = (kernel, sdpa)`` seconds over ``counts``
    (rising), up to the first SDPA wins, or to the count at which ``clock`` shows
    ``budget_s`` seconds passed since the start (then the bound is not ``complete``)."""
    started = clock()
    timings: dict[int, tuple[float, float]] = {}
    complete = True
    for rows in counts:
        timings[rows] = time_count(rows)
        if timings[rows][0] > timings[rows][1]:
            break
        if rows != counts[-1] and clock() - started > budget_s:
            complete = False
            break
    return AttentionBound(choose(timings, complete), timings, complete)
