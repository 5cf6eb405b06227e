"""Iteration statistics under the adapter's event loop, and the per-release options.

The fake reproduces TensorRT-LLM's statistics plumbing (tests/trtllm/fake_llmapi/_stats.py
names the sources). The first test is the regression test for the start-up failure: the
previous adapter called the generate_async on its loop and then the sync ``get_stats``
from the engine's thread, which fails against these semantics (it failed on the previous
adapter's own start-up path, ``_measure_kv``, before the reader replaced it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import SchedulerOutput
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.backend import EventLoopThread
from plugins.trtllm.runner import Ask
from tests.factories import plan_entry
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild, write_build
from tests.trtllm.conftest import LlmCalls, StartLlmExecutor, spy_llmapi
from tests.trtllm.fake_llmapi._releases import release_1_2
from tests.trtllm.fake_llmapi._stats import MixedSyncAsyncAPIError
from tests.trtllm.plans import GREEDY

PARAMS = fake_llmapi.SamplingParams(max_tokens=2, top_k=1, ignore_eos=True)


def start_fake(tmp_path: Path, **build: Any) -> Any:
    root = write_build(tmp_path, FakeBuild(backend="pytorch", **build))
    return fake_llmapi.LLM(str(root / "checkpoint"), enable_iter_perf_stats=True)


async def finish(output: Any) -> None:
    async for _ in output:
        pass


async def entries(llm: Any, timeout: float) -> list[dict[str, Any]]:
    return [entry async for entry in llm.get_stats_async(timeout=timeout)]


def test_the_previous_start_up_path_fails_on_tensorrt_llms_queues(tmp_path: Path) -> None:
    llm = start_fake(tmp_path)
    loop = EventLoopThread()
    try:
        # As the previous adapter did: generate_async on its loop (so the statistics
        # queue is an AsyncQueue), then the sync get_stats from the engine's thread.
        output = loop.call(llm.generate_async, [1, 2, 3], PARAMS)
        asyncio.run_coroutine_threadsafe(finish(output), loop.loop).result(5)
        with (
            pytest.warns(UserWarning, match="running in async mode"),
            pytest.raises(TypeError, match="not NoneType"),
        ):
            llm.get_stats(timeout=0.05)  # _SyncQueue.get returns None at its deadline
        with pytest.warns(UserWarning), pytest.raises(TypeError, match="not NoneType"):
            llm.get_stats(timeout=0)  # ... at once with no wait at all
        # The sync read tainted the queue: the async reader is now unusable too.
        with pytest.raises(MixedSyncAsyncAPIError):
            asyncio.run_coroutine_threadsafe(entries(llm, 1.0), loop.loop).result(5)
    finally:
        llm.shutdown()
        loop.stop()


def test_a_zero_timeout_raises_out_of_the_async_iteration(tmp_path: Path) -> None:
    llm = start_fake(tmp_path)

    async def run() -> None:
        await finish(llm.generate_async([1, 2, 3], PARAMS, streaming=True))
        with pytest.raises(asyncio.QueueEmpty):
            await entries(llm, 0)  # __anext__ catches asyncio.TimeoutError only

    try:
        asyncio.run(run())
    finally:
        llm.shutdown()


def test_the_statistics_latch_until_the_next_submission(tmp_path: Path) -> None:
    llm = start_fake(tmp_path, stats_delay_ms=50)

    async def run() -> tuple[int, int, int]:
        await finish(llm.generate_async([1, 2, 3], PARAMS, streaming=True))
        first = len(await entries(llm, 0.3))  # read until an empty 0.3 s wait latches
        await asyncio.sleep(0.2)
        latched = len(await entries(llm, 0.3))  # ends at once: nothing is read
        await finish(llm.generate_async([4, 5, 6], PARAMS, streaming=True))  # mark_undone
        return first, latched, len(await entries(llm, 0.3))

    try:
        first, latched, again = asyncio.run(run())
    finally:
        llm.shutdown()
    assert first >= 1 and latched == 0 and again >= 1


def test_statistics_arrive_only_after_the_dispatch_delay(tmp_path: Path) -> None:
    llm = start_fake(tmp_path, stats_delay_ms=300)

    async def run() -> float:
        await finish(llm.generate_async([1, 2, 3], PARAMS, streaming=True))
        done = time.monotonic()
        assert await llm.get_stats_async(timeout=2.0).__anext__()
        return time.monotonic() - done

    try:
        waited = asyncio.run(run())
    finally:
        llm.shutdown()
    assert 0.05 < waited < 1.0


def test_a_statistics_queue_belongs_to_the_loop_of_the_first_submission(tmp_path: Path) -> None:
    llm = start_fake(tmp_path)

    async def run() -> asyncio.AbstractEventLoop:
        await finish(llm.generate_async([1, 2, 3], PARAMS, streaming=True))
        return asyncio.get_running_loop()

    try:
        first_loop = asyncio.run(run())
        assert llm._iter_stats.queue.loop is first_loop
        # A later loop gets no queue of its own; the first one is closed, so its
        # statistics are dropped as the worker drops them (EventLoopShutdownError).
        asyncio.run(run())
        assert llm._iter_stats.queue.loop is first_loop
    finally:
        llm.shutdown()


def test_the_executor_starts_when_statistics_come_late(
    start_llm_executor: StartLlmExecutor,
) -> None:
    # 400 ms: the worker's and a proxy's 0.2 s sleeps together.
    executor = start_llm_executor(FakeBuild(backend="pytorch", stats_delay_ms=400))
    assert executor.info().num_kv_blocks == int(4096 * 0.9) // 16


def test_the_v1_kv_manager_is_pinned_and_the_policy_logged(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="plugins.trtllm.base"):
        start_llm_executor()
    assert llm_calls.options[0]["kv_cache_config"].use_kv_cache_manager_v2 is False
    assert "capacity policy GUARANTEED_NO_EVICT (KV cache manager V1 pinned" in caplog.text


def test_a_release_without_the_option_is_started_without_it(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls, caplog: pytest.LogCaptureFixture
) -> None:
    older = release_1_2(spy_llmapi(llm_calls, release_1_2(fake_llmapi).LLM))
    with caplog.at_level(logging.INFO, logger="plugins.trtllm.base"):
        start_llm_executor(llmapi=older)
    assert (
        "use_kv_cache_manager_v2" not in type(llm_calls.options[0]["kv_cache_config"]).model_fields
    )
    assert "this release has no use_kv_cache_manager_v2 option" in caplog.text
    assert "waiting queue first-come-first-served" in caplog.text
    assert llm_calls.generate_options == [{"streaming": True}]


def test_the_v2_kv_manager_would_replace_the_policy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Why the pin matters: KVCacheV2Scheduler runs MAX_UTILIZATION whatever was asked.
    root = write_build(tmp_path, FakeBuild(backend="pytorch"))
    with caplog.at_level(logging.WARNING, logger="tensorrt_llm"):
        llm = fake_llmapi.LLM(
            str(root / "checkpoint"),
            kv_cache_config=fake_llmapi.KvCacheConfig(use_kv_cache_manager_v2=True),
        )
    llm.shutdown()
    assert llm._limits.policy == "MAX_UTILIZATION"
    assert "only supports MAX_UTILIZATION" in caplog.text


def test_priorities_reach_a_release_that_takes_them(
    start_llm_executor: StartLlmExecutor, llm_calls: LlmCalls
) -> None:
    executor = start_llm_executor()
    policy = llm_calls.options[0]["scheduler_config"].waiting_queue_policy
    assert (
        policy
        == fake_llmapi.SchedulerConfig.model_fields["waiting_queue_policy"].annotation.PRIORITY
    )
    backend = executor._backend
    for priority in (3, -2):
        backend.submit(Ask([1, 2, 3], 1, GREEDY, None, priority))
    sent = [options["priority"] for options in llm_calls.generate_options[1:]]
    assert sent == [translate.llm_priority(3), translate.llm_priority(-2)]
    assert llm_calls.generate_options[0]["priority"] == 0.5  # the warm-up: the default
    # Through a plan: the scheduler's ScheduledRequest.priority is what reaches the LLM.
    plan = SchedulerOutput([plan_entry("r", [1, 2, 3], 0, [0], True, GREEDY, priority=7)])
    executor.execute(plan)
    assert llm_calls.generate_options[-1]["priority"] == translate.llm_priority(7)


def test_our_priorities_map_into_tensorrt_llms_range_in_reverse_order() -> None:
    values = [translate.llm_priority(p) for p in range(-1000, 1001, 50)]
    assert all(0 < v < 1 for v in values)
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values)
    assert translate.llm_priority(0) == 0.5


def test_the_fake_serves_a_higher_priority_first_when_it_must_queue(tmp_path: Path) -> None:
    root = write_build(tmp_path, FakeBuild(backend="pytorch", max_batch_size=1))
    llm = fake_llmapi.LLM(
        str(root / "checkpoint"),
        max_batch_size=1,
        scheduler_config=fake_llmapi.SchedulerConfig(waiting_queue_policy="priority"),
    )
    order: list[str] = []

    async def run(name: str, priority: float) -> None:
        await finish(llm.generate_async([1, 2, 3], PARAMS, streaming=True, priority=priority))
        order.append(name)

    async def all_three() -> None:
        first = asyncio.ensure_future(run("first", 0.5))  # runs at once: the batch is free
        await asyncio.sleep(0)
        await asyncio.gather(first, run("low", 0.1), run("high", 0.9))

    try:
        asyncio.run(all_three())
        with pytest.raises(ValueError, match=r"priority must be a float in \[0.0, 1.0\]"):
            llm.generate_async([1], PARAMS, priority=2.0)
    finally:
        llm.shutdown()
    assert order.index("high") < order.index("low")
