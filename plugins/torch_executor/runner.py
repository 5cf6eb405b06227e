"""Runs one ``SchedulerOutput`` on the model: flat batch in, sampled tokens out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from orchestrator.core import ScheduledRequest, SchedulerOutput, TokenLogprobs
from plugins.torch_executor import attention_bound, row_bound
from plugins.torch_executor.attention_bound import AttentionBound
from plugins.torch_executor.buckets import padded_rows
from plugins.torch_executor.compact import WeightFormat, applies
from plugins.torch_executor.cuda_graphs import DecodeGraphs
from plugins.torch_executor.grammar import Matchers
from plugins.torch_executor.linear import Linear
from plugins.torch_executor.model import (
    BFLOAT16,
    DENSE,
    Ops,
    RotaryTable,
    compute_logits,
    forward_hidden,
    kernel_ops,
    torch_ops,
)
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels
from plugins.torch_executor.paged import (
    KERNEL_MAX_ROWS,
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    build_step,
)
from plugins.torch_executor.row_bound import RowBound
from plugins.torch_executor.sampler import Sampler, SampleRow
from plugins.torch_executor.stack import DecodeStack
from plugins.torch_executor.weights import LlamaWeights


def kv_cache_dtype(dtype: torch.dtype, matmul_dtype: torch.dtype | None) -> torch.dtype:
    """The KV cache's dtype for a ``dtype`` model whose matmuls compute in
    ``matmul_dtype``: the narrower of the two. K and V come out of a projection's
    product, so with bfloat16 matmuls they already carry bfloat16 rounding; storing them
    in bfloat16 halves the bytes attention reads (most of a decode step's at 64 rows of
    a few hundred tokens) and the pool's memory, within the accuracy bar
    (docs/torch_executor.md)."""
    return torch.bfloat16 if torch.bfloat16 in (dtype, matmul_dtype) else dtype


@dataclass(frozen=True, slots=True)
class StepLogits:
    """Logits of the requests that sample this step: ``logits[i]`` (float32 ``[vocab]``,
    on the CPU) predicts the token after ``request_ids[i]``'s last token."""

    request_ids: list[str]
    logits: torch.Tensor  # [num_sampling, vocab]


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What ``ModelRunner.execute`` returns: the sampled token and, where asked, logprobs
    of every request that sampled, and why each request that could not run did not."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class ModelRunner:
    """Owns the weights, the paged KV cache and the sampler of one model instance, on the
    weights' device.

    ``max_model_len`` (tokens) bounds positions. A plan entry that runs past it, names a
    block outside the pool, has a block table too short for its tokens, carries a token id
    outside the vocabulary or no tokens at all cannot run: ``execute`` reports it in
    ``failed`` and runs the rest of the plan as if it were absent (nothing of it is
    written to the cache); ``logits`` raises ``ValueError`` naming it.

    ``kernels``: the CPU kernels (``native.load_kernels``), or ``None`` for torch ops
    only. ``cuda_graphs``: on CUDA, replay captured graphs for decode-only steps.
    ``weights``: how the kernels read the projections (``compact.py``; compact formats
    need ``kernels`` and float32 weights). ``matchers``: the constrained requests'
    grammar state (``grammar.py``), ``None`` when the executor enforces no constraints.
    ``compact_max_rows``: the most rows a step may have for the compact projections;
    ``None`` measures it at start on this CPU with compact weights (``row_bound.py``;
    ``row_bound`` keeps the figures), else ``native.COMPACT_MAX_ROWS``.
    ``kernel_max_rows``: the most rows of one request a step attends through the paged
    kernel (more go through SDPA); ``None`` measures it at start on this CPU when the
    kernels are loaded (``attention_bound.py``; ``attention_bound`` keeps the figures),
    else ``paged.KERNEL_MAX_ROWS``, or 1 without the kernels.
    ``matmul_dtype``: what the projections compute in where the compact weights do not
    take them (``None``: the weights' dtype); ``torch.bfloat16`` for float32 weights runs
    them as ``linear.bfloat16_linear`` (float32 activations and residual sums).
    ``kv_dtype``: what the KV cache stores (``None``: ``kv_cache_dtype``'s rule); a
    float32 model's may be narrower (bfloat16, float16), another model's is its dtype.
    """

    def __init__(
        self,
        weights: LlamaWeights,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        rng: torch.Generator,
        kernels: Kernels | None = None,
        cuda_graphs: bool = True,
        weights_format: WeightFormat = WeightFormat.DENSE,
        matchers: Matchers | None = None,
        compact_max_rows: int | None = None,
        kernel_max_rows: int | None = None,
        matmul_dtype: torch.dtype | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.weights = weights
        self.matchers = matchers
        self.args = weights.args
        self.device = weights.device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.kernels = kernels if self.device.type == "cpu" else None
        if weights_format is not WeightFormat.DENSE and (
            self.kernels is None or weights.dtype != torch.float32
        ):
            raise ValueError(f"weights {weights_format} need the CPU kernels and float32")
        self.weights_format = weights_format
        if matmul_dtype not in (None, weights.dtype, torch.bfloat16):
            raise ValueError(f"{matmul_dtype} matmuls need {matmul_dtype} weights")
        bf16_matmuls = matmul_dtype == torch.bfloat16 and weights.dtype == torch.float32
        if bf16_matmuls and self.device.type != "cpu":
            raise ValueError("bfloat16 matmuls for float32 weights run on the CPU only")
        self.dense = BFLOAT16 if bf16_matmuls else DENSE
        kv_dtype = kv_dtype or kv_cache_dtype(weights.dtype, matmul_dtype)
        if weights.dtype != torch.float32 and kv_dtype != weights.dtype:
            raise ValueError(f"a {kv_dtype} KV cache needs float32 weights, not {weights.dtype}")
        self.cache = PagedKVCache(weights.args, num_blocks, block_size, kv_dtype, self.device)
        self.rope = RotaryTable(weights.args, max_model_len, weights.dtype, self.device)
        self.sampler = Sampler(rng, self.kernels)
        self._build_layouts(tiles=self.kernels is not None and self.kernels.has_tile_linear)
        self.row_bound: RowBound | None = None
        if compact_max_rows is None:
            compact_max_rows = COMPACT_MAX_ROWS
            if self.kernels is not None and weights_format is not WeightFormat.DENSE:
                self.row_bound = row_bound.measure(
                    self.kernels, weights, weights_format, self.dense.linear
                )
                compact_max_rows = self.row_bound.rows
        self.compact_max_rows = compact_max_rows
        self.ops: Ops = (
            torch_ops(self.dense)
            if self.kernels is None
            else kernel_ops(self.kernels, weights_format, compact_max_rows, self.dense)
        )
        # On the CPU oneDNN runs the layers' projections that neither the compact weights
        # nor AMX tiles (the bfloat16 model's, Kernels.linear) take.
        self._onednn_projections = self.device.type == "cpu" and not (
            self.kernels is not None
            and self.kernels.has_tile_linear
            and all(x.has_tile_layout for layer in weights.layers for x in layer.linears)
        )
        # Small steps run every layer in one kernel call where it can (stack.py).
        self.stack = DecodeStack.for_model(
            self.kernels, weights, self.cache, weights_format, compact_max_rows
        )
        # Prompt chunks of the bfloat16 model attend on AMX tiles where the kernels take
        # its shape (KernelRows.runs): on 2 threads of a Sapphire Rapids Xeon, one layer
        # of eight 256-token prompts took 1.6 ms there against 4.4 ms through the paged
        # kernel, which had been on a par with SDPA.
        self.tile_chunks = (
            self.kernels is not None
            and weights.dtype == torch.bfloat16
            and kv_dtype == torch.bfloat16
            and self.kernels.has_tile_attention(
                self.args.head_dim, self.args.group_size, block_size
            )
        )
        self.attention_bound: AttentionBound | None = None
        if self.kernels is None:
            kernel_max_rows = 1  # the torch-op row attention takes one query per sequence
        elif kernel_max_rows is None and self.tile_chunks:
            # No SDPA chunks to weigh the paged kernel against: rows past the bound go on
            # tiles, but for a prompt's last block (SequenceSlice.first_kernel_row).
            kernel_max_rows = KERNEL_MAX_ROWS
        elif kernel_max_rows is None:
            kernel_max_rows = KERNEL_MAX_ROWS
            self.attention_bound = attention_bound.measure(
                self.kernels, self.args, self.rope, weights.dtype, kv_dtype
            )
            if self.attention_bound is not None:
                kernel_max_rows = self.attention_bound.rows
        self.kernel_max_rows = kernel_max_rows
        self.graphs = (
            DecodeGraphs(weights, self.cache, self.rope, max_model_len, capture=True)
            if cuda_graphs and self.device.type == "cuda"
            else None
        )

    def _build_layouts(self, tiles: bool) -> None:
        """Build each projection's matmul layouts now rather than in the first step: AMX
        tiles for the layers where the kernels run them, oneDNN's packed copies
        otherwise (and for the LM head; of the bfloat16 copy with bfloat16 matmuls),
        and with compact weights their layout too (oneDNN's copy still runs the batches
        too long for them)."""
        fmt = self.weights_format
        gate_ups = {id(layer.gate_up) for layer in self.weights.layers}
        for linear in self._projections():
            if tiles and linear.has_tile_layout and linear is not self.weights.lm_head:
                # The gate/up projections run gated (Kernels.gated_linear), the rest plain.
                if id(linear) in gate_ups and linear.out_features % 32 == 0:
                    linear.gated_tile_weight()
                else:
                    linear.tile_weight()
                continue
            if self.dense is BFLOAT16:
                linear.as_bfloat16().packed_weight()
            else:
                linear.packed_weight()
            if applies(fmt, linear.out_features, linear.in_features):
                linear.compact_weight(fmt)

    def _projections(self) -> list[Linear]:
        """Every layer's projections, then the LM head."""
        w = self.weights
        return [*(x for layer in w.layers for x in layer.linears), w.lm_head]

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights a decode step of a few rows reads (the projections in the
        layout they run in, the LM head, the norms): a memory roofline's numerator."""
        fmt = self.weights_format
        total = self.weights.num_bytes
        for linear in self._projections():
            if applies(fmt, linear.out_features, linear.in_features):
                total += linear.compact_weight(fmt).num_bytes - linear.num_bytes
        return total

    def check(self, s: ScheduledRequest) -> str | None:
        """Why ``s`` cannot run, or ``None`` when it can."""
        if not s.token_ids:
            return f"request {s.request_id!r} is scheduled with no tokens"
        if s.start_position < 0 or s.context_len > self.max_model_len:
            return (
                f"request {s.request_id!r} runs positions {s.start_position}..{s.context_len - 1}"
                f", outside the model's 0..{self.max_model_len - 1}"
            )
        needed = -(-s.context_len // self.block_size)
        if len(s.block_table) < needed:
            return (
                f"request {s.request_id!r} needs {needed} blocks for {s.context_len} tokens, "
                f"its block table has {len(s.block_table)}"
            )
        bad = [b for b in s.block_table[:needed] if not 0 <= b < self.cache.num_blocks]
        if bad:
            return (
                f"request {s.request_id!r} names blocks {bad} outside the pool "
                f"0..{self.cache.num_blocks - 1}"
            )
        vocab = self.args.vocab_size
        if any(not 0 <= t < vocab for t in s.token_ids):
            return f"request {s.request_id!r} has token ids outside 0..{vocab - 1}"
        return None

    def logits(self, plan: SchedulerOutput) -> StepLogits:
        """Run the plan's tokens through the model, writing their K/V into the cache, and
        return the logits of the requests with ``sample=True``. Raises ``ValueError``,
        before anything is written, if any entry cannot run."""
        for s in plan.scheduled:
            problem = self.check(s)
            if problem is not None:
                raise ValueError(problem)
        return self._logits(plan.scheduled)

    @torch.inference_mode()
    def _logits(self, scheduled: Sequence[ScheduledRequest]) -> StepLogits:
        ids = [s.request_id for s in scheduled if s.sample]
        slices = []
        row = 0
        for s in scheduled:
            slices.append(
                SequenceSlice(row, s.num_tokens, s.start_position, s.block_table, s.sample)
            )
            row += s.num_tokens
        token_ids = [t for s in scheduled for t in s.token_ids]
        if self.graphs is not None and all(s.num_tokens == 1 and s.sample for s in scheduled):
            logits = self.graphs.run(slices, token_ids)
            if logits is not None:
                return StepLogits(ids, logits.cpu())
        step = build_step(
            slices,
            self.block_size,
            self.rope,
            self.cache.scratch_block,
            self.kernel_max_rows,
            self.device,
            tile_chunks=self.tile_chunks,
        )
        tokens = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        if self.stack is not None and self.stack.runs(step):
            hidden = self.stack(self.weights.embed[tokens], step, self.rope.cos, self.rope.sin)
        else:
            attention = PagedAttention(self.cache, step, self.args, self.rope, self.kernels)
            hidden = forward_hidden(
                self.weights, tokens, attention, self.ops, self._matmul_rows(len(token_ids))
            )
        if not ids:
            return StepLogits([], torch.empty(0, self.args.vocab_size))
        last_rows = [
            sl.first_row + sl.num_rows - 1
            for sl, s in zip(slices, scheduled, strict=True)
            if s.sample
        ]
        if len(last_rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(last_rows, device=self.device)]
        return StepLogits(ids, compute_logits(self.weights, hidden, self.ops).cpu())

    def _matmul_rows(self, tokens: int) -> int | None:
        """The rows a step of ``tokens`` runs its layers' projections at: the bucket
        (``buckets.padded_rows``) where oneDNN's matmuls take them on the CPU, ``None``
        (exactly ``tokens``) where the compact or tile kernels do, which run any count."""
        if not self._onednn_projections:
            return None
        if self.weights_format is not WeightFormat.DENSE and tokens <= self.compact_max_rows:
            return None
        return padded_rows(tokens)

    def execute(self, plan: SchedulerOutput) -> StepOutcome:
        """Tokens sampled for every runnable request with ``sample=True``, logprobs for
        those that asked, and the entries that could not run (see the class doc).

        A constrained request samples only what its grammar allows: its mask is filled
        on the matchers' worker thread while the forward pass runs here, then applied to
        the logits before sampling (logprobs are then of the masked distribution); a
        sampled token its matcher refuses fails that request only."""
        failed: dict[str, str] = {}
        runnable = []
        matchers = self.matchers
        if matchers is not None and plan.finished_ids:
            matchers.forget(plan.finished_ids)
        for s in plan.scheduled:
            problem = self.check(s)
            if problem is None:
                runnable.append(s)
            else:
                failed[s.request_id] = problem
        if not runnable:
            return StepOutcome(failed=failed)
        masked = [s for s in runnable if s.sample and s.constraint is not None]
        pending = matchers.start(masked) if matchers is not None and masked else None
        step = self._logits(runnable)
        sampling = {s.request_id: s for s in runnable if s.sample}
        rows = [SampleRow(sampling[r].sampling, sampling[r].context_len) for r in step.request_ids]
        with torch.inference_mode():
            if pending is not None:
                assert matchers is not None
                row_of = {r: i for i, r in enumerate(step.request_ids)}
                matchers.apply(pending, step.logits, [row_of[r] for r in pending.request_ids])
            tokens, logprobs = self.sampler.sample(step.logits, rows)
        sampled = dict(zip(step.request_ids, tokens, strict=True))
        if pending is not None:
            assert matchers is not None
            matchers.advance(pending, sampled)
            failed.update(pending.failed)
            for rid in pending.failed:
                sampled.pop(rid, None)
        lp = {
            r: x
            for r, x in zip(step.request_ids, logprobs, strict=True)
            if x is not None and r in sampled
        }
        return StepOutcome(sampled, lp, failed)
