"""Config, weight loading and the dequantised-weight cache of the torch executor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.common.model_source import ResolvedSource
from orchestrator.core.config import ConfigError, EngineConfig, load_engine_config
from plugins.torch_executor import TorchExecutor, TorchExecutorConfig
from plugins.torch_executor import weights as weights_module
from plugins.torch_executor.paged import PagedKVCache
from plugins.torch_executor.weights import (
    ModelArgs,
    UnsupportedModelError,
    cached_gguf_folder,
    load_folder,
)
from tests.e2e.models import TINY_CONFIG, write_tiny_llama


def test_config_imports_without_torch() -> None:
    code = (
        "import sys, plugins.torch_executor as p; p.TorchExecutor.Config(dtype='float32');"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_engine_config_validates_torch_options(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("executor: {type: torch, dtype: float32, kv_cache_gib: 0.5, num_threads: 2}\n")
    options = load_engine_config(path).executor.options
    assert options == TorchExecutorConfig(dtype="float32", kv_cache_gib=0.5, num_threads=2)
    assert options.kv_cache_size_gib == 0.5
    assert TorchExecutorConfig().kv_cache_size_gib is None  # auto
    for bad in ("0", "-1", "nan", "lots"):
        path.write_text(f"executor: {{type: torch, kv_cache_gib: {bad}}}\n")
        with pytest.raises(ConfigError, match="kv_cache_gib"):
            load_engine_config(path)
    path.write_text("executor: {type: torch, dtype: float16}\n")
    with pytest.raises(ConfigError, match="dtype"):
        load_engine_config(path)
    path.write_text("executor: {type: torch, kv_cache: 1}\n")
    with pytest.raises(ConfigError, match="kv_cache: unknown key"):
        load_engine_config(path)


def engine_config(folder: Path, tmp_path: Path, **options: Any) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {"source": str(folder)},
            "cache": {"block_size": 8},
            # The tiny model has no tokenizer, which constrained decoding needs.
            "executor": {
                "type": "torch",
                "cache_dir": str(tmp_path / "cache"),
                "constraints": False,
                **options,
            },
        }
    )


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])
def test_from_config_sizes_the_pool_from_the_memory_budget(
    tmp_path: Path, kv_cache_dtype: str
) -> None:
    folder = write_tiny_llama(tmp_path / "tiny")
    config = engine_config(
        folder, tmp_path, dtype="float32", kv_cache_gib=0.001, seed=1,
        kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip
    executor = TorchExecutor.from_config(config.executor.options, config)
    args = ModelArgs.from_hf_config(json.loads((folder / "config.json").read_text()))
    dtype = getattr(torch, kv_cache_dtype)
    assert executor.runner.cache.k[0].dtype == dtype
    per_block = PagedKVCache.bytes_per_block(args, 8, dtype)
    assert per_block == 2 * 2 * 2 * 16 * 8 * dtype.itemsize
    assert executor.info().num_kv_blocks == int(0.001 * 2**30) // per_block
    assert executor.max_model_len == TINY_CONFIG["max_position_embeddings"]
    assert executor.eos_token_ids == (2,)
    assert executor.runner.weights.dtype == torch.float32


def test_from_config_rejects_a_budget_below_one_block(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "tiny")
    config = engine_config(folder, tmp_path, kv_cache_gib=1e-9)
    with pytest.raises(ValueError, match=r"\(kv_cache_gib 1e-09\) holds no block of 8 tokens"):
        TorchExecutor.from_config(config.executor.options, config)


def test_shutdown_is_idempotent_and_final(tmp_path: Path) -> None:
    executor = TorchExecutor(
        load_folder(write_tiny_llama(tmp_path / "tiny"), torch.float32), block_size=4, num_blocks=4
    )
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        executor.runner  # noqa: B018


def hf_config(**changes: Any) -> dict[str, Any]:
    base = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 101,
    }
    return {**base, **changes}


def test_model_args_read_old_and_new_rope_fields() -> None:
    old = ModelArgs.from_hf_config(
        hf_config(
            rope_theta=5e5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            eos_token_id=[7, 9],
        )
    )
    assert old.rope_theta == 5e5 and old.rope_scaling is not None
    assert old.rope_scaling.factor == 8.0 and old.eos_token_ids == (7, 9)
    new = ModelArgs.from_hf_config(
        hf_config(rope_parameters={"rope_type": "default", "rope_theta": 1e5})
    )
    assert new.rope_theta == 1e5 and new.rope_scaling is None
    assert new.head_dim == 16 and new.group_size == 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope_type 'yarn'"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"attention_bias": True}, "attention_bias=True"),
    ],
)
def test_model_args_reject_what_the_forward_does_not_implement(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        ModelArgs.from_hf_config(hf_config(**changes))


def test_generation_config_eos_ids_are_merged(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "tiny")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    assert load_folder(folder, torch.float32).args.eos_token_ids == (2, 5)


def test_gguf_cache_is_built_once_and_rebuilt_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "src" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"v1")
    tiny = write_tiny_llama(tmp_path / "tiny")
    calls: list[Path] = []

    def fake_dequantise(source: ResolvedSource, out: Path) -> None:
        calls.append(out)
        for f in ("config.json", "model.safetensors"):
            (out / f).write_bytes((tiny / f).read_bytes())

    monkeypatch.setattr(weights_module, "_dequantise_gguf", fake_dequantise)
    source = ResolvedSource(gguf.parent, gguf.name)
    cache = tmp_path / "cache"
    first = cached_gguf_folder(source, cache)
    assert cached_gguf_folder(source, cache) == first and len(calls) == 1
    assert load_folder(first, torch.float32).args.vocab_size == 101
    gguf.write_bytes(b"version 2")
    assert cached_gguf_folder(source, cache) != first and len(calls) == 2
    # Only finished folders remain: no half-written partial directories.
    assert all(not p.name.startswith(".partial") for p in first.parent.iterdir())


def test_failed_dequantisation_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")

    def broken(source: ResolvedSource, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(weights_module, "_dequantise_gguf", broken)
    with pytest.raises(OSError, match="disk full"):
        cached_gguf_folder(ResolvedSource(tmp_path, gguf.name), tmp_path / "cache")
    assert list((tmp_path / "cache" / "torch_executor").iterdir()) == []


def test_constraints_on_a_model_without_a_tokenizer_is_a_clear_start_up_error(
    tmp_path: Path,
) -> None:
    folder = write_tiny_llama(tmp_path / "tiny")
    config = engine_config(folder, tmp_path, constraints=True)
    with pytest.raises(
        ValueError, match=r"(?s)tokenizer cannot be read .* executor.constraints: false"
    ):
        TorchExecutor.from_config(config.executor.options, config)
