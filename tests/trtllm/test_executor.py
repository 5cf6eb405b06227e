"""The adapter through the fake executor: what it enqueues, cancels and returns."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError
from tests.trtllm import fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild
from tests.trtllm.conftest import Calls, StartExecutor, spy_bindings
from tests.trtllm.plans import Seq, prompt_of, step


def test_the_kv_cache_can_be_capped_in_tokens(start_executor: StartExecutor) -> None:
    build = FakeBuild(kv_memory_tokens=4096, tokens_per_block=16)
    capped = start_executor(build, kv_cache_max_tokens=1000)
    assert capped.info().num_kv_blocks == 1000 // 16
    assert capped.info().max_model_len == build.max_seq_len


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
    with pytest.raises(
        TrtllmError, match="KV blocks hold 64 tokens but it was started with tokens_per_block=16"
    ):
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
