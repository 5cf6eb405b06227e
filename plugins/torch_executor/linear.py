"""``y = x @ W.T`` over a weight kept dense, plus the one layout its matmul reads, built
on first use.

Two ways to run it on CPU:

- **AMX tiles** (the CPU kernels' ``tile_linear``, ``native.py``), in bfloat16 where the
  CPU has AMX: ``tile_weight()`` is the weight as AMX's B tiles. The kernels' ``Ops``
  route every projection of a layer there.
- **Compact weights** (``compact.py``: int8 with per-group scales, or bfloat16) for the
  float32 model's decode-sized matmuls: ``compact_weight(fmt)``, which the CPU kernels'
  compact projections read.
- **bfloat16 matmuls for the float32 model** (``bfloat16_linear``, ``bfloat16_linear_add``)
  where the CPU computes bfloat16 natively: the activations rounded to bfloat16 meet
  ``as_bfloat16()``, a copy of the layer over the weight rounded once to bfloat16; the
  product is bfloat16, and residual sums stay float32. What the float32 model runs for
  the batches its compact weights do not take (``matmul_dtype``).
- **oneDNN**, everywhere else: ``__call__`` and ``add``. ``F.linear`` on CPU reorders the
  weight for oneDNN (bfloat16) or calls MKL (float32) on every call; packing once and
  calling oneDNN's linear directly ran 2-3x faster at decode sizes (1-64 rows) and
  15-60% faster at prefill sizes (512 rows) here, with bit-identical bfloat16 results
  and float32 results within ~1e-6. Where oneDNN is unavailable, or the weight is on a
  GPU, ``F.linear`` runs on the dense weight.

``add(x, residual)`` computes ``residual + x @ W.T`` with the add done by the matmul
itself (oneDNN's binary post-op; ``addmm`` on dense weights), which saves a pass over the
activations and an op per residual connection; in bfloat16 the sum is rounded once,
where the unfused form rounds the product and then the sum.

For the attention output and down projections, oneDNN's packed kernels fell behind a
dense ``addmm`` from about 384 rows (at 512 rows: 259 vs 161 us for the output
projection, 607 vs 393 us for the down projection, bfloat16, 2 threads), so those layers
switch to the dense weight for long chunks (``dense_from_rows``).

On CPU every oneDNN matmul runs at a bucketed row count (``buckets.padded_rows``), so
oneDNN's per-shape primitives stay few. The tile kernel keeps no per-shape state.

oneDNN's bfloat16 matmuls need AVX-NE-CONVERT or AVX-512 BW/VL/DQ (``cpu_features``);
without them a bfloat16 weight is not packed and ``F.linear`` runs on the dense weight.

Memory: the dense weight plus the layouts in use (oneDNN's packed copy, the tiles, a
compact copy), each built by the first call that needs it (``ModelRunner`` builds them
at start).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plugins.torch_executor.buckets import pad_dim, padded_rows
from plugins.torch_executor.compact import CompactWeight, WeightFormat, compact
from plugins.torch_executor.cpu_features import detect

# oneDNN picks its blocking from an expected row count; 64 was as fast as the best
# choice from 1 to 512 rows in both dtypes.
_ROWS_HINT = 64


class Linear:
    """A bias-free linear layer over ``weight``: ``[out_features, in_features]``."""

    def __init__(
        self, weight: torch.Tensor, pack: bool = True, dense_from_rows: int | None = None
    ) -> None:
        """``pack``: run oneDNN on a packed copy (CPU, where oneDNN is available);
        ``dense_from_rows``: use the dense weight instead from that many rows."""
        self.weight = weight
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self._dense_from_rows = dense_from_rows
        self._on_cpu = weight.device.type == "cpu"  # oneDNN matmuls bucket rows there
        self._pack = pack and self._on_cpu and torch.backends.mkldnn.is_available()
        if self.dtype == torch.bfloat16 and not detect().onednn_bfloat16:
            self._pack = False  # oneDNN's bfloat16 reorder raises on this CPU
        self._pack_asked = pack
        self._packed: torch.Tensor | None = None
        self._tiles: torch.Tensor | None = None
        self._gated_tiles: torch.Tensor | None = None
        self._compact: dict[WeightFormat, CompactWeight] = {}
        self._bfloat16: Linear | None = None

    @property
    def num_bytes(self) -> int:
        """Bytes of one copy of the weight (what a forward pass reads)."""
        return self.weight.numel() * self.weight.element_size()

    @property
    def has_tile_layout(self) -> bool:
        """Whether ``tile_weight`` applies: a CPU bfloat16 weight of a multiple of 16
        outputs and of 32 inputs (whole tiles)."""
        return (
            self._on_cpu
            and self.dtype == torch.bfloat16
            and self.out_features % 16 == 0
            and self.in_features % 32 == 0
        )

    def tile_weight(self) -> torch.Tensor:
        """``[out / 16, in / 2, 16, 2]``: for each block of 16 outputs, consecutive pairs
        of inputs (AMX's B-tile layout, which the CPU kernels' ``tile_linear`` reads).
        Built on the first call; raises ``ValueError`` where ``has_tile_layout`` is false."""
        if self._tiles is None:
            if not self.has_tile_layout:
                raise ValueError(
                    f"no tile layout for a {self.dtype} {self.out_features}x"
                    f"{self.in_features} weight on {self.weight.device}"
                )
            out, inp = self.out_features, self.in_features
            self._tiles = (
                self.weight.view(out // 16, 16, inp // 2, 2).permute(0, 2, 1, 3).contiguous()
            )
        return self._tiles

    def gated_tile_weight(self) -> torch.Tensor:
        """The tile layout (``tile_weight``) of a gate/up projection, whose first half of
        outputs are the gates and the second the values they gate, with each block of 16
        gates followed by the block of 16 values it gates: one pair of output blocks holds
        both, which lets ``tile_gated_silu`` apply SiLU as it stores them. Built on the
        first call; ``ValueError`` as ``tile_weight``, or for an odd number of 16-output
        blocks."""
        if self._gated_tiles is None:
            if not self.has_tile_layout or self.out_features % 32 != 0:
                raise ValueError(
                    f"no gated tile layout for a {self.dtype} {self.out_features}x"
                    f"{self.in_features} weight on {self.weight.device}"
                )
            out, inp = self.out_features, self.in_features
            # [2 (gate, up), blocks, 16, in] -> [blocks, 2, 16, in]: blocks interleaved.
            paired = self.weight.view(2, out // 32, 16, inp).transpose(0, 1)
            self._gated_tiles = (
                paired.reshape(out // 16, 16, inp // 2, 2).permute(0, 2, 1, 3).contiguous()
            )
        return self._gated_tiles

    def compact_weight(self, fmt: WeightFormat) -> CompactWeight:
        """The weight in ``fmt``'s compact layout (``compact.py``), built on the first call;
        ``ValueError`` where the shape has none."""
        if fmt not in self._compact:
            self._compact[fmt] = compact(self.weight, fmt)
        return self._compact[fmt]

    def as_bfloat16(self) -> Linear:
        """This layer over its weight rounded to bfloat16 (itself when it is bfloat16),
        packed and switched to the dense weight as this one is; built on the first call."""
        if self.dtype == torch.bfloat16:
            return self
        if self._bfloat16 is None:
            self._bfloat16 = Linear(
                self.weight.to(torch.bfloat16), self._pack_asked, self._dense_from_rows
            )
        return self._bfloat16

    def packed_weight(self) -> torch.Tensor | None:
        """oneDNN's packed copy, built on the first call; ``None`` without ``pack``."""
        if self._packed is None and self._pack:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _ROWS_HINT)
        return self._packed

    def _packed_for(self, rows: int) -> torch.Tensor | None:
        """The packed copy for a matmul of ``rows`` rows, or ``None`` for the dense one."""
        if self._dense_from_rows is not None and rows >= self._dense_from_rows:
            return None
        return self.packed_weight()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in_features]`` -> ``[rows, out_features]``."""
        rows = x.shape[0]
        padded = padded_rows(rows) if self._on_cpu else rows
        if padded != rows:
            x = pad_dim(x, 0, padded)
        packed = self._packed_for(padded)
        if packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        else:
            y = F.linear(x, self.weight)
        return y if padded == rows else y[:rows]

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + x @ W.T``: ``x`` ``[rows, in_features]``, ``residual`` ``[rows,
        out_features]`` (contiguous) -> a new ``[rows, out_features]``."""
        rows = x.shape[0]
        padded = padded_rows(rows) if self._on_cpu else rows
        if padded != rows:
            x, residual = pad_dim(x, 0, padded), pad_dim(residual, 0, padded)
        packed = self._packed_for(padded)
        if packed is not None:
            y = torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, None, "add")
        else:
            y = torch.addmm(residual, x, self.weight.t())
        return y if padded == rows else y[:rows]


def bfloat16_linear(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` through ``layer.as_bfloat16()``: ``x`` rounded to bfloat16, products
    summed in float32 and rounded once to bfloat16 (oneDNN's output, returned as is:
    the ops that read it widen it where they need float32)."""
    return layer.as_bfloat16()(x.to(torch.bfloat16))


def bfloat16_linear_add(layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + bfloat16_linear(layer, x)``, summed in ``residual``'s dtype (float32 for
    the float32 model: its residual stream keeps float32's precision)."""
    return residual + bfloat16_linear(layer, x)
