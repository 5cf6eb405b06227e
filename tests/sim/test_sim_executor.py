"""The ``sim`` executor: config validation, KV capacity from the capacity model, and its
steps."""

from __future__ import annotations

import math

import pytest

from orchestrator.common.capacity import DEFAULT_RUNTIME_RESERVE_BYTES
from orchestrator.common.deployment import Deployment, DoesNotFitError
from orchestrator.common.specs import load_gpu_spec, load_model_spec
from orchestrator.core.config import ConfigError, EngineConfig, SchedulerConfig, load_engine_config
from orchestrator.core.executor import Executor, create_executor
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.sim_executor import SimExecutor
from tests.factories import plan_entry

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
        ({"runtime_reserve_bytes": -1}, "runtime_reserve_bytes"),
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


def test_kv_capacity_is_the_capacity_plan_for_the_engines_limits() -> None:
    config = engine(model="llama3-70b", weight_dtype="fp8", kv_dtype="fp8", tp=2)
    executor = create_executor(config)
    options = config.executor.options
    assert isinstance(options, Deployment)
    plan = options.capacity(config.scheduler, config.cache.block_size)
    assert executor.info().num_kv_blocks == plan.kv_blocks
    assert executor.info().block_size == config.cache.block_size == 16
    assert executor.info().num_gpus == 2
    # A larger step needs more activation workspace, which leaves fewer KV blocks.
    wide = config.model_copy(update={"scheduler": SchedulerConfig(max_num_tokens=16384)})
    assert create_executor(wide).info().num_kv_blocks < plan.kv_blocks


def test_the_runtime_reserve_defaults_to_the_builders_and_comes_out_of_the_kv_pool() -> None:
    from build_engines.spec import MemorySection

    assert Deployment().runtime_reserve_bytes == DEFAULT_RUNTIME_RESERVE_BYTES
    assert MemorySection().runtime_reserve_bytes == DEFAULT_RUNTIME_RESERVE_BYTES
    base = dict(model="llama3-70b", weight_dtype="fp8", kv_dtype="fp8", tp=2)
    default = create_executor(engine(**base)).info().num_kv_blocks
    spare = create_executor(engine(**base, runtime_reserve_bytes=0)).info().num_kv_blocks
    # 0.9 of the 2 GB reserve, in blocks of 16 tokens x 81,920 bytes.
    assert spare - default == pytest.approx(0.9 * 2e9 / (16 * 81_920), abs=1)


def test_weights_that_do_not_fit_fail_at_construction_with_the_sizes() -> None:
    with pytest.raises(
        DoesNotFitError, match=r"141\.1 GB of weights and .* per GPU at tp=1.*80 GB of H100-SXM"
    ):
        create_executor(engine(model="llama3-70b", weight_dtype="bf16"))


def test_workspace_alone_can_make_a_deployment_not_fit() -> None:
    # FP8 70B at tp=1 leaves about 7 GB beside its 72.7 GB of weights; an 8 GB reserve
    # takes all of it.
    with pytest.raises(DoesNotFitError, match="of workspace per GPU at tp=1"):
        create_executor(
            engine(model="llama3-70b", weight_dtype="fp8", runtime_reserve_bytes=8_000_000_000)
        )


def _plan(*entries: tuple[str, int, int, bool], stops: tuple[int, ...] = ()) -> SchedulerOutput:
    params = SamplingParams(stop_token_ids=stops)
    return SchedulerOutput(
        scheduled=[
            plan_entry(rid, [7] * n, p, list(range(math.ceil((n + p) / 16))), sample, params)
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


def test_decode_ceiling_is_bounded_by_kv_capacity() -> None:
    config = engine(model="llama3-70b", weight_dtype="fp8", kv_dtype="fp8", tp=2)
    options = config.executor.options
    assert isinstance(options, Deployment)
    uncapped = SchedulerConfig(max_batch_size=10_000, max_num_tokens=10_000)
    fits = options.capacity(uncapped, 16).sequences_at(8000)
    capped = options.decode_ceiling(uncapped, config.cache, 4000, 4000)
    assert capped == pytest.approx(options.cost_model().decode_tokens_per_s(fits, 6000))
    assert fits >= 2
    fewer = SchedulerConfig(max_batch_size=fits - 1, max_num_tokens=10_000)
    assert options.decode_ceiling(fewer, config.cache, 4000, 4000) < capped
    # The engine's pool is cache.num_blocks where that is smaller, and so is the ceiling.
    pinned = config.cache.model_copy(update={"num_blocks": 500})  # one 8,000-token sequence
    assert options.decode_ceiling(uncapped, pinned, 4000, 4000) == pytest.approx(
        options.cost_model().decode_tokens_per_s(1, 6000)
    )
