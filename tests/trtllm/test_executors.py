"""What both TensorRT-LLM executors do alike, run once per mode over its fake (engine
mode: the fake C++ executor; LLM-API mode: the fake LLM): how plans become submissions,
cancels and tokens, the KV picture, failures and shutdown. Each mode's own translations
are tested in test_executor.py and test_llmapi_executor.py."""

from __future__ import annotations

import time

import pytest

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError, TrtllmStalledError
from plugins.trtllm.runner import resume_seed
from tests.factories import plan_entry
from tests.trtllm.conftest import Mode
from tests.trtllm.plans import GREEDY, Seq, greedy_logprob, greedy_tokens, prompt_of, step


def test_kv_capacity_is_what_tensorrt_llm_reports(mode: Mode) -> None:
    executor = mode.start({"kv_memory_tokens": 4096, "tokens_per_block": 16})
    # The build's default fraction is 0.9 of the memory left for the KV cache.
    assert executor.info().num_kv_blocks == int(4096 * 0.9) // 16
    assert executor.kv_cache_stats().max_blocks == executor.info().num_kv_blocks
    half = mode.start(kv_cache_free_gpu_memory_fraction=0.5)
    assert half.info().num_kv_blocks == 4096 // 2 // 16


def test_the_kv_picture_is_refreshed_from_the_statistics(mode: Mode) -> None:
    executor = mode.start(stats_interval_s=0.01)
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


def test_greedy_tokens_are_the_models(mode: Mode) -> None:
    executor = mode.start()
    seq = Seq("a", prompt_of(20, 1), blocks=[5, 9])
    for _ in range(6):
        step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 6)


def test_a_chunked_prompt_is_submitted_once_whole(mode: Mode) -> None:
    executor = mode.start()
    seq = Seq("a", prompt_of(40, 2), blocks=[3, 0, 7, 1])
    for _ in range(3):  # chunks of 16, 16 and 8: only the last one samples
        result = step(executor, [seq], chunk=16)
    assert result.sampled == {"a": seq.output[0]}
    assert mode.inputs() == [seq.prompt]
    step(executor, [seq])
    assert seq.output == greedy_tokens(seq.prompt, 2)


def test_a_prefix_cache_hit_is_rebuilt_from_the_shared_blocks(mode: Mode) -> None:
    executor = mode.start()
    shared = prompt_of(32, 3)
    step(executor, [Seq("first", [*shared, 1, 2], blocks=[4, 6, 8])])
    # The second request's first 32 tokens hit the cache: its plan starts at 32, on the
    # first request's two full blocks.
    second = Seq("second", [*shared, 9, 9, 9], blocks=[4, 6, 2], computed=32)
    for _ in range(3):
        step(executor, [second])
    assert mode.inputs()[-1] == second.prompt
    assert second.output == greedy_tokens(second.prompt, 3)


def test_preemption_cancels_and_resubmits_with_the_generated_tokens(mode: Mode) -> None:
    executor = mode.start()
    sampling = SamplingParams(max_tokens=8, temperature=0)
    seq = Seq("a", prompt_of(10, 4), blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    seq.computed = 0  # recompute mode: blocks freed, tokens kept
    step(executor, [seq], chunk=8, preempted=["a"])  # the plan resumes it at once
    assert len(mode.inputs()) == 1  # nothing sent until the resumed request samples
    while len(seq.output) < 8:
        step(executor, [seq], chunk=8)
    assert mode.cancelled() == [0]
    assert mode.inputs()[-1] == seq.prompt + seq.output[:3]
    assert mode.max_tokens()[-1] == 8 - 3
    assert seq.output == greedy_tokens(seq.prompt, 8)


def test_a_seeded_request_resumes_with_a_derived_seed(mode: Mode) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=1234)

    def run() -> list[int]:
        mode.forget()
        executor = mode.start()
        seq = Seq("s", prompt_of(12, 5), blocks=[2, 3], sampling=sampling)
        for n in range(8):
            if n == 4:
                seq.computed = 0
                step(executor, [seq], preempted=["s"])
            else:
                step(executor, [seq])
        return seq.output

    first = run()
    assert mode.seeds() == [1234, resume_seed(1234, 4)]
    assert resume_seed(1234, 4) != 1234
    assert run() == first  # the same preemption gives the same tokens


def test_a_request_finished_early_is_cancelled(mode: Mode) -> None:
    executor = mode.start()
    long = Seq("long", prompt_of(8, 9), blocks=[0, 1, 2])
    other = Seq("other", prompt_of(8, 10), blocks=[3, 4])
    step(executor, [long, other])
    step(executor, [long, other])
    step(executor, [other], finished=["long"])  # e.g. aborted by its client
    for _ in range(2):
        step(executor, [other])
    assert mode.cancelled() == [0]
    assert other.output == greedy_tokens(other.prompt, 5)


def test_a_stop_token_comes_back_and_ends_the_request_inside_tensorrt_llm(mode: Mode) -> None:
    executor = mode.start()
    prompt = prompt_of(9, 8)
    stop = greedy_tokens(prompt, 3)[2]
    sampling = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,))
    seq = Seq("a", prompt, blocks=[0, 1], sampling=sampling)
    for _ in range(3):
        step(executor, [seq])
    assert seq.output[-1] == stop
    time.sleep(0.05)  # let the final output arrive
    executor.execute(SchedulerOutput(finished_ids=["a"]))
    assert mode.cancelled() == []  # TensorRT-LLM had already finished it


def test_logprobs_are_the_chosen_tokens_only_for_requests_that_ask(mode: Mode) -> None:
    executor = mode.start()
    asks = Seq(
        "asks", prompt_of(7, 11), blocks=[0], sampling=SamplingParams(temperature=0, logprobs=0)
    )
    plain = Seq("plain", prompt_of(7, 12), blocks=[1])
    for _ in range(2):
        context = asks.tokens
        result = step(executor, [asks, plain])
        assert set(result.logprobs) == {"asks"}
        assert result.logprobs["asks"].logprob == pytest.approx(greedy_logprob(context))
        assert result.logprobs["asks"].top == []  # TensorRT-LLM returns no alternatives


def test_a_failed_request_is_named_and_the_others_are_spared(mode: Mode) -> None:
    executor = mode.start({"fail_token_id": 7})
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


def test_a_stalled_executor_raises_after_the_step_timeout(mode: Mode) -> None:
    # 33 blocks of KV: the first request reserves 26 for its lifetime, so the second waits
    # inside TensorRT-LLM until the first has generated 400 tokens.
    executor = mode.start({"kv_memory_tokens": 600, "iteration_ms": 5}, step_timeout_s=0.3)
    first = Seq(
        "first", prompt_of(10, 16), [0], sampling=SamplingParams(max_tokens=400, temperature=0)
    )
    second = Seq(
        "second", prompt_of(10, 17), [1], sampling=SamplingParams(max_tokens=150, temperature=0)
    )
    step(executor, [first])
    with pytest.raises(TrtllmStalledError, match=r"within 0.3 s for request\(s\) 'second'"):
        step(executor, [first, second])


def test_a_decode_of_another_token_is_refused(mode: Mode) -> None:
    executor = mode.start()
    seq = Seq("a", prompt_of(5, 18), blocks=[0])
    step(executor, [seq])
    wrong = plan_entry("a", [seq.output[0] + 1], 5, [0], True, GREEDY)
    with pytest.raises(TrtllmError, match=r"runs in TensorRT-LLM after token"):
        executor.execute(SchedulerOutput([wrong]))


def test_step_duration_is_the_wall_time_waited(mode: Mode) -> None:
    executor = mode.start({"iteration_ms": 30})
    seq = Seq("a", prompt_of(5, 19), blocks=[0])
    step(executor, [seq])
    before = time.perf_counter()
    result = step(executor, [seq])  # the next token comes one 30 ms iteration later
    wall = time.perf_counter() - before
    assert 0.01 < result.duration_s <= wall


def test_a_plan_without_requests_samples_nothing(mode: Mode) -> None:
    executor = mode.start()
    result = executor.execute(SchedulerOutput(preempted_ids=["x"], finished_ids=["y"]))
    assert result.sampled == {} and result.logprobs == {}


def test_shutdown_is_final_and_idempotent(mode: Mode) -> None:
    executor = mode.start()
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(TrtllmError, match="shut down"):
        executor.execute(SchedulerOutput())
