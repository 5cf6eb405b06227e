"""The decode stack (every layer in one kernel call) against the same kernels run one op
at a time: the same logits bit for bit, on every variant this CPU runs, both compact
formats, both attention paths (vectorised at head_dim 64, general at 16), a float32, a
bfloat16 (with bfloat16 matmuls past the compact bound) and a float16 KV cache, one and two
threads; the bfloat16 model's stack on AMX tiles the same way where the CPU has AMX; and
it stays out of the steps it does not cover."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.torch_executor.attention_bound import EVERY_CHUNK
from plugins.torch_executor.compact import WeightFormat
from plugins.torch_executor.kernel_build import VARIANT_NAMES
from plugins.torch_executor.native import COMPACT_MAX_ROWS, Kernels
from plugins.torch_executor.paged import KERNEL_MAX_ROWS, StepBatch
from plugins.torch_executor.runner import ModelRunner
from plugins.torch_executor.stack import DecodeStack
from plugins.torch_executor.weights import LlamaWeights, load_folder
from tests.e2e.models import write_tiny_llama
from tests.factories import plan_entry
from tests.unit.test_torch_paged import variant_kernels

GREEDY = SamplingParams(temperature=0)
BLOCK = 16
# Whole blocks of 16 outputs and groups of 64 inputs everywhere, so both formats apply.
SHAPES = {
    # 3 query heads per KV head at head_dim 64, as SmolLM2: the vectorised attention.
    "hd64": {"hidden_size": 192, "num_attention_heads": 3, "num_key_value_heads": 1,
             "head_dim": 64, "intermediate_size": 128},
    "hd16": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128},
}  # fmt: skip


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    return variant_kernels(request.param, Path(tmp_path_factory.mktemp("kernels")))


@pytest.fixture(scope="module", params=list(SHAPES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"), **SHAPES[request.param])


@pytest.fixture(scope="module")
def weights(folder: Path) -> LlamaWeights:
    return load_folder(folder, torch.float32)


class Counted:
    """A ``DecodeStack`` that counts the steps it ran."""

    def __init__(self, stack: DecodeStack) -> None:
        self.stack, self.calls, self.with_runs = stack, 0, 0

    def runs(self, step: StepBatch) -> bool:
        return self.stack.runs(step)

    def __call__(self, *args: torch.Tensor | StepBatch) -> torch.Tensor:
        self.calls += 1
        step = args[1]
        assert isinstance(step, StepBatch) and step.kernel_rows is not None
        self.with_runs += step.kernel_rows.runs is not None
        return self.stack(*args)  # type: ignore[arg-type]


def runner(
    weights: LlamaWeights,
    kernels: Kernels,
    fmt: WeightFormat,
    max_rows: int = COMPACT_MAX_ROWS,
    kernel_rows: int = KERNEL_MAX_ROWS,
    matmul_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
) -> ModelRunner:
    # Runners compared route attention alike (a given bound, not one measured per
    # runner): what differs between them is only the stack.
    return ModelRunner(
        weights, 64, BLOCK, 256, torch.Generator().manual_seed(0), kernels,
        weights_format=fmt, compact_max_rows=max_rows, kernel_max_rows=kernel_rows,
        matmul_dtype=matmul_dtype, kv_dtype=kv_dtype,
    )  # fmt: skip


# (request, start, stop) per step: small chunks from 0 and mid-sequence, decodes at
# lengths across block edges; the third and last steps are too long for the stack.
STEPS = [
    [("a", 0, 9), ("b", 0, 3)],
    [("a", 9, 16), ("b", 3, 4), ("c", 0, 1)],
    [("c", 1, 40)],
    [("a", 16, 17), ("b", 4, 5), ("c", 40, 41)],
    [("a", 17, 18)],
    [("a", 18, 18 + COMPACT_MAX_ROWS + 1)],
    [("a", 35, 36), ("b", 5, 6), ("c", 41, 42)],
]


# (compact row bound, attention kernel row bound, steps that run stacked): the fixed
# bounds, where the third and last steps are too long for the stack; and bounds as
# measured on CPUs where the kernel attends every chunk, where every step runs stacked.
ROUTINGS = [
    (COMPACT_MAX_ROWS, KERNEL_MAX_ROWS, len(STEPS) - 2),
    (64, EVERY_CHUNK, len(STEPS)),
]


def assert_same_logits_every_step(
    stacked: ModelRunner, op_by_op: ModelRunner, threads: int, seed: int
) -> None:
    """Run ``STEPS`` over three requests of random tokens through both runners on
    ``threads`` threads: the same request ids and bit-identical logits at every step."""
    rng = random.Random(seed)
    sequences = {r: [rng.randrange(101) for _ in range(64)] for r in "abc"}
    tables = {r: list(range(20 * i, 20 * i + 4)) for i, r in enumerate("abc")}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for step in STEPS:
            plan = SchedulerOutput(
                [plan_entry(r, sequences[r][a:b], a, tables[r], True, GREEDY)
                 for r, a, b in step]
            )  # fmt: skip
            got, expected = stacked.logits(plan), op_by_op.logits(plan)
            assert got.request_ids == expected.request_ids
            assert torch.equal(got.logits, expected.logits), step
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fmt", [WeightFormat.INT8, WeightFormat.BFLOAT16])
@pytest.mark.parametrize("routing", ROUTINGS, ids=["fixed", "every-chunk"])
@pytest.mark.parametrize(
    ("matmul_dtype", "kv_dtype"),
    [(None, torch.float32), (torch.bfloat16, torch.bfloat16), (None, torch.float16)],
    ids=["float32", "bfloat16", "float16-kv"],
)
def test_the_stack_gives_the_op_by_op_logits_bit_for_bit(
    kernels: Kernels,
    weights: LlamaWeights,
    fmt: WeightFormat,
    threads: int,
    routing: tuple[int, int, int],
    matmul_dtype: torch.dtype | None,
    kv_dtype: torch.dtype,
) -> None:
    max_rows, kernel_rows, num_stacked = routing
    stacked = runner(weights, kernels, fmt, max_rows, kernel_rows, matmul_dtype, kv_dtype)
    op_by_op = runner(weights, kernels, fmt, max_rows, kernel_rows, matmul_dtype, kv_dtype)
    assert stacked.cache.k[0].dtype == kv_dtype
    assert stacked.stack is not None
    counted = Counted(stacked.stack)
    stacked.stack = counted  # type: ignore[assignment]
    op_by_op.stack = None
    assert_same_logits_every_step(stacked, op_by_op, threads, seed=1)
    assert counted.calls == num_stacked


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("routing", ROUTINGS, ids=["fixed", "every-chunk"])
def test_the_tile_stack_gives_the_op_by_op_logits_bit_for_bit(
    kernels: Kernels, folder: Path, threads: int, routing: tuple[int, int, int]
) -> None:
    """The bfloat16 model on AMX tiles: every step whose rows all attend through the
    kernels runs stacked, whatever its length (17 and 39 rows pad to whole tiles). With
    head_dim 64, every step: the 39-row chunk of the fixed routing attends on tiles
    (``KernelRows.runs``) but for its last block, and so do the 17 rows from 18; with
    head_dim 16, which the tile attention does not take, those two are SDPA chunks."""
    if not kernels.has_tile_linear:
        pytest.skip(f"the {kernels.variant} kernels have no AMX tiles this process may use")
    _, kernel_rows, num_stacked = routing
    bf16 = load_folder(folder, torch.bfloat16)
    stacked = runner(bf16, kernels, WeightFormat.DENSE, kernel_rows=kernel_rows)
    op_by_op = runner(bf16, kernels, WeightFormat.DENSE, kernel_rows=kernel_rows)
    assert stacked.stack is not None and stacked.stack.max_rows is None
    tiles = bf16.args.head_dim == 64
    assert stacked.tile_chunks == op_by_op.tile_chunks == tiles
    counted = Counted(stacked.stack)
    stacked.stack = counted  # type: ignore[assignment]
    op_by_op.stack = None
    assert_same_logits_every_step(stacked, op_by_op, threads, seed=2)
    assert counted.calls == (len(STEPS) if tiles else num_stacked)
    assert counted.with_runs == (2 if tiles and kernel_rows == KERNEL_MAX_ROWS else 0)


def test_the_stack_needs_compact_float32_weights_or_amx_tiles(
    kernels: Kernels, folder: Path, weights: LlamaWeights
) -> None:
    assert runner(weights, kernels, WeightFormat.DENSE).stack is None
    bf16 = ModelRunner(
        load_folder(folder, torch.bfloat16), 8, BLOCK, 64, torch.Generator(), kernels
    )
    assert (bf16.stack is not None) == kernels.has_tile_linear
    assert DecodeStack.for_model(None, weights, bf16.cache, WeightFormat.INT8) is None


def test_steps_past_the_row_bound_run_op_by_op(kernels: Kernels, weights: LlamaWeights) -> None:
    """With a bound of 2 rows, three decodes take the dense matmuls one op at a time;
    the stack's runner gives the same logits as one without a stack."""
    stacked = runner(weights, kernels, WeightFormat.INT8, max_rows=2)
    op_by_op = runner(weights, kernels, WeightFormat.INT8, max_rows=2)
    assert stacked.stack is not None
    counted = Counted(stacked.stack)
    stacked.stack = counted  # type: ignore[assignment]
    op_by_op.stack = None
    for step in range(3):  # request i joins at step i, one token a step
        plan = SchedulerOutput(
            [plan_entry(r, [7 + i], step - i, [i], True, GREEDY)
             for i, r in enumerate("abc"[: step + 1])]
        )  # fmt: skip
        assert torch.equal(stacked.logits(plan).logits, op_by_op.logits(plan).logits)
    assert counted.calls == 2, "the one- and two-row steps ran stacked, the three-row one not"
