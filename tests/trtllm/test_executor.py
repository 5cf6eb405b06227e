"""The adapter through the fake executor: what it enqueues, cancels and returns."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from orchestrator.core.output import ScheduledRequest, SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError, TrtllmStalledError
from plugins.trtllm.runner import resume_seed
from tests.trtllm import fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild
from tests.trtllm.conftest import Calls, StartExecutor, spy_bindings
from tests.trtllm.plans import GREEDY, Seq, greedy_logprob, greedy_tokens, prompt_of, step


def test_kv_capacity_is_what_the_executor_reports(start_executor: StartExecutor) -> None:
    build = FakeBuild(kv_memory_tokens=4096, tokens_per_block=16)
    # The build's default fraction is 0.9 of the memory left for the KV cache.
    assert start_executor(build).info().num_kv_blocks == int(4096 * 0.9) // 16
    half = start_executor(build, kv_cache_free_gpu_memory_fraction=0.5)
    assert half.info().num_kv_blocks == 4096 // 2 // 16
    capped = start_executor(build, kv_cache_max_tokens=1000)
    assert capped.info().num_kv_blocks == 1000 // 16
    assert capped.max_model_len == build.max_seq_len


def test_greedy_tokens_are_the_models(start_executor: StartExecutor) -> None:
    executor = start_executor()
    seq = Seq("a", prompt_of(20, 1), blocks=[5, 9])
    for _ in range(6):
        step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 6)


def test_a_chunked_prompt_is_enqueued_once_whole(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor()
    seq = Seq("a", prompt_of(40, 2), blocks=[3, 0, 7, 1])
    for _ in range(3):  # chunks of 16, 16 and 8: only the last one samples
        result = step(executor, [seq], chunk=16)
    assert result.sampled == {"a": seq.output[0]}
    assert calls.inputs() == [seq.prompt]
    step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 2)


def test_a_prefix_cache_hit_is_rebuilt_from_the_shared_blocks(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor()
    shared = prompt_of(32, 3)
    first = Seq("first", [*shared, 1, 2], blocks=[4, 6, 8])
    step(executor, [first])
    # The second request's first 32 tokens hit the cache: its plan starts at 32, on the
    # first request's two full blocks.
    second = Seq("second", [*shared, 9, 9, 9], blocks=[4, 6, 2], computed=32)
    for _ in range(3):
        step(executor, [second])
    assert calls.inputs()[-1] == second.prompt
    assert second.output == greedy_tokens(second.prompt, 3)


def test_preemption_cancels_and_resumes_with_the_generated_tokens(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor()
    sampling = SamplingParams(max_tokens=8, temperature=0)
    seq = Seq("a", prompt_of(10, 4), blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    engine_id = calls.enqueued[-1][0]
    seq.computed = 0  # recompute mode: blocks freed, tokens kept
    step(executor, [seq], chunk=8, preempted=["a"])  # the plan resumes it at once
    assert calls.cancelled == [engine_id]
    assert len(calls.enqueued) == 2  # nothing sent until the resumed request samples
    while len(seq.output) < 8:
        step(executor, [seq], chunk=8)
    resumed = calls.enqueued[-1][1]
    assert resumed.input_token_ids == seq.prompt + seq.output[:3]
    assert resumed.max_tokens == 8 - 3
    assert seq.output == greedy_tokens(seq.prompt, 8)


def test_a_seeded_request_resumes_with_a_derived_seed(
    start_executor: StartExecutor, calls: Calls
) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=1234)

    def run() -> list[int]:
        executor = start_executor()
        seq = Seq("s", prompt_of(12, 5), blocks=[2, 3], sampling=sampling)
        for n in range(8):
            if n == 4:
                seq.computed = 0
                step(executor, [seq], preempted=["s"])
            else:
                step(executor, [seq])
        return seq.output

    first = run()
    seeds = [r.sampling_config.seed for _, r in calls.enqueued if r.input_token_ids != [0]]
    assert seeds == [1234, resume_seed(1234, 4)]
    assert resume_seed(1234, 4) != 1234
    assert run() == first  # the same preemption gives the same tokens


def test_unseeded_requests_get_distinct_seeds_from_the_seed_option(
    start_executor: StartExecutor, calls: Calls
) -> None:
    sampling = SamplingParams(max_tokens=4, temperature=1.0)

    def seeds(seed: int) -> list[int]:
        calls.enqueued.clear()
        executor = start_executor(seed=seed)
        seqs = [Seq(f"r{i}", prompt_of(5, 6), blocks=[i], sampling=sampling) for i in range(4)]
        step(executor, seqs)
        return [r.sampling_config.seed for _, r in calls.enqueued[1:]]

    first = seeds(7)
    assert len(set(first)) == 4
    assert seeds(7) == first
    assert seeds(8) != first


def test_sampling_parameters_reach_the_executor(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor(pad_id=3)
    sampling = SamplingParams(
        max_tokens=5, temperature=0.7, top_p=0.8, top_k=20, seed=9, stop_token_ids=(4, 5)
    )
    step(executor, [Seq("a", prompt_of(6, 7), blocks=[0], sampling=sampling)])
    request = calls.enqueued[-1][1]
    config = request.sampling_config
    assert (config.temperature, config.top_p, config.top_k, config.seed) == (0.7, 0.8, 20, 9)
    assert request.stop_words == [[4], [5]]
    assert (request.end_id, request.pad_id, request.streaming) == (-1, 3, True)
    assert request.output_config.exclude_input_from_output
    assert not request.output_config.return_log_probs


def test_a_stop_token_ends_the_request_inside_the_executor(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor()
    prompt = prompt_of(9, 8)
    stop = greedy_tokens(prompt, 3)[2]
    sampling = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,))
    seq = Seq("a", prompt, blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    assert seq.output[-1] == stop
    time.sleep(0.05)  # let the final response arrive
    executor.execute(SchedulerOutput(finished_ids=["a"]))
    assert calls.cancelled == []  # the executor had already finished it


def test_a_request_finished_early_is_cancelled(start_executor: StartExecutor, calls: Calls) -> None:
    executor = start_executor()
    long = Seq("long", prompt_of(8, 9), blocks=[0, 1, 2])
    other = Seq("other", prompt_of(8, 10), blocks=[3, 4])
    step(executor, [long, other])
    step(executor, [long, other])
    long_id = calls.enqueued[1][0]
    step(executor, [other], finished=["long"])  # e.g. aborted by its client
    step(executor, [other])
    step(executor, [other])
    assert calls.cancelled == [long_id]
    assert other.output == greedy_tokens(other.prompt, 5)


def test_a_request_the_executor_already_ended_is_not_cancelled(
    start_executor: StartExecutor, calls: Calls
) -> None:
    executor = start_executor()
    seq = Seq(
        "a", prompt_of(6, 20), blocks=[0], sampling=SamplingParams(max_tokens=3, temperature=0)
    )
    step(executor, [seq])
    time.sleep(0.1)  # the executor runs ahead and ends the request after its 3 tokens
    executor.execute(SchedulerOutput(finished_ids=["a"]))  # aborted after one token
    assert calls.cancelled == []


def test_logprobs_are_the_chosen_tokens_only_for_requests_that_ask(
    start_executor: StartExecutor,
) -> None:
    executor = start_executor()
    asks = Seq(
        "asks", prompt_of(7, 11), blocks=[0], sampling=SamplingParams(temperature=0, logprobs=2)
    )
    plain = Seq("plain", prompt_of(7, 12), blocks=[1])
    for _ in range(2):
        context = asks.tokens
        result = step(executor, [asks, plain])
        assert set(result.logprobs) == {"asks"}
        logprob = result.logprobs["asks"]
        assert logprob.logprob == pytest.approx(greedy_logprob(context))
        assert logprob.top == []  # TensorRT-LLM's executor returns no alternatives


def test_an_executor_error_names_the_request_and_spares_the_others(
    start_executor: StartExecutor,
) -> None:
    executor = start_executor(FakeBuild(fail_token_id=7))
    bad = Seq("bad", [7, *prompt_of(6, 13)], blocks=[0])
    good = Seq("good", prompt_of(6, 14), blocks=[1])
    step(executor, [bad, good])  # the fake fails a request after its first token
    good_step = good.next()
    result = executor.execute(SchedulerOutput([bad.next(), good_step]))
    assert list(result.failed) == ["bad"] and "token 7" in result.failed["bad"]
    assert set(result.sampled) == {"good"}
    good.advance(good_step, result)
    for _ in range(2):
        step(executor, [good])
    assert good.output == greedy_tokens(good.prompt, 4)


def test_a_request_the_executor_rejects_is_named(start_executor: StartExecutor) -> None:
    executor = start_executor(FakeBuild(max_input_len=32))
    seq = Seq("long", prompt_of(40, 15), blocks=[0, 1, 2])
    result = executor.execute(SchedulerOutput([seq.next()]))
    assert result.sampled == {}
    assert re.search(r"exceeds maximum input length \(32\)", result.failed["long"])


class _RefusesToken99(fake_tensorrt_llm.Executor):
    def enqueue_request(self, request: Any) -> int:
        if 99 in request.input_token_ids:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: bad input")
        return super().enqueue_request(request)


def test_a_request_enqueue_refuses_is_named(start_executor: StartExecutor, calls: Calls) -> None:
    executor = start_executor(bindings=spy_bindings(calls, _RefusesToken99))
    bad = Seq("bad", [99, 1, 2], blocks=[0])
    good = Seq("good", prompt_of(5, 21), blocks=[1])
    result = executor.execute(SchedulerOutput([bad.next(), good.next()]))
    assert list(result.failed) == ["bad"] and set(result.sampled) == {"good"}
    assert re.search(r"TensorRT-LLM refused.*bad input", result.failed["bad"])


def test_a_stalled_executor_raises_after_the_step_timeout(start_executor: StartExecutor) -> None:
    # 33 blocks of KV: the first request reserves 26 for its lifetime, so the second waits
    # inside the executor until the first has generated 400 tokens.
    build = FakeBuild(kv_memory_tokens=600, iteration_ms=5)
    executor = start_executor(build, step_timeout_s=0.3)
    first = Seq(
        "first",
        prompt_of(10, 16),
        blocks=[0],
        sampling=SamplingParams(max_tokens=400, temperature=0),
    )
    second = Seq(
        "second",
        prompt_of(10, 17),
        blocks=[1],
        sampling=SamplingParams(max_tokens=150, temperature=0),
    )
    step(executor, [first])
    with pytest.raises(TrtllmStalledError, match=r"within 0.3 s for request\(s\) 'second'"):
        step(executor, [first, second])


def test_a_decode_of_another_token_is_refused(start_executor: StartExecutor) -> None:
    executor = start_executor()
    seq = Seq("a", prompt_of(5, 18), blocks=[0])
    step(executor, [seq])
    wrong = ScheduledRequest("a", [seq.output[0] + 1], 5, [0], True, GREEDY)
    with pytest.raises(TrtllmError, match=r"runs in TensorRT-LLM after token"):
        executor.execute(SchedulerOutput([wrong]))


def test_step_duration_is_the_wall_time_waited(start_executor: StartExecutor) -> None:
    executor = start_executor(FakeBuild(iteration_ms=30))
    seq = Seq("a", prompt_of(5, 19), blocks=[0])
    step(executor, [seq])
    before = time.perf_counter()
    result = step(executor, [seq])  # the next token comes one 30 ms iteration later
    wall = time.perf_counter() - before
    assert 0.01 < result.duration_s <= wall


def test_a_plan_without_requests_samples_nothing(start_executor: StartExecutor) -> None:
    executor = start_executor()
    result = executor.execute(SchedulerOutput(preempted_ids=["x"], finished_ids=["y"]))
    assert result.sampled == {} and result.logprobs == {}


def test_shutdown_is_final_and_idempotent(start_executor: StartExecutor) -> None:
    executor = start_executor()
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(TrtllmError, match="shut down"):
        executor.execute(SchedulerOutput())


class _NoStats(fake_tensorrt_llm.Executor):
    def get_latest_iteration_stats(self) -> list[Any]:
        return []


class _OtherBlockSize(fake_tensorrt_llm.Executor):
    def get_latest_iteration_stats(self) -> list[Any]:
        stats = super().get_latest_iteration_stats()
        for s in stats:
            assert s.kv_cache_stats is not None
            s.kv_cache_stats.tokens_per_block = 64
        return stats


def test_start_fails_without_kv_statistics(start_executor: StartExecutor, calls: Calls) -> None:
    with pytest.raises(TrtllmError, match="no KV cache statistics"):
        start_executor(bindings=spy_bindings(calls, _NoStats), startup_timeout_s=0.2)


def test_start_fails_on_a_block_size_the_manifest_does_not_say(
    start_executor: StartExecutor, calls: Calls
) -> None:
    with pytest.raises(TrtllmError, match="KV blocks of 64 tokens but its manifest says 16"):
        start_executor(bindings=spy_bindings(calls, _OtherBlockSize))


def test_a_multi_gpu_engine_is_orchestrated(
    start_executor: StartExecutor, calls: Calls, tmp_path: Any
) -> None:
    worker = tmp_path / "executorWorker"
    start_executor(FakeBuild(tp=2), executor_worker_path=worker)
    parallel = calls.configs[-1].parallel_config
    assert parallel.communication_mode == fake_tensorrt_llm.CommunicationMode.ORCHESTRATOR
    assert parallel.orchestrator_config.worker_executable_path == str(worker)
    start_executor(FakeBuild(tp=1))
    assert calls.configs[-1].parallel_config is None
