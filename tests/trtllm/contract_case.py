"""The trtllm adapters over their fakes, as cases of the shared executor contract suite
(tests/contract): engine mode over the fake bindings, LLM-API mode over the fake LLM."""

from __future__ import annotations

import pytest

from plugins.trtllm import (
    TrtllmExecutor,
    TrtllmExecutorConfig,
    TrtllmLlmApiConfig,
    TrtllmLlmApiExecutor,
)
from plugins.trtllm.llm_api.settings import load_settings as load_llm_settings
from plugins.trtllm.settings import load_settings
from tests.contract.conftest import ExecutorCase
from tests.trtllm import fake_llmapi, fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build

BUILD = FakeBuild(tokens_per_block=16, vocab_size=512, kv_memory_tokens=4096)


def trtllm_fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    """Executors started on one fake engine build (230 KV blocks of 16 tokens, a
    512-token vocabulary). The executor returns the chosen token's log-probability only."""
    config = TrtllmExecutorConfig(engine_dir=write_build(tmp_path_factory.mktemp("trtllm"), BUILD))
    settings = load_settings(config)
    return ExecutorCase(
        lambda: TrtllmExecutor.open(config, settings, module=fake_tensorrt_llm),
        BUILD.tokens_per_block,
        BUILD.vocab_size,
        returns_logprobs=True,
        top_logprobs=False,
        seeded_survives_preemption=False,
    )


def trtllm_llmapi_fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    """LLM-API executors started on one fake PyTorch-backend build of the same shape."""
    root = write_build(tmp_path_factory.mktemp("trtllm-llmapi"), FakeBuild(backend="pytorch"))
    config = TrtllmLlmApiConfig(build_dir=root)
    settings = load_llm_settings(config)
    return ExecutorCase(
        lambda: TrtllmLlmApiExecutor.open(config, settings, module=fake_llmapi),
        BUILD.tokens_per_block,
        BUILD.vocab_size,
        returns_logprobs=True,
        top_logprobs=False,
        seeded_survives_preemption=False,
    )
