"""The torch executor on a CUDA GPU (``device: cuda``): the same token-exact checks as on
the CPU against transformers' Llama (float32, on the CPU), captured decode graphs against
the eager forward, and bfloat16 against float32. Skipped, saying so, without a GPU;
``benchmarks/gpu_check.sh`` runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams, Submission
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.weights import LlamaWeights, load_folder
from tests.e2e.generation import (
    BLOCK,
    GREEDY,
    MAX_TOKENS,
    TIE_GAP,
    first_divergence,
    make_engine,
    run_engine,
)
from tests.e2e.models import smollm_folder
from tests.factories import plan_entry

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU; torch sees none here"
    ),
]


@pytest.fixture(scope="module")
def cuda_f32(cache_dir: Path) -> LlamaWeights:
    return load_folder(smollm_folder(cache_dir), torch.float32, "cuda")


@pytest.fixture(scope="module")
def cuda_bf16(cache_dir: Path) -> LlamaWeights:
    return load_folder(smollm_folder(cache_dir), torch.bfloat16, "cuda")


def test_mixed_batch_logits_match_transformers_on_cuda(
    cuda_f32: LlamaWeights, reference: Any, prompts: list[list[int]]
) -> None:
    executor = TorchExecutor(cuda_f32, block_size=BLOCK, num_blocks=64)
    seqs = {"a": prompts[15], "b": prompts[12], "c": prompts[3]}
    tables = {rid: list(range(10 * i, 10 * i + 8)) for i, rid in enumerate(seqs)}
    with torch.no_grad():
        ref = {rid: reference(torch.tensor([s])).logits[0] for rid, s in seqs.items()}
    steps = [
        {"a": (0, 50, False), "b": (0, 33, False), "c": (0, 22, True)},
        {"a": (50, 127, True), "b": (33, 100, True), "c": (22, 23, True)},
    ]
    for step in steps:
        plan = SchedulerOutput(
            [
                plan_entry(rid, seqs[rid][a:b], a, tables[rid], sample, GREEDY)
                for rid, (a, b, sample) in step.items()
            ]
        )
        out = executor.runner.logits(plan)
        for i, rid in enumerate(out.request_ids):
            pos = step[rid][1] - 1
            err = (out.logits[i] - ref[rid][pos]).abs().max().item()
            assert err < 1e-3, f"{rid} at position {pos}: max abs logit error {err:.2e}"


def test_greedy_generation_matches_transformers_on_cuda(
    cuda_f32: LlamaWeights,
    prompts: list[list[int]],
    greedy_references: list[tuple[list[int], torch.Tensor]],
) -> None:
    """Chunked prefill, preemption, and decode steps replayed from CUDA graphs."""
    engine = make_engine(cuda_f32, 64, num_blocks=40)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    requests = [Submission(f"r{i}", tuple(p), params) for i, p in enumerate(prompts)]
    ours = run_engine(engine, requests)
    assert engine.stats().num_preemptions > 0
    for i, (expected, logits) in enumerate(greedy_references):
        got = ours[f"r{i}"]
        at = first_divergence(got, expected)
        if at is None:
            continue
        assert at < len(got)
        top2 = logits[at].topk(2).values
        assert (top2[0] - top2[1]).item() < TIE_GAP, f"r{i}: token {at} differs"


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-4), (torch.bfloat16, 0.25)])
def test_graph_decode_equals_eager_decode(
    cuda_f32: LlamaWeights,
    cuda_bf16: LlamaWeights,
    prompts: list[list[int]],
    dtype: torch.dtype,
    atol: float,
) -> None:
    weights = cuda_f32 if dtype == torch.float32 else cuda_bf16
    logits = {}
    for graphs in (True, False):
        executor = TorchExecutor(weights, block_size=BLOCK, num_blocks=128, cuda_graphs=graphs)
        tables = {i: list(range(8 * i, 8 * i + 8)) for i in range(5)}
        prefill = [
            plan_entry(f"r{i}", prompts[i + 3], 0, tables[i], True, GREEDY) for i in range(5)
        ]
        executor.runner.logits(SchedulerOutput(prefill))
        decode = [
            plan_entry(f"r{i}", [17], len(prompts[i + 3]), tables[i], True, GREEDY)
            for i in range(5)
        ]
        logits[graphs] = executor.runner.logits(SchedulerOutput(decode)).logits
    assert (logits[True] - logits[False]).abs().max().item() < atol
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))


def test_bfloat16_stays_close_to_float32_on_cuda(
    cuda_f32: LlamaWeights, cuda_bf16: LlamaWeights, prompts: list[list[int]]
) -> None:
    plan = SchedulerOutput([plan_entry("a", prompts[10], 0, list(range(8)), True, GREEDY)])
    probs = {}
    for weights in (cuda_f32, cuda_bf16):
        executor = TorchExecutor(weights, block_size=BLOCK, num_blocks=16)
        probs[weights.dtype] = torch.softmax(executor.runner.logits(plan).logits[0], -1)
    assert (probs[torch.float32] - probs[torch.bfloat16]).abs().max() < 0.05
