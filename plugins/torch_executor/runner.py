"""Runs one ``SchedulerOutput`` on the model: flat batch in, sampled tokens out."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orchestrator.core import ScheduledRequest, SchedulerOutput, TokenLogprobs
from plugins.torch_executor.model import RotaryTable, compute_logits, forward_hidden
from plugins.torch_executor.paged import (
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    plan_groups,
    slot_mapping,
)
from plugins.torch_executor.sampler import Sampler, SampleRow
from plugins.torch_executor.weights import LlamaWeights


@dataclass(frozen=True, slots=True)
class StepLogits:
    """Logits of the requests that sample this step: ``logits[i]`` (float32 ``[vocab]``)
    predicts the token after ``request_ids[i]``'s last token."""

    request_ids: list[str]
    logits: torch.Tensor  # [num_sampling, vocab]


class ModelRunner:
    """Owns the weights, the paged KV cache and the sampler of one model instance.

    ``max_model_len`` (tokens) bounds positions; a plan entry that runs past it, names a
    block outside the pool, or has a block table too short for its tokens fails that
    request with a message naming it, before anything is written to the cache.
    """

    def __init__(
        self,
        weights: LlamaWeights,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        rng: torch.Generator,
    ) -> None:
        self.weights = weights
        self.args = weights.args
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.cache = PagedKVCache(weights.args, num_blocks, block_size, weights.dtype)
        self.rope = RotaryTable(weights.args, max_model_len, weights.dtype)
        self.sampler = Sampler(rng)

    @torch.inference_mode()
    def logits(self, plan: SchedulerOutput) -> StepLogits:
        """Run the plan's tokens through the model, writing their K/V into the cache, and
        return the logits of the requests with ``sample=True``."""
        slices = []
        row = 0
        for s in plan.scheduled:
            self._check(s)
            slices.append(SequenceSlice(row, s.num_tokens, s.start_position, s.block_table))
            row += s.num_tokens
        token_ids = torch.tensor([t for s in plan.scheduled for t in s.token_ids])
        positions = torch.cat([torch.arange(s.start_position, s.context_len) for s in slices])
        attention = PagedAttention(
            self.cache,
            slot_mapping(slices, self.block_size),
            plan_groups(slices, self.block_size, self.args.group_size),
            self.args,
        )
        hidden = forward_hidden(self.weights, token_ids, positions, self.rope, attention)
        last_rows = [
            sl.first_row + sl.num_rows - 1
            for sl, s in zip(slices, plan.scheduled, strict=True)
            if s.sample
        ]
        ids = [s.request_id for s in plan.scheduled if s.sample]
        if not ids:
            return StepLogits([], torch.empty(0, self.args.vocab_size))
        return StepLogits(ids, compute_logits(self.weights, hidden[torch.tensor(last_rows)]))

    def execute(
        self, plan: SchedulerOutput
    ) -> tuple[dict[str, int], dict[str, TokenLogprobs], dict[str, str]]:
        """Tokens sampled for every request with ``sample=True``, logprobs for those that
        asked for them, and the entries this runner cannot run with the reason. A bad
        entry fails only its own request: the rest of the plan runs as if it were absent
        (nothing of the bad entry is written to the cache)."""
        failed: dict[str, str] = {}
        for s in plan.scheduled:
            try:
                self._check(s)
            except ValueError as err:
                failed[s.request_id] = str(err)
        if failed:
            plan = SchedulerOutput([s for s in plan.scheduled if s.request_id not in failed])
        if plan.is_empty:
            return {}, {}, failed
        step = self.logits(plan)
        sampling = {s.request_id: s for s in plan.scheduled if s.sample}
        rows = [SampleRow(sampling[r].sampling, sampling[r].context_len) for r in step.request_ids]
        with torch.inference_mode():
            tokens, logprobs = self.sampler.sample(step.logits, rows)
        sampled = dict(zip(step.request_ids, tokens, strict=True))
        lp = {r: x for r, x in zip(step.request_ids, logprobs, strict=True) if x is not None}
        return sampled, lp, failed

    def _check(self, s: ScheduledRequest) -> None:
        if not s.token_ids:
            raise ValueError(f"request {s.request_id!r} is scheduled with no tokens")
        if s.start_position < 0 or s.context_len > self.max_model_len:
            raise ValueError(
                f"request {s.request_id!r} runs positions {s.start_position}..{s.context_len - 1}"
                f", outside the model's 0..{self.max_model_len - 1}"
            )
        needed = -(-s.context_len // self.block_size)
        if len(s.block_table) < needed:
            raise ValueError(
                f"request {s.request_id!r} needs {needed} blocks for {s.context_len} tokens, "
                f"its block table has {len(s.block_table)}"
            )
        bad = [b for b in s.block_table[:needed] if not 0 <= b < self.cache.num_blocks]
        if bad:
            raise ValueError(
                f"request {s.request_id!r} names blocks {bad} outside the pool "
                f"0..{self.cache.num_blocks - 1}"
            )
        vocab = self.args.vocab_size
        if any(not 0 <= t < vocab for t in s.token_ids):
            raise ValueError(f"request {s.request_id!r} has token ids outside 0..{vocab - 1}")
