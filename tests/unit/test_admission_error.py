"""SLO admission judged by the forecast's measured error (``TtftOutcomes``): the
correction from recent actual/predicted TTFT ratios, leniency while a class has few,
and regretted refusals: counted when the queue drained in time and a step had room for
the refused request, and learned from."""

from __future__ import annotations

import pytest

from orchestrator.core import OverloadedError, SchedulerConfig, StepResult
from orchestrator.core.request import Request, RequestStatus
from orchestrator.core.sched.room import RoomLog
from orchestrator.core.sched.scheduler import Scheduler
from orchestrator.core.sched.slo import (
    MIN_CORRECTION,
    PRIOR_OUTCOMES,
    RELEVANT_PREDICTION_SHARE,
    TtftOutcomes,
    assign_class,
)
from tests.factories import constant_step_time, make_request, make_scheduler

# 350 ms: a 96-token prompt (three 32-token chunks of 0.1 s) predicts 0.3 s, inside it.
CLASSES = {
    "chat": {"ttft_ms": 350, "tpot_ms": 100},
    "other": {"ttft_ms": 350, "tpot_ms": 100},
}
SLO_CLASSES = SchedulerConfig(slo_classes=CLASSES).slo_classes


def scheduler(**admission: object) -> Scheduler:
    """Every step is predicted (and taken) at 0.1 s; 32-token chunks; SLO admission."""
    return make_scheduler(
        predictor=constant_step_time(0.1),
        max_num_tokens=64,
        chunk_size=32,
        max_batch_size=8,
        slo_classes=CLASSES,
        admission={"type": "slo", "min_retry_after_s": 0.0, **admission},
    )


def classed(slo_class: str = "chat", arrival: float = 0.0, **kwargs: object) -> Request:
    request = make_request(slo_class=slo_class, arrival_time=arrival, **kwargs)  # type: ignore[arg-type]
    assign_class(request, slo_class, SLO_CLASSES)
    return request


def teach(outcomes: TtftOutcomes, slo_class: str, ratios: list[float]) -> None:
    """Admitted requests of ``slo_class`` predicted at 1 s whose first tokens came at
    ``ratio`` s."""
    for ratio in ratios:
        request = classed(slo_class)
        request.predicted_ttft_s = 1.0
        outcomes.admitted(request)
        request.first_token_time = ratio
    outcomes.update(RoomLog(), now=0.0)


def admits(sched: Scheduler, prompt_len: int, slo_class: str = "chat") -> bool:
    try:
        sched.add_request(make_request(prompt_len, slo_class=slo_class), now=0.0)
    except OverloadedError:
        return False
    return True


def test_without_outcomes_the_bare_prediction_is_judged_against_the_target() -> None:
    sched = scheduler()
    assert sched.admission.outcomes.correction("chat") == 1.0
    # 0.3 s predicted against 350 ms: within the target, no fixed margin taken off.
    assert admits(sched, 96)
    assert not admits(scheduler(), 128)


def shrunk(quantile: float, n: int) -> float:
    """The correction of ``n`` outcomes whose chosen quantile is ``quantile``."""
    return (PRIOR_OUTCOMES + n * quantile) / (PRIOR_OUTCOMES + n)


def test_few_outcomes_move_the_correction_part_of_the_way() -> None:
    sched = scheduler()
    teach(sched.admission.outcomes, "chat", [1.5] * 2)
    assert sched.admission.outcomes.correction("chat") == pytest.approx(shrunk(1.5, 2))
    assert admits(sched, 96)  # 0.3 s x 1.1 inside 0.35 s: a refusal needs more evidence


def test_a_tight_window_admits_up_to_the_target() -> None:
    sched = scheduler()
    teach(sched.admission.outcomes, "chat", [1.0] * 64)
    assert sched.admission.outcomes.correction("chat") == 1.0
    assert admits(sched, 96)


def test_a_wide_window_adds_its_spread() -> None:
    sched = scheduler()
    outcomes = sched.admission.outcomes
    teach(outcomes, "chat", [0.8, 0.9, 1.0, 1.25] * 30)
    correction = shrunk(1.25, 120)  # the 0.75 quantile
    assert outcomes.correction("chat") == pytest.approx(correction)
    with pytest.raises(OverloadedError) as refused:
        sched.add_request(make_request(96, slo_class="chat"), now=0.0)
    assert f"x{correction:.2f}" in str(refused.value)
    # Corrected, 0.3 s is over 0.35 s: back when the excess has drained.
    assert refused.value.retry_after_s == pytest.approx(0.3 - 0.35 / correction)
    assert admits(sched, 64)  # 0.2 s corrected: 0.25 s
    # Each class has its own window.
    assert outcomes.correction("other") == 1.0 and admits(scheduler(), 96, "other")


def test_a_forecast_that_runs_high_admits_beyond_it_within_a_floor() -> None:
    sched = scheduler()
    teach(sched.admission.outcomes, "chat", [0.7] * 120)
    assert admits(sched, 128)  # 0.4 s predicted, about 0.29 s expected
    low = scheduler()
    teach(low.admission.outcomes, "chat", [0.1] * 120)
    assert low.admission.outcomes.correction("chat") == MIN_CORRECTION
    assert not admits(low, 32 * 8)  # 0.8 s x 0.5 over 0.35 s


def test_outcomes_of_short_predictions_do_not_move_the_correction() -> None:
    outcomes = TtftOutcomes(quantile=0.75)
    short = RELEVANT_PREDICTION_SHARE * 0.35 * 0.9  # under a quarter of the 350 ms target
    for _ in range(16):
        request = classed()
        request.predicted_ttft_s = short
        outcomes.admitted(request)
        request.first_token_time = 3 * short  # a step's phase: three times the prediction
    outcomes.update(RoomLog(), now=1.0)
    assert outcomes.correction("chat") == 1.0
    # At a quarter of the target and above, the same error counts.
    teach(outcomes, "chat", [3.0] * 16)
    assert outcomes.correction("chat") == pytest.approx(shrunk(3.0, 16))


def test_the_operator_margin_still_applies_on_top() -> None:
    assert not admits(scheduler(ttft_margin=0.8), 96)  # 0.3 s over 0.8 x 0.35 s


def room_at(*step_times: float) -> RoomLog:
    """A room log busy since before 0 s whose steps at ``step_times`` had room, each
    followed by one without."""
    room = RoomLog()
    room.on_queued(-1.0)  # a new log is idle: room since ever
    for at in step_times:
        room.on_step(at, room=True)
        room.on_step(at + 0.01, room=False)
    return room


def test_a_refusal_whose_queue_drained_with_room_in_time_is_regretted() -> None:
    outcomes = TtftOutcomes(0.75)
    ahead = [classed(), classed()]
    refused = classed(arrival=0.0)
    refused.predicted_ttft_s = 0.5
    outcomes.refused(refused, ahead, own_s=0.05, earliest=0.01)  # due 0.35 s
    ahead[0].first_token_time = 0.1
    outcomes.update(room_at(), now=0.1)
    assert outcomes.resolved == {}  # the second is still waiting
    ahead[1].first_token_time = 0.2
    outcomes.update(room_at(), now=0.2)
    # Its first token would have come at 0.25 s, inside 0.35 s, but no step has had room
    # yet, and one may still come before 0.3 s (its last start that ends in time).
    assert outcomes.resolved == {}
    outcomes.update(room_at(0.22), now=0.22)
    assert outcomes.regretted == {"chat": 1} and outcomes.resolved == {"chat": 1}
    # Learned: an outcome of 0.25 s against the 0.5 s it was refused on.
    assert outcomes.correction("chat") == pytest.approx(shrunk(0.5, 1))


def test_a_refusal_with_no_room_before_its_last_start_is_not_regretted() -> None:
    outcomes = TtftOutcomes(0.75)
    outcomes.refused(classed(arrival=0.0), [], own_s=0.05, earliest=0.01)
    # Room came only after 0.3 s: too late for its prefill to end by 0.35 s.
    outcomes.update(room_at(0.32), now=0.32)
    assert outcomes.regretted == {} and outcomes.resolved == {"chat": 1}
    assert outcomes.correction("chat") == 1.0


def test_room_before_the_refusal_does_not_count() -> None:
    outcomes = TtftOutcomes(0.75)
    outcomes.refused(classed(arrival=0.1), [], own_s=0.05, earliest=0.1)  # due 0.45 s
    outcomes.update(room_at(0.0), now=0.5)
    assert outcomes.regretted == {} and outcomes.resolved == {"chat": 1}


def test_a_refusal_that_would_have_missed_is_not_regretted() -> None:
    outcomes = TtftOutcomes(0.75)
    ahead = classed()
    outcomes.refused(classed(arrival=0.0), [ahead], own_s=0.05, earliest=0.0)
    ahead.first_token_time = 0.32  # 0.37 s with its own prefill: past 0.35 s
    outcomes.update(room_at(0.1), now=0.32)
    assert outcomes.regretted == {} and outcomes.resolved == {"chat": 1}


def test_requests_that_left_without_a_token_drain_the_queue_when_they_left() -> None:
    outcomes = TtftOutcomes(0.75)
    aborted = classed()
    outcomes.refused(classed(arrival=0.0), [aborted], own_s=0.05, earliest=0.0)
    aborted.status, aborted.finish_time = RequestStatus.FINISHED_ABORTED, 0.1
    outcomes.update(room_at(0.1), now=0.1)
    assert outcomes.regretted == {"chat": 1}
    # Nothing ahead: the refusal settles once its last start has passed.
    outcomes.refused(classed(arrival=0.0), [], own_s=0.05, earliest=0.31)
    outcomes.update(room_at(0.1), now=0.31)
    assert outcomes.regretted == {"chat": 1} and outcomes.resolved == {"chat": 2}


def test_the_room_log_keeps_runs_of_steps_with_room_and_idle_spells() -> None:
    room = RoomLog()
    assert room.had_room(0.0, 10.0)  # idle since it was made
    room.on_queued(0.5)  # the idle spell ends when a request is queued, not at a step
    for at, has_room in ((1.0, True), (2.0, True), (3.0, False), (5.0, True)):
        room.on_step(at, has_room)
    assert room.had_room(1.5, 1.8)  # inside the run of 1 to 2 s
    assert room.had_room(0.0, 0.4) and room.had_room(2.0, 2.5)
    assert not room.had_room(0.6, 0.9) and not room.had_room(2.5, 4.9)  # between runs
    assert room.had_room(4.0, 6.0)  # the run going on since 5 s
    assert not room.had_room(6.0, 7.0)  # no step since 5 s says so yet
    assert not room.had_room(2.0, 1.0)  # an empty window
    room.on_idle(8.0)  # the last request left: room until the next is queued
    assert room.had_room(9.0, 12.0)
    room.on_queued(12.0)
    room.on_step(12.5, False)
    assert room.had_room(11.0, 11.5) and not room.had_room(12.1, 13.0)


def test_a_scheduler_logs_room_idle_and_queueing() -> None:
    sched = make_scheduler(max_num_tokens=64, chunk_size=64, max_batch_size=2)
    sched.add_request(make_request(8, max_tokens=2, request_id="a"), now=1.0)
    sched.add_request(make_request(8, max_tokens=2, request_id="b"), now=1.0)
    sched.add_request(make_request(8, max_tokens=2, request_id="c"), now=1.0)
    assert not sched.room.had_room(1.01, 1.5)  # queued at 1 s: not idle any more
    now = 2.0
    while sched.has_work():
        plan = sched.schedule(now)
        sampled = {s.request_id: 5 for s in plan.scheduled if s.sample}
        sched.update(plan, StepResult(sampled, duration_s=1.0), now + 1.0)
        now += 1.0
    # a and b fill the batch (no room) until they finish; c then runs alone with room,
    # and once it finished the scheduler is idle.
    assert not sched.room.had_room(2.0, 3.5)
    assert sched.room.had_room(4.0, 4.0)
    assert sched.room.had_room(now + 10, now + 20)


def test_refusals_by_the_scheduler_are_followed_and_reported() -> None:
    sched = scheduler()
    for i, rid in enumerate("abc"):
        request = make_request(64, slo_class="chat", request_id=rid, arrival_time=i * 1e-3)
        if rid != "c":
            sched.add_request(request, now=request.arrival_time)
    # Behind a and b (two shared steps of 0.1 s), c's two chunks end at 0.4 s: refused.
    with pytest.raises(OverloadedError):
        sched.add_request(request, now=request.arrival_time)
    outcomes = sched.admission.outcomes
    for rid, at in (("a", 0.1), ("b", 0.35)):
        sched.requests[rid].first_token_time = at
    outcomes.update(sched.room, now=0.35)
    # b's first token at 0.35 s: c's own 0.1 s of prefill would end past 0.35 s.
    assert outcomes.resolved == {"chat": 1} and outcomes.regretted == {}


def test_shedding_the_last_waiting_request_leaves_the_scheduler_idle_with_room() -> None:
    sched = scheduler(shed_after_deadline_s=0.0)
    late = make_request(8, slo_class="chat", request_id="late", arrival_time=0.0)
    sched.add_request(late, now=0.0)
    # Nothing ran it before its deadline (0.35 s): the next step sheds it, and with
    # nothing left the scheduler idles, which counts as room from then on.
    plan = sched.schedule(1.0)
    assert plan.is_empty
    (shed,) = sched.update(plan, StepResult({}, duration_s=0.0), 1.0)
    assert shed.error_code == "ttft_deadline_passed"
    assert not sched.room.had_room(0.1, 0.9)
    assert sched.room.had_room(2.0, 3.0)
