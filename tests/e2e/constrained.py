"""Helpers for constrained generation on the default model through the real engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import (
    EngineConfig,
    EngineCore,
    FinishReason,
    ModelConfig,
    SamplingParams,
    Submission,
)
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.grammar import GrammarBackend, load_tokenizer, tokenizer_json
from plugins.torch_executor.weights import LlamaWeights

# Bounds every engine loop in these tests.
MAX_STEPS = 2000


def grammar_backend(weights: LlamaWeights, cache_dir: Path) -> GrammarBackend:
    """The executor's llguidance backend for the default model, as ``from_config``
    builds it."""
    text = tokenizer_json(ModelConfig(), cache_dir)
    args = weights.args
    return GrammarBackend(load_tokenizer(text, args.vocab_size, args.eos_token_ids))


def constrained_engine(
    weights: LlamaWeights, backend: GrammarBackend, num_blocks: int = 256, **scheduler: Any
) -> EngineCore:
    """An engine over the torch executor with constraints on."""
    executor = TorchExecutor(weights, block_size=16, num_blocks=num_blocks, seed=0, grammar=backend)
    config = EngineConfig.model_validate(
        {"model": {"max_model_len": 2048}, "executor": {"type": "torch"}, "scheduler": scheduler}
    )
    return EngineCore.from_config(config, executor=executor)


def chat_prompt(tokenizer: Any, text: str) -> tuple[int, ...]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return tuple(int(t) for t in ids)


def sampling(max_tokens: int, eos: Sequence[int], **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, stop_token_ids=tuple(eos), **kw)


@dataclass
class Finished:
    tokens: list[int]
    reason: FinishReason | None
    error: str | None
    error_code: str | None


def run(engine: EngineCore, submissions: Sequence[Submission]) -> dict[str, Finished]:
    """Submit everything, step until all have finished (bounded), and return each
    request's tokens (those produced during this call, for a request submitted before)
    and how it ended."""
    for s in submissions:
        engine.add_request(s)
    done: dict[str, Finished] = {}
    tokens: dict[str, list[int]] = {s.request_id: [] for s in submissions}
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            break
        for out in engine.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                done[out.request_id] = Finished(
                    tokens[out.request_id], out.finish_reason, out.error, out.error_code
                )
    assert not engine.has_work(), f"engine still busy after {MAX_STEPS} steps"
    return done


def text_of(tokenizer: Any, finished: Finished) -> str:
    """The output text without the end-of-sequence token it stopped on."""
    return str(tokenizer.decode(finished.tokens, skip_special_tokens=True))
