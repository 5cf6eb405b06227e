"""The roofline cost model: the seed article's arithmetic, and how each term moves."""

from __future__ import annotations

import pytest

from orchestrator.common.cost_model import CostModel
from orchestrator.common.specs import GPUSpec, load_gpu_spec, load_model_spec
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from tests.factories import plan_entry

LLAMA_70B = load_model_spec("llama3-70b")
H100 = load_gpu_spec("h100-sxm")


def plan_of(*shapes: tuple[int, int]) -> SchedulerOutput:
    """One sampling request per ``(new tokens, cached positions)``."""
    params = SamplingParams()
    return SchedulerOutput(
        scheduled=[
            plan_entry(f"r{i}", [1] * n, p, [], True, params) for i, (n, p) in enumerate(shapes)
        ]
    )


def test_llama3_70b_bf16_weight_load_per_decode_step_is_41_8_ms() -> None:
    model = CostModel(LLAMA_70B, H100)
    assert model.weights_s == pytest.approx(41.8e-3, rel=0.02)
    assert model.decode_cost(1, 0).weights_s == model.weights_s


def test_memory_compute_crossover_is_near_batch_296() -> None:
    assert CostModel(LLAMA_70B, H100).crossover_batch_size() == pytest.approx(296, rel=0.05)


def test_crossover_is_where_dense_compute_catches_up_with_weights() -> None:
    model = CostModel(LLAMA_70B, H100)
    b = round(model.crossover_batch_size())
    below, above = model.decode_cost(b - 20, 0), model.decode_cost(b + 20, 0)
    assert below.dense_compute_s < below.weights_s
    assert above.dense_compute_s > above.weights_s


@pytest.mark.parametrize(("batch", "article"), [(1, 24), (32, 760), (64, 1500)])
def test_weights_only_tokens_per_second_match_the_article(batch: int, article: int) -> None:
    model = CostModel(LLAMA_70B, H100)
    assert batch / model.weights_s == pytest.approx(article, rel=0.05)


def test_kv_bytes_per_token_is_layers_x_2_x_kv_heads_x_head_dim_x_dtype() -> None:
    model = CostModel(LLAMA_70B, H100)
    assert model.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    fp8 = CostModel(LLAMA_70B, H100, kv_dtype="fp8", tp=2)
    assert fp8.kv_bytes_per_token == 80 * 2 * 8 * 128 / 2


def test_empty_plan_costs_nothing() -> None:
    cost = CostModel(LLAMA_70B, H100, step_overhead_s=1e-3).step_cost(SchedulerOutput())
    assert cost.total_s == 0.0


def test_total_takes_the_slower_of_memory_and_compute_per_kernel_kind() -> None:
    model = CostModel(LLAMA_70B, H100, step_overhead_s=1e-3)
    decode = model.decode_cost(8, 1000)
    assert decode.total_s == pytest.approx(
        decode.weights_s + decode.kv_s + decode.comms_s + decode.overhead_s
    )
    prefill = model.prefill_cost(4096)
    assert prefill.dense_compute_s > prefill.weights_s
    assert prefill.total_s == pytest.approx(
        prefill.dense_compute_s + prefill.attention_s + prefill.overhead_s
    )


def test_attributed_causes_sum_to_the_total() -> None:
    model = CostModel(LLAMA_70B, H100, tp=2, step_overhead_s=1e-3, allreduce_latency_s=5e-6)
    for cost in (model.decode_cost(16, 2000), model.prefill_cost(2048), model.decode_cost(512, 0)):
        assert sum(cost.attributed()) == pytest.approx(cost.total_s)


def test_decode_time_grows_with_context_through_kv_reads() -> None:
    model = CostModel(LLAMA_70B, H100)
    short, long = model.decode_cost(64, 100), model.decode_cost(64, 4000)
    assert long.kv_s > short.kv_s * 10
    assert long.weights_s == short.weights_s


def test_a_chunk_mid_sequence_attends_like_its_tokens_one_by_one() -> None:
    model = CostModel(LLAMA_70B, H100)
    chunk = model.step_cost(plan_of((64, 1000)))
    one_by_one = sum(model.step_cost(plan_of((1, 1000 + i))).attention_compute_s for i in range(64))
    assert chunk.attention_compute_s == pytest.approx(one_by_one)


def test_lm_head_flops_count_only_for_sampling_requests() -> None:
    model = CostModel(LLAMA_70B, H100)
    params = SamplingParams()
    sampling = SchedulerOutput([plan_entry("a", [1] * 512, 0, [], True, params)])
    silent = SchedulerOutput([plan_entry("a", [1] * 512, 0, [], False, params)])
    diff = model.step_cost(sampling).dense_compute_s - model.step_cost(silent).dense_compute_s
    vocab_flops = 2 * LLAMA_70B.vocab_size * LLAMA_70B.hidden_size
    assert diff == pytest.approx(vocab_flops / H100.bf16_flops)


def test_tensor_parallel_splits_weights_and_adds_two_allreduces_per_layer() -> None:
    tp1 = CostModel(LLAMA_70B, H100)
    tp2 = CostModel(LLAMA_70B, H100, tp=2, allreduce_latency_s=5e-6)
    assert tp2.weights_s == pytest.approx(tp1.weights_s / 2)
    assert tp1.decode_cost(64, 0).comms_s == 0.0
    comms = tp2.decode_cost(64, 0).comms_s
    per_allreduce_bytes = 64 * LLAMA_70B.hidden_size * 2  # bf16 activations
    ring = 2 * (2 - 1) / 2
    expected = 2 * 80 * (5e-6 + ring * per_allreduce_bytes / H100.interconnect_bw)
    assert comms == pytest.approx(expected)


def test_fp8_halves_weight_bytes_and_runs_on_fp8_tensor_cores() -> None:
    bf16 = CostModel(LLAMA_70B, H100)
    fp8 = CostModel(LLAMA_70B, H100, weight_dtype="fp8")
    assert fp8.weights_s == pytest.approx(bf16.weights_s / 2)
    assert fp8.dense_flops_rate == H100.fp8_flops


def test_fp8_on_a_gpu_without_fp8_tensor_cores_computes_in_bf16() -> None:
    a100 = load_gpu_spec("a100-80gb")
    model = CostModel(LLAMA_70B, a100, weight_dtype="fp8", kv_dtype="fp8")
    assert model.dense_flops_rate == a100.bf16_flops
    assert model.weights_s == pytest.approx(CostModel(LLAMA_70B, a100).weights_s / 2)


def test_efficiency_factors_scale_the_peaks() -> None:
    derated = GPUSpec(**{**H100.model_dump(), "bw_efficiency": 0.5, "flops_efficiency": 0.8})
    model = CostModel(LLAMA_70B, derated)
    assert model.weights_s == pytest.approx(CostModel(LLAMA_70B, H100).weights_s * 2)
    assert model.dense_flops_rate == pytest.approx(H100.bf16_flops * 0.8)


def test_tied_embeddings_are_streamed_once_as_the_lm_head() -> None:
    small = load_model_spec("smollm2-135m")
    model = CostModel(small, H100)
    assert model.weight_bytes == small.num_params * 2


def test_tp_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="tp must be at least 1"):
        CostModel(LLAMA_70B, H100, tp=0)


def test_attention_efficiency_slows_only_the_attention_kernels() -> None:
    full = CostModel(LLAMA_70B, H100)
    half = CostModel(LLAMA_70B, H100, attention_efficiency=0.5)
    a, b = full.decode_cost(32, 2000), half.decode_cost(32, 2000)
    assert b.kv_s == pytest.approx(2 * a.kv_s)
    assert b.attention_compute_s == pytest.approx(2 * a.attention_compute_s)
    assert (b.weights_s, b.dense_compute_s) == (a.weights_s, a.dense_compute_s)
    with pytest.raises(ValueError, match="attention_efficiency must be positive"):
        CostModel(LLAMA_70B, H100, attention_efficiency=0)
