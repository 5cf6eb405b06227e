"""The ``sim`` executor: config validation, KV capacity from memory, and its steps."""

from __future__ import annotations

import math

import pytest

from orchestrator.common.specs import load_gpu_spec, load_model_spec
from orchestrator.core.config import ConfigError, EngineConfig, load_engine_config
from orchestrator.core.executor import Executor, create_executor
from orchestrator.core.output import ScheduledRequest, SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.sim_executor import DoesNotFitError, SimExecutor, memory_plan

LLAMA_70B = load_model_spec("llama3-70b")
H100 = load_gpu_spec("h100-sxm")


def engine(**options: object) -> EngineConfig:
    return EngineConfig.model_validate({"executor": {"type": "sim", **options}})


def test_yaml_executor_section_builds_a_sim_executor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "engine.yaml"
    path.write_text(
        "executor: {type: sim, model: llama3-70b, hardware: h100-sxm, "
        "weight_dtype: fp8, kv_dtype: fp8, tp: 2}\n"
    )
    executor = create_executor(load_engine_config(path))
    assert isinstance(executor, SimExecutor)
    assert isinstance(executor, Executor)
    assert executor.cost_model.tp == 2
    assert executor.max_model_len == LLAMA_70B.max_position_embeddings


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": "llama-9000"}, "unknown models spec 'llama-9000'"),
        ({"hardware": "tpu"}, "unknown hardware spec 'tpu'"),
        ({"tp": 3}, "tp=3 does not divide the 64 attention heads"),
        ({"weight_dtype": "int4"}, "weight_dtype"),
        ({"kv_memory_fraction": 0}, "kv_memory_fraction"),
        ({"bogus": 1}, "bogus: unknown key"),
    ],
)
def test_bad_options_are_rejected_naming_the_key(
    tmp_path, options: dict[str, object], message: str
) -> None:  # type: ignore[no-untyped-def]
    import yaml

    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"executor": {"type": "sim", **options}}))
    with pytest.raises(ConfigError, match=message):
        load_engine_config(path)


def test_kv_capacity_is_the_memory_left_after_weights_in_blocks() -> None:
    executor = create_executor(
        engine(model="llama3-70b", weight_dtype="fp8", kv_dtype="fp8", tp=2, kv_memory_fraction=0.9)
    )
    weights_per_gpu = LLAMA_70B.num_params / 2  # fp8: one byte per parameter
    kv_per_gpu = (H100.memory_bytes - weights_per_gpu) * 0.9
    per_token = 80 * 2 * 8 * 128 / 2
    assert executor.info().num_kv_blocks == int(kv_per_gpu // per_token) // 16


def test_weights_that_do_not_fit_fail_at_construction_with_the_sizes() -> None:
    with pytest.raises(DoesNotFitError, match=r"141\.1 GB per GPU at tp=1.*80 GB of H100-SXM"):
        create_executor(engine(model="llama3-70b", weight_dtype="bf16"))


def test_memory_plan_max_sequences_rounds_each_to_whole_blocks() -> None:
    plan = memory_plan(
        LLAMA_70B, H100, weight_dtype="fp8", kv_dtype="fp8", tp=2, kv_memory_fraction=0.9
    )
    blocks = plan.kv_tokens // 16
    assert plan.max_sequences(4096, 16) == blocks // 256
    assert plan.max_sequences(4097, 16) == blocks // 257
    assert plan.kv_blocks(16) == blocks


def test_kv_heads_repeat_beyond_their_count_under_wide_tp() -> None:
    def per_gpu(tp: int) -> float:
        plan = memory_plan(
            LLAMA_70B, H100, weight_dtype="fp8", kv_dtype="fp8", tp=tp, kv_memory_fraction=1
        )
        return plan.kv_bytes_per_token

    whole = LLAMA_70B.kv_bytes_per_token("fp8")
    assert per_gpu(8) == whole / 8  # one KV head per rank
    assert per_gpu(16) == whole / 8  # 16 ranks share 8 heads: each holds one, repeated


def _plan(*entries: tuple[str, int, int, bool], stops: tuple[int, ...] = ()) -> SchedulerOutput:
    params = SamplingParams(stop_token_ids=stops)
    return SchedulerOutput(
        scheduled=[
            ScheduledRequest(rid, [7] * n, p, list(range(math.ceil((n + p) / 16))), sample, params)
            for rid, n, p, sample in entries
        ]
    )


def test_execute_samples_exactly_the_requests_that_sample() -> None:
    executor = create_executor(engine(model="llama3-8b"))
    plan = _plan(("a", 100, 0, True), ("b", 64, 0, False), ("c", 1, 500, True))
    result = executor.execute(plan)
    assert set(result.sampled) == {"a", "c"}
    vocab = load_model_spec("llama3-8b").vocab_size
    assert all(0 <= t < vocab for t in result.sampled.values())


def test_duration_is_the_cost_models_prediction_and_explained() -> None:
    executor = create_executor(engine(model="llama3-8b"))
    assert isinstance(executor, SimExecutor)
    plan = _plan(("a", 512, 0, True), ("b", 1, 300, True))
    result = executor.execute(plan)
    assert executor.info().reports_step_cost
    assert result.cost is not None
    assert result.duration_s == executor.cost_model.step_cost(plan).total_s
    assert result.duration_s == pytest.approx(sum(result.cost.attributed()))


def test_tokens_depend_only_on_the_request_position_never_the_batch() -> None:
    executor = create_executor(engine(model="llama3-8b"))
    alone = executor.execute(_plan(("a", 10, 20, True))).sampled["a"]
    batched = executor.execute(_plan(("x", 99, 0, True), ("a", 10, 20, True))).sampled["a"]
    assert alone == batched


def test_sampled_tokens_avoid_the_requests_stop_ids() -> None:
    executor = create_executor(engine(model="llama3-8b"))
    natural = executor.execute(_plan(("a", 10, 20, True))).sampled["a"]
    avoided = executor.execute(_plan(("a", 10, 20, True), stops=(natural, natural + 1))).sampled
    assert avoided["a"] not in (natural, natural + 1)


def test_throughput_ceiling_is_bounded_by_kv_capacity() -> None:
    executor = create_executor(engine(model="llama3-70b", weight_dtype="fp8", kv_dtype="fp8"))
    assert isinstance(executor, SimExecutor)
    fits = executor.memory.max_sequences(8000, 16)
    capped = executor.throughput_ceiling(10_000, 4000, 4000)
    expected = executor.cost_model.decode_tokens_per_s(fits, 6000)
    assert capped == pytest.approx(expected)
    assert fits >= 2
    assert executor.throughput_ceiling(fits - 1, 4000, 4000) < capped
