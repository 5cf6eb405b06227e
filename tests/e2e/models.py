"""Models for the torch executor's tests: a tiny random Llama written as a Hugging Face
folder (fast, exercises GQA, an untied head and Llama 3.1 RoPE scaling), and the
embedded SmolLM2 default, dequantised once per test session into the session's
temporary directory."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from orchestrator.common.model_source import resolve_source
from orchestrator.core.config import ModelConfig
from plugins.torch_executor.weights import LlamaWeights, cached_gguf_folder, load_folder

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 101,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    # Large weights give peaked distributions, so greedy choices are far from ties.
    "initializer_range": 0.2,
}


def write_tiny_llama(folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialised Llama (``TINY_CONFIG`` updated by ``overrides``) as
    ``config.json`` + ``model.safetensors`` in ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_CONFIG, **overrides}))
    model.save_pretrained(folder)
    return folder


def hf_model(folder: Path, gguf_file: str | None = None) -> Any:
    """transformers' own Llama on the same weights: the correctness oracle (float32)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()


def smollm_folder(cache_dir: Path) -> Path:
    """The dequantised default model under ``cache_dir`` (built on first call)."""
    return cached_gguf_folder(resolve_source(ModelConfig()), cache_dir)


@functools.cache
def smollm_weights(cache_dir: Path, dtype: torch.dtype) -> LlamaWeights:
    """Load the default model once per process and dtype: the contract and e2e suites
    share it, and executors built on it share its tensors."""
    return load_folder(smollm_folder(cache_dir), dtype)


def session_cache_dir(tmp_path_factory: Any) -> Path:
    """One weight cache per test session, shared by every suite that loads the model."""
    return Path(tmp_path_factory.getbasetemp()) / "orchestrator-cache"
