"""Shape buckets for the CPU: the row and context counts a step's oneDNN matmuls and
prefill attention run at (the CPU kernels' AMX projections keep no per-shape state and
run at exact row counts).

oneDNN (through ideep) keeps a compiled primitive per matmul input shape, and the CPU
flash-attention kernel of ``scaled_dot_product_attention`` compiles a small GEMM kernel
per tail size of its query and key blocks and keeps every one for the life of the
process. A server meets a new row count every few steps (it follows the batch) and a new
(rows, context) pair with every prefill chunk, so before bucketing its resident memory
grew by about 1 MiB per request, without bound, and each new shape cost milliseconds to
compile. Run at bucketed shapes, the process meets a few hundred shapes at most, all in
its first minutes; on this project's machines a masked prefill chunk of 17-256 rows also
ran 2x faster (0.40 vs 0.81 ms a call, the compile cost gone).

On a GPU nothing is padded (cuBLAS and SDPA keep no per-shape state that grows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Row counts up to this run exactly; above it, at one of 8 steps per power of two.
EXACT_ROWS = 8
# Attention contexts round up to a multiple of this many keys.
CONTEXT_STEP = 64


def padded_rows(rows: int) -> int:
    """The bucket ``rows`` rounds up to: ``rows`` itself up to 8, then the next multiple
    of ``2**(k - 3)`` for rows in ``(2**k, 2**(k + 1)]`` (8 buckets per power of two, at
    most 12.5% extra rows)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << ((rows - 1).bit_length() - 4)
    return -(-rows // step) * step


def padded_context(context: int) -> int:
    """``context`` (keys) rounded up to a multiple of ``CONTEXT_STEP``."""
    return -(-context // CONTEXT_STEP) * CONTEXT_STEP


def pad_dim(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` with zeros appended along ``dim`` up to ``size`` (``x`` itself when it is
    that long already)."""
    extra = size - x.shape[dim]
    if extra == 0:
        return x
    # F.pad's pairs run from the last dimension backwards.
    pairs = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return F.pad(x, pairs)
