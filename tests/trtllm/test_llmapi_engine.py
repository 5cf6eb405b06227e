"""The real scheduler and engine core driving the LLM-API adapter over the fake LLM:
preemption by abort and resubmission, prefix caching, stop tokens and aborts end to end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.clock import WallClock
from orchestrator.core.engine import EngineCore
from orchestrator.core.request import FinishReason
from plugins.trtllm import TrtllmLlmApiConfig, TrtllmLlmApiExecutor
from tests.trtllm.builds import engine_config, write_build
from tests.trtllm.conftest import PYTORCH, LlmCalls, spy_llmapi
from tests.trtllm.plans import greedy_tokens, prompt_of
from tests.trtllm.test_engine import greedy, run

MakeEngine = Callable[..., EngineCore]


@pytest.fixture
def make_engine(tmp_path: Path, llm_calls: LlmCalls) -> Iterator[MakeEngine]:
    engines: list[EngineCore] = []

    def make(num_blocks: int | None = None, **scheduler: Any) -> EngineCore:
        root = write_build(tmp_path / f"b{len(engines)}", PYTORCH)
        options = TrtllmLlmApiConfig(build_dir=root)
        scheduler.setdefault("max_batch_size", 8)  # the fake build's
        config = engine_config(options, block_size=16, num_blocks=num_blocks, **scheduler)
        executor = TrtllmLlmApiExecutor.from_config(options, config, llmapi=spy_llmapi(llm_calls))
        engine = EngineCore.from_config(config, executor=executor, clock=WallClock())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()


def test_requests_preempted_for_kv_finish_with_the_models_tokens(
    make_engine: MakeEngine, llm_calls: LlmCalls
) -> None:
    # 14 blocks of 16 tokens for five requests that need 4 each over their lifetime.
    engine = make_engine(num_blocks=14, chunk_size=32, max_num_tokens=64)
    prompts = {f"r{i}": prompt_of(40, 30 + i) for i in range(5)}
    for rid, prompt in prompts.items():
        engine.add_request(greedy(rid, prompt, 24))
    outputs = run(engine)
    assert engine.stats().num_preemptions > 0
    assert llm_calls.cancelled()  # preempted requests were aborted in the LLM
    for rid, prompt in prompts.items():
        assert outputs[rid] == (greedy_tokens(prompt, 24), FinishReason.LENGTH), rid


def test_a_shared_prefix_and_a_stop_token(make_engine: MakeEngine) -> None:
    engine = make_engine(chunk_size=16)
    shared = prompt_of(48, 40)
    first, second = [*shared, 1], [*shared, 2, 3]
    stop = greedy_tokens(second, 3)[2]
    engine.add_request(greedy("first", first, 5))
    run(engine)  # its full blocks stay cached for the second request
    engine.add_request(greedy("second", second, 20, stop_token_ids=(stop,)))
    (planned,) = engine.step().plan.scheduled
    assert planned.start_position == 48  # three cached blocks: the plan starts after them
    outputs = run(engine)
    assert outputs["second"] == (greedy_tokens(second, 3)[1:], FinishReason.STOP)


def test_an_aborted_request_is_aborted_in_the_llm_and_the_rest_carry_on(
    make_engine: MakeEngine, llm_calls: LlmCalls
) -> None:
    engine = make_engine()
    engine.add_request(greedy("kept", prompt_of(20, 50), 12))
    engine.add_request(greedy("dropped", prompt_of(20, 51), 200))
    for _ in range(4):
        engine.step()
    dropped = next(i for i, (_, p, _) in enumerate(llm_calls.submitted[1:]) if p.max_tokens == 200)
    engine.abort("dropped")
    outputs = run(engine)
    assert llm_calls.cancelled() == [dropped]
    assert outputs["kept"][0][-1] == greedy_tokens(prompt_of(20, 50), 12)[-1]
    assert engine.stats().kv_blocks_used == 0
