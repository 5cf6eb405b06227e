"""AsyncEngine: the core's step loop in a thread, per-request async streams, aborts,
error isolation and an idle loop that sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable

import msgspec
import pytest

from orchestrator.common.async_engine import (
    INVALID_CONSTRAINT,
    AsyncEngine,
    InvalidConstraintError,
    RequestFailedError,
    RequestShedError,
    RequestStream,
    SubmissionFailedError,
)
from orchestrator.core.engine import EngineCore, EngineStep
from orchestrator.core.errors import AdmissionError, EngineDeadError, OverloadedError
from orchestrator.core.output import RequestOutput, SchedulerOutput, StepResult
from orchestrator.core.request import FinishReason, Submission
from tests.factories import make_request
from tests.fakes import fake_token
from tests.gateway.support import fake_core

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def collect(engine: AsyncEngine, request_id: str, max_tokens: int) -> list[int]:
    stream = await engine.submit(make_request(8, max_tokens, request_id=request_id))
    tokens = []
    async with stream:
        async for output in stream:
            tokens += output.new_token_ids
    return tokens


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait (polling every 5 ms) until ``condition()`` is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.005)


async def started(core: EngineCore) -> AsyncEngine:
    engine = AsyncEngine(core)
    engine.start()
    return engine


async def test_concurrent_streams_each_get_their_own_tokens() -> None:
    core, _ = fake_core()
    engine = await started(core)
    try:
        results = await asyncio.gather(*(collect(engine, f"r{i}", 5 + i) for i in range(10)))
    finally:
        await engine.shutdown()
    for i, tokens in enumerate(results):
        # FakeExecutor's token at a position is a pure function of (id, position).
        assert tokens == [fake_token(f"r{i}", 7 + k) for k in range(5 + i)]


async def test_steps_run_off_the_event_loop() -> None:
    """The executor blocks until the event loop sets a flag: with the step on the loop's
    thread this would deadlock."""
    core, executor = fake_core()
    release = threading.Event()
    step_threads: list[str] = []
    execute = executor.execute

    def blocking_execute(plan: SchedulerOutput) -> StepResult:
        step_threads.append(threading.current_thread().name)
        assert release.wait(timeout=10), "the event loop was blocked by the step"
        return execute(plan)

    executor.execute = blocking_execute  # type: ignore[method-assign]
    engine = await started(core)
    try:
        consumer = asyncio.create_task(collect(engine, "a", 2))
        await until(lambda: step_threads)
        release.set()  # only reachable if the loop runs while the step blocks
        assert len(await consumer) == 2
    finally:
        await engine.shutdown()
    assert set(step_threads) == {"engine-loop"}


async def test_idle_engine_sleeps_instead_of_spinning() -> None:
    core, _ = fake_core()
    calls = 0
    has_work = core.has_work

    def counting_has_work() -> bool:
        nonlocal calls
        calls += 1
        return has_work()

    core.has_work = counting_has_work  # type: ignore[method-assign]
    engine = await started(core)
    try:
        await collect(engine, "a", 3)
        await asyncio.sleep(0.05)
        before = calls
        await asyncio.sleep(0.5)
        idle_calls = calls - before
        assert await collect(engine, "b", 3)  # and a submission wakes it up
    finally:
        await engine.shutdown()
    assert idle_calls == 0


async def test_abort_frees_blocks_before_the_next_step() -> None:
    core, executor = fake_core(step_time_s=0.02)
    engine = await started(core)
    try:
        stream = await engine.submit(make_request(40, 200, request_id="long"))
        async for output in stream:
            if output.num_output_tokens >= 2:
                break
        assert engine.stats().kv_blocks_used > 0
        steps_before = len(executor.plans)
        stream.close()
        await until(lambda: engine.stats().kv_blocks_used == 0)
        freed_after = len(executor.plans) - steps_before
    finally:
        await engine.shutdown()
    assert engine.stats().kv_blocks_used == 0
    assert engine.stats().num_running == 0
    # The step in flight when the abort came may finish; the abort lands before the next.
    assert freed_after <= 2
    later = [p for p in executor.plans[steps_before + 1 :] if p.scheduled]
    assert all(s.request_id != "long" for p in later for s in p.scheduled)


async def test_cancelled_consumer_aborts_its_request() -> None:
    core, _ = fake_core(step_time_s=0.02)
    engine = await started(core)
    try:
        task = asyncio.create_task(collect(engine, "c", 200))
        await until(lambda: engine.stats().num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: engine.stats().kv_blocks_used == 0)
        assert engine.stats().kv_blocks_used == 0
        assert engine.num_live_requests == 0
    finally:
        await engine.shutdown()


async def test_admission_errors_reach_the_submitter_only() -> None:
    core, _ = fake_core(max_batch_size=1, max_waiting_requests=1, step_time_s=0.01)
    engine = await started(core)
    try:
        with pytest.raises(AdmissionError, match="maximum context"):
            await engine.submit(make_request(200, 100, request_id="too-long"))
        running = asyncio.create_task(collect(engine, "w1", 20))
        await until(lambda: engine.stats().num_running == 1)
        waiting = asyncio.create_task(collect(engine, "w2", 20))
        await until(lambda: engine.stats().num_waiting == 1)
        with pytest.raises(OverloadedError, match="max_waiting_requests=1"):
            await engine.submit(make_request(8, 20, request_id="x"))
        assert await running == [fake_token("w1", 7 + k) for k in range(20)]
        assert await waiting == [fake_token("w2", 7 + k) for k in range(20)]
    finally:
        await engine.shutdown()


class ErrorForOne(EngineCore):
    """Reports ``victim`` as failed by the engine at its second token."""

    victim = "victim"

    def step(self) -> EngineStep:
        step = super().step()
        outputs = []
        for output in step.outputs:
            if output.request_id == self.victim and output.num_output_tokens == 2:
                self.abort(self.victim)
                output = msgspec.structs.replace(
                    output, finished=True, finish_reason=FinishReason.ERROR
                )
            outputs.append(output)
        return dataclasses.replace(step, outputs=outputs)


async def test_a_failed_request_does_not_disturb_the_others() -> None:
    core, executor = fake_core()
    engine = await started(ErrorForOne(core.scheduler, executor, core.clock))
    try:
        results = await asyncio.gather(
            collect(engine, "victim", 10),
            collect(engine, "bystander", 10),
            return_exceptions=True,
        )
    finally:
        await engine.shutdown()
    assert isinstance(results[0], RequestFailedError)
    assert results[1] == [fake_token("bystander", 7 + k) for k in range(10)]


async def test_a_crashing_step_fails_every_live_request_and_later_submissions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, executor = fake_core()
    executor.crash_after(2)
    engine = await started(core)
    results = await asyncio.gather(
        collect(engine, "a", 10), collect(engine, "b", 10), return_exceptions=True
    )
    assert all(isinstance(r, EngineDeadError) for r in results)
    # The cause goes to the log; the error that reaches clients does not carry it.
    assert "device lost" not in str(results[0])
    assert "device lost" in caplog.text
    await asyncio.wait_for(engine.crashed.wait(), 5)
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        await engine.submit(make_request(8, 2, request_id="late"))
    await engine.shutdown()


async def test_abort_all_ends_streams_with_the_error_and_keeps_running() -> None:
    core, _ = fake_core(step_time_s=0.02)
    engine = await started(core)
    try:
        tasks = [asyncio.create_task(collect(engine, f"d{i}", 200)) for i in range(3)]
        await until(lambda: engine.stats().num_running == 3)
        engine.abort_all(EngineDeadError("draining"))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) for r in results)
        assert engine.is_running
        assert len(await collect(engine, "after", 3)) == 3
        await until(lambda: engine.stats().kv_blocks_used == 0)
    finally:
        await engine.shutdown()


async def test_shutdown_fails_live_requests_and_shuts_the_executor_down() -> None:
    core, executor = fake_core(step_time_s=0.02)
    engine = await started(core)
    task = asyncio.create_task(collect(engine, "s", 200))
    await until(lambda: engine.stats().num_running == 1)
    await engine.shutdown()
    with pytest.raises(EngineDeadError):
        await task
    assert executor.shut_down


async def test_a_submission_that_raises_rejects_only_that_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, _ = fake_core(step_time_s=0.01)
    add = core.add_request

    def add_or_break(submission: Submission) -> None:
        if submission.request_id == "bad":
            add(submission)  # half applied: the scheduler holds it, then something raises
            raise KeyError("internal bookkeeping")
        add(submission)

    core.add_request = add_or_break  # type: ignore[method-assign]
    engine = await started(core)
    try:
        running = asyncio.create_task(collect(engine, "good", 30))
        await until(lambda: engine.stats().num_running == 1)
        with pytest.raises(SubmissionFailedError) as refused:
            await engine.submit(make_request(8, 5, request_id="bad"))
        assert "bookkeeping" not in str(refused.value)
        assert await running == [fake_token("good", 7 + k) for k in range(30)]
        assert engine.is_running
        assert await collect(engine, "after", 3) == [fake_token("after", 7 + k) for k in range(3)]
        await until(lambda: engine.stats().kv_blocks_used == 0)
        assert engine.stats().num_waiting == 0  # the half-applied one was dropped
    finally:
        await engine.shutdown()
    assert "internal bookkeeping" in caplog.text


async def test_an_abort_that_raises_is_logged_and_the_engine_runs_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, _ = fake_core(step_time_s=0.01)
    abort = core.abort

    def abort_or_break(request_id: str) -> bool:
        if request_id == "cursed":
            raise ValueError("abort bookkeeping")
        return abort(request_id)

    core.abort = abort_or_break  # type: ignore[method-assign]
    engine = await started(core)
    try:
        stream = await engine.submit(make_request(8, 5, request_id="cursed"))
        stream.close()
        assert await collect(engine, "next", 5) == [fake_token("next", 7 + k) for k in range(5)]
        assert engine.is_running
    finally:
        await engine.shutdown()
    assert "aborting request cursed failed" in caplog.text


def _output(request_id: str, tokens: tuple[int, ...], **end: object) -> RequestOutput:
    finished = bool(end)
    return RequestOutput(
        request_id=request_id,
        new_token_ids=tokens,
        new_logprobs=(),
        finished=finished,
        finish_reason=end.get("reason"),
        num_prompt_tokens=3,
        num_output_tokens=len(tokens),  # type: ignore[arg-type]
        error=end.get("error"),
        error_code=end.get("code"),  # type: ignore[arg-type]
    )


@pytest.mark.anyio
async def test_peek_waits_for_the_first_output_without_consuming_it() -> None:
    stream = RequestStream("r", lambda request_id: None)
    waiting = asyncio.ensure_future(stream.peek())
    await asyncio.sleep(0)
    assert not waiting.done()
    stream.put(_output("r", (5,)))
    stream.put(_output("r", (6,), reason=FinishReason.LENGTH))
    assert (await waiting).new_token_ids == (5,)
    assert (await stream.peek()).new_token_ids == (5,)  # peeking twice consumes nothing
    assert [o.new_token_ids async for o in stream] == [(5,), (6,)]


@pytest.mark.anyio
async def test_an_invalid_constraint_ending_raises_a_constraint_error() -> None:
    stream = RequestStream("r", lambda request_id: None)
    stream.put(
        _output(
            "r", (), reason=FinishReason.ERROR, error="schema too deep", code=INVALID_CONSTRAINT
        )
    )
    with pytest.raises(InvalidConstraintError, match="schema too deep"):
        await stream.peek()
    other = RequestStream("s", lambda request_id: None)
    other.put(
        _output("s", (), reason=FinishReason.ERROR, error="late", code="ttft_deadline_passed")
    )
    with pytest.raises(RequestShedError):  # other engine codes keep their meaning
        await other.peek()
