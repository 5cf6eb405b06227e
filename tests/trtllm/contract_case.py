"""The trtllm adapter over the fake bindings, as a case of the shared executor contract
suite (tests/contract)."""

from __future__ import annotations

import pytest

from plugins.trtllm import TrtllmExecutor, TrtllmExecutorConfig
from plugins.trtllm.settings import load_settings
from tests.contract.conftest import ExecutorCase
from tests.trtllm import fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build

BUILD = FakeBuild(tokens_per_block=16, vocab_size=512, kv_memory_tokens=4096)


def trtllm_fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    """Executors started on one fake build (230 KV blocks of 16 tokens, a 512-token
    vocabulary). The executor returns the chosen token's log-probability only."""
    config = TrtllmExecutorConfig(engine_dir=write_build(tmp_path_factory.mktemp("trtllm"), BUILD))
    settings = load_settings(config)
    return ExecutorCase(
        lambda: TrtllmExecutor.open(config, settings, bindings=fake_tensorrt_llm),
        BUILD.tokens_per_block,
        BUILD.vocab_size,
        returns_logprobs=True,
        top_logprobs=False,
        seeded_survives_preemption=False,
    )
