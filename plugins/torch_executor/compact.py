"""Projection weights stored in fewer bytes for the float32 model on CPUs without native
bfloat16, in the layout the CPU kernels' compact projections read (``csrc/kernels.cpp``).

A decode step reads every weight once and waits on memory, so its time follows the
bytes the weights take: float32 4, ``bfloat16`` 2, ``int8`` 1 + 1/16 (one float32 scale
per group of 64 inputs of an output, symmetric: ``W = q * scale``, ``|q| <= 127``).
With ``bfloat16`` the kernels widen the weights in registers and compute in float32;
with ``int8`` they quantise the activations to int16 per row and group of 64 and sum
the integer products exactly in int32 per group (``csrc/vec.h`` says why int16).

Layout, for each block of 16 outputs one contiguous stream:

- ``int8``: ``values`` ``[out / 16, in / 4, 16, 4]``, 4 consecutive inputs of an output
  adjacent (the weights of one step of the kernels' integer dot products: pairs of
  inputs per ``madd``/``dpwssd`` lane); ``scales`` ``[out / 16, in / 64, 16]``;
- ``bfloat16``: ``values`` ``[out / 16, in, 16]``, input by input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

INT8_GROUP = 64  # inputs per scale; the kernels' QGROUP
BLOCK = 16  # outputs per block


class WeightFormat(StrEnum):
    """How projection weights are stored: ``dense`` in the model's dtype, or compactly."""

    DENSE = "dense"
    INT8 = "int8"
    BFLOAT16 = "bfloat16"


@dataclass(frozen=True, slots=True)
class CompactWeight:
    """A ``[out_features, in_features]`` weight in ``format``'s layout (module doc)."""

    format: WeightFormat
    values: torch.Tensor  # int8 [out / 16, in / 4, 16, 4]; bfloat16 [out / 16, in, 16]
    scales: torch.Tensor | None  # [out / 16, in / 64, 16] float32 for int8, else None

    @property
    def num_bytes(self) -> int:
        """Bytes a matmul reads: the values and the scales."""
        scales = 0 if self.scales is None else self.scales.numel() * 4
        return self.values.numel() * self.values.element_size() + scales

    def dense(self) -> torch.Tensor:
        """The float32 ``[out, in]`` weight this layout stands for (the kernels' exact
        weight operand)."""
        w = self.values.float()
        if self.scales is not None:  # [blocks, in / 4, 16, 4] -> [blocks, in, 16]
            blocks, quads = w.shape[:2]
            w = w.permute(0, 1, 3, 2).reshape(blocks, quads * 4, BLOCK)
            w = w * self.scales.repeat_interleave(INT8_GROUP, dim=1)
        blocks, inp, _ = w.shape
        return w.permute(0, 2, 1).reshape(blocks * BLOCK, inp)


def applies(fmt: WeightFormat, out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape has a ``fmt`` layout: whole blocks of 16 outputs,
    and whole groups of 64 inputs for int8."""
    if fmt is WeightFormat.DENSE or out_features % BLOCK:
        return False
    return in_features % INT8_GROUP == 0 if fmt is WeightFormat.INT8 else True


def compact(weight: torch.Tensor, fmt: WeightFormat) -> CompactWeight:
    """``weight`` ``[out, in]`` (any float dtype, on the CPU) in ``fmt``'s layout; raises
    ``ValueError`` where ``applies`` is false."""
    out, inp = weight.shape
    if not applies(fmt, out, inp):
        raise ValueError(f"no {fmt} layout for a {out}x{inp} weight")
    w = weight.float()
    scales = None
    if fmt is WeightFormat.INT8:
        groups = w.view(out, inp // INT8_GROUP, INT8_GROUP)
        scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / 127.0
        q = torch.round(groups / scale).clamp_(-127, 127).to(torch.int8).view(out, inp)
        scales = scale.view(out // BLOCK, BLOCK, inp // INT8_GROUP).permute(0, 2, 1).contiguous()
        blocked = q.view(out // BLOCK, BLOCK, inp // 4, 4).permute(0, 2, 1, 3).contiguous()
    else:
        values = w.to(torch.bfloat16)
        blocked = values.view(out // BLOCK, BLOCK, inp).permute(0, 2, 1).contiguous()
    return CompactWeight(fmt, blocked, scales)
