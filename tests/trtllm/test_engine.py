"""The real scheduler and engine core driving each TensorRT-LLM adapter over its fake:
prefix caching, chunked prefill, preemption (cancel and resubmit), stop tokens and aborts
end to end, once per mode."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.clock import WallClock
from orchestrator.core.engine import EngineCore
from orchestrator.core.request import FinishReason, SamplingParams, Submission
from tests.trtllm.builds import FakeBuild, engine_config, write_build
from tests.trtllm.conftest import Mode
from tests.trtllm.plans import greedy_tokens, prompt_of

MAX_STEPS = 2000

MakeEngine = Callable[..., EngineCore]


@pytest.fixture
def make_engine(tmp_path: Path, mode: Mode) -> Iterator[MakeEngine]:
    engines: list[EngineCore] = []

    def make(num_blocks: int | None = None, **scheduler: Any) -> EngineCore:
        root = write_build(tmp_path / f"b{len(engines)}", FakeBuild(backend=mode.backend))
        options = mode.options(root)
        scheduler.setdefault("max_batch_size", 8)  # the fake build's
        config = engine_config(options, block_size=16, num_blocks=num_blocks, **scheduler)
        executor = mode.from_config(options, config)
        engine = EngineCore.from_config(config, executor=executor, clock=WallClock())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()


def run(engine: EngineCore) -> dict[str, tuple[list[int], FinishReason | None]]:
    """Step until idle; each request's tokens and finish reason."""
    outputs: dict[str, tuple[list[int], FinishReason | None]] = {}
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return outputs
        for out in engine.step().outputs:
            tokens, _ = outputs.get(out.request_id, ([], None))
            outputs[out.request_id] = ([*tokens, *out.new_token_ids], out.finish_reason)
        engine.scheduler.kv.integrity_check()
    raise AssertionError(f"not idle after {MAX_STEPS} steps")


def greedy(request_id: str, prompt: list[int], max_tokens: int, **kw: Any) -> Submission:
    return Submission(
        request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, **kw)
    )


def test_requests_preempted_for_kv_finish_with_the_models_tokens(
    make_engine: MakeEngine, mode: Mode
) -> None:
    # 14 blocks of 16 tokens for five requests that need 4 each over their lifetime.
    engine = make_engine(num_blocks=14, chunk_size=32, max_num_tokens=64)
    prompts = {f"r{i}": prompt_of(40, 30 + i) for i in range(5)}
    for rid, prompt in prompts.items():
        engine.add_request(greedy(rid, prompt, 24))
    outputs = run(engine)
    assert engine.stats().num_preemptions > 0
    assert mode.cancelled()  # preempted requests were cancelled in TensorRT-LLM
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


def test_an_aborted_request_is_cancelled_and_the_rest_carry_on(
    make_engine: MakeEngine, mode: Mode
) -> None:
    engine = make_engine()
    engine.add_request(greedy("kept", prompt_of(20, 50), 12))
    engine.add_request(greedy("dropped", prompt_of(20, 51), 200))
    for _ in range(4):
        engine.step()
    dropped = mode.max_tokens().index(200)
    engine.abort("dropped")
    outputs = run(engine)
    assert mode.cancelled() == [dropped]
    assert outputs["kept"][0][-1] == greedy_tokens(prompt_of(20, 50), 12)[-1]
    assert engine.stats().kv_blocks_used == 0
