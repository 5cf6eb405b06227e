"""The fakes are as strict as the real TensorRT-LLM: they refuse what the real classes
refuse, take arguments in the same forms, and share the KV cache under each capacity
policy the way TensorRT-LLM's capacity scheduler does (capacityScheduler.cpp)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest

from tests.trtllm import fake_llmapi, fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build
from tests.trtllm.fake_llmapi._llm import RequestError
from tests.trtllm.plans import greedy_tokens, prompt_of

executor_bindings = fake_tensorrt_llm


def test_the_engine_fake_refuses_none_for_cpp_reference_parameters() -> None:
    # The real ExecutorConfig and Request take these as `const&`: None does not convert.
    for keyword in ("scheduler_config", "kv_cache_config", "extended_runtime_perf_knob_config"):
        with pytest.raises(TypeError, match=keyword):
            executor_bindings.ExecutorConfig(**{keyword: None})
    for keyword in ("sampling_config", "output_config", "streaming"):
        with pytest.raises(TypeError, match=keyword):
            executor_bindings.Request([1, 2], 3, **{keyword: None})
    with pytest.raises(TypeError, match="enable_block_reuse"):
        executor_bindings.KvCacheConfig(enable_block_reuse=None)
    # std::optional parameters take None.
    executor_bindings.ExecutorConfig(max_batch_size=None, parallel_config=None)
    executor_bindings.KvCacheConfig(max_tokens=None, free_gpu_memory_fraction=None)
    executor_bindings.Request([1], 1, end_id=None, stop_words=None)


def test_the_engine_fake_takes_the_real_positional_forms() -> None:
    config = executor_bindings.ExecutorConfig(
        1, executor_bindings.SchedulerConfig(), executor_bindings.KvCacheConfig(True, 128), True
    )
    assert config.kv_cache_config.max_tokens == 128 and config.enable_chunked_context
    assert executor_bindings.Request([1, 2], 3).max_tokens == 3
    # Past the real positional parameters the adapter uses, keywords only.
    with pytest.raises(TypeError):
        executor_bindings.SamplingConfig(1, 5)  # top_k is keyword-only in the real class too
    with pytest.raises(TypeError):
        executor_bindings.Request([1, 2], 3, True)


def test_the_llm_api_fake_validates_options_as_pydantic_does() -> None:
    with pytest.raises(pydantic.ValidationError, match="enable_block_reuse"):
        fake_llmapi.KvCacheConfig(enable_block_reuse=None)
    with pytest.raises(pydantic.ValidationError, match="tokens_per_blok"):
        fake_llmapi.KvCacheConfig(tokens_per_blok=16)
    with pytest.raises(pydantic.ValidationError, match="free_gpu_memory_fraction"):
        fake_llmapi.KvCacheConfig(free_gpu_memory_fraction=1.5)
    assert fake_llmapi.KvCacheConfig(free_gpu_memory_fraction=None).free_gpu_memory_fraction is None
    with pytest.raises(TypeError):
        fake_llmapi.SamplingParams(4)  # keyword-only


def checkpoint(tmp_path: Path, **changes: Any) -> str:
    build = FakeBuild(**{"backend": "pytorch", **changes})
    return str(write_build(tmp_path, build) / "checkpoint")


def test_the_llm_takes_its_model_by_position_and_refuses_unknown_options(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    fake_llmapi.LLM(model, max_batch_size=None).shutdown()  # None: the default
    with pytest.raises(TypeError):
        fake_llmapi.LLM(model, max_batch_sise=8)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError, match="enable_chunked_prefill"):
        fake_llmapi.LLM(model, enable_chunked_prefill=None)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="not a local model folder"):
        fake_llmapi.LLM(str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="Only 1 GPUs are available, but 2 are required"):
        fake_llmapi.LLM(checkpoint(tmp_path / "one", gpus=1), tensor_parallel_size=2)


def test_an_output_made_outside_a_running_loop_cannot_be_iterated_async(tmp_path: Path) -> None:
    llm = fake_llmapi.LLM(checkpoint(tmp_path))
    try:
        output = llm.generate_async([1, 2, 3], fake_llmapi.SamplingParams(max_tokens=2))

        async def consume() -> None:
            async for _ in output:
                pass

        with pytest.raises(AttributeError):
            asyncio.run(consume())
    finally:
        llm.shutdown()


def stream(llm: Any, prompt: list[int], params: Any) -> tuple[list[int], str | None]:
    """Every token of one streamed request, made and iterated on one loop."""

    async def consume() -> tuple[list[int], str | None]:
        tokens: list[int] = []
        output = llm.generate_async(prompt, params, streaming=True)
        async for out in output:
            tokens += out.outputs[0].token_ids_diff
        return tokens, out.outputs[0].finish_reason

    return asyncio.run(consume())


def test_stop_tokens_and_the_end_token_follow_the_llm_apis_rules(tmp_path: Path) -> None:
    prompt = prompt_of(9, 3)
    expected = greedy_tokens(prompt, 6)
    llm = fake_llmapi.LLM(checkpoint(tmp_path, eos_token_id=expected[3]))
    params = fake_llmapi.SamplingParams
    try:
        stop = expected[2]
        # A stop token is trimmed from the output unless include_stop_str_in_output.
        assert stream(llm, prompt, params(max_tokens=6, top_k=1, stop_token_ids=[stop])) == (
            expected[:2],
            "stop",
        )
        kept = params(max_tokens=6, top_k=1, stop_token_ids=[stop], include_stop_str_in_output=True)
        assert stream(llm, prompt, kept) == (expected[:3], "stop")
        # The model's end token ends a request (left out) unless ignore_eos.
        assert stream(llm, prompt, params(max_tokens=6, top_k=1)) == (expected[:3], "stop")
        ignored = params(max_tokens=6, top_k=1, ignore_eos=True)
        assert stream(llm, prompt, ignored) == (expected, "length")
    finally:
        llm.shutdown()


def test_a_failed_request_raises_from_its_iteration(tmp_path: Path) -> None:
    llm = fake_llmapi.LLM(checkpoint(tmp_path, fail_token_id=7))
    try:
        with pytest.raises(RequestError, match="token 7"):
            stream(llm, [7, 1, 2], fake_llmapi.SamplingParams(max_tokens=4, top_k=1))
    finally:
        llm.shutdown()


# ---------------------------------------------------------------------------- capacity

# 10 KV blocks of 16 tokens (0.9 x 178 tokens); each request needs 8 over its lifetime.
CACHE = FakeBuild(kv_memory_tokens=178, tokens_per_block=16, iteration_ms=0.5)
PROMPTS = (prompt_of(16, 60), prompt_of(16, 61), prompt_of(16, 62))


def run_executor(
    tmp_path: Path, policy: str, prompts: tuple[list[int], ...], max_tokens: int, later: int = 0
) -> list[tuple[int, int, bool]]:
    """``(engine id, tokens in this response, final)`` in arrival order. The last
    ``later`` prompts are enqueued only once the first has produced a token."""
    root = write_build(tmp_path / policy, CACHE)
    config = executor_bindings.ExecutorConfig(
        scheduler_config=executor_bindings.SchedulerConfig(
            getattr(executor_bindings.CapacitySchedulerPolicy, policy)
        ),
        enable_chunked_context=True,
    )
    executor = executor_bindings.Executor(
        root / "engine", executor_bindings.ModelType.DECODER_ONLY, config
    )
    output = executor_bindings.OutputConfig(exclude_input_from_output=True)
    sampling = executor_bindings.SamplingConfig(top_k=1)

    def enqueue(prompt: list[int]) -> int:
        request = executor_bindings.Request(
            prompt, max_tokens, streaming=True, sampling_config=sampling, output_config=output
        )
        return executor.enqueue_request(request)

    pending = list(prompts[len(prompts) - later :])
    ids = [enqueue(p) for p in prompts[: len(prompts) - later]]
    seen: list[tuple[int, int, bool]] = []
    tokens: dict[int, list[int]] = {}
    try:
        while sum(final for _, _, final in seen) < len(prompts):
            for response in executor.await_responses(timeout=timedelta(seconds=5)):
                result = response.result
                tokens.setdefault(response.request_id, []).extend(result.output_token_ids[0])
                seen.append((response.request_id, len(result.output_token_ids[0]), result.is_final))
            if pending and seen:
                ids += [enqueue(p) for p in pending]
                pending = []
    finally:
        executor.shutdown()
    for engine_id, prompt in zip(ids, prompts, strict=True):
        assert tokens[engine_id] == greedy_tokens(prompt, max_tokens), engine_id
    return seen


def first_token(seen: list[tuple[int, int, bool]], engine_id: int) -> int:
    return next(i for i, (e, n, _) in enumerate(seen) if e == engine_id and n > 0)


def final(seen: list[tuple[int, int, bool]], engine_id: int) -> int:
    return next(i for i, (e, _, f) in enumerate(seen) if e == engine_id and f)


def test_guaranteed_no_evict_starts_a_request_only_when_its_lifetime_fits(tmp_path: Path) -> None:
    seen = run_executor(tmp_path, "GUARANTEED_NO_EVICT", PROMPTS[:2], max_tokens=100)
    assert first_token(seen, 2) > final(seen, 1)


def test_max_utilization_runs_both_and_pauses_the_latest_when_the_cache_fills(
    tmp_path: Path,
) -> None:
    seen = run_executor(tmp_path, "MAX_UTILIZATION", PROMPTS[:2], max_tokens=100)
    assert first_token(seen, 2) < final(seen, 1)  # both ran at once
    # Together they outgrow the 10 blocks at 80 tokens each: the later one pauses, the
    # earlier runs to its end alone, then the paused one resumes (its tokens still right).
    second_tokens = [i for i, (e, n, _) in enumerate(seen) if e == 2 and n > 0]
    resumed = [i for i in second_tokens if i > final(seen, 1)]
    assert resumed and len(second_tokens) == 100


def test_static_batch_starts_new_requests_only_when_none_runs(tmp_path: Path) -> None:
    short = (prompt_of(16, 63), prompt_of(16, 64))
    no_evict = run_executor(tmp_path / "a", "GUARANTEED_NO_EVICT", short, 20, later=1)
    assert first_token(no_evict, 2) < final(no_evict, 1)  # both fit: the second joins at once
    static = run_executor(tmp_path / "b", "STATIC_BATCH", short, 20, later=1)
    assert first_token(static, 2) > final(static, 1)


def test_the_llm_api_fake_shares_its_cache_under_the_same_policies(tmp_path: Path) -> None:
    def overlap(policy: str) -> bool:
        model = checkpoint(tmp_path / policy, kv_memory_tokens=178, tokens_per_block=16)
        scheduler = fake_llmapi.SchedulerConfig(
            capacity_scheduler_policy=getattr(fake_llmapi.CapacitySchedulerPolicy, policy)
        )
        llm = fake_llmapi.LLM(model, scheduler_config=scheduler, enable_chunked_prefill=True)
        params = fake_llmapi.SamplingParams(max_tokens=100, top_k=1)

        async def both() -> list[tuple[int, bool]]:
            order: list[tuple[int, bool]] = []

            async def one(index: int) -> None:
                async for out in llm.generate_async(PROMPTS[index], params, streaming=True):
                    order.append((index, out.finished))

            await asyncio.gather(one(0), one(1))
            return order

        try:
            order = asyncio.run(both())
        finally:
            llm.shutdown()
        return order.index((1, False)) < order.index((0, True))

    assert overlap("MAX_UTILIZATION") and not overlap("GUARANTEED_NO_EVICT")
