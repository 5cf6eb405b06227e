"""What the end-to-end checks share: the prompt lengths, greedy generation through
``EngineCore`` with the torch executor, transformers' own greedy tokens, and where two
token sequences first differ."""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.core.config import CacheConfig, EngineConfig, SchedulerConfig
from orchestrator.core.engine import EngineCore
from orchestrator.core.request import SamplingParams, Submission
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.weights import LlamaWeights

BLOCK = 16
GREEDY = SamplingParams(temperature=0)
PROMPT_LENGTHS = [5, 9, 17, 23, 31, 40, 47, 55, 64, 71, 80, 90, 100, 110, 120, 127]
# EOS is ignored so every request grows by exactly 32 tokens, two blocks: more than the
# one block of headroom per running request the scheduler keeps, so the small pool below
# must preempt.
MAX_TOKENS = 32
TIE_GAP = 1e-4  # top-2 logit gap under which float rounding may pick either token


def run_engine(
    engine: EngineCore, requests: list[Submission], max_steps: int = 5000
) -> dict[str, list[int]]:
    """Submit ``requests`` together and step until all finish; output tokens by id."""
    for r in requests:
        engine.add_request(r)
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        for out in engine.step().outputs:
            outputs[out.request_id] += out.new_token_ids
    raise AssertionError(f"engine still busy after {max_steps} steps")


def make_engine(weights: LlamaWeights, chunk: int, num_blocks: int) -> EngineCore:
    config = EngineConfig(
        scheduler=SchedulerConfig(chunk_size=chunk, max_batch_size=16),
        cache=CacheConfig(block_size=BLOCK),
        executor={"type": "torch", "dtype": "float32"},
    )
    executor = TorchExecutor(weights, block_size=BLOCK, num_blocks=num_blocks, seed=0)
    return EngineCore.from_config(config, executor=executor)


def reference_greedy(reference: Any, prompt: list[int], pad: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens for one prompt alone (EOS ignored), and its logits at
    each step: ``[MAX_TOKENS, vocab]``."""
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=MAX_TOKENS,
            eos_token_id=None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    assert len(tokens) == MAX_TOKENS
    return tokens, torch.cat(out.logits)


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))
