"""How GPU memory divides between the weights and the KV cache of one replica."""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.common.specs import DTYPE_BYTES, DType, GPUSpec, ModelSpec


class DoesNotFitError(ValueError):
    """The weights leave no room for a KV cache on the GPUs given."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Memory of each GPU of a ``tp``-way replica, in bytes.

    ``kv_bytes_per_token`` is per GPU (each holds its share of the KV heads);
    ``kv_tokens`` is how many tokens' K/V the replica holds.
    """

    gpu_memory_bytes: float
    weight_bytes: float
    kv_bytes: float
    kv_bytes_per_token: float
    kv_tokens: int
    tp: int

    def kv_blocks(self, block_size: int) -> int:
        """Whole KV blocks of ``block_size`` tokens that fit."""
        return self.kv_tokens // block_size

    def max_sequences(self, context_len: int, block_size: int = 1) -> int:
        """Sequences of ``context_len`` tokens (prompt plus output) whose K/V fit at once,
        each rounded up to whole blocks."""
        per_seq = math.ceil(context_len / block_size)
        return self.kv_blocks(block_size) // per_seq


def memory_plan(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    weight_dtype: DType,
    kv_dtype: DType,
    tp: int,
    kv_memory_fraction: float,
) -> MemoryPlan:
    """Weights first (every parameter, the embedding table included, split ``tp`` ways),
    then ``kv_memory_fraction`` of what is left for the KV cache.

    Raises ``DoesNotFitError`` when the weights take all of the memory.
    """
    weights = model.num_params * DTYPE_BYTES[weight_dtype] / tp
    free = gpu.memory_bytes - weights
    if free <= 0:
        raise DoesNotFitError(
            f"{model.name} weights in {weight_dtype} need {weights / 1e9:.1f} GB per GPU at "
            f"tp={tp}, more than the {gpu.memory_bytes / 1e9:.0f} GB of {gpu.name}; "
            "use a larger tp or a smaller weight dtype"
        )
    per_token = model.kv_bytes_per_token(kv_dtype, min(tp, model.num_kv_heads))
    kv = free * kv_memory_fraction
    return MemoryPlan(
        gpu_memory_bytes=gpu.memory_bytes,
        weight_bytes=weights,
        kv_bytes=kv,
        kv_bytes_per_token=per_token,
        kv_tokens=int(kv // per_token),
        tp=tp,
    )
