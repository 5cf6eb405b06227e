"""Projection weights stored in fewer bytes for the float32 model on CPUs without native
bfloat16, in the layout the CPU kernels' compact projections read (``csrc/kernels.cpp``).

A decode step reads every weight once and waits on memory, so its time follows the
bytes the weights take: float32 4, ``bfloat16`` 2, ``int8`` 1 + 1/16 (one float32 scale
per group of 64 inputs of an output, symmetric: ``W = q * scale``, ``|q| <= 127``).
Arithmetic stays float32: the kernels widen the weights in registers.

Layout: ``values`` ``[out / 16, in, 16]``: for each block of 16 outputs, input by input,
so a block is one contiguous stream; ``scales`` ``[out / 16, in / 64, 16]`` (int8 only).
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
    values: torch.Tensor  # [out / 16, in, 16], int8 or bfloat16
    scales: torch.Tensor | None  # [out / 16, in / 64, 16] float32 for int8, else None

    @property
    def num_bytes(self) -> int:
        """Bytes a matmul reads: the values and the scales."""
        scales = 0 if self.scales is None else self.scales.numel() * 4
        return self.values.numel() * self.values.element_size() + scales

    def dense(self) -> torch.Tensor:
        """The float32 ``[out, in]`` weight this layout stands for (the kernels' exact
        operand: their results are this times ``x``, summed in float32)."""
        blocks, inp, _ = self.values.shape
        w = self.values.float()  # [blocks, in, 16]
        if self.scales is not None:
            w = w * self.scales.repeat_interleave(INT8_GROUP, dim=1)
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
        values = q
    else:
        values = w.to(torch.bfloat16)
    blocked = values.view(out // BLOCK, BLOCK, inp).permute(0, 2, 1).contiguous()
    return CompactWeight(fmt, blocked, scales)
