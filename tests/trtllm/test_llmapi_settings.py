"""LLM-API settings: a PyTorch-backend build's manifest or a model given directly, with
options over them; bad folders and mismatched engine configs are named."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.config import ConfigError, ModelConfig
from plugins.trtllm import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.settings import (
    CudaGraphs,
    LlmApiSettings,
    load_settings,
    with_model_len,
)
from tests.trtllm.builds import FakeBuild, engine_config, write_build


def settings_for(root: Path, **options: Any) -> LlmApiSettings:
    return load_settings(TrtllmLlmApiConfig(build_dir=root, **options))


def test_the_manifest_gives_the_llm_options(tmp_path: Path) -> None:
    build = FakeBuild(
        backend="pytorch",
        max_batch_size=4,
        max_num_tokens=128,
        max_input_len=100,
        max_seq_len=300,
        tokens_per_block=32,
        tp=2,
        runtime={
            "cuda_graph_batch_sizes": [4, 1, 2],
            "cuda_graph_padding": True,
            "kv_cache_free_gpu_memory_fraction": 0.8,
            "enable_block_reuse": False,
            "capacity_scheduler_policy": "MAX_UTILIZATION",
        },
    )
    settings = settings_for(write_build(tmp_path, build))
    assert settings.model == str(tmp_path / "checkpoint")
    assert (settings.tensor_parallel_size, settings.pipeline_parallel_size) == (2, 1)
    assert (settings.max_batch_size, settings.max_num_tokens) == (4, 128)
    assert (settings.max_input_len, settings.max_seq_len) == (100, 300)
    assert (settings.tokens_per_block, settings.kv_cache_dtype) == (32, "fp8")
    assert settings.kv_cache_free_gpu_memory_fraction == 0.8
    assert settings.enable_block_reuse is False and settings.enable_chunked_prefill is True
    assert settings.cuda_graphs == CudaGraphs((1, 2, 4), None, True)
    assert settings.capacity_scheduler_policy == "MAX_UTILIZATION"
    assert settings.world_size == 2


def test_options_override_the_build(tmp_path: Path) -> None:
    settings = settings_for(
        write_build(tmp_path, FakeBuild(backend="pytorch")),
        tensor_parallel_size=2,
        kv_cache_free_gpu_memory_fraction=0.5,
        enable_block_reuse=False,
        max_batch_size=4,
        max_seq_len=256,
        enable_chunked_prefill=False,
        cuda_graph_batch_sizes=[2, 1],
        capacity_scheduler_policy="STATIC_BATCH",
    )
    assert settings.tensor_parallel_size == 2
    assert settings.kv_cache_free_gpu_memory_fraction == 0.5
    assert not (settings.enable_block_reuse or settings.enable_chunked_prefill)
    assert (settings.max_batch_size, settings.max_seq_len) == (4, 256)
    assert settings.cuda_graphs == CudaGraphs((1, 2), None, False)
    assert settings.capacity_scheduler_policy == "STATIC_BATCH"


def test_cuda_graphs_can_be_turned_off(tmp_path: Path) -> None:
    root = write_build(tmp_path, FakeBuild(backend="pytorch"))
    assert settings_for(root).cuda_graphs == CudaGraphs(None, 8, False)
    assert settings_for(root, cuda_graphs=False).cuda_graphs is None
    off = write_build(
        tmp_path / "off", FakeBuild(backend="pytorch", runtime={"cuda_graphs": False})
    )
    assert settings_for(off).cuda_graphs is None


def test_a_model_given_directly_takes_the_defaults() -> None:
    settings = load_settings(TrtllmLlmApiConfig(model="meta-llama/Llama-3.2-1B", max_seq_len=4096))
    assert settings.model == "meta-llama/Llama-3.2-1B"
    assert (settings.tensor_parallel_size, settings.tokens_per_block) == (1, 32)
    assert (settings.max_batch_size, settings.max_num_tokens) == (256, 8192)
    # Without an input limit of its own the input may use the whole sequence.
    assert (settings.max_input_len, settings.max_seq_len) == (4096, 4096)
    assert settings.cuda_graphs == CudaGraphs(None, 256, True)
    assert settings.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"
    assert load_settings(TrtllmLlmApiConfig(model="m")).max_seq_len is None


def test_cuda_graphs_are_captured_up_to_the_batch_size_and_no_further() -> None:
    small = load_settings(TrtllmLlmApiConfig(model="m", max_seq_len=64, max_batch_size=16))
    assert small.cuda_graphs == CudaGraphs(None, 16, True)
    listed = TrtllmLlmApiConfig(model="m", max_batch_size=16, cuda_graph_batch_sizes=[8, 1, 4])
    assert load_settings(listed).cuda_graphs == CudaGraphs((1, 4, 8), None, True)


def test_the_input_limit_is_never_left_to_tensorrt_llms_default() -> None:
    # TensorRT-LLM defaults max_input_len to 1024 when neither limit is set.
    options = TrtllmLlmApiConfig(model="m")
    engine = engine_config(options)
    with_len = engine.model_copy(
        update={"model": ModelConfig(name="fake", source="unused", max_model_len=8192)}
    )
    assert with_model_len(load_settings(options), with_len).max_input_len == 8192
    with pytest.raises(ConfigError, match=r"set model.max_model_len .* 1024 tokens"):
        with_model_len(load_settings(options), engine)
    given = TrtllmLlmApiConfig(model="m", max_input_len=100)
    assert with_model_len(load_settings(given), engine).max_input_len == 100


def test_exactly_one_source_is_required() -> None:
    with pytest.raises(ValueError, match="exactly one of build_dir"):
        TrtllmLlmApiConfig()
    with pytest.raises(ValueError, match="exactly one of build_dir"):
        TrtllmLlmApiConfig(build_dir=Path("/b"), model="m")


def test_an_engine_build_is_refused_with_the_other_type_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"serving.backend is 'engine'.*type: trtllm$"):
        settings_for(write_build(tmp_path))


def test_folders_without_a_verified_manifest_or_checkpoint_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"{tmp_path}: no manifest.json"):
        settings_for(tmp_path)
    root = write_build(tmp_path / "b", FakeBuild(backend="pytorch"))
    shutil.rmtree(root / "checkpoint")
    with pytest.raises(ConfigError, match=r"serving.artifact_dir: no config.json"):
        settings_for(root)
    unverified = write_build(tmp_path / "u", FakeBuild(backend="pytorch"), verified=False)
    with pytest.raises(ConfigError, match="failed verification"):
        settings_for(unverified)
