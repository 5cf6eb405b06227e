"""Our paged Llama forward against transformers' Llama on a tiny random model: mixed
batches of mid-sequence chunks and decodes over scattered block tables."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.cpu_features import detect
from plugins.torch_executor.cuda_graphs import DecodeGraphs
from plugins.torch_executor.linear import Linear
from plugins.torch_executor.model import Ops
from plugins.torch_executor.native import Kernels
from plugins.torch_executor.paged import SequenceSlice
from plugins.torch_executor.weights import load_folder
from tests.e2e.models import hf_model, write_tiny_llama
from tests.factories import plan_entry

BLOCK = 4
GREEDY = SamplingParams(temperature=0)

# Each step lists (request, start, stop, sample): tokens [start, stop) of its sequence.
STEPS: list[list[tuple[str, int, int, bool]]] = [
    [("a", 0, 10, False), ("b", 0, 17, True), ("c", 0, 9, True), ("d", 0, 4, False)],
    [("a", 10, 23, True), ("b", 17, 18, True), ("c", 9, 10, True), ("d", 4, 5, True)],
    [("a", 23, 24, True), ("b", 18, 19, True), ("c", 10, 13, False), ("d", 5, 6, True)],
    [("c", 13, 14, True), ("a", 24, 25, True)],
]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param({}, id="llama3-rope-untied"),
        pytest.param(
            {
                "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
                "tie_word_embeddings": True,
            },
            id="default-rope-tied",
        ),
    ],
)
def tiny_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"), **request.param)


def run_steps(
    executor: TorchExecutor, sequences: dict[str, list[int]], tables: dict[str, list[int]]
) -> list[tuple[str, int, torch.Tensor]]:
    """Run ``STEPS``; return ``(request, position, logits)`` for every sampled row."""
    seen = []
    for step in STEPS:
        plan = SchedulerOutput(
            [
                plan_entry(rid, sequences[rid][a:b], a, tables[rid], sample, GREEDY)
                for rid, a, b, sample in step
            ]
        )
        out = executor.runner.logits(plan)
        expected_ids = [rid for rid, _, _, sample in step if sample]
        assert out.request_ids == expected_ids
        stops = {rid: b for rid, _, b, _ in step}
        seen += [(rid, stops[rid] - 1, out.logits[i]) for i, rid in enumerate(out.request_ids)]
    return seen


def test_mixed_batches_match_transformers(tiny_folder: Path) -> None:
    weights = load_folder(tiny_folder, torch.float32)
    executor = TorchExecutor(weights, block_size=BLOCK, num_blocks=64)
    rng = random.Random(1)
    lengths = {rid: max(b for step in STEPS for r, _, b, _ in step if r == rid) for rid in "abcd"}
    sequences = {rid: [rng.randrange(101) for _ in range(n)] for rid, n in lengths.items()}
    # Scattered, interleaved block ids: a request's blocks are never contiguous.
    free = list(range(64))
    rng.shuffle(free)
    tables = {rid: [free.pop() for _ in range(-(-n // BLOCK))] for rid, n in lengths.items()}

    rows = run_steps(executor, sequences, tables)

    reference = hf_model(tiny_folder)
    with torch.no_grad():
        ref = {rid: reference(torch.tensor([seq])).logits[0] for rid, seq in sequences.items()}
    assert len(rows) == 11
    for rid, pos, logits in rows:
        err = (logits - ref[rid][pos]).abs().max().item()
        assert err < 1e-4, f"request {rid} position {pos}: max abs logit error {err}"


BAD_ENTRIES = {
    "outside the pool": plan_entry("x", [1, 2], 0, [8], True, GREEDY),
    "needs 2 blocks": plan_entry("x", [1] * 5, 0, [6], True, GREEDY),
    "outside the model's": plan_entry("x", [1], 32, [6] * 9, True, GREEDY),
    "token ids outside": plan_entry("x", [101], 0, [6], True, GREEDY),
    "no tokens": plan_entry("x", [], 0, [6], True, GREEDY),
}


@pytest.mark.parametrize("message", list(BAD_ENTRIES))
def test_an_entry_it_cannot_run_fails_alone(tiny_folder: Path, message: str) -> None:
    """One bad entry among good ones: it is reported in ``failed``, nothing of it reaches
    the cache, and the good ones get exactly the tokens they get when run alone."""
    weights = load_folder(tiny_folder, torch.float32)
    good = [
        plan_entry("a", list(range(3, 12)), 0, [0, 1, 2], True, GREEDY),
        plan_entry("b", [7, 8, 9, 10, 11], 0, [3, 4], True, GREEDY),
        plan_entry("c", [5, 6, 7], 0, [5], False, GREEDY),
    ]
    alone = TorchExecutor(weights, block_size=BLOCK, num_blocks=8, max_model_len=32)
    expected = alone.execute(SchedulerOutput(good))
    executor = TorchExecutor(weights, block_size=BLOCK, num_blocks=8, max_model_len=32)
    result = executor.execute(SchedulerOutput([good[0], BAD_ENTRIES[message], *good[1:]]))
    assert list(result.failed) == ["x"] and message in result.failed["x"]
    assert result.sampled == expected.sampled and set(result.sampled) == {"a", "b"}
    cache = executor.runner.cache
    assert not cache.k[0][:, 6:].any() and not cache.v[0][:, 6:].any()
    with pytest.raises(ValueError, match=message):
        executor.runner.logits(SchedulerOutput([BAD_ENTRIES[message]]))


def test_a_plan_of_only_bad_entries_samples_nothing(tiny_folder: Path) -> None:
    executor = TorchExecutor(
        load_folder(tiny_folder, torch.float32), block_size=BLOCK, num_blocks=8
    )
    result = executor.execute(SchedulerOutput([BAD_ENTRIES["outside the pool"]]))
    assert result.sampled == {} and list(result.failed) == ["x"]


def test_kernels_and_torch_ops_agree(tiny_folder: Path) -> None:
    """The CPU kernels and the torch-op path give the same logits on the mixed steps."""
    weights = load_folder(tiny_folder, torch.float32)
    rng = random.Random(2)
    sequences = {rid: [rng.randrange(101) for _ in range(25)] for rid in "abcd"}
    tables = {rid: list(range(8 * i, 8 * i + 7)) for i, rid in enumerate("abcd")}
    native = TorchExecutor(weights, block_size=BLOCK, num_blocks=64)
    if native.runner.kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    reference = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, kernels="torch")
    assert reference.runner.kernels is None
    ours = run_steps(native, sequences, tables)
    theirs = run_steps(reference, sequences, tables)
    for (rid, pos, a), (_, _, b) in zip(ours, theirs, strict=True):
        assert (a - b).abs().max().item() < 1e-5, (rid, pos)


def test_bfloat16_tile_projections_stay_within_rounding_of_the_packed_matmul(
    tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bfloat16 on AMX the kernels also run the projections of up to 64 rows; against
    the same kernels with every projection through ``Linear``, the mixed steps'
    probabilities differ only by bfloat16 rounding."""
    weights = load_folder(tiny_folder, torch.bfloat16)
    rng = random.Random(4)
    sequences = {rid: [rng.randrange(101) for _ in range(25)] for rid in "abcd"}
    tables = {rid: list(range(8 * i, 8 * i + 7)) for i, rid in enumerate("abcd")}
    with_tiles = TorchExecutor(weights, block_size=BLOCK, num_blocks=64)
    kernels = with_tiles.runner.kernels
    if kernels is None or not kernels.has_tile_linear:
        pytest.skip("no AMX linear here (no C++ compiler, or a CPU or OS without AMX)")
    without = TorchExecutor(weights, block_size=BLOCK, num_blocks=64)
    without.runner.ops = Ops(norm=kernels.rms_norm, silu_mul=kernels.silu_mul)
    # One op at a time on both sides: the decode stack runs the same tile projections
    # (test_torch_stack holds it to the op-by-op path bit for bit), but not through
    # ``Ops``, which is what the two executors differ in.
    with_tiles.runner.stack = without.runner.stack = None
    tile_rows = []
    real, real_gated = Kernels._tile_linear, Kernels._tile_gated

    def counted(self: Kernels, layer: Linear, x: torch.Tensor, r: torch.Tensor | None) -> object:
        tile_rows.append(x.shape[0])
        return real(self, layer, x, r)

    def counted_gated(self: Kernels, layer: Linear, x: torch.Tensor) -> object:
        tile_rows.append(x.shape[0])
        return real_gated(self, layer, x)

    monkeypatch.setattr(Kernels, "_tile_linear", counted)
    monkeypatch.setattr(Kernels, "_tile_gated", counted_gated)
    ours = run_steps(with_tiles, sequences, tables)
    # Every step has at most 64 rows: each layer's four projections run on tiles (the
    # gate/up one with SiLU, Kernels.gated_linear).
    step_rows = [sum(b - a for _, a, b, _ in step) for step in STEPS]
    assert tile_rows == [n for n in step_rows for _ in range(4 * weights.args.num_layers)]
    theirs = run_steps(without, sequences, tables)
    assert len(tile_rows) == 4 * weights.args.num_layers * len(STEPS)
    for (rid, pos, a), (_, _, b) in zip(ours, theirs, strict=True):
        gap = (torch.softmax(a, -1) - torch.softmax(b, -1)).abs().max().item()
        assert gap < 0.01, (rid, pos, gap)


def test_bucketed_decode_forward_matches_the_eager_one(tiny_folder: Path) -> None:
    """The forward CUDA graphs capture (batch and block tables padded to power-of-two
    buckets, padding written to the scratch block), run here without a graph."""
    weights = load_folder(tiny_folder, torch.float32)
    rng = random.Random(3)
    eager = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, kernels="torch")
    bucketed = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, kernels="torch")
    runner = bucketed.runner
    graphs = DecodeGraphs(weights, runner.cache, runner.rope, runner.max_model_len, capture=False)
    prompts = {f"r{i}": [rng.randrange(101) for _ in range(4 + 5 * i)] for i in range(5)}
    tables = {rid: list(range(10 * i, 10 * i + 9)) for i, rid in enumerate(prompts)}
    prefill = SchedulerOutput(
        [plan_entry(r, p, 0, tables[r], True, GREEDY) for r, p in prompts.items()]
    )
    for executor in (eager, bucketed):
        executor.runner.logits(prefill)
    decode = [plan_entry(r, [9], len(p), tables[r], True, GREEDY) for r, p in prompts.items()]
    expected = eager.runner.logits(SchedulerOutput(decode)).logits
    slices = [SequenceSlice(i, 1, s.start_position, s.block_table) for i, s in enumerate(decode)]
    got = graphs.run(slices, [9] * len(decode))
    assert got is not None and got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-5
    assert list(graphs.graphs) == [(8, 8)]  # 5 requests -> 8 rows; at most 7 blocks -> 8
    # Padded rows wrote only the scratch block: the cache matches the eager one's pool.
    for k_eager, k_bucketed in zip(eager.runner.cache.k, runner.cache.k, strict=True):
        assert torch.allclose(k_eager[:, :64], k_bucketed[:, :64], atol=1e-6)


def test_max_model_len_defaults_to_the_model_and_may_only_shrink(tiny_folder: Path) -> None:
    weights = load_folder(tiny_folder, torch.float32)
    assert TorchExecutor(weights, block_size=BLOCK, num_blocks=4).max_model_len == 256
    assert (
        TorchExecutor(weights, block_size=BLOCK, num_blocks=4, max_model_len=100).max_model_len
        == 100
    )
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 256"):
        TorchExecutor(weights, block_size=BLOCK, num_blocks=4, max_model_len=300)


def test_bfloat16_stays_close_to_float32(tiny_folder: Path) -> None:
    tokens = list(range(3, 40))
    plan = SchedulerOutput([plan_entry("a", tokens, 0, list(range(10)), True, GREEDY)])
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        executor = TorchExecutor(load_folder(tiny_folder, dtype), block_size=BLOCK, num_blocks=16)
        logits[dtype] = executor.runner.logits(plan).logits[0]
    probs = {d: torch.softmax(x, -1) for d, x in logits.items()}
    assert (probs[torch.float32] - probs[torch.bfloat16]).abs().max() < 0.05


def _bfloat16_matmuls_or_skip() -> None:
    if not detect().onednn_bfloat16:
        pytest.skip(f"oneDNN runs no bfloat16 on this CPU ({' '.join(detect().names())})")


def largest_probability_gap(
    a: TorchExecutor, b: TorchExecutor, seed: int
) -> tuple[float, tuple[str, int]]:
    """The largest difference of any token's probability between ``a`` and ``b`` over
    ``STEPS`` on random sequences (``seed``), and the (request, position) where it was."""
    rng = random.Random(seed)
    sequences = {rid: [rng.randrange(101) for _ in range(25)] for rid in "abcd"}
    tables = {rid: list(range(8 * i, 8 * i + 7)) for i, rid in enumerate("abcd")}
    gaps = [
        ((torch.softmax(x, -1) - torch.softmax(y, -1)).abs().max().item(), (rid, pos))
        for (rid, pos, x), (_, _, y) in zip(
            run_steps(a, sequences, tables), run_steps(b, sequences, tables), strict=True
        )
    ]
    return max(gaps)


def test_bfloat16_matmuls_keep_a_float32_model_close_to_float32(tiny_folder: Path) -> None:
    """``matmul_dtype: bfloat16``: the float32 model's matmuls in bfloat16 over a
    bfloat16 KV cache, on the mixed steps, stay within bfloat16's rounding of float32."""
    _bfloat16_matmuls_or_skip()
    weights = load_folder(tiny_folder, torch.float32)
    mixed = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, matmul_dtype="bfloat16")
    assert ("matmul_dtype", "bfloat16") in mixed.platform
    assert mixed.runner.cache.k[0].dtype == torch.bfloat16
    full = TorchExecutor(weights, block_size=BLOCK, num_blocks=64)
    assert full.runner.cache.k[0].dtype == torch.float32
    gap, where = largest_probability_gap(mixed, full, seed=3)
    # 0.004 here on an AMD EPYC (Zen 4); the bfloat16 model is 0.012 from float32.
    assert gap < 0.02, where


def test_bfloat16_matmuls_through_kernels_and_torch_ops_agree(tiny_folder: Path) -> None:
    """The same bfloat16 matmuls and cache through the CPU kernels and through torch ops:
    the two differ only where a float32 sum rounds to the other bfloat16 neighbour."""
    _bfloat16_matmuls_or_skip()
    weights = load_folder(tiny_folder, torch.float32)
    native = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, matmul_dtype="bfloat16")
    if native.runner.kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    reference = TorchExecutor(
        weights, block_size=BLOCK, num_blocks=64, kernels="torch", matmul_dtype="bfloat16"
    )
    gap, where = largest_probability_gap(native, reference, seed=4)
    assert gap < 5e-3, where  # 0.002 seen (Zen 4)


def test_a_float16_kv_cache_keeps_a_float32_model_close_to_float32(tiny_folder: Path) -> None:
    """``kv_cache_dtype: float16``: K and V stored in float16 (10 mantissa bits to
    bfloat16's 7), on the mixed steps, against the float32 cache."""
    weights = load_folder(tiny_folder, torch.float32)
    half = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, kv_cache_dtype="float16")
    assert ("kv_cache_dtype", "float16") in half.platform
    assert half.runner.cache.k[0].dtype == torch.float16
    full = TorchExecutor(weights, block_size=BLOCK, num_blocks=64, kv_cache_dtype="float32")
    assert full.runner.cache.k[0].dtype == torch.float32
    gap, where = largest_probability_gap(half, full, seed=3)
    assert gap < 0.005, where


@pytest.mark.parametrize("fmt", ["dense", "int8"])
def test_a_step_padded_once_gives_the_logits_of_each_matmul_padding_its_own_input(
    tiny_folder: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step past the compact weights' bound runs its layers at the bucketed row count
    from the embeddings on (``forward_hidden``'s ``rows``): its logits equal, bit for
    bit, the same step run at its exact row count, each matmul padding its own input to
    the same bucket."""
    weights = load_folder(tiny_folder, torch.float32)
    executor = TorchExecutor(
        weights, block_size=BLOCK, num_blocks=64, weights_format=fmt,  # type: ignore[arg-type]
        compact_max_rows=16,
    )  # fmt: skip
    runner = executor.runner
    if fmt == "int8" and runner.kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    rng = random.Random(5)
    plan = SchedulerOutput(
        [
            plan_entry("a", [rng.randrange(101) for _ in range(30)], 0, list(range(8)), True, GREEDY),
            plan_entry("b", [rng.randrange(101) for _ in range(15)], 0, list(range(8, 12)), True, GREEDY),
        ]
    )  # fmt: skip
    assert runner._matmul_rows(45) == 48
    padded = runner.logits(plan)
    monkeypatch.setattr(runner, "_matmul_rows", lambda tokens: None)
    exact = runner.logits(plan)
    assert padded.request_ids == exact.request_ids == ["a", "b"]
    assert torch.equal(padded.logits, exact.logits)
