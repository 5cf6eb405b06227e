"""Settings come from the build's manifest; options override them; bad folders are named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.config import ConfigError
from plugins.trtllm import TrtllmExecutorConfig
from plugins.trtllm.settings import EngineSettings, load_settings
from tests.trtllm.builds import FakeBuild, write_build


def settings_for(root: Path, **options: Any) -> EngineSettings:
    return load_settings(TrtllmExecutorConfig(engine_dir=root, **options))


def test_the_manifest_gives_limits_and_run_time_defaults(tmp_path: Path) -> None:
    build = FakeBuild(
        max_batch_size=4,
        max_num_tokens=128,
        max_input_len=100,
        max_seq_len=300,
        tokens_per_block=32,
        runtime={
            "cuda_graph_cache_size": 12,
            "kv_cache_free_gpu_memory_fraction": 0.8,
            "enable_block_reuse": False,
            "capacity_scheduler_policy": "MAX_UTILIZATION",
        },
    )
    settings = settings_for(write_build(tmp_path, build))
    assert settings.engine_path == tmp_path / "engine"
    assert (settings.max_batch_size, settings.max_num_tokens) == (4, 128)
    assert (settings.max_input_len, settings.max_seq_len, settings.tokens_per_block) == (
        100,
        300,
        32,
    )
    assert settings.kv_cache_free_gpu_memory_fraction == 0.8
    assert settings.enable_block_reuse is False
    assert settings.enable_chunked_context is True
    assert (settings.cuda_graph_mode, settings.cuda_graph_cache_size) == (True, 12)
    assert settings.capacity_scheduler_policy == "MAX_UTILIZATION"
    assert settings.kv_cache_max_tokens is None and settings.world_size == 1


def test_options_override_the_build(tmp_path: Path) -> None:
    settings = settings_for(
        write_build(tmp_path),
        kv_cache_free_gpu_memory_fraction=0.5,
        kv_cache_max_tokens=2048,
        enable_block_reuse=False,
        enable_chunked_context=False,
        cuda_graph_mode=False,
        cuda_graph_cache_size=3,
        capacity_scheduler_policy="STATIC_BATCH",
        pad_id=2,
    )
    assert settings.kv_cache_free_gpu_memory_fraction == 0.5
    assert settings.kv_cache_max_tokens == 2048
    assert not (settings.enable_block_reuse or settings.enable_chunked_context)
    assert (settings.cuda_graph_mode, settings.cuda_graph_cache_size) == (False, 3)
    assert (settings.capacity_scheduler_policy, settings.pad_id) == ("STATIC_BATCH", 2)


def test_a_copied_build_folder_finds_its_engine(tmp_path: Path) -> None:
    write_build(tmp_path / "built")
    shutil.move(tmp_path / "built", tmp_path / "moved")
    assert settings_for(tmp_path / "moved").engine_path == tmp_path / "moved" / "engine"


def test_a_folder_without_a_manifest_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"{tmp_path}: no manifest.json"):
        settings_for(tmp_path)


def test_a_missing_engine_is_named(tmp_path: Path) -> None:
    shutil.rmtree(write_build(tmp_path) / "engine")
    with pytest.raises(ConfigError, match=r"serving.artifact_dir: no config.json at"):
        settings_for(tmp_path)


def test_an_unverified_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="failed verification"):
        settings_for(write_build(tmp_path, verified=False))


def test_a_pytorch_backend_build_is_refused(tmp_path: Path) -> None:
    root = write_build(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["serving"]["backend"] = "pytorch"
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"serving.backend is 'pytorch'"):
        settings_for(root)
