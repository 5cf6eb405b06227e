"""Teacher-forced logits of the embedded model in each weight format: every format is
fed the same tokens (transformers' float32 greedy continuation of each prompt), so
their logits compare position by position however early a greedy choice would differ."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orchestrator.core.output import SchedulerOutput
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.weights import LlamaWeights
from tests.e2e.generation import BLOCK, GREEDY
from tests.factories import plan_entry


def teacher_forced_logits(
    executor: TorchExecutor, prompts: list[list[int]], continuations: list[list[int]]
) -> torch.Tensor:
    """``[len(prompts), steps, vocab]``: each prompt prefilled in one batch, then one
    decode row per prompt per step (a batch of ``len(prompts)`` rows) feeding the
    continuation's tokens; logits predict continuation token ``t`` at step ``t``."""
    steps = len(continuations[0])
    tables = {}
    next_block = 0
    for i, p in enumerate(prompts):
        blocks = -(-(len(p) + steps) // BLOCK)
        tables[str(i)] = list(range(next_block, next_block + blocks))
        next_block += blocks
    out = torch.empty(len(prompts), steps, executor.runner.args.vocab_size)
    for t in range(steps):
        plan = SchedulerOutput(
            [
                plan_entry(
                    str(i),
                    p if t == 0 else [continuations[i][t - 1]],
                    0 if t == 0 else len(p) + t - 1,
                    tables[str(i)],
                    True,
                    GREEDY,
                )
                for i, p in enumerate(prompts)
            ]
        )
        step = executor.runner.logits(plan)
        for rid, row in zip(step.request_ids, step.logits, strict=True):
            out[int(rid), t] = row
    return out


@dataclass(frozen=True)
class Agreement:
    """How far one format's logits are from the float32 model's on the same positions."""

    top1: float  # fraction of positions whose argmax is the float32 model's
    max_abs: float  # largest absolute logit difference
    mean_abs: float  # mean absolute logit difference


def agreement(ours: torch.Tensor, float32: torch.Tensor) -> Agreement:
    diff = (ours - float32).abs()
    same = (ours.argmax(-1) == float32.argmax(-1)).float().mean().item()
    return Agreement(same, diff.max().item(), diff.mean().item())


def executor_for(
    weights: LlamaWeights, fmt: str, num_blocks: int, matmul_dtype: str = "float32"
) -> TorchExecutor:
    """An executor over ``weights`` storing its projections as ``fmt``, its dense matmuls
    in ``matmul_dtype``; compact weights take batches of up to 16 rows (the teacher-forced
    decode steps), so their kernels run whatever bound this CPU would measure."""
    kernels = "torch" if weights.dtype == torch.bfloat16 else "auto"
    return TorchExecutor(
        weights, block_size=BLOCK, num_blocks=num_blocks, seed=0, kernels=kernels,
        weights_format=fmt, matmul_dtype=matmul_dtype,  # type: ignore[arg-type]
        compact_max_rows=16,
    )  # fmt: skip
