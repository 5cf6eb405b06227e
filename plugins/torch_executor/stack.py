"""Every decoder layer of a small step in one call of the CPU kernels (``csrc/stack.cpp``).

Run one op at a time, a decode step of SmolLM2 makes about 270 kernel calls (30 layers,
9 each), and each costs interpreter work, a tensor allocation and a parallel region
opened and closed: about a quarter of a batch-1 step on 2 threads of an AMD EPYC
(Zen 1), outside the kernels. The stack runs the same ops, in the same order, on the same numbers, inside
one parallel region: its hidden states are the op-by-op path's, bit for bit (a test
holds it to that).

It runs where the op-by-op path would run every layer through the kernels: float32
weights in a compact format (``compact.py``) whose layout every projection has, over a
float32 or bfloat16 KV cache (``matmul_dtype: bfloat16``), and a
step whose rows all attend through the paged kernel (no SDPA chunk) and are few enough
for the compact projections (the bound the runner measured, ``row_bound.py``).
"""

from __future__ import annotations

import torch

from plugins.torch_executor.compact import WeightFormat, applies
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels
from plugins.torch_executor.paged import PagedKVCache, StepBatch
from plugins.torch_executor.weights import LlamaWeights


class DecodeStack:
    """The stack over one model's weights and KV cache. Build with ``for_model``."""

    def __init__(
        self,
        kernels: Kernels,
        weights: LlamaWeights,
        cache: PagedKVCache,
        fmt: WeightFormat,
        max_rows: int = COMPACT_MAX_ROWS,
    ) -> None:
        self.max_rows = max_rows
        self._kernels = kernels
        self._weights = weights
        self._cache = cache
        addresses: list[int] = []
        for i, layer in enumerate(weights.layers):
            addresses += [layer.input_norm.data_ptr(), layer.post_norm.data_ptr()]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                w = linear.compact_weight(fmt)
                addresses += [w.values.data_ptr(), 0 if w.scales is None else w.scales.data_ptr()]
            addresses += [cache.k[i].data_ptr(), cache.v[i].data_ptr()]
        # 12 per layer, in stack.cpp's ``Layer`` order; the tensors they point into are
        # the weights' and the cache's, which outlive this object.
        self._addresses = torch.tensor(addresses, dtype=torch.int64)

    @staticmethod
    def for_model(
        kernels: Kernels | None,
        weights: LlamaWeights,
        cache: PagedKVCache,
        fmt: WeightFormat,
        max_rows: int = COMPACT_MAX_ROWS,
    ) -> DecodeStack | None:
        """The stack for steps of up to ``max_rows`` rows (the compact projections'
        bound), or ``None`` where it cannot run this model: no kernels, not float32, or
        a projection without a ``fmt`` layout."""
        if kernels is None or weights.dtype != torch.float32 or weights.device.type != "cpu":
            return None
        for layer in weights.layers:
            for linear in layer.linears:
                if not applies(fmt, linear.out_features, linear.in_features):
                    return None
        norms = [t for layer in weights.layers for t in (layer.input_norm, layer.post_norm)]
        if not all(t.is_contiguous() for t in norms):
            return None
        return DecodeStack(kernels, weights, cache, fmt, max_rows)

    def runs(self, step: StepBatch) -> bool:
        """Whether ``step`` can run through the stack (module doc)."""
        kr = step.kernel_rows
        return (
            kr is not None
            and kr.rows is None
            and not step.chunks
            and 0 < step.num_tokens <= self.max_rows
        )

    def __call__(
        self, h: torch.Tensor, step: StepBatch, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Every layer on ``h``: ``[num_tokens, hidden]`` float32 embeddings (overwritten:
        it comes back as the last layer's output), writing the step's K/V into the
        cache; ``cos``/``sin``: the rotary table ``[max_len, head_dim]``. ``step`` must
        satisfy ``runs``."""
        kr = step.kernel_rows
        assert kr is not None and kr.rows is None and h.is_contiguous()
        a = self._weights.args
        k0 = self._cache.k[0]
        kv_heads, num_blocks, hd, bs = k0.shape
        run = (
            self._kernels.lib.decode_stack_f32
            if k0.dtype == torch.float32
            else self._kernels.lib.decode_stack_f32_bf16kv
        )
        run(
            self._addresses.data_ptr(), a.num_layers, h.data_ptr(), h.shape[0], a.hidden_size,
            a.num_heads, kv_heads, hd, a.intermediate_size, a.rms_norm_eps,
            step.positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), step.slots.data_ptr(),
            kr.tables.data_ptr(), kr.seqs.data_ptr(), kr.lens.data_ptr(), num_blocks, bs,
            kr.tables.shape[1], kr.max_len, a.head_dim**-0.5, torch.get_num_threads(),
        )  # fmt: skip
        return h
