"""The LLM-API adapter through the fake LLM API: how it starts the LLM, what it submits,
aborts and returns, and the KV picture it reads."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.core.output import ScheduledRequest, SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError, TrtllmStalledError
from plugins.trtllm.runner import resume_seed
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild
from tests.trtllm.conftest import PYTORCH, LlmCalls, StartLlmExecutor, spy_llmapi
from tests.trtllm.plans import GREEDY, Seq, greedy_logprob, greedy_tokens, prompt_of, step


def build(**changes: Any) -> FakeBuild:
    return FakeBuild(**{"backend": "pytorch", **changes})


def test_kv_capacity_is_what_the_llm_reports(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor(build(kv_memory_tokens=4096, tokens_per_block=16))
    # The build's fraction is 0.9 of the memory left for the KV cache.
    assert executor.info().num_kv_blocks == int(4096 * 0.9) // 16
    assert executor.kv_cache_stats().max_blocks == executor.info().num_kv_blocks
    half = start_llm_executor(build(), kv_cache_free_gpu_memory_fraction=0.5)
    assert half.info().num_kv_blocks == 4096 // 2 // 16


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


def test_greedy_tokens_are_the_models(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor()
    seq = Seq("a", prompt_of(20, 1), blocks=[5, 9])
    for _ in range(6):
        step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 6)


def test_a_chunked_prompt_is_submitted_once_whole(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    seq = Seq("a", prompt_of(40, 2), blocks=[3, 0, 7, 1])
    for _ in range(3):  # chunks of 16, 16 and 8: only the last one samples
        result = step(executor, [seq], chunk=16)
    assert result.sampled == {"a": seq.output[0]}
    assert llm_calls.inputs() == [seq.prompt]
    step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 2)


def test_a_prefix_cache_hit_is_rebuilt_from_the_shared_blocks(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    shared = prompt_of(32, 3)
    step(executor, [Seq("first", [*shared, 1, 2], blocks=[4, 6, 8])])
    second = Seq("second", [*shared, 9, 9, 9], blocks=[4, 6, 2], computed=32)
    for _ in range(3):
        step(executor, [second])
    assert llm_calls.inputs()[-1] == second.prompt
    assert second.output == greedy_tokens(second.prompt, 3)


def test_preemption_aborts_and_resubmits_with_the_generated_tokens(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    sampling = SamplingParams(max_tokens=8, temperature=0)
    seq = Seq("a", prompt_of(10, 4), blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    seq.computed = 0  # recompute mode: blocks freed, tokens kept
    step(executor, [seq], chunk=8, preempted=["a"])  # the plan resumes it at once
    assert len(llm_calls.submitted) == 2  # nothing sent until the resumed request samples
    while len(seq.output) < 8:
        step(executor, [seq], chunk=8)
    assert llm_calls.cancelled() == [0]
    inputs, params, _ = llm_calls.submitted[-1]
    assert inputs == seq.prompt + seq.output[:3]
    assert params.max_tokens == 8 - 3
    assert seq.output == greedy_tokens(seq.prompt, 8)


def test_a_seeded_request_resumes_with_a_derived_seed(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=1234)

    def run() -> list[int]:
        llm_calls.submitted.clear()
        executor = start_llm_executor()
        seq = Seq("s", prompt_of(12, 5), blocks=[2, 3], sampling=sampling)
        for n in range(8):
            if n == 4:
                seq.computed = 0
                step(executor, [seq], preempted=["s"])
            else:
                step(executor, [seq])
        return seq.output

    first = run()
    assert [p.seed for _, p, _ in llm_calls.submitted[1:]] == [1234, resume_seed(1234, 4)]
    assert run() == first  # the same preemption gives the same tokens


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


def test_a_stop_token_comes_back_and_ends_the_request_inside_the_llm(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    prompt = prompt_of(9, 8)
    stop = greedy_tokens(prompt, 3)[2]
    sampling = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,))
    seq = Seq("a", prompt, blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    assert seq.output[-1] == stop
    time.sleep(0.05)  # let the final output arrive
    executor.execute(SchedulerOutput(finished_ids=["a"]))
    assert llm_calls.cancelled() == []  # the LLM had already finished it
    assert llm_calls.submitted[-1][2].outputs[0].finish_reason == "stop"


def test_a_request_finished_early_is_aborted(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    long = Seq("long", prompt_of(8, 9), blocks=[0, 1, 2])
    other = Seq("other", prompt_of(8, 10), blocks=[3, 4])
    step(executor, [long, other])
    step(executor, [long, other])
    step(executor, [other], finished=["long"])  # e.g. aborted by its client
    for _ in range(2):
        step(executor, [other])
    assert llm_calls.cancelled() == [0]
    assert other.output == greedy_tokens(other.prompt, 5)


def test_logprobs_are_the_chosen_tokens_only_for_requests_that_ask(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    asks = Seq(
        "asks", prompt_of(7, 11), blocks=[0], sampling=SamplingParams(temperature=0, logprobs=0)
    )
    plain = Seq("plain", prompt_of(7, 12), blocks=[1])
    for _ in range(2):
        context = asks.tokens
        result = step(executor, [asks, plain])
        assert set(result.logprobs) == {"asks"}
        assert result.logprobs["asks"].logprob == pytest.approx(greedy_logprob(context))
        assert result.logprobs["asks"].top == []
    assert llm_calls.submitted[1][1].logprobs == 1  # 0 would ask for none


def test_an_llm_error_names_the_request_and_spares_the_others(
    start_llm_executor: StartLlmExecutor,
) -> None:
    executor = start_llm_executor(build(fail_token_id=7))
    bad = Seq("bad", [7, *prompt_of(6, 13)], blocks=[0])
    good = Seq("good", prompt_of(6, 14), blocks=[1])
    step(executor, [bad, good])  # the fake fails a request after its first token
    good_step = good.next()
    result = executor.execute(SchedulerOutput([bad.next(), good_step]))
    assert list(result.failed) == ["bad"]
    assert re.search(r"RequestError: .*token 7", result.failed["bad"])
    good.advance(good_step, result)
    for _ in range(2):
        step(executor, [good])
    assert good.output == greedy_tokens(good.prompt, 4)


def test_a_request_generate_async_refuses_is_named(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor(build(runtime={"enable_chunked_context": False}))
    long = Seq("long", prompt_of(300, 15), blocks=list(range(19)))  # over max_num_tokens 256
    good = Seq("good", prompt_of(5, 21), blocks=[20])
    result = executor.execute(SchedulerOutput([long.next(), good.next()]))
    assert list(result.failed) == ["long"] and set(result.sampled) == {"good"}
    assert re.search(
        r"TensorRT-LLM refused.*ValueError.*max_num_tokens \(256\)", result.failed["long"]
    )


def test_a_stalled_llm_raises_after_the_step_timeout(start_llm_executor: StartLlmExecutor) -> None:
    # 33 blocks: the first request reserves 26 for its lifetime, so the second waits
    # inside the LLM until the first has generated 400 tokens.
    executor = start_llm_executor(build(kv_memory_tokens=600, iteration_ms=5), step_timeout_s=0.3)
    first = Seq(
        "first", prompt_of(10, 16), [0], sampling=SamplingParams(max_tokens=400, temperature=0)
    )
    second = Seq(
        "second", prompt_of(10, 17), [1], sampling=SamplingParams(max_tokens=150, temperature=0)
    )
    step(executor, [first])
    with pytest.raises(TrtllmStalledError, match=r"within 0.3 s for request\(s\) 'second'"):
        step(executor, [first, second])


def test_a_decode_of_another_token_is_refused(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor()
    seq = Seq("a", prompt_of(5, 18), blocks=[0])
    step(executor, [seq])
    wrong = ScheduledRequest("a", [seq.output[0] + 1], 5, [0], True, GREEDY)
    with pytest.raises(TrtllmError, match=r"runs in TensorRT-LLM after token"):
        executor.execute(SchedulerOutput([wrong]))


def test_the_kv_picture_is_refreshed_from_the_llms_statistics(
    start_llm_executor: StartLlmExecutor,
) -> None:
    executor = start_llm_executor(stats_interval_s=0.01)
    at_start = executor.kv_cache_stats()
    assert at_start.used_blocks == 0 and at_start.free_blocks == at_start.max_blocks
    seq = Seq("a", prompt_of(40, 19), blocks=[0, 1, 2, 3])
    step(executor, [seq])
    time.sleep(0.05)
    result = step(executor, [seq])
    later = executor.kv_cache_stats()
    assert later.at_s > at_start.at_s
    assert later.used_blocks >= 3  # the 41 tokens it holds, in blocks of 16
    assert later.used_blocks + later.free_blocks == later.max_blocks == at_start.max_blocks
    # A step that read the statistics hands the scheduler TensorRT-LLM's own free count.
    assert result.kv_free_blocks == later.free_blocks


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


def test_shutdown_is_final_and_idempotent(start_llm_executor: StartLlmExecutor) -> None:
    executor = start_llm_executor(PYTORCH)
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(TrtllmError, match="shut down"):
        executor.execute(SchedulerOutput())
