"""``y = x @ W.T`` with the weight reordered once into oneDNN's blocked layout.

``F.linear`` on CPU reorders the weight for oneDNN (bfloat16) or calls MKL (float32) on
every call. Packing once at load time and calling oneDNN's linear directly ran 2-3x
faster at decode sizes (1-64 rows) and 15-60% faster at prefill sizes (512 rows) on
this project's machines, with bit-identical bfloat16 results and float32 results within
~1e-6. Where oneDNN is unavailable, or the weight is on a GPU, the dense weight is kept
and ``F.linear`` is used.

``add(x, residual)`` computes ``residual + x @ W.T`` with the add done by the matmul
itself (oneDNN's binary post-op; ``addmm`` on dense weights), which saves a pass over the
activations and an op per residual connection; in bfloat16 the sum is rounded once,
where the unfused form rounds the product and then the sum.

For the attention output and down projections, oneDNN's packed kernels fell behind a
dense ``addmm`` from about 384 rows (at 512 rows: 259 vs 161 us for the output
projection, 607 vs 393 us for the down projection, bfloat16, 2 threads), so those layers
keep the dense weight as well (``dense_from_rows``) and switch to it for long chunks.

On CPU every matmul runs at a bucketed row count (``buckets.padded_rows``), so oneDNN's
per-shape primitives stay few.

For up to 64 rows in bfloat16 the CPU kernels' AMX linear reads the weight faster than
oneDNN does (``native.py``); with ``tiles=True`` a CPU bfloat16 layer also keeps the
layout it reads (``tile_weight``), one more copy of the weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plugins.torch_executor.buckets import pad_dim, padded_rows

# oneDNN picks its blocking from an expected row count; 64 was as fast as the best
# choice from 1 to 512 rows in both dtypes.
_ROWS_HINT = 64


def _has_tile_layout(weight: torch.Tensor) -> bool:
    out, inp = weight.shape
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and out % 16 == 0
        and inp % 32 == 0
    )


class Linear:
    """A bias-free linear layer over ``weight``: ``[out_features, in_features]``."""

    def __init__(
        self,
        weight: torch.Tensor,
        pack: bool = True,
        dense_from_rows: int | None = None,
        tiles: bool = False,
    ) -> None:
        """``dense_from_rows``: also keep the dense weight and use it for inputs of at
        least that many rows (``None``: the packed copy replaces the dense one).
        ``tiles``: also keep ``tile_weight`` where that layout applies (a CPU bfloat16
        weight of a multiple of 16 outputs and of 32 inputs)."""
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self._packed: torch.Tensor | None = None
        self._dense: torch.Tensor | None = weight
        self._dense_from_rows = dense_from_rows
        self._bucketed = weight.device.type == "cpu"  # see buckets.py
        self.tile_weight: torch.Tensor | None = None
        """``[out / 16, in / 2, 16, 2]``: for each block of 16 outputs, consecutive pairs
        of inputs (AMX's B-tile layout, the CPU kernels' ``tile_linear``), or ``None``."""
        if tiles and _has_tile_layout(weight):
            out, inp = weight.shape
            self.tile_weight = (
                weight.view(out // 16, 16, inp // 2, 2).permute(0, 2, 1, 3).contiguous()
            )
        if pack and weight.device.type == "cpu" and torch.backends.mkldnn.is_available():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
            if dense_from_rows is None:
                self._dense = None  # keep one copy in memory

    def _use_packed(self, x: torch.Tensor) -> bool:
        if self._packed is None:
            return False
        return self._dense_from_rows is None or x.shape[0] < self._dense_from_rows

    @property
    def num_bytes(self) -> int:
        return (
            self.out_features * self.in_features * torch.empty((), dtype=self.dtype).element_size()
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in_features]`` -> ``[rows, out_features]``."""
        rows = x.shape[0]
        padded = padded_rows(rows) if self._bucketed else rows
        if padded != rows:
            x = pad_dim(x, 0, padded)
        if self._use_packed(x):
            y = torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        else:
            assert self._dense is not None
            y = F.linear(x, self._dense)
        return y if padded == rows else y[:rows]

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + x @ W.T``: ``x`` ``[rows, in_features]``, ``residual`` ``[rows,
        out_features]`` (contiguous) -> a new ``[rows, out_features]``."""
        rows = x.shape[0]
        padded = padded_rows(rows) if self._bucketed else rows
        if padded != rows:
            x, residual = pad_dim(x, 0, padded), pad_dim(residual, 0, padded)
        if self._use_packed(x):
            y = torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._packed, None, "add")
        else:
            assert self._dense is not None
            y = torch.addmm(residual, x, self._dense.t())
        return y if padded == rows else y[:rows]
