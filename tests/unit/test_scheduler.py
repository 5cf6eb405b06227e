"""Focused scheduler behaviours, each through the public API on the fake executor."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import AdmissionError, OverloadedError
from orchestrator.core.output import StepResult
from orchestrator.core.request import RequestStatus
from orchestrator.core.sched.preemption import kv_victim
from orchestrator.core.sched.step import StepState
from tests.factories import make_engine, make_request, make_scheduler, run_step, run_to_completion
from tests.fakes import fake_token


def tokens_by_id(step) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {s.request_id: s.num_tokens for s in step.plan.scheduled}


def test_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    engine, clock = make_engine(num_blocks=256, max_num_tokens=2048, chunk_size=512)
    short = make_request(prompt_len=8, max_tokens=50)
    engine.scheduler.add_request(short)
    run_step(engine, clock)  # short's prompt; it is decoding from now on
    long = make_request(prompt_len=2048, max_tokens=2)
    engine.scheduler.add_request(long)
    steps = [run_step(engine, clock) for _ in range(4)]
    for i, step in enumerate(steps):
        assert tokens_by_id(step) == {short.request_id: 1, long.request_id: 512}, i
    samples = [
        s.sample for step in steps for s in step.plan.scheduled if s.request_id == long.request_id
    ]
    assert samples == [False, False, False, True]
    assert long.num_computed_tokens == 2048 and long.num_output_tokens == 1


def test_decodes_come_first_and_prefill_gets_the_rest_of_the_budget() -> None:
    engine, clock = make_engine(num_blocks=128, max_num_tokens=20, max_batch_size=8, chunk_size=512)
    decoders = [make_request(prompt_len=4, max_tokens=30) for _ in range(5)]
    for r in decoders:
        engine.scheduler.add_request(r)
    run_step(engine, clock)
    long = make_request(prompt_len=100, max_tokens=1)
    engine.scheduler.add_request(long)
    step = run_step(engine, clock)
    counts = tokens_by_id(step)
    assert all(counts[r.request_id] == 1 for r in decoders)
    assert counts[long.request_id] == 15
    assert step.plan.num_tokens == 20


def _prefill_chunks(max_num_tokens: int, prompt_len: int, steps: int) -> list[int]:
    """The chunks a ``prompt_len`` prompt gets beside five decoding requests, one per
    step for ``steps`` steps or until its prompt is done, with a chunk unit of 16."""
    engine, clock = make_engine(
        num_blocks=128,
        max_num_tokens=max_num_tokens,
        max_batch_size=8,
        chunk_size=512,
        chunk_unit=16,
    )
    decoders = [make_request(prompt_len=4, max_tokens=60) for _ in range(5)]
    for r in decoders:
        engine.scheduler.add_request(r)
    run_step(engine, clock)
    long = make_request(prompt_len=prompt_len, max_tokens=1)
    engine.scheduler.add_request(long)
    chunks = []
    for _ in range(steps):
        chunks.append(tokens_by_id(run_step(engine, clock)).get(long.request_id, 0))
        if long.num_output_tokens:
            break
    return chunks


def test_chunks_other_than_a_prompts_last_are_whole_chunk_units() -> None:
    """TensorRT-LLM's own chunking (microBatchScheduler.cpp, FIRST_COME_FIRST_SERVED)
    rounds a chunk that does not end the prompt down to a multiple of its chunk unit;
    so does ours with ``chunk_unit``. 37 tokens of budget beside five decodes: 32 at
    admission, 32 while running, then the prompt's last 8 as they are (37 and 35 with
    no unit)."""
    assert _prefill_chunks(max_num_tokens=42, prompt_len=72, steps=10) == [32, 32, 8]


def test_a_budget_below_one_chunk_unit_prefills_nothing_of_a_longer_prompt() -> None:
    assert _prefill_chunks(max_num_tokens=20, prompt_len=72, steps=4) == [0, 0, 0, 0]


def test_priority_policy_admits_lower_numbers_first_ties_by_arrival() -> None:
    engine, clock = make_engine(policy="priority", aging_rate=0.0, max_batch_size=1)
    reqs = [
        make_request(priority=5, arrival_time=0.0, request_id="p5"),
        make_request(priority=1, arrival_time=0.1, request_id="p1-early"),
        make_request(priority=1, arrival_time=0.2, request_id="p1-late"),
        make_request(priority=3, arrival_time=0.3, request_id="p3"),
    ]
    for r in reqs:
        engine.scheduler.add_request(r)
    order: list[str] = []
    for step in run_to_completion(engine, clock):
        for s in step.plan.scheduled:
            if s.request_id not in order:
                order.append(s.request_id)
    assert order == ["p1-early", "p1-late", "p3", "p5"]


def test_fcfs_ignores_priority() -> None:
    engine, clock = make_engine(policy="fcfs", max_batch_size=1)
    engine.scheduler.add_request(make_request(priority=9, arrival_time=0.0, request_id="first"))
    engine.scheduler.add_request(make_request(priority=0, arrival_time=0.1, request_id="second"))
    assert [s.request_id for s in run_step(engine, clock).plan.scheduled] == ["first"]


def _serve_low_among_high_stream(aging_rate: float, max_steps: int) -> tuple[float | None, float]:
    """One batch slot; a priority-10 request at t=0, then a priority-0 request arriving
    every step (10 ms). Returns when the low request was first scheduled (or None)."""
    engine, clock = make_engine(policy="priority", aging_rate=aging_rate, max_batch_size=1)
    low = make_request(priority=10, max_tokens=4, request_id="low")
    engine.scheduler.add_request(low)
    for i in range(max_steps):
        engine.scheduler.add_request(
            make_request(priority=0, max_tokens=4, arrival_time=clock.now())
        )
        run_step(engine, clock)
        if low.first_scheduled_time is not None:
            break
        assert i < max_steps - 1 or aging_rate == 0
    return low.first_scheduled_time, clock.now()


def test_aging_bounds_the_wait_of_a_low_priority_request() -> None:
    # Bound: aging 100 levels/s lifts priority 10 to 0 after T = 0.1 s; high requests
    # arriving by then are ahead of it (one per 10 ms step: at most 11), each served in
    # 5 steps (8-token prompt, then 4 tokens of which the first comes with the prompt:
    # 4 steps, plus one step of slack) = 50 ms. So it starts by T + 11 * 0.05 s = 0.65 s.
    started, _ = _serve_low_among_high_stream(aging_rate=100.0, max_steps=400)
    assert started is not None and started <= 0.65, started


def test_without_aging_a_low_priority_request_starves_under_the_same_stream() -> None:
    started, now = _serve_low_among_high_stream(aging_rate=0.0, max_steps=200)
    assert started is None and now >= 1.99


def test_kv_pressure_preempts_the_worst_priority_and_keeps_its_tokens() -> None:
    # 6 blocks of 4 tokens. Each request: 4-token prompt -> grows a block every 4 tokens.
    engine, clock = make_engine(
        num_blocks=6,
        block_size=4,
        policy="priority",
        preempt_for_priority=False,
        max_batch_size=3,
        chunk_size=64,
    )
    best = make_request(prompt_len=4, max_tokens=12, priority=0, request_id="best")
    worst = make_request(prompt_len=4, max_tokens=12, priority=2, request_id="worst")
    mid = make_request(prompt_len=4, max_tokens=12, priority=1, request_id="mid")
    for r in (best, worst, mid):
        engine.scheduler.add_request(r)
    preempted: list[str] = []
    while not preempted:
        preempted = run_step(engine, clock).plan.preempted_ids or preempted
        if not preempted:
            continue
    step_ids = preempted
    assert step_ids == ["worst"]
    assert worst.status in (RequestStatus.PREEMPTED, RequestStatus.RUNNING)
    kept = list(worst.output_token_ids)
    assert kept and worst.num_preemptions == 1
    run_to_completion(engine, clock)
    # Resumed by recompute: the tokens kept, and the rest as if never preempted.
    assert worst.output_token_ids[: len(kept)] == kept
    assert worst.output_token_ids == [fake_token("worst", 3 + k) for k in range(12)]


def test_fcfs_preempts_the_latest_arrival() -> None:
    engine, clock = make_engine(num_blocks=6, block_size=4, max_batch_size=3, chunk_size=64)
    for i in range(3):
        engine.scheduler.add_request(
            make_request(prompt_len=4, max_tokens=12, arrival_time=i, request_id=f"a{i}")
        )
    first = next(p for s in run_to_completion(engine, clock) if (p := s.plan.preempted_ids))
    assert first == ["a2"]


def test_preemption_cap_protects_a_request_that_was_preempted_enough() -> None:
    engine, clock = make_engine(num_blocks=64, block_size=4, max_preemptions=1, max_batch_size=3)
    a, b, c = (
        make_request(prompt_len=4, max_tokens=12, arrival_time=t, request_id=rid)
        for t, rid in enumerate("abc")
    )
    for r in (a, b, c):
        engine.scheduler.add_request(r)
    run_step(engine, clock)
    sched = engine.scheduler
    assert sched.running == [a, b, c]
    cap = sched.config.max_preemptions
    assert kv_victim(sched.running, a, cap) is c
    c.num_preemptions = 1  # c is at the cap: b, not c, must yield
    assert kv_victim(sched.running, a, cap) is b
    b.num_preemptions = 1  # everyone below a is at the cap: a yields itself
    assert kv_victim(sched.running, a, cap) is a
    a.num_preemptions = 1  # all at the cap: progress wins, the worst other one yields
    assert kv_victim(sched.running, a, cap) is c


def test_priority_arrival_preempts_a_worse_request_when_the_batch_is_full() -> None:
    engine, clock = make_engine(policy="priority", max_batch_size=2)
    low1 = make_request(priority=5, max_tokens=50, request_id="low1")
    low2 = make_request(priority=6, max_tokens=50, request_id="low2")
    engine.scheduler.add_request(low1)
    engine.scheduler.add_request(low2)
    run_step(engine, clock)
    high = make_request(priority=0, max_tokens=2, request_id="high", arrival_time=clock.now())
    engine.scheduler.add_request(high)
    step = run_step(engine, clock)
    assert step.plan.preempted_ids == ["low2"]
    assert "high" in tokens_by_id(step) and "low2" not in tokens_by_id(step)


def test_equal_priority_arrival_does_not_preempt() -> None:
    engine, clock = make_engine(policy="priority", max_batch_size=1)
    engine.scheduler.add_request(make_request(priority=1, max_tokens=5, request_id="a"))
    run_step(engine, clock)
    engine.scheduler.add_request(make_request(priority=1, request_id="b", arrival_time=clock.now()))
    assert run_step(engine, clock).plan.preempted_ids == []


def test_static_mode_admits_a_batch_and_retires_it_whole() -> None:
    engine, clock = make_engine(batching="static", max_batch_size=3)
    lengths = {"s1": 2, "s2": 10, "s3": 5}
    for rid, n in lengths.items():
        engine.scheduler.add_request(make_request(max_tokens=n, request_id=rid))
    late = make_request(max_tokens=2, request_id="late")
    engine.scheduler.add_request(late)
    steps = run_to_completion(engine, clock)
    late_first = next(i for i, s in enumerate(steps) if "late" in tokens_by_id(s))
    s2_last = max(i for i, s in enumerate(steps) if "s2" in tokens_by_id(s))
    assert late_first == s2_last + 1, "a static batch takes no one until all finish"
    assert all(not s.plan.preempted_ids for s in steps)
    # s1 finished early, but its slot stayed empty: batch size 3 never refilled.
    assert max(len(s.plan.scheduled) for s in steps[3 : s2_last + 1]) <= 2


def test_continuous_mode_refills_a_freed_slot_at_once() -> None:
    engine, clock = make_engine(max_batch_size=2)
    engine.scheduler.add_request(make_request(max_tokens=2, request_id="short"))
    engine.scheduler.add_request(make_request(max_tokens=10, request_id="long"))
    engine.scheduler.add_request(make_request(max_tokens=2, request_id="next"))
    steps = run_to_completion(engine, clock)
    short_last = max(i for i, s in enumerate(steps) if "short" in tokens_by_id(s))
    assert "next" in tokens_by_id(steps[short_last + 1])


def test_without_chunked_prefill_prompts_run_whole_in_prefill_only_steps() -> None:
    engine, clock = make_engine(num_blocks=128, batching="prefill_first", max_num_tokens=512)
    decoder = make_request(prompt_len=8, max_tokens=20, request_id="dec")
    engine.scheduler.add_request(decoder)
    run_step(engine, clock)
    engine.scheduler.add_request(make_request(prompt_len=300, max_tokens=3, request_id="big"))
    step = run_step(engine, clock)
    assert tokens_by_id(step) == {"big": 300}, "decodes wait during a prefill step"
    assert tokens_by_id(run_step(engine, clock)) == {"dec": 1, "big": 1}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_len": 4000, "max_tokens": 200}, "over the model's maximum context of 4096"),
        ({"prompt_len": 1000, "max_tokens": 100}, "needs 69 KV blocks; the KV pool holds 64"),
    ],
)
def test_requests_that_can_never_run_are_rejected_at_submission(kwargs, match) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(num_blocks=64)
    with pytest.raises(AdmissionError, match=match):
        sched.add_request(make_request(**kwargs))
    assert sched.num_waiting == 0 and not sched.requests


def test_prompt_over_the_step_budget_is_rejected_without_chunked_prefill() -> None:
    sched = make_scheduler(batching="prefill_first", max_num_tokens=256)
    with pytest.raises(AdmissionError, match="without chunked prefill"):
        sched.add_request(make_request(prompt_len=300))


def test_duplicate_request_id_is_rejected() -> None:
    sched = make_scheduler()
    sched.add_request(make_request(request_id="x"))
    with pytest.raises(AdmissionError, match="already in use"):
        sched.add_request(make_request(request_id="x"))
    assert sched.num_waiting == 1


def test_queue_limits_raise_overloaded_and_queue_nothing() -> None:
    sched = make_scheduler(max_waiting_requests=2, max_waiting_tokens=100)
    sched.add_request(make_request(prompt_len=10))
    sched.add_request(make_request(prompt_len=10))
    with pytest.raises(OverloadedError, match="max_waiting_requests=2"):
        sched.add_request(make_request(prompt_len=10))
    sched2 = make_scheduler(max_waiting_tokens=100)
    sched2.add_request(make_request(prompt_len=90))
    with pytest.raises(OverloadedError, match="max_waiting_tokens=100"):
        sched2.add_request(make_request(prompt_len=11))
    assert sched.num_waiting == 2 and sched2.num_waiting == 1


def test_abort_frees_blocks_at_once_and_tells_the_executor() -> None:
    engine, clock = make_engine()
    r = make_request(prompt_len=40, max_tokens=50, request_id="gone")
    engine.scheduler.add_request(r)
    run_step(engine, clock)
    assert engine.stats().kv_blocks_used == 3
    engine.abort("gone")
    assert engine.stats().kv_blocks_used == 0
    assert r.status == RequestStatus.FINISHED_ABORTED
    step = engine.step()
    assert step.plan.finished_ids == ["gone"] and not step.plan.scheduled
    assert not engine.has_work()


def test_abort_of_a_waiting_request_removes_it_from_the_queue() -> None:
    engine, _ = make_engine()
    engine.scheduler.add_request(make_request(request_id="w"))
    engine.abort("w")
    assert engine.stats().num_waiting == 0
    assert engine.abort("w") is False


def test_stop_token_finishes_with_stop_and_length_limit_with_length() -> None:
    engine, clock = make_engine()
    expected = [fake_token("stopper", 7 + k) for k in range(10)]  # 8-token prompt
    stop_at = expected.index(expected[2]) + 1  # first time the third token appears
    stopper = make_request(max_tokens=10, request_id="stopper", stop_token_ids=(expected[2],))
    runner = make_request(max_tokens=3, request_id="runner")
    engine.scheduler.add_request(stopper)
    engine.scheduler.add_request(runner)
    outputs = [o for s in run_to_completion(engine, clock) for o in s.outputs]
    final = {o.request_id: o for o in outputs if o.finished}
    assert final["runner"].finish_reason == "length" and runner.num_output_tokens == 3
    assert final["stopper"].finish_reason == "stop"
    assert stopper.output_token_ids == expected[:stop_at]


def test_resumed_request_reuses_its_cached_prefix() -> None:
    engine, clock = make_engine(num_blocks=64, block_size=4, chunk_size=64)
    r = make_request(prompt_len=40, max_tokens=30, request_id="r")
    engine.scheduler.add_request(r)
    for _ in range(5):
        run_step(engine, clock)
    engine.scheduler.preempt(StepState(0), r, clock.now())
    step = run_step(engine, clock)
    (planned,) = step.plan.scheduled
    # 45 known tokens (40 + 5 sampled), 44 computed: 11 full blocks come back from the
    # prefix cache and only the last token is recomputed, to sample the next one.
    assert planned.start_position == 44 and planned.num_tokens == 1


def test_a_request_the_executor_fails_ends_alone_with_its_error() -> None:
    engine, clock = make_engine()
    bad = make_request(max_tokens=5, request_id="bad")
    good = make_request(max_tokens=5, request_id="good")
    engine.scheduler.add_request(bad)
    engine.scheduler.add_request(good)
    run_step(engine, clock)
    executor = engine.executor
    real_execute = executor.execute

    def failing(plan):  # type: ignore[no-untyped-def]
        result = real_execute(plan)
        sampled = {k: v for k, v in result.sampled.items() if k != "bad"}
        return StepResult(sampled, result.duration_s, failed={"bad": "device fault"})

    executor.execute = failing  # type: ignore[method-assign]
    step = run_step(engine, clock)
    (failed,) = [o for o in step.outputs if o.request_id == "bad"]
    assert failed.finished and failed.finish_reason == "error" and failed.error == "device fault"
    assert bad.status == RequestStatus.FINISHED_ERROR
    executor.execute = real_execute  # type: ignore[method-assign]
    run_to_completion(engine, clock)
    assert good.output_token_ids == [fake_token("good", 7 + k) for k in range(5)]
    assert engine.stats().kv_blocks_used == 0


def test_admission_uses_the_executors_free_count_when_it_reports_a_tighter_one() -> None:
    # 64 blocks here, but the executor (which owns the real cache) says 2 are free.
    engine, clock = make_engine(num_blocks=64, block_size=16)
    sched = engine.scheduler
    sched.add_request(make_request(prompt_len=16, max_tokens=50, request_id="running"))
    plan = sched.schedule(clock.now())
    sched.update(plan, StepResult({"running": 1}, 0.01, kv_free_blocks=2), clock.now())
    for i in range(3):
        sched.add_request(make_request(prompt_len=40, max_tokens=4, request_id=f"w{i}"))
    plan = sched.schedule(clock.now())
    # Each newcomer needs 3 blocks plus the running request's headroom: none fits in 2.
    assert [s.request_id for s in plan.scheduled] == ["running"]
    assert sched.num_waiting == 3
    sched.update(plan, StepResult({"running": 1}, 0.01, kv_free_blocks=60), clock.now())
    admitted = {s.request_id for s in sched.schedule(clock.now()).scheduled}
    assert admitted == {"running", "w0", "w1", "w2"}


def test_plan_entries_carry_the_requests_facts() -> None:
    # An executor that schedules inside itself with the same policies needs them.
    engine, clock = make_engine(slo_classes={"chat": {"ttft_ms": 500, "tpot_ms": 80}})
    engine.scheduler.add_request(
        make_request(
            8, 2, request_id="a", priority=3, slo_class="chat", tenant="t", arrival_time=0.5
        ),
        0.5,
    )
    (entry,) = run_step(engine, clock).plan.scheduled
    assert (entry.priority, entry.slo_class, entry.tenant, entry.arrival_time) == (
        3,
        "chat",
        "t",
        0.5,
    )


def test_the_two_halves_of_a_step_are_the_step() -> None:
    # plan_step and finish_step, with the executor called between them, are what step()
    # does: a loop that runs plans itself (TensorRT-LLM's in-executor mode) drives these.
    whole, clock_a = make_engine(num_blocks=5, max_num_tokens=32, chunk_size=16, max_batch_size=4)
    halves, clock_b = make_engine(num_blocks=5, max_num_tokens=32, chunk_size=16, max_batch_size=4)
    for engine in (whole, halves):
        for i in range(4):
            engine.scheduler.add_request(make_request(28, 10, request_id=f"r{i}"), 0.0)
    for _ in range(40):
        a = run_step(whole, clock_a)
        start = clock_b.now()
        plan = halves.plan_step(start)
        b = halves.finish_step(plan, halves.executor.execute(plan), start)
        clock_b.advance_to(b.start_time + b.duration_s)
        assert (a.plan, a.outputs) == (b.plan, b.outputs)
    assert whole.scheduler.num_preemptions == halves.scheduler.num_preemptions > 0
    assert not whole.has_work() and not halves.has_work()
