"""Decode steps replayed from captured CUDA graphs.

A decode step of a small model on a GPU is mostly kernel-launch time: about ten kernels
per layer, each a few microseconds of work. A CUDA graph launches the whole step at once.
A graph fixes every shape, so steps are bucketed: the batch is padded up to a power of
two, and the block tables to a power-of-two width. Each (batch, width) bucket is captured
the first time a step needs it; a step larger than the largest bucket runs eagerly.

Padded rows decode token 0 at position 0 into the cache's scratch block, which no
request owns, and their logits are dropped. The captured forward is the same torch-op
forward an eager CUDA step runs (``PagedAttention`` without CPU kernels), over static
input buffers that each replay refills.

``capture=False`` runs the same bucketed forward over the same buffers without a graph,
so the padding and bucketing are tested on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from plugins.torch_executor.model import RotaryTable, compute_logits, forward_hidden
from plugins.torch_executor.paged import (
    KernelRows,
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    StepBatch,
)
from plugins.torch_executor.weights import LlamaWeights

MAX_GRAPH_BATCH = 256


def bucket(n: int) -> int:
    """The smallest power of two ``>= n``."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _Graph:
    tokens: torch.Tensor  # [batch] int64
    positions: torch.Tensor  # [batch] int64
    slots: torch.Tensor  # [batch] int64
    tables: torch.Tensor  # [batch, width] int64
    lens: torch.Tensor  # [batch] int64
    logits: torch.Tensor  # [batch, vocab] float32, written by each replay
    replay: Callable[[], object]


class DecodeGraphs:
    """Captured decode forwards keyed by (padded batch, padded block-table width).

    ``run`` takes a step in which every request decodes one token and samples, and
    returns float32 logits ``[requests, vocab]`` on the device, or ``None`` when the step
    exceeds ``max_batch`` requests (the caller then runs it eagerly).
    """

    def __init__(
        self,
        weights: LlamaWeights,
        cache: PagedKVCache,
        rope: RotaryTable,
        max_model_len: int,
        *,
        capture: bool,
        max_batch: int = MAX_GRAPH_BATCH,
    ) -> None:
        self.weights = weights
        self.cache = cache
        self.rope = rope
        self.capture = capture
        self.max_batch = max_batch
        self.max_width = -(-max_model_len // cache.block_size)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def run(self, seqs: Sequence[SequenceSlice], token_ids: Sequence[int]) -> torch.Tensor | None:
        """``seqs``: one slice per request, each with one row; ``token_ids``: their
        tokens, in order."""
        n = len(token_ids)
        if n > self.max_batch:
            return None
        bs = self.cache.block_size
        width = min(bucket(max(s.num_blocks(bs) for s in seqs)), self.max_width)
        graph = self._graph(bucket(n), width)
        scratch = self.cache.scratch_block
        pad = graph.tokens.shape[0] - n
        positions = [s.start_position for s in seqs] + [0] * pad
        slots = [
            s.block_table[s.start_position // bs] * bs + s.start_position % bs for s in seqs
        ] + [scratch * bs] * pad
        tables = [
            list(s.block_table[: s.num_blocks(bs)]) + [scratch] * (width - s.num_blocks(bs))
            for s in seqs
        ] + [[scratch] * width] * pad
        device = graph.tokens.device
        graph.tokens.copy_(torch.tensor(list(token_ids) + [0] * pad, device=device))
        graph.positions.copy_(torch.tensor(positions, device=device))
        graph.slots.copy_(torch.tensor(slots, device=device))
        graph.tables.copy_(torch.tensor(tables, device=device))
        graph.lens.copy_(torch.tensor([p + 1 for p in positions], device=device))
        graph.replay()
        return graph.logits[:n]

    def _graph(self, batch: int, width: int) -> _Graph:
        key = (batch, width)
        if key not in self.graphs:
            self.graphs[key] = self._build(batch, width)
        return self.graphs[key]

    def _build(self, batch: int, width: int) -> _Graph:
        device = self.weights.device
        scratch = self.cache.scratch_block
        bs = self.cache.block_size

        def full(value: int, *shape: int) -> torch.Tensor:
            return torch.full(shape, value, dtype=torch.int64, device=device)

        tokens, positions = full(0, batch), full(0, batch)
        slots, lens = full(scratch * bs, batch), full(1, batch)
        tables = full(scratch, batch, width)
        seqs = torch.arange(batch, device=device)
        args = self.weights.args
        logits = torch.empty(batch, args.vocab_size, dtype=torch.float32, device=device)

        def forward() -> None:
            step = StepBatch(
                num_tokens=batch,
                positions=positions,
                slots=slots,
                cos=self.rope.cos[positions].unsqueeze(1),
                sin=self.rope.sin[positions].unsqueeze(1),
                kernel_rows=KernelRows(None, tables, seqs, lens, width * bs),
                chunks=[],
            )
            attention = PagedAttention(self.cache, step, args, self.rope, kernels=None)
            hidden = forward_hidden(self.weights, tokens, attention)
            logits.copy_(compute_logits(self.weights, hidden))

        replay: Callable[[], object] = forward
        if self.capture:
            # Warm up on a side stream (the allocator and cuBLAS settle), then capture.
            # The buffers hold padding, so these runs write only the scratch block.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                forward()
            replay = graph.replay
        return _Graph(tokens, positions, slots, tables, lens, logits, replay)
