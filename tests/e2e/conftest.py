"""Session fixtures: the default model loaded once (ours and transformers' own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.common.corpus import token_prompts
from orchestrator.common.model_source import load_tokenizer, resolve_source
from orchestrator.core.config import ModelConfig
from plugins.torch_executor.weights import LlamaWeights
from tests.e2e.generation import PROMPT_LENGTHS, reference_greedy
from tests.e2e.models import hf_model, session_cache_dir, smollm_weights


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def weights_f32(cache_dir: Path) -> LlamaWeights:
    return smollm_weights(cache_dir, torch.float32)


@pytest.fixture(scope="session")
def reference() -> Any:
    """transformers' Llama, dequantising the GGUF itself (not reading our cache), so a
    fault in our conversion cannot hide in both sides."""
    source = resolve_source(ModelConfig())
    return hf_model(source.directory, source.gguf_file)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer(ModelConfig())


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """Run this package on one intra-op thread. On a 2-core machine shared with other
    work, OpenMP threads that spin-wait for a busy core make each op several times
    slower; one thread keeps the suite's time predictable. Restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def prompts(tokenizer: Any) -> list[list[int]]:
    return token_prompts(tokenizer.encode, PROMPT_LENGTHS, seed=0)


@pytest.fixture(scope="session")
def greedy_references(
    reference: Any, prompts: list[list[int]], weights_f32: LlamaWeights
) -> list[tuple[list[int], torch.Tensor]]:
    pad = weights_f32.args.eos_token_ids[0]
    return [reference_greedy(reference, p, pad) for p in prompts]
