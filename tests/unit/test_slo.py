"""SLO-aware scheduling: classes in config, deadline ordering and its starvation bound,
SLO admission (verdict, Retry-After arithmetic, downgrade), computed Retry-After for
queue limits, shedding past the deadline, and the SLO-derived token budget."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from orchestrator.core import OverloadedError, SchedulerConfig
from orchestrator.core.errors import AdmissionError
from orchestrator.core.predictor import ModelStepTimePredictor, StepFeatures
from orchestrator.core.request import FinishReason, RequestStatus
from orchestrator.core.sched.forecast import (
    RETURN_GRACE_S,
    RETURN_PRIOR_MISSES,
    RETURN_WINDOW,
    Bookings,
    Forecast,
)
from orchestrator.core.sched.ordering import SloOrdering
from orchestrator.core.sched.slo import OutputLengths
from orchestrator.core.sched.waiting import WaitingQueue
from tests.factories import (
    constant_step_time,
    make_engine,
    make_request,
    make_scheduler,
    run_to_completion,
)

CLASSES = {
    "interactive": {"ttft_ms": 250, "tpot_ms": 50},
    "batch": {"ttft_ms": 1000, "tpot_ms": 200},
}

# ------------------------------------------------------------------ config


def test_slo_classes_validate_and_name_the_field() -> None:
    cfg = SchedulerConfig(slo_classes=CLASSES, default_slo_class="batch")
    assert cfg.slo_classes["interactive"].ttft_s == 0.25
    assert cfg.slo_classes["batch"].tpot_s == 0.2
    with pytest.raises(ValidationError, match=r"slo_classes\.x\.ttft_ms"):
        SchedulerConfig(slo_classes={"x": {"ttft_ms": 0, "tpot_ms": 50}})
    with pytest.raises(ValidationError, match=r"slo_classes\.x\.tpot_ms"):
        SchedulerConfig(slo_classes={"x": {"ttft_ms": 100, "tpot_ms": 1e9}})
    with pytest.raises(ValidationError, match="e2e_ms"):
        SchedulerConfig(slo_classes={"x": {"ttft_ms": 500, "tpot_ms": 50, "e2e_ms": 100}})
    with pytest.raises(ValidationError, match="default_slo_class: unknown SLO class 'gold'"):
        SchedulerConfig(slo_classes=CLASSES, default_slo_class="gold")
    with pytest.raises(ValidationError, match=r"admission\.downgrade_to"):
        SchedulerConfig(slo_classes=CLASSES, admission={"downgrade_to": "gold"})
    with pytest.raises(
        ValidationError, match=r"admission.type\n  Input should be 'queue_limits' or 'slo'"
    ):
        SchedulerConfig(admission={"type": "lottery"})
    with pytest.raises(ValidationError, match="needs slo_classes"):
        SchedulerConfig(admission={"type": "slo"})


def test_tenant_default_classes_must_exist() -> None:
    from orchestrator.gateway.config import ServeConfig

    scheduler = {"slo_classes": CLASSES}
    ServeConfig(
        scheduler=scheduler,
        executor={"type": "sim"},
        server={"tenant_slo_classes": {"key-abc": "batch"}},
    )
    with pytest.raises(ValidationError, match=r"tenant_slo_classes.*'gold'"):
        ServeConfig(
            scheduler=scheduler,
            executor={"type": "sim"},
            server={"tenant_slo_classes": {"key-abc": "gold"}},
        )


def test_an_unknown_class_at_submission_is_a_400_naming_the_field() -> None:
    sched = make_scheduler(slo_classes=CLASSES)
    with pytest.raises(AdmissionError, match="slo_class: unknown SLO class 'gold'"):
        sched.add_request(make_request(slo_class="gold"))
    assert sched.num_waiting == 0


def test_the_default_class_sets_deadline_and_tpot_target() -> None:
    sched = make_scheduler(slo_classes=CLASSES, default_slo_class="batch")
    r = make_request(arrival_time=2.0)
    sched.add_request(r)
    assert (r.slo_class, r.ttft_deadline, r.tpot_target_s) == ("batch", 3.0, 0.2)
    plain = make_scheduler()
    q = make_request(arrival_time=2.0)
    plain.add_request(q)
    assert (q.slo_class, q.ttft_deadline, q.tpot_target_s) == (None, 2.0, None)


# ------------------------------------------------------------------ ordering


def test_slo_policy_admits_earliest_deadline_first() -> None:
    sched = make_scheduler(policy="slo", slo_classes=CLASSES, aging_rate=0.0)
    # batch arrives first but is due at 1.0 s; interactive arriving at 0.5 s is due at 0.75.
    sched.add_request(make_request(request_id="batch", slo_class="batch", arrival_time=0.0))
    sched.add_request(make_request(request_id="late", slo_class="interactive", arrival_time=0.9))
    sched.add_request(make_request(request_id="inter", slo_class="interactive", arrival_time=0.5))
    order = [sched.waiting.pop().request_id for _ in range(3)]
    assert order == ["inter", "batch", "late"]


def test_priority_strata_come_before_deadlines_without_aging() -> None:
    queue = WaitingQueue(SloOrdering(aging_rate=0.0))
    early = make_request(request_id="p1-early", priority=1)
    early.ttft_deadline = 0.1
    late = make_request(request_id="p0-late", priority=0)
    late.ttft_deadline = 50.0
    queue.push(early)
    queue.push(late)
    assert queue.pop().request_id == "p0-late"


@pytest.mark.parametrize("aging_rate", [0.5, 2.0])
def test_slo_starvation_bound_holds_for_random_requests(aging_rate: float) -> None:
    # Stated bound: priority p with deadline d0 is ahead of any request of priority
    # q <= p whose deadline is after d0 + (p - q) / aging_rate.
    policy = SloOrdering(aging_rate)
    rng = random.Random(7)
    requests = []
    for i in range(300):
        r = make_request(request_id=f"r{i}", priority=rng.randint(0, 5))
        r.ttft_deadline = rng.uniform(0, 20)
        requests.append(r)
    checked = 0
    for a in requests:
        for b in requests:
            p, q = a.priority, b.priority
            if q <= p and b.ttft_deadline > a.ttft_deadline + (p - q) / aging_rate:
                assert policy.admission_key(a) < policy.admission_key(b)
                checked += 1
    assert checked > 1000


# ------------------------------------------------------------------ admission


def slo_scheduler(**config: object):  # type: ignore[no-untyped-def]
    """A scheduler whose predictor knows every step takes 0.1 s; 64-token budget,
    32-token chunks, SLO admission with no Retry-After floor."""
    admission = {"type": "slo", "min_retry_after_s": 0.0}
    admission.update(config.pop("admission", {}))  # type: ignore[arg-type]
    settings: dict[str, object] = {
        "max_num_tokens": 64,
        "chunk_size": 32,
        "max_batch_size": 8,
        "slo_classes": CLASSES,
        "admission": admission,
    }
    settings.update(config)
    return make_scheduler(predictor=constant_step_time(0.1), **settings)


def test_slo_admission_predicts_ttft_and_computes_retry_after() -> None:
    sched = slo_scheduler()
    a = make_request(64, slo_class="batch", arrival_time=0.0, request_id="a")
    b = make_request(64, slo_class="batch", arrival_time=0.001, request_id="b")
    sched.add_request(a, now=0.0)
    sched.add_request(b, now=0.001)
    # a alone: 64 tokens at 32 per step = 2 steps of 0.1 s.
    assert a.predicted_ttft_s == pytest.approx(0.2)
    # Steps 1-2 run a and b (32 + 32 each); the newcomer's 32 tokens run in step 3.
    c = make_request(32, slo_class="interactive", arrival_time=0.002, request_id="c")
    with pytest.raises(OverloadedError) as refused:
        sched.add_request(c, now=0.002)
    err = refused.value
    assert err.code == "ttft_unattainable"
    # predicted 0.3 s against a 0.25 s target: back in 0.05 s.
    assert err.retry_after_s == pytest.approx(0.05)
    assert "250 ms target of SLO class 'interactive'" in str(err)
    assert sched.num_waiting == 2 and "c" not in sched.requests
    assert sched.slo.rejections == {("interactive", "ttft_unattainable"): 1}
    # The same request fits the batch target; time already waited counts.
    d = make_request(32, slo_class="batch", arrival_time=0.002, request_id="d")
    sched.add_request(d, now=0.012)
    assert d.predicted_ttft_s == pytest.approx(0.01 + 0.3)


def test_margin_tightens_the_verdict_and_the_floor_bounds_retry_after() -> None:
    sched = slo_scheduler(admission={"ttft_margin": 0.5, "min_retry_after_s": 1.0})
    with pytest.raises(OverloadedError) as refused:
        # 8 chunks of 32 at 0.1 s: 0.8 s against 0.5 x 1000 ms.
        sched.add_request(make_request(256, slo_class="batch"), now=0.0)
    assert refused.value.retry_after_s == 1.0
    sched.add_request(make_request(128, slo_class="batch"), now=0.0)  # 0.4 s <= 0.5 s


def test_downgrade_moves_a_request_to_the_best_effort_class() -> None:
    sched = slo_scheduler(admission={"downgrade_to": "batch"})
    r = make_request(96, slo_class="interactive", arrival_time=0.0)
    sched.add_request(r, now=0.0)  # 0.3 s > 0.25 s, but within batch's 1 s
    assert r.slo_class == "batch" and r.ttft_deadline == pytest.approx(1.0)
    with pytest.raises(OverloadedError):
        sched.add_request(make_request(32 * 12, slo_class="interactive"), now=0.0)


def test_requests_without_a_class_face_only_the_queue_limits() -> None:
    sched = slo_scheduler()
    sched.add_request(make_request(32 * 30, max_tokens=1), now=0.0)  # 3 s, but no target
    assert sched.num_waiting == 1


def seen_returning(bookings: Bookings, clients: int) -> None:
    """Teach ``bookings`` that ``clients`` refused clients came back (long ago)."""
    for key in range(-clients, 0):
        bookings.book(-100.0, 1, key)
        assert bookings.settle(-100.0, key) == -100.0


def test_reserved_returns_count_as_work_ahead() -> None:
    sched = slo_scheduler(chunk_size=64, admission={"reserve_retries": True})
    seen_returning(sched.admission.bookings, RETURN_WINDOW)  # type: ignore[attr-defined]
    with pytest.raises(OverloadedError) as first:
        sched.add_request(make_request(192, slo_class="interactive", request_id="x"), now=0.0)
    assert first.value.retry_after_s == pytest.approx(0.3 - 0.25)
    # x is told to come back in whole seconds: its 192 tokens are due back at 1 s. A
    # request at 0 s (its 250 ms window ends before then) does not wait for them ...
    sched.add_request(make_request(64, slo_class="interactive", request_id="y0"), now=0.0)
    sched.abort("y0", now=0.0)
    # ... one at 0.9 s does: 64 tokens alone would take 0.1 s; behind x's return, 3
    # steps of x first -> 0.4 s.
    with pytest.raises(OverloadedError) as second:
        y = make_request(64, slo_class="interactive", request_id="y", arrival_time=0.9)
        sched.add_request(y, now=0.9)
    # Its own excess (0.15 s) plus x's booked prefill (192 tokens: 3 steps, 0.3 s).
    assert second.value.retry_after_s == pytest.approx(0.15 + 0.3)
    # Past its due time, x's reservation holds for RETURN_GRACE_S (a client takes a
    # moment to send again), then lapses, as every other does.
    other = make_request(prompt=[5] * 64, slo_class="interactive", arrival_time=1.5)
    assert 1.0 + RETURN_GRACE_S > 1.5
    with pytest.raises(OverloadedError):
        sched.add_request(other, now=1.5)
    late = make_request(prompt=[6] * 64, slo_class="interactive", arrival_time=100.0)
    sched.add_request(late, now=100.0)


def test_bookings_learn_how_many_clients_come_back() -> None:
    bookings = Bookings()
    for i in range(10):
        bookings.book(float(i), 100, key=i)
    # No client seen coming back yet: a booking holds no capacity on trust.
    assert bookings.return_rate == 0.0
    assert bookings.expected_ahead(until=9.0) == []
    assert bookings.expected_tokens() == 0.0
    # Client 0 comes back; 1..5 never do (their bookings lapse by t = 5 + grace).
    assert bookings.settle(0.5, key=0) == 0.0
    bookings.settle(5.0 + RETURN_GRACE_S, key=-1)
    assert len(bookings) == 4
    rate = 1 / (6 + RETURN_PRIOR_MISSES)
    assert bookings.return_rate == pytest.approx(rate)
    assert bookings.expected_ahead(until=9.0) == [100] * round(rate * 4)
    assert bookings.expected_tokens() == pytest.approx(rate * 400)
    # Clients that do come back earn their places back within a few returns, and only
    # the last RETURN_WINDOW settlements count.
    seen_returning(bookings, RETURN_WINDOW)
    full = RETURN_WINDOW / (RETURN_WINDOW + RETURN_PRIOR_MISSES)
    assert bookings.return_rate == pytest.approx(full)
    assert bookings.expected_ahead(until=9.0) == [100] * 4


def test_a_returning_request_does_not_wait_behind_its_own_reservation() -> None:
    sched = slo_scheduler(chunk_size=64, admission={"reserve_retries": True})
    prompt = [9] * 192
    with pytest.raises(OverloadedError) as first:
        sched.add_request(make_request(prompt=prompt, slo_class="interactive"), now=0.0)
    assert first.value.retry_after_s == pytest.approx(0.05)
    # Back with the same prompt: its booking is its own, so only its 3 steps count
    # (counted as work ahead it would predict 0.6 s and be told 0.65 s).
    with pytest.raises(OverloadedError) as again:
        back = make_request(prompt=prompt, slo_class="interactive", arrival_time=0.05)
        sched.add_request(back, now=0.05)
    assert again.value.retry_after_s == pytest.approx(0.05)


def test_prompt_tokens_in_the_prefix_cache_are_not_predicted_as_work() -> None:
    engine, clock = make_engine(
        step_time_s=0.1,
        exact_predictor=True,
        max_num_tokens=64,
        chunk_size=64,
        slo_classes=CLASSES,
        admission={"type": "slo", "min_retry_after_s": 0.0},
    )
    sched = engine.scheduler
    prompt = [(3 * i + 1) % 1000 for i in range(192)]
    first = make_request(prompt=prompt, slo_class="batch")
    sched.add_request(first, now=clock.now())
    assert first.predicted_ttft_s == pytest.approx(0.3)  # 3 steps of 64 tokens
    run_to_completion(engine, clock)
    again = make_request(prompt=prompt, slo_class="interactive", arrival_time=clock.now())
    sched.add_request(again, now=clock.now())
    # 176 of 192 tokens are cached (11 blocks of 16; the last block is computed): one step.
    assert again.num_expected_cached_tokens == 176
    assert again.predicted_ttft_s == pytest.approx(0.1)
    assert sched.kv.probe_cached_tokens(make_request(prompt=[1, 2, 3])) == 0


def test_queue_limit_retry_after_is_the_predicted_drain_time() -> None:
    sched = make_scheduler(
        predictor=constant_step_time(0.1),
        max_num_tokens=64,
        chunk_size=32,
        max_waiting_requests=2,
        admission={"min_retry_after_s": 0.0},
    )
    for i in range(2):
        sched.add_request(make_request(64, arrival_time=i * 0.01))
    with pytest.raises(OverloadedError) as full:
        sched.add_request(make_request(8))
    # One request (64 tokens) must leave the queue: one full 64-token step.
    assert full.value.code == "queue_full"
    assert full.value.retry_after_s == pytest.approx(0.1)
    tokens = make_scheduler(
        predictor=constant_step_time(0.1), max_num_tokens=64, chunk_size=32, max_waiting_tokens=100
    )
    tokens.add_request(make_request(64))
    with pytest.raises(OverloadedError) as over:
        tokens.add_request(make_request(100))
    # 64 of the 164 tokens over a limit of 100 must drain: one step. Floor is 1 s.
    assert over.value.code == "queue_tokens_full" and over.value.retry_after_s == 1.0


# ------------------------------------------------------------------ shedding


def test_waiting_requests_past_their_deadline_are_ended_with_an_error() -> None:
    engine, clock = make_engine(
        step_time_s=0.01,
        max_batch_size=1,
        slo_classes={"fast": {"ttft_ms": 50, "tpot_ms": 100}},
        admission={"shed_after_deadline_s": 0.02},
    )
    blocker = make_request(8, max_tokens=40, request_id="blocker")  # no class: never shed
    stuck = make_request(8, max_tokens=4, request_id="stuck", slo_class="fast")
    engine.scheduler.add_request(blocker)
    engine.scheduler.add_request(stuck)
    outputs = [o for step in run_to_completion(engine, clock) for o in step.outputs]
    ended = [o for o in outputs if o.request_id == "stuck"]
    assert len(ended) == 1 and ended[0].finished
    assert ended[0].finish_reason == FinishReason.ERROR
    assert ended[0].error_code == "ttft_deadline_passed"
    assert ended[0].error is not None and "TTFT deadline (50 ms" in ended[0].error
    assert stuck.status == RequestStatus.FINISHED_ERROR and not stuck.output_token_ids
    # It ended at the first step after 50 + 20 ms, not when the blocker finished (0.4 s).
    assert stuck.finish_time is not None and 0.07 <= stuck.finish_time <= 0.09
    assert blocker.status == RequestStatus.FINISHED_LENGTH
    assert engine.stats().num_shed == 1 and engine.scheduler.kv.num_used_blocks == 0


def test_shedding_off_keeps_late_requests() -> None:
    engine, clock = make_engine(
        max_batch_size=1, slo_classes={"fast": {"ttft_ms": 50, "tpot_ms": 100}}
    )
    engine.scheduler.add_request(make_request(8, max_tokens=40))
    late = make_request(8, max_tokens=4, slo_class="fast")
    engine.scheduler.add_request(late)
    run_to_completion(engine, clock)
    assert late.status == RequestStatus.FINISHED_LENGTH


# ------------------------------------------------------------------ SLO budget


def linear_step(features: StepFeatures) -> float:
    return 0.01 + 0.001 * features.num_tokens


def test_slo_budget_is_the_largest_prefill_under_the_tightest_tpot() -> None:
    sched = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=1000,
        chunk_size=512,
        slo_classes=CLASSES,
        slo_budget={"enabled": True},
    )
    assert sched.step_budget() == 1000  # nothing running: no target to keep
    for i in range(4):
        sched.add_request(make_request(8, max_tokens=50, slo_class="batch", request_id=f"b{i}"))
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.01)
    # batch: 0.01 + 0.001 x tokens <= 0.2 s -> at most 190 tokens.
    assert sched.step_budget() == 190
    sched.add_request(make_request(8, max_tokens=50, slo_class="interactive"))
    sched.update(plan := sched.schedule(0.02), _sampled(plan), 0.03)
    # The tightest target now: 50 ms -> 0.01 + 0.001 x tokens <= 0.05 -> 40 tokens.
    assert sched.step_budget() == 40
    for _ in range(3):
        sched.add_request(make_request(300, max_tokens=5))
    plan = sched.schedule(0.04)
    assert plan.num_tokens == 40 and linear_step(StepFeatures(40, 0, 0, 0, 0)) <= 0.05


def test_slo_budget_keeps_a_minimum_prefill_and_the_fixed_caps() -> None:
    sched = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=100,
        slo_classes={"tight": {"ttft_ms": 100, "tpot_ms": 5}},
        slo_budget={"enabled": True, "min_prefill_tokens": 16},
    )
    sched.add_request(make_request(8, max_tokens=50, slo_class="tight"))
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.01)
    # Even one decode misses 5 ms: decodes plus the 16-token floor.
    assert sched.step_budget() == 1 + 16
    loose = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=100,
        slo_classes={"loose": {"ttft_ms": 100, "tpot_ms": 10_000}},
        slo_budget={"enabled": True},
    )
    loose.add_request(make_request(8, max_tokens=50, slo_class="loose"))
    loose.update(plan := loose.schedule(0.0), _sampled(plan), 0.01)
    assert loose.step_budget() == 100  # max_num_tokens stays the upper bound


def test_slo_budget_holds_requests_without_a_class_to_the_default_tpot() -> None:
    sched = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=1000,
        chunk_size=512,
        slo_budget={"enabled": True, "default_tpot_ms": 100},
    )
    for i in range(4):
        sched.add_request(make_request(8, max_tokens=50, request_id=f"r{i}"))
    assert sched.step_budget() == 1000  # a burst's prompts: no stream to stall yet
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.01)
    # No class: 0.01 + 0.001 x tokens <= 0.1 s -> at most 90 tokens.
    assert sched.step_budget() == 90
    mixed = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=1000,
        slo_classes=CLASSES,
        slo_budget={"enabled": True, "default_tpot_ms": 100},
    )
    mixed.add_request(make_request(8, max_tokens=50, slo_class="batch"))
    mixed.update(plan := mixed.schedule(0.0), _sampled(plan), 0.01)
    assert mixed.step_budget() == 190  # only the batch class's 200 ms runs
    mixed.add_request(make_request(8, max_tokens=50, request_id="no-class"))
    assert mixed.step_budget() == 190  # a queued request bounds nothing
    mixed.update(plan := mixed.schedule(0.02), _sampled(plan), 0.03)
    assert mixed.step_budget() == 90  # the tighter default now: 100 ms
    without = make_scheduler(
        predictor=ModelStepTimePredictor(linear_step),
        max_num_tokens=1000,
        slo_budget={"enabled": True},
    )
    without.add_request(make_request(8, max_tokens=50))
    without.update(plan := without.schedule(0.0), _sampled(plan), 0.01)
    assert without.step_budget() == 1000  # no default: requests without a class bound nothing


def test_slo_budget_off_keeps_max_num_tokens() -> None:
    sched = make_scheduler(predictor=ModelStepTimePredictor(linear_step), slo_classes=CLASSES)
    sched.add_request(make_request(8, slo_class="interactive"))
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.01)
    assert sched.step_budget() == sched.config.max_num_tokens


def _sampled(plan):  # type: ignore[no-untyped-def]
    from orchestrator.core.output import StepResult

    return StepResult({s.request_id: 5 for s in plan.scheduled if s.sample}, duration_s=0.01)


# ------------------------------------------------------------------ expected output length


def test_expected_output_length_is_learned_per_class_and_capped_by_max_tokens() -> None:
    lengths = OutputLengths(window=16, min_count=4, quantile=0.75)
    long = make_request(max_tokens=1000, slo_class="chat")
    assert lengths.expected(long) == 1000  # nothing observed yet: its max_tokens
    for n in (10, 20, 30):
        lengths.observe("chat", n, stopped=True)
    assert lengths.cap("chat") is None and lengths.expected(long) == 1000  # too few
    lengths.observe("chat", 40, stopped=True)
    assert lengths.cap("chat") == 40  # the 0.75 quantile of [10, 20, 30, 40]
    assert lengths.expected(long) == 40
    assert lengths.expected(make_request(max_tokens=25, slo_class="chat")) == 25
    # Other classes, and requests without one, learn separately.
    assert lengths.expected(make_request(max_tokens=1000, slo_class="batch")) == 1000
    assert lengths.expected(make_request(max_tokens=1000)) == 1000
    # A request already past the cap is in the tail: back to its own limit.
    past = make_request(max_tokens=1000, slo_class="chat")
    past.output_token_ids.extend([1] * 41)
    assert lengths.expected(past) == 1000
    # Requests cut off at their limit would have run longer: when the quantile falls on
    # them, the class's outputs run to their limits and max_tokens is the prediction.
    for _ in range(4):
        lengths.observe("chat", 50, stopped=False)
    assert lengths.cap("chat") is None and lengths.expected(long) == 1000


def test_the_scheduler_teaches_output_lengths_from_requests_that_stop() -> None:
    sched = slo_scheduler(max_batch_size=16)
    for _ in range(8):  # token 5 is what every step samples: each stops after one token
        sched.add_request(make_request(8, max_tokens=100, slo_class="batch", stop_token_ids=(5,)))
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.1)
    assert not sched.requests
    assert sched.slo.expected_output_tokens(make_request(max_tokens=100, slo_class="batch")) == 1
    unseen = make_request(max_tokens=100, slo_class="interactive")
    assert sched.slo.expected_output_tokens(unseen) == 100


def test_the_forecast_counts_priority_preemption_and_expected_lengths() -> None:
    """Two running requests of priority 1 fill the batch (50 tokens each at most). A
    priority-0 newcomer evicts one at the next step; one of priority 1 waits for a slot,
    for as long as the running requests are expected to run."""
    sched = slo_scheduler(policy="slo", max_batch_size=2)
    for _ in range(2):
        sched.add_request(make_request(32, max_tokens=50, priority=1, slo_class="batch"))
    sched.update(plan := sched.schedule(0.0), _sampled(plan), 0.1)  # prompts done, 1 token
    assert sched.num_running == 2
    assert Forecast(sched, 0.1).first_token_s([], 32, priority=0) == pytest.approx(0.1)
    # 49 decode steps until a slot frees, then its prompt's step.
    assert Forecast(sched, 0.1).first_token_s([], 32, priority=1) == pytest.approx(5.0)
    for _ in range(8):  # the class's requests usually stop after 4 tokens
        sched.slo.output_lengths.observe("batch", 4, stopped=True)
    assert Forecast(sched, 0.1).first_token_s([], 32, priority=1) == pytest.approx(0.4)
