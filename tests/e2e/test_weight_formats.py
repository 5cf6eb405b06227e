"""The accuracy of the compact weight formats on the embedded model, against our float32
forward on the same tokens (teacher-forced on transformers' greedy continuations of the
16 test prompts: 512 positions, decoded in batches of 16 rows, so the decode steps run
the compact kernels).

The bar ``weights: auto`` must meet to pick a format is the bfloat16 model's own
distance from float32 (the format the project serves by default where bfloat16 is
native), measured the same way on this model: top-1 agreement 98.4%, mean absolute
logit error 0.095, largest 0.97 (docs/torch_executor.md has the table)."""

from __future__ import annotations

import pytest
import torch

from plugins.torch_executor.cpu_features import detect
from plugins.torch_executor.weights import LlamaWeights
from tests.e2e.formats import agreement, executor_for, teacher_forced_logits

pytestmark = pytest.mark.slow

TOP1_AT_LEAST = 0.98
MEAN_ABS_AT_MOST = 0.1
MAX_ABS_AT_MOST = 1.0


@pytest.fixture(scope="module")
def continuations(greedy_references: list[tuple[list[int], torch.Tensor]]) -> list[list[int]]:
    return [tokens for tokens, _ in greedy_references]


@pytest.fixture(scope="module")
def float32_logits(
    weights_f32: LlamaWeights, prompts: list[list[int]], continuations: list[list[int]]
) -> torch.Tensor:
    return teacher_forced_logits(executor_for(weights_f32, "dense", 1024), prompts, continuations)


# (weights, matmul_dtype): what ``weights: auto`` picks for the float32 model with float32
# matmuls (int8, over the float16 KV cache ``kv_cache_dtype: auto`` then picks), the other
# compact format (the same cache), and what it picks with bfloat16 matmuls and KV cache
# (``dtype: auto`` where bfloat16 is native without AMX): bfloat16 weights. int8
# weights with bfloat16 matmuls fell just under the bar (docs/torch_executor.md), so
# ``auto`` does not pick them and they are not held to it here.
SETUPS = [("int8", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")]


@pytest.fixture(scope="module", params=SETUPS, ids=["/".join(s) for s in SETUPS])
def compact_logits(
    request: pytest.FixtureRequest,
    weights_f32: LlamaWeights,
    prompts: list[list[int]],
    continuations: list[list[int]],
) -> tuple[str, torch.Tensor]:
    fmt, matmul_dtype = request.param
    if matmul_dtype == "bfloat16" and not detect().onednn_bfloat16:
        pytest.skip(f"oneDNN runs no bfloat16 on this CPU ({' '.join(detect().names())})")
    executor = executor_for(weights_f32, fmt, 1024, matmul_dtype)
    if executor.runner.kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    expected_kv = "bfloat16" if matmul_dtype == "bfloat16" else "float16"
    if executor.plan.kernels == "portable":
        expected_kv = "float32"  # no F16C
    assert executor.plan.kv_cache_dtype == expected_kv, executor.plan
    return f"{fmt}/{matmul_dtype}", teacher_forced_logits(executor, prompts, continuations)


def test_compact_weights_meet_the_bfloat16_models_bar(
    compact_logits: tuple[str, torch.Tensor], float32_logits: torch.Tensor
) -> None:
    fmt, ours = compact_logits
    a = agreement(ours, float32_logits)
    assert a.top1 >= TOP1_AT_LEAST, a
    assert a.mean_abs <= MEAN_ABS_AT_MOST, a
    assert a.max_abs <= MAX_ABS_AT_MOST, a
    if fmt == "bfloat16/float32":
        # Only the weights are rounded (activations stay float32): well inside the bar.
        assert a.top1 >= 0.995 and a.max_abs <= 0.5, a


def test_greedy_choices_differ_only_near_float32_ties(
    compact_logits: tuple[str, torch.Tensor], float32_logits: torch.Tensor
) -> None:
    """Where a format's greedy choice first differs from float32's, float32 itself was
    close to a tie: its top two logits within 1.0 (the bar's largest error)."""
    _, ours = compact_logits
    picks, reference = ours.argmax(-1), float32_logits.argmax(-1)
    for i in range(len(picks)):
        differ = (picks[i] != reference[i]).nonzero()
        if len(differ) == 0:
            continue
        t = int(differ[0])
        top2 = float32_logits[i, t].topk(2).values
        assert (top2[0] - top2[1]).item() < MAX_ABS_AT_MOST, (i, t, top2)
