"""Every decoder layer of a step in one call of the CPU kernels (``csrc/stack.h``).

Run one op at a time, a decode step of SmolLM2 makes about 270 kernel calls (30 layers,
9 each), and each costs interpreter work, a tensor allocation and a parallel region
opened and closed: about a quarter of a batch-1 step on 2 threads of an AMD EPYC
(Zen 1), outside the kernels, and a stall whenever another process takes one of the
cores the region waits on. The stack runs the same ops, in the same order, on the same
numbers, inside one parallel region: its hidden states are the op-by-op path's, bit for
bit (a test holds it to that).

It runs a step whose rows all attend through the paged kernel (no SDPA chunk) where the
op-by-op path would run every layer through the kernels:

- the float32 model over weights in a compact format (``compact.py``) whose layout every
  projection has, over a float32, bfloat16 or float16 KV cache (``kv_cache_dtype``), for
  steps few enough rows for the compact projections (the bound the runner measured,
  ``row_bound.py``; longer ones take oneDNN's matmuls, one op at a time);
- the bfloat16 model with every layer projection on AMX tiles (``tile_linear``), which
  run any number of rows: every such step, prompt chunks attending on tiles too
  (``KernelRows.runs``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from plugins.torch_executor.compact import WeightFormat, applies
from plugins.torch_executor.linear import Linear
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels, kv_suffix
from plugins.torch_executor.paged import PagedKVCache, StepBatch
from plugins.torch_executor.weights import LlamaWeights


class DecodeStack:
    """The stack over one model's weights and KV cache. Build with ``for_model``."""

    def __init__(
        self,
        run: Callable[..., None],
        weights: LlamaWeights,
        cache: PagedKVCache,
        projection: Callable[[Linear], tuple[torch.Tensor, torch.Tensor | None]],
        max_rows: int | None,
        takes_runs: bool = False,
        gate_up: Callable[[Linear], tuple[torch.Tensor, torch.Tensor | None]] | None = None,
    ) -> None:
        """``run``: the kernels' export; ``projection(linear)``: the weight it reads and
        its scales (``None`` but for int8); ``max_rows``: the most rows a step may have
        (``None``: no bound); ``takes_runs``: whether it attends chunks on tiles;
        ``gate_up``: the gate/up projection's weight where it differs from
        ``projection``'s."""
        self.max_rows = max_rows
        self.takes_runs = takes_runs
        self._run = run
        self._weights = weights
        self._cache = cache
        addresses: list[int] = []
        for i, layer in enumerate(weights.layers):
            addresses += [layer.input_norm.data_ptr(), layer.post_norm.data_ptr()]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                own = gate_up if gate_up is not None and linear is layer.gate_up else projection
                values, scales = own(linear)
                addresses += [values.data_ptr(), 0 if scales is None else scales.data_ptr()]
            addresses += [cache.k[i].data_ptr(), cache.v[i].data_ptr()]
        # 12 per layer, in stack.h's ``StackLayer`` order; the tensors they point into
        # are the weights' and the cache's, which outlive this object.
        self._addresses = torch.tensor(addresses, dtype=torch.int64)

    @staticmethod
    def for_model(
        kernels: Kernels | None,
        weights: LlamaWeights,
        cache: PagedKVCache,
        fmt: WeightFormat,
        max_rows: int = COMPACT_MAX_ROWS,
    ) -> DecodeStack | None:
        """The stack for this model (module doc): over ``fmt`` weights for steps of up to
        ``max_rows`` rows (the compact projections' bound) for the float32 model, over
        AMX tiles for the bfloat16 model; ``None`` where it cannot run it: no kernels,
        not on the CPU, a projection without the layout, norms not contiguous."""
        if kernels is None or weights.device.type != "cpu":
            return None
        norms = [t for layer in weights.layers for t in (layer.input_norm, layer.post_norm)]
        if not all(t.is_contiguous() for t in norms):
            return None
        linears = [linear for layer in weights.layers for linear in layer.linears]
        if weights.dtype == torch.bfloat16 and kernels.has_tile_linear:
            if not all(linear.has_tile_layout for linear in linears) or any(
                layer.gate_up.out_features % 32 for layer in weights.layers
            ):
                return None
            return DecodeStack(
                kernels.lib.decode_stack_bf16_tiles,
                weights,
                cache,
                lambda linear: (linear.tile_weight(), None),
                max_rows=None,
                takes_runs=True,
                gate_up=lambda linear: (linear.gated_tile_weight(), None),
            )
        if weights.dtype != torch.float32:
            return None
        if not all(applies(fmt, x.out_features, x.in_features) for x in linears):
            return None
        run = getattr(kernels.lib, f"decode_stack_f32{kv_suffix(cache.k[0].dtype)}")

        def compact(linear: Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
            w = linear.compact_weight(fmt)
            return w.values, w.scales

        return DecodeStack(run, weights, cache, compact, max_rows)

    def runs(self, step: StepBatch) -> bool:
        """Whether ``step`` can run through the stack (module doc)."""
        kr = step.kernel_rows
        return (
            kr is not None
            and (kr.rows is None or (kr.runs is not None and self.takes_runs))
            and not step.chunks
            and step.num_tokens > 0
            and (self.max_rows is None or step.num_tokens <= self.max_rows)
        )

    def __call__(
        self, h: torch.Tensor, step: StepBatch, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Every layer on ``h``: ``[num_tokens, hidden]`` embeddings in the model's dtype
        (overwritten: it comes back as the last layer's output), writing the step's K/V
        into the cache; ``cos``/``sin``: the rotary table ``[max_len, head_dim]``.
        ``step`` must satisfy ``runs``."""
        kr = step.kernel_rows
        assert kr is not None and h.is_contiguous()
        a = self._weights.args
        kv_heads, num_blocks, hd, bs = self._cache.k[0].shape
        self._run(
            self._addresses.data_ptr(), a.num_layers, h.data_ptr(), h.shape[0], a.hidden_size,
            a.num_heads, kv_heads, hd, a.intermediate_size, a.rms_norm_eps,
            step.positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), step.slots.data_ptr(),
            kr.tables.data_ptr(), kr.seqs.data_ptr(), kr.lens.data_ptr(),
            0 if kr.rows is None else kr.rows.data_ptr(), kr.lens.numel(),
            0 if kr.runs is None else kr.runs.data_ptr(),
            0 if kr.runs is None else kr.runs.shape[0], num_blocks, bs,
            kr.tables.shape[1], kr.max_len, a.head_dim**-0.5, torch.get_num_threads(),
        )  # fmt: skip
        return h
