"""The LLM-API adapter through the fake LLM API: how it starts the LLM, what it submits,
aborts and returns, and the KV picture it reads."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild
from tests.trtllm.conftest import LlmCalls, StartLlmExecutor, spy_llmapi
from tests.trtllm.plans import Seq, greedy_tokens, prompt_of, step


def build(**changes: Any) -> FakeBuild:
    return FakeBuild(**{"backend": "pytorch", **changes})


def test_the_llm_is_started_from_the_builds_options(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    runtime = {"cuda_graph_batch_sizes": [1, 4, 8], "capacity_scheduler_policy": "MAX_UTILIZATION"}
    executor = start_llm_executor(build(tp=2, runtime=runtime))
    (options,) = llm_calls.options
    assert options["model"].endswith("/checkpoint")
    assert (options["tensor_parallel_size"], options["pipeline_parallel_size"]) == (2, 1)
    assert (options["max_batch_size"], options["max_num_tokens"]) == (8, 256)
    assert (options["max_input_len"], options["max_seq_len"]) == (448, 512)
    assert options["enable_chunked_prefill"] is True
    assert options["enable_iter_perf_stats"] is True  # the KV picture comes from the stats
    kv = options["kv_cache_config"]
    assert (kv.tokens_per_block, kv.dtype, kv.enable_block_reuse) == (16, "fp8", True)
    assert kv.free_gpu_memory_fraction == 0.9
    graphs = options["cuda_graph_config"]
    assert (graphs.batch_sizes, graphs.enable_padding) == ([1, 4, 8], False)
    policy = options["scheduler_config"].capacity_scheduler_policy
    assert policy is fake_llmapi.CapacitySchedulerPolicy.MAX_UTILIZATION
    info = executor.info()
    assert (info.num_gpus, info.max_model_len, info.owns_batching) == (2, 512, True)
    assert not (info.top_logprobs or info.seeded_survives_preemption)


def test_sampling_parameters_reach_the_llm(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    sampling = SamplingParams(
        max_tokens=5, temperature=0.7, top_p=0.8, top_k=20, seed=9, stop_token_ids=(4, 5)
    )
    step(executor, [Seq("a", prompt_of(6, 7), blocks=[0], sampling=sampling)])
    _, params, _ = llm_calls.submitted[-1]
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.7, 0.8, 20, 9)
    assert (params.max_tokens, params.stop_token_ids) == (5, [4, 5])
    assert params.include_stop_str_in_output and params.ignore_eos
    assert not params.detokenize and params.logprobs is None
    step(executor, [Seq("g", prompt_of(6, 8), blocks=[1])])
    _, greedy, _ = llm_calls.submitted[-1]
    assert (greedy.top_k, greedy.top_p, greedy.temperature, greedy.seed) == (1, None, None, None)


def test_the_models_own_end_token_does_not_stop_a_request(
    start_llm_executor: StartLlmExecutor,
) -> None:
    prompt = prompt_of(9, 8)
    eos = greedy_tokens(prompt, 2)[1]  # the model would end the request here
    executor = start_llm_executor(build(eos_token_id=eos))
    seq = Seq("a", prompt, blocks=[0, 1], sampling=SamplingParams(max_tokens=6, temperature=0))
    for _ in range(6):
        step(executor, [seq])
    assert seq.output == greedy_tokens(prompt, 6)  # the scheduler decides where to stop


def test_logprobs_ask_for_the_chosen_token(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    sampling = SamplingParams(temperature=0, logprobs=0)
    step(executor, [Seq("asks", prompt_of(7, 11), blocks=[0], sampling=sampling)])
    assert llm_calls.submitted[1][1].logprobs == 1  # 0 would ask for none


def test_a_request_generate_async_refuses_is_named(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor(build(runtime={"enable_chunked_context": False}))
    long = Seq("long", prompt_of(300, 15), blocks=list(range(19)))  # over max_num_tokens 256
    good = Seq("good", prompt_of(5, 21), blocks=[20])
    result = executor.execute(SchedulerOutput([long.next(), good.next()]))
    assert list(result.failed) == ["long"] and set(result.sampled) == {"good"}
    assert re.search(
        r"TensorRT-LLM refused.*ValueError.*max_num_tokens \(256\)", result.failed["long"]
    )


class _EditedStats(fake_llmapi.LLM):
    """Statistics entries changed (or dropped, for ``None``) by ``edit`` on their way out
    of ``get_stats_async``."""

    def edit(self, entry: dict[str, Any]) -> Any:
        return entry

    def get_stats_async(self, timeout: float | None = 2) -> AsyncIterator[Any]:
        entries = super().get_stats_async(timeout)

        async def edited() -> AsyncIterator[Any]:
            async for entry in entries:
                changed = self.edit(entry)
                if changed is not None:
                    yield changed

        return edited()


class _JsonStats(_EditedStats):
    def edit(self, entry: dict[str, Any]) -> Any:
        return json.dumps(entry)


class _NoStats(_EditedStats):
    def edit(self, entry: dict[str, Any]) -> Any:
        return None


class _OtherBlockSize(_EditedStats):
    def edit(self, entry: dict[str, Any]) -> Any:
        entry["kvCacheStats"]["tokensPerBlock"] = 64
        return entry


def test_statistics_given_as_json_text_are_read(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor(llmapi=spy_llmapi(llm_calls, _JsonStats))
    assert executor.info().num_kv_blocks == int(4096 * 0.9) // 16


def test_start_fails_without_kv_statistics(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    with pytest.raises(TrtllmError, match="no KV cache statistics"):
        start_llm_executor(llmapi=spy_llmapi(llm_calls, _NoStats), startup_timeout_s=0.2)


def test_start_fails_on_a_block_size_it_did_not_ask_for(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    with pytest.raises(
        TrtllmError, match="hold 64 tokens but it was started with tokens_per_block=16"
    ):
        start_llm_executor(llmapi=spy_llmapi(llm_calls, _OtherBlockSize))
